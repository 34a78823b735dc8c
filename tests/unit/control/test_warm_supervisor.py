"""The warm supervisor (control/warm.py) run for real as a warm pod runs it: `agentrun reporter report
--warm` in a process of its own, its postStart hook (the real script) opening `main`'s gate, `main`
the real shell loop (jobs/warm.py) around a small command, and the operator's real client
(shell/warm_client.py) on the channel (docs/design.md#warm-channel)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agentrun_operator.control.envelope import ControlEnvelope, decode_envelope
from agentrun_operator.control.reporter import NO_CHANNEL, WARM_EXIT
from agentrun_operator.control.warm import DEFAULT_PORT
from agentrun_operator.control.warm_auth import (
    ANSWER_HEADER,
    answer_is_signed,
    authorization,
    new_nonce,
)
from agentrun_operator.jobs.reporter_container import READY_HOOK_SCRIPT
from agentrun_operator.jobs.warm import WARM_LOOP_SCRIPT, WARM_MARK
from agentrun_operator.shell.warm_client import WarmClient, WarmError, WarmState

GUARD_SECONDS = 60.0
"""Only a guard against a hang: every condition waited for comes within a second."""
POLL_SECONDS = 5.0
LISTENING = re.compile(r"warm: listening on 127\.0\.0\.1:(\d+)")

COMMAND = (
    'echo "$ID" >> "$OUT/runs"; '
    'if [ -n "$CONTROL" ]; then printf %s "$CONTROL" > "$CONTROL_PATH"; fi; '
    'if [ -n "$REMOVE" ]; then rm -f "$CONTROL_PATH"; fi; '
    'if [ -n "$HOLD" ]; then while [ ! -e "$HOLD" ]; do sleep 0.01; done; fi; '
    'exit "${CODE:-0}"'
)
PYDANTIC_PROBE = (
    "import sys, atexit; "
    "atexit.register(lambda: print('pydantic loaded:', 'pydantic' in sys.modules, file=sys.stderr)); "
    "from agentrun_operator.control.reporter import main; sys.exit(main(sys.argv[1:]))"
)


class WarmPod:
    """The files of one warm pod, its reporter, its hook and its `main`."""

    def __init__(self, root: Path, idle: float = 60.0, first: str = "i1") -> None:
        self.root = root
        self.meta = root / "meta"
        self.meta.mkdir(parents=True)
        self.out = root / "out"
        self.out.mkdir()
        self.control = root / "workspace" / ".agentrun" / "loop-control.json"
        self.control.parent.mkdir(parents=True)
        self.key = secrets.token_bytes(32)
        self.key_file = root / "key"
        self.key_file.write_bytes(self.key)
        self.termination_log = root / "termination-log"
        self.reporter_err = root / "reporter.err"
        self.main_err = root / "main.err"
        self.idle = idle
        self.first = first
        self.reporter: subprocess.Popen[bytes] | None = None
        self.main: subprocess.Popen[bytes] | None = None
        self._port: int | None = None

    def reporter_args(self, *extra: str) -> list[str]:
        m = self.meta
        return [
            "report", "--path", str(self.control), "--fingerprint", f"{m}/fingerprint.json",
            "--termination-log", str(self.termination_log), "--hook-done", f"{m}/hook-done",
            "--ready-file", f"{m}/ready", "--before-main", "--gate", f"{m}/gate", "--knock", f"{m}/knock",
            "--hook-failed", f"{m}/hook-failed", "--warm", "--warm-port", "0",
            "--warm-key-file", str(self.key_file), "--warm-dir", f"{m}/warm",
            "--warm-first-id", self.first, "--warm-idle-seconds", str(self.idle), *extra,
        ]  # fmt: skip

    def start_reporter(self, *extra: str, env: dict[str, str] | None = None) -> None:
        with self.reporter_err.open("wb") as err:
            self.reporter = subprocess.Popen(
                [sys.executable, "-c", PYDANTIC_PROBE, *self.reporter_args(*extra)],
                env={**os.environ, "AGENTRUN_POD_IP": "127.0.0.1", **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def run_hook(self) -> None:
        m = self.meta
        hook = [
            "sh", "-c", READY_HOOK_SCRIPT, "agentrun-ready", f"{m}/ready", "1500", f"{m}/gate",
            f"{m}/hook-done", f"{m}/hook-failed",
        ]  # fmt: skip
        done = subprocess.run(hook, capture_output=True, text=True, timeout=GUARD_SECONDS, check=False)
        assert done.returncode == 0, done.stderr + self.reporter_log()

    def start_main(self, **env: str) -> None:
        """`main`: the loop around `COMMAND`; `env` is the container's (the first iteration's)."""
        with self.main_err.open("wb") as err:
            self.main = subprocess.Popen(
                ["sh", "-c", WARM_LOOP_SCRIPT, WARM_MARK, "sh", "-c", COMMAND],
                env={
                    **os.environ,
                    "AGENTRUN_WARM_DIR": str(self.meta / "warm"),
                    "OUT": str(self.out),
                    "CONTROL_PATH": str(self.control),
                    **env,
                },
                stdin=subprocess.DEVNULL,
                stderr=err,
            )

    def start(self, **env: str) -> None:
        """The pod as the kubelet starts it: the reporter, its hook, then `main`."""
        self.start_reporter()
        self.run_hook()
        self.start_main(**env)

    # ------------------------------------------------------------------------------ the channel

    @property
    def port(self) -> int:
        if self._port is None:
            self._port = int(self.wait_for_log(LISTENING)[1])
        return self._port

    def call(self, method: str, *args: Any, key: bytes | None = None, **kwargs: Any) -> WarmState:
        """One call of the operator's client, in a session of its own (a reconnecting operator)."""

        async def go() -> WarmState:
            async with aiohttp.ClientSession() as session:
                client = WarmClient(session, "127.0.0.1", self.port, self.key if key is None else key)
                state: WarmState = await getattr(client, method)(*args, **kwargs)
                return state

        return asyncio.run(go())

    def refused(self, method: str, *args: Any, **kwargs: Any) -> str:
        with pytest.raises(WarmError) as caught:
            self.call(method, *args, **kwargs)
        return caught.value.message

    def until(self, check: Callable[[WarmState], bool], what: str) -> WarmState:
        """Long polls until the state passes `check`."""
        guard = time.monotonic() + GUARD_SECONDS
        state = self.call("state")
        while not check(state):
            assert self.reporter is not None and self.reporter.poll() is None, self.reporter_log()
            assert time.monotonic() < guard, f"never {what}: {state}\n{self.reporter_log()}"
            state = self.call("state", wait=POLL_SECONDS, seen=state.version)
        return state

    def result_of(self, iteration: str) -> WarmState:
        return self.until(lambda s: s.result is not None and s.result.id == iteration, f"{iteration} done")

    def raw(
        self,
        method: str,
        target: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        send_body: bool = True,
    ) -> tuple[int, bytes, str | None]:
        """A request made by hand (status, body, the answer's signature header); without `send_body`
        only its headers go (its `Content-Length` that of `body`), for an answer due before the body."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=GUARD_SECONDS)
        try:
            if send_body:
                connection.request(method, target, body=body, headers=headers or {})
            else:
                connection.putrequest(method, target)
                for name, value in {**(headers or {}), "Content-Length": str(len(body))}.items():
                    connection.putheader(name, value)
                connection.endheaders()
            answer = connection.getresponse()
            return answer.status, answer.read(), answer.getheader(ANSWER_HEADER)
        finally:
            connection.close()

    def signed(self, method: str, target: str, body: bytes = b"", nonce: str | None = None) -> dict[str, str]:
        return {"Authorization": authorization(self.key, method, target, nonce or new_nonce(), body)}

    # ------------------------------------------------------------------------------------ the end

    def reporter_ends(self) -> int:
        assert self.reporter is not None
        return self.reporter.wait(timeout=GUARD_SECONDS)

    def main_ends(self) -> int:
        assert self.main is not None
        return self.main.wait(timeout=GUARD_SECONDS)

    def termination(self) -> tuple[ControlEnvelope, dict[str, Any]]:
        text = self.termination_log.read_text()
        assert len(text.encode()) <= 4096
        return decode_envelope(text), json.loads(text)

    def reporter_log(self) -> str:
        return self.reporter_err.read_text() if self.reporter_err.exists() else ""

    def wait_for_log(self, pattern: re.Pattern[str]) -> re.Match[str]:
        guard = time.monotonic() + GUARD_SECONDS
        while (found := pattern.search(self.reporter_log())) is None:
            assert self.reporter is not None and self.reporter.poll() is None, self.reporter_log()
            assert time.monotonic() < guard, f"no {pattern.pattern}: {self.reporter_log()}"
            time.sleep(0.01)
        return found

    def runs(self) -> list[str]:
        runs = self.out / "runs"
        return runs.read_text().split() if runs.exists() else []

    def stop_all(self) -> None:
        for proc in (self.reporter, self.main):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[Callable[..., WarmPod]]:
    made: list[WarmPod] = []

    def make(**kwargs: Any) -> WarmPod:
        pod = WarmPod(tmp_path / str(len(made)), **kwargs)
        made.append(pod)
        return pod

    yield make
    for pod in made:
        pod.stop_all()


def envelope_of(state: WarmState) -> ControlEnvelope:
    assert state.result is not None
    return decode_envelope(state.result.envelope)


# ---------------------------------------------------------------------------------- iterations


def test_the_first_iteration_runs_at_once_and_its_result_is_kept_until_acknowledged(
    pods: Callable[..., WarmPod],
) -> None:
    pod = pods()
    pod.start(ID="i1", CONTROL='{"continue": true, "n": 1}')
    state = pod.result_of("i1")
    assert state.phase == "idle" and state.running is None
    assert state.result is not None and state.result.exit_code == 0 and state.result.acked is False
    env = envelope_of(state)
    assert env.status == "found" and env.control == {"continue": True, "n": 1} and env.warm is None
    again = pod.call("state")  # an operator that comes back later (another session) gets it too
    assert again == state
    acked = pod.call("ack", "i1")
    assert acked.result is not None and acked.result.acked is True and acked.version == state.version + 1
    assert pod.call("ack", "i1") == acked  # a second ack changes nothing
    stopping = pod.call("stop", "i1")
    assert stopping.phase == "stopping"
    assert pod.reporter_ends() == 0
    assert pod.main_ends() == 0
    assert pod.runs() == ["i1"]
    termination, doc = pod.termination()
    assert termination.status == "found" and termination.control == {"continue": True, "n": 1}
    assert doc["warm"] == {"id": "i1", "exitCode": 0} and termination.warm == doc["warm"]
    log = pod.reporter_log()
    for line in (
        "warm: started iteration i1 (the pod's first)",
        "warm: iteration i1 ended: exit code 0, control file found",
        "warm: iteration i1 acknowledged",
        "warm: stopped after iteration i1",
        "warm: ended (stop)",
        "pydantic loaded: False",
    ):
        assert line in log, log
    assert pod.main_err.read_text() == "agentrun: iteration i1\n"


def test_a_start_runs_the_next_iteration_once_with_its_env_and_acknowledges_the_last(
    pods: Callable[..., WarmPod],
) -> None:
    pod = pods()
    pod.start(ID="i1", CONTROL='{"n": 1}')
    pod.result_of("i1")
    env = {"ID": "i2", "CONTROL": '{"n": 2, "said": "it\'s"}', "CODE": "3"}
    started = pod.call("start", "i2", env)
    assert started.phase == "running" and started.running is not None and started.running.id == "i2"
    assert started.running.started_at is not None
    assert started.result is not None and started.result.id == "i1" and started.result.acked is True
    pod.call("start", "i2", env)  # again, while it runs or just after: nothing more
    state = pod.result_of("i2")
    assert state.result is not None and state.result.exit_code == 3 and state.result.acked is False
    assert envelope_of(state).control == {"n": 2, "said": "it's"}
    assert pod.call("start", "i2", env) == state  # again once it ended: still nothing, not acknowledged
    assert pod.runs() == ["i1", "i2"]
    assert "refused: 409 iteration i1 ran in this pod and was acknowledged" in pod.refused("start", "i1", {})
    assert pod.runs() == ["i1", "i2"]


def test_a_running_iteration_refuses_another_start_its_ack_and_a_stop(pods: Callable[..., WarmPod]) -> None:
    pod = pods()
    pod.start(ID="i1")
    pod.result_of("i1")
    hold = pod.root / "hold"
    pod.call("start", "i2", {"ID": "i2", "HOLD": str(hold)})
    assert "refused: 409 iteration i2 is running" in pod.refused("start", "i3", {"ID": "i3"})
    assert "refused: 409 iteration i2 is running" in pod.refused("ack", "i2")
    assert "refused: 409 iteration i2 is running" in pod.refused("stop", "i2")
    assert "refused: 404 no result of iteration i9" in pod.refused("ack", "i9")
    hold.touch()
    pod.result_of("i2")
    assert "refused: 409 iteration i2's result is not acknowledged" in pod.refused("stop", "i1")
    assert pod.runs() == ["i1", "i2"]
    for refusal in ("refused POST /v1/start: 409", "refused POST /v1/ack: 409", "refused POST /v1/stop: 409"):
        assert refusal in pod.reporter_log()


def test_the_first_iteration_waits_for_mains_gate_and_main(pods: Callable[..., WarmPod]) -> None:
    """Before the hook opened the gate, and while `main` is not there yet, the first iteration is
    running without a start time, and a start of another id is refused."""
    pod = pods()
    pod.start_reporter()
    state = pod.call("state")
    assert state.phase == "running" and state.running is not None
    assert state.running.id == "i1" and state.running.started_at is None and state.result is None
    assert "refused: 409 iteration i1 is running" in pod.refused("start", "i2", {})
    assert pod.call("start", "i1", {}).running == state.running  # the same id: a no-op
    pod.run_hook()
    pod.start_main(ID="i1")
    assert pod.result_of("i1").result is not None
    assert pod.runs() == ["i1"]


def test_a_hook_the_kubelet_never_ran_has_the_warm_reporter_open_the_gate(
    pods: Callable[..., WarmPod],
) -> None:
    pod = pods()
    pod.start_reporter()
    pod.wait_for_log(LISTENING)
    (pod.meta / "knock").mkdir()  # the kubelet's try at main, past a hook it never ran
    pod.wait_for_log(re.compile("the postStart hook never completed"))
    assert (pod.meta / "gate").is_dir()
    pod.start_main(ID="i1")
    assert pod.result_of("i1").result is not None


# -------------------------------------------------------------------------------- the control file


def test_each_iteration_reads_the_control_file_as_a_cold_reporter_does(pods: Callable[..., WarmPod]) -> None:
    pod = pods()
    pod.start(ID="i1", CONTROL='{"continue": true}')
    assert envelope_of(pod.result_of("i1")).status == "found"
    cases: list[tuple[dict[str, str], str, str]] = [
        ({}, "stale", "left by an earlier iteration"),  # i2 wrote nothing: i1's file
        ({"CONTROL": "{nope"}, "invalid", "invalid JSON"),
        ({"CONTROL": json.dumps({"pad": "x" * 5000})}, "tooLarge", "bytes fit"),
        ({"REMOVE": "1"}, "missing", "this iteration deleted it"),
        ({"CONTROL": '{"continue": true}'}, "found", ""),
    ]
    for number, (env, status, reason) in enumerate(cases, start=2):
        iteration = f"i{number}"
        pod.call("start", iteration, {"ID": iteration, "CONTROL": "", **env})  # not the container's
        result = envelope_of(pod.result_of(iteration))
        assert result.status == status, (iteration, result)
        assert reason in (result.reason or ""), (iteration, result)
    assert pod.runs() == [f"i{n}" for n in range(1, 7)]


def test_the_claims_outcome_rides_in_the_first_iterations_envelope_only(pods: Callable[..., WarmPod]) -> None:
    pod = pods()
    claims = pod.root / "claims"
    pod.start_reporter(
        "--claim-dir", str(claims), "--claim-volume", "work", "--claim-report", f"{pod.meta}/claim.json"
    )
    pod.run_hook()
    pod.start_main(ID="i1", CONTROL="{}")
    first = envelope_of(pod.result_of("i1"))
    assert first.claim is not None and first.claim["claim"] == "unavailable"  # no uids given
    pod.call("start", "i2", {"ID": "i2", "CONTROL": "{}"})
    assert envelope_of(pod.result_of("i2")).claim is None


def test_a_duplicate_pod_never_serves_and_keeps_main_shut(pods: Callable[..., WarmPod]) -> None:
    pod = pods()
    claims = pod.root / "claims"
    claims.mkdir()
    (claims / "job-1").write_text("another-pod")
    uids = {"AGENTRUN_JOB_UID": "job-1", "AGENTRUN_POD_UID": "this-pod"}
    pod.start_reporter("--claim-dir", str(claims), "--claim-report", f"{pod.meta}/claim.json", env=uids)
    m = pod.meta
    hook = ["sh", "-c", READY_HOOK_SCRIPT, "agentrun-ready", f"{m}/ready", "1500", f"{m}/gate",
            f"{m}/hook-done", f"{m}/hook-failed"]  # fmt: skip
    done = subprocess.run(hook, capture_output=True, text=True, timeout=GUARD_SECONDS, check=False)
    assert done.returncode == 1 and "another pod of this Job holds its claim" in done.stderr
    assert (m / "gate").is_symlink()
    assert not (m / "warm").exists() and "listening" not in pod.reporter_log()
    assert pod.reporter is not None
    pod.reporter.send_signal(signal.SIGTERM)
    assert pod.reporter_ends() == 0
    termination, _ = pod.termination()
    assert termination.claim is not None and termination.claim["claim"] == "taken"


# ------------------------------------------------------------------------------------- the end


def test_idle_ends_the_pod_only_after_the_result_is_acknowledged(pods: Callable[..., WarmPod]) -> None:
    pod = pods(idle=0.2)
    pod.start(ID="i1", CONTROL='{"continue": false}', CODE="4")
    state = pod.result_of("i1")
    # Many idle periods without an ack: nothing changes, the result is held.
    assert pod.call("state", wait=1.0, seen=state.version) == state
    assert pod.reporter is not None and pod.reporter.poll() is None
    pod.call("ack", "i1")
    assert pod.reporter_ends() == 0
    assert pod.main_ends() == 0
    termination, doc = pod.termination()
    assert termination.status == "found" and doc["warm"] == {"id": "i1", "exitCode": 4}
    assert "warm: idle for 0.2s after the last acknowledgement: stopped" in pod.reporter_log()


def test_sigterm_reports_the_last_result_unacknowledged(pods: Callable[..., WarmPod]) -> None:
    pod = pods()
    pod.start(ID="i1", CONTROL='{"continue": true}')
    pod.result_of("i1")
    pod.call("start", "i2", {"ID": "i2", "CONTROL": '{"continue": false}', "CODE": "2"})
    pod.result_of("i2")  # not acknowledged: the pod's deletion must not lose it
    assert pod.reporter is not None and pod.main is not None
    pod.reporter.send_signal(signal.SIGTERM)  # the pod deleted: the kubelet signals both
    pod.main.send_signal(signal.SIGTERM)
    assert pod.reporter_ends() == 0
    assert pod.main_ends() == 143  # it was waiting for an id
    termination, doc = pod.termination()
    assert termination.control == {"continue": False} and doc["warm"] == {"id": "i2", "exitCode": 2}
    assert "warm: ended (signal)" in pod.reporter_log()


def test_sigterm_before_any_iteration_ended_reports_none(pods: Callable[..., WarmPod]) -> None:
    pod = pods()
    pod.start_reporter()
    pod.wait_for_log(LISTENING)
    assert pod.reporter is not None
    pod.reporter.send_signal(signal.SIGTERM)
    assert pod.reporter_ends() == 0
    termination, doc = pod.termination()
    assert termination.status == "missing" and "warm" not in doc
    assert termination.reason == "no warm iteration finished in this pod"


def test_a_start_main_does_not_read_is_refused_with_503(pods: Callable[..., WarmPod]) -> None:
    pod = pods()
    pod.start(ID="i1")
    pod.result_of("i1")
    assert pod.main is not None
    pod.main.kill()  # main's loop is gone: nobody reads the FIFO
    pod.main.wait()
    assert "refused: 503 main is not reading its FIFO" in pod.refused("start", "i2", {"ID": "i2"})
    state = pod.call("state")  # nothing changed: the result is still held, not acknowledged
    assert state.phase == "idle" and state.result is not None and state.result.acked is False
    assert pod.runs() == ["i1"]


# -------------------------------------------------------------------------------- the channel


def test_a_request_without_the_runs_signature_is_refused_with_401(pods: Callable[..., WarmPod]) -> None:
    pod = pods()
    pod.start_reporter()
    status, body, signature = pod.raw("GET", "/v1/state")
    assert status == 401 and json.loads(body) == {"error": "the request is not signed with this run's key"}
    assert answer_is_signed(pod.key, "", 401, body, signature)  # no nonce: signed over an empty one
    nonce = new_nonce()
    wrong = {"Authorization": authorization(b"another run's key", "GET", "/v1/state", nonce, b"")}
    status, body, signature = pod.raw("GET", "/v1/state", headers=wrong)
    assert status == 401 and answer_is_signed(pod.key, nonce, 401, body, signature)
    # The operator's client with the wrong key cannot even read that answer as the pod's.
    message = pod.refused("state", key=b"another run's key")
    assert message.endswith("answered without the run's signature (HTTP 401)")
    # Signed for another request: another path, another body.
    status, _, _ = pod.raw("GET", "/v1/state?wait=0", headers=pod.signed("GET", "/v1/state"))
    assert status == 401
    body = b'{"id":"i2","env":{}}'
    status, _, _ = pod.raw(
        "POST", "/v1/start", b'{"id":"i3","env":{}}', pod.signed("POST", "/v1/start", body)
    )
    assert status == 401
    assert pod.runs() == []


def test_a_replayed_request_is_refused_with_401(pods: Callable[..., WarmPod]) -> None:
    pod = pods()
    pod.start_reporter()
    headers = pod.signed("GET", "/v1/state")
    nonce = headers["Authorization"].split('"')[1]
    status, body, signature = pod.raw("GET", "/v1/state", headers=headers)
    assert status == 200 and answer_is_signed(pod.key, nonce, 200, body, signature)
    status, body, signature = pod.raw("GET", "/v1/state", headers=headers)
    assert status == 401 and json.loads(body) == {"error": "the request's nonce was used before (a replay)"}
    assert answer_is_signed(pod.key, nonce, 401, body, signature)


@pytest.mark.parametrize(
    ("method", "target", "body", "status", "error"),
    [
        ("POST", "/v1/start", b"{nope", 400, "the request body is not JSON"),
        ("POST", "/v1/start", b"[]", 400, "the request body is not a JSON object"),
        ("POST", "/v1/start", b'{"id":"../x"}', 400, "id must be a string"),
        ("POST", "/v1/start", b'{"id":"stop"}', 400, "id must be a string"),
        ("POST", "/v1/ack", b'{"id":7}', 400, "id must be a string"),
        ("POST", "/v1/start", b'{"id":"i2","env":{"A-B":"x"}}', 400, "env: 'A-B' is not a variable name"),
        ("POST", "/v1/start", b'{"id":"i2","env":{"A":1}}', 400, "env: A must be a string"),
        ("POST", "/v1/start", b'{"id":"i2","env":[]}', 400, "env must be an object"),
        ("GET", "/v1/state?wait=x", b"", 400, "wait must be a number"),
        ("GET", "/v1/state?wait=-1", b"", 400, "wait must be 0 or more"),
        ("GET", "/v1/state?seen=x", b"", 400, "seen must be a version number"),
        ("GET", "/v1/start", b"", 404, "no endpoint GET /v1/start"),
        ("POST", "/v2/start", b"{}", 404, "no endpoint POST /v2/start"),
    ],
)
def test_bad_requests_are_refused_saying_why(
    pods: Callable[..., WarmPod], method: str, target: str, body: bytes, status: int, error: str
) -> None:
    pod = pods()
    pod.start_reporter()
    nonce = new_nonce()
    headers = {"Authorization": authorization(pod.key, method, target, nonce, body)}
    got, answer, signature = pod.raw(method, target, body, headers)
    assert got == status and error in json.loads(answer)["error"]
    assert answer_is_signed(pod.key, nonce, status, answer, signature)


def test_a_body_over_1_mib_is_refused_unread(pods: Callable[..., WarmPod]) -> None:
    pod = pods()
    pod.start_reporter()
    body = b'{"id":"i2","env":{"A":"' + b"x" * (1 << 20) + b'"}}'
    # Only the headers go: the answer comes from Content-Length, before a byte of the body is read
    # (a client still sending the body when the supervisor closes would meet a broken pipe).
    signed = pod.signed("POST", "/v1/start", body)
    status, answer, _ = pod.raw("POST", "/v1/start", body, signed, send_body=False)
    assert status == 400 and json.loads(answer) == {"error": f"the request body is over {1 << 20} bytes"}


def test_a_long_poll_answers_at_once_when_the_version_is_another_and_waits_otherwise(
    pods: Callable[..., WarmPod],
) -> None:
    pod = pods()
    pod.start_reporter()
    state = pod.call("state")
    assert pod.call("state", wait=30, seen=state.version - 1) == state  # at once: no 30 s here
    pod.run_hook()
    pod.start_main(ID="i1")
    changed = pod.call("state", wait=30, seen=state.version)  # until main took the first id
    assert changed.version > state.version


def test_the_channels_defaults_agree() -> None:
    from agentrun_operator.control.reporter import build_parser

    args = build_parser().parse_args(["report", "--path", "/c", "--warm"])
    assert args.warm_port == DEFAULT_PORT == 8471


def test_a_warm_reporter_without_its_key_keeps_main_shut_saying_why(pods: Callable[..., WarmPod]) -> None:
    pod = pods()
    pod.key_file.unlink()
    pod.start_reporter()
    assert pod.reporter_ends() == WARM_EXIT
    assert (pod.meta / "ready").read_text() == NO_CHANNEL
    said = pod.termination_log.read_text()
    assert said.startswith("warm pod: cannot read the run's key") and str(pod.key_file) in said


def test_warm_arguments_are_checked() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agentrun_operator.control.reporter", "report", "--path", "/c", "--warm"],
        capture_output=True,
        text=True,
        timeout=GUARD_SECONDS,
        check=False,
    )
    assert proc.returncode == 2
    assert (
        "--warm needs --fingerprint, --hook-done, --warm-key-file, --warm-dir, --warm-first-id" in proc.stderr
    )
