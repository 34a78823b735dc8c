"""`agentrun reporter`, run for real as a subprocess the way an iteration pod runs it
(docs/design.md#iteration-pod)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentrun_operator.control import envelope, reporter
from agentrun_operator.control.envelope import MAX_ENVELOPE_BYTES, decode_envelope

MODULE = "agentrun_operator.control.reporter"


@dataclass
class Pod:
    """The files one iteration pod's reporter containers share."""

    root: Path

    @property
    def control(self) -> Path:
        return self.root / "workspace" / ".agentrun" / "loop-control.json"

    @property
    def fingerprint(self) -> Path:
        return self.root / "reporter" / "fingerprint.json"

    @property
    def ready(self) -> Path:
        return self.root / "reporter" / "ready"

    @property
    def termination_log(self) -> Path:
        return self.root / "termination-log"

    def write_control(self, data: bytes | str) -> None:
        self.control.parent.mkdir(parents=True, exist_ok=True)
        self.control.write_bytes(data.encode() if isinstance(data, str) else data)

    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", MODULE, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def take_fingerprint(self) -> dict[str, Any]:
        """What the reporter does before `main` may start (`report --before-main`, as the Job runs
        it, here without a claim directory and reporting at once, to a log of its own)."""
        proc = self.run(*self.before_main_args())
        assert proc.returncode == 0, proc.stderr
        doc: dict[str, Any] = json.loads(self.fingerprint.read_text())
        return doc

    def before_main_args(self) -> list[str]:
        return [
            "report",
            "--path",
            str(self.control),
            "--fingerprint",
            str(self.fingerprint),
            "--termination-log",
            str(self.root / "before-main-log"),
            "--before-main",
        ]

    def report_args(self) -> list[str]:
        return [
            "report",
            "--path",
            str(self.control),
            "--fingerprint",
            str(self.fingerprint),
            "--termination-log",
            str(self.termination_log),
        ]

    def report(self) -> tuple[envelope.ControlEnvelope, subprocess.CompletedProcess[str]]:
        proc = self.run(*self.report_args())
        assert proc.returncode == 0, proc.stderr
        message = self.termination_log.read_text()
        assert proc.stdout.strip() == message
        assert len(message.encode()) <= MAX_ENVELOPE_BYTES
        return decode_envelope(message), proc


@pytest.fixture
def pod(tmp_path: Path) -> Pod:
    return Pod(tmp_path)


def test_read_limit_matches_the_envelope_module() -> None:
    assert reporter.READ_LIMIT == envelope.MAX_CONTROL_FILE_BYTES


# ------------------------------------------------------------------------------ found / missing


def test_fresh_file_written_by_the_iteration_is_found(pod: Pod) -> None:
    fp = pod.take_fingerprint()
    assert fp["exists"] is False and fp["path"] == str(pod.control)
    pod.write_control('{"continue": true, "outputs": {"remaining_tasks": 2}}')
    env, _ = pod.report()
    assert env.status == "found"
    assert env.control == {"continue": True, "outputs": {"remaining_tasks": 2}}
    assert env.path == str(pod.control)
    assert env.size == pod.control.stat().st_size


def test_no_file_is_missing(pod: Pod) -> None:
    pod.take_fingerprint()
    env, _ = pod.report()
    assert env.status == "missing"
    assert env.reason == f"no file at {pod.control}"
    assert env.size is None


def test_file_deleted_by_the_iteration_is_missing(pod: Pod) -> None:
    pod.write_control('{"continue": true}')
    pod.take_fingerprint()
    pod.control.unlink()
    env, _ = pod.report()
    assert env.status == "missing"
    assert env.reason is not None and "this iteration deleted it" in env.reason


# ----------------------------------------------------------------------------------- staleness


def test_untouched_file_from_an_earlier_iteration_is_stale(pod: Pod) -> None:
    pod.write_control('{"continue": true}')
    fp = pod.take_fingerprint()
    assert fp["exists"] is True and fp["size"] == 18 and len(fp["sha256"]) == 64
    env, _ = pod.report()
    assert env.status == "stale"
    assert env.control is None
    assert env.size == 18
    assert env.reason is not None and "not rewritten by this iteration" in env.reason
    assert envelope.effective_status(env) == "missing"


def test_rewritten_file_is_found(pod: Pod) -> None:
    pod.write_control('{"continue": true}')
    pod.take_fingerprint()
    pod.write_control('{"continue": false}')
    env, _ = pod.report()
    assert env.status == "found" and env.control == {"continue": False}


def test_rewritten_with_identical_content_is_found(pod: Pod) -> None:
    """Writing the same bytes again is still a write by this iteration (the mtime moves)."""
    pod.write_control('{"continue": true}')
    before = pod.control.stat().st_mtime_ns
    pod.take_fingerprint()
    pod.write_control('{"continue": true}')
    os.utime(pod.control, ns=(before + 1_000_000_000, before + 1_000_000_000))
    env, _ = pod.report()
    assert env.status == "found" and env.control == {"continue": True}


def test_same_mtime_but_different_content_is_not_stale(pod: Pod) -> None:
    pod.write_control('{"continue": true}')
    stamp = pod.control.stat().st_mtime_ns
    pod.take_fingerprint()
    pod.write_control('{"continue": fals}')  # same size, different bytes
    os.utime(pod.control, ns=(stamp, stamp))
    env, _ = pod.report()
    assert env.status == "invalid"  # it was looked at: not stale


def test_stale_invalid_file_is_stale_not_invalid(pod: Pod) -> None:
    """A leftover file says nothing about this iteration, whatever it contains."""
    pod.write_control("not json at all")
    pod.take_fingerprint()
    env, _ = pod.report()
    assert env.status == "stale"


def test_without_a_fingerprint_staleness_is_not_checked(pod: Pod) -> None:
    pod.write_control('{"continue": true}')
    env, proc = pod.report()  # no fingerprint was taken
    assert env.status == "found"
    assert "staleness not checked" in proc.stderr


def test_fingerprint_of_another_path_is_ignored(pod: Pod) -> None:
    pod.write_control('{"continue": true}')
    pod.fingerprint.parent.mkdir(parents=True)
    other = reporter.fingerprint_of("/elsewhere.json", reporter.observe(str(pod.control)))
    pod.fingerprint.write_text(json.dumps(other))
    env, proc = pod.report()
    assert env.status == "found"
    assert "staleness not checked: fingerprint is of '/elsewhere.json'" in proc.stderr


def test_corrupt_fingerprint_is_ignored(pod: Pod) -> None:
    pod.write_control('{"continue": true}')
    pod.fingerprint.parent.mkdir(parents=True)
    pod.fingerprint.write_text("{garbage")
    env, proc = pod.report()
    assert env.status == "found"
    assert "unreadable fingerprint" in proc.stderr


# --------------------------------------------------------------------------------- bad payloads


@pytest.mark.parametrize(
    ("data", "status", "reason_part"),
    [
        (b"", "invalid", "empty file"),
        (b"continue: yes", "invalid", "invalid JSON at line 1 column 1"),
        (b'["a", "b"]', "invalid", "root must be a JSON object, got array"),
        (b'{"continue": true, "outputs": {', "invalid", "unexpected end of input"),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00", "invalid", "binary data"),
        (b"\xc3\x28{}", "invalid", "not UTF-8 text"),
        (b'{"a":' * 40 + b"1" + b"}" * 40, "invalid", "nested deeper than 32 levels"),
        (json.dumps({"summary": "x" * 6000}).encode(), "tooLarge", "at most"),
    ],
)
def test_bad_payloads(pod: Pod, data: bytes, status: str, reason_part: str) -> None:
    pod.take_fingerprint()
    pod.write_control(data)
    env, _ = pod.report()
    assert env.status == status
    assert env.reason is not None and reason_part in env.reason, env.reason
    assert env.size == len(data)


def test_huge_file_is_too_large_and_not_read_whole(pod: Pod) -> None:
    pod.take_fingerprint()
    pod.control.parent.mkdir(parents=True, exist_ok=True)
    with open(pod.control, "wb") as handle:  # sparse: 4 GiB on paper, nothing on disk
        handle.truncate(4 * 1024**3)
    obs = reporter.observe(str(pod.control))
    assert obs.size == 4 * 1024**3
    assert obs.data is not None and len(obs.data) == reporter.READ_LIMIT + 1
    env, _ = pod.report()  # reads READ_LIMIT + 1 bytes, as observe() above: no clock bound needed
    assert env.status == "tooLarge"
    assert env.reason is not None and f"control file is {4 * 1024**3} bytes" in env.reason


def test_directory_fifo_and_unreadable_paths(pod: Pod) -> None:
    pod.control.mkdir(parents=True)
    env, _ = pod.report()
    assert env.status == "invalid" and env.reason is not None and "is a directory" in env.reason
    pod.control.rmdir()
    os.mkfifo(pod.control)
    env, _ = pod.report()  # must not block on the FIFO
    assert env.status == "invalid" and env.reason is not None and "not a regular file" in env.reason


def test_a_fingerprint_that_cannot_be_written_never_fails_the_pod(pod: Pod, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    pod.write_control('{"continue": true}')
    args = pod.report_args()
    args[args.index("--fingerprint") + 1] = str(blocker / "sub" / "fp.json")
    proc = pod.run(*args, "--before-main")
    assert proc.returncode == 0
    assert "cannot write the fingerprint" in proc.stderr
    assert decode_envelope(pod.termination_log.read_text()).status == "found"  # not checked for staleness


def test_unwritable_termination_log_still_prints_and_exits_zero(pod: Pod, tmp_path: Path) -> None:
    pod.write_control("{}")
    args = pod.report_args()
    args[args.index("--termination-log") + 1] = str(tmp_path / "missing-dir" / "log")
    proc = pod.run(*args)
    assert proc.returncode == 0
    assert decode_envelope(proc.stdout.strip()).status == "found"
    assert "cannot write the termination message" in proc.stderr


def test_unexpected_error_still_writes_a_well_formed_envelope(
    pod: Pod, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(path: str, fingerprint_path: str | None) -> envelope.ControlEnvelope:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(reporter, "build_report", boom)
    rc = reporter.main(pod.report_args())
    assert rc == 0
    env = decode_envelope(pod.termination_log.read_text())
    assert env.status == "invalid"
    assert env.reason == "reporter failed: RuntimeError: disk on fire"
    assert capsys.readouterr().out.strip() == pod.termination_log.read_text()


def test_fallback_text_is_a_bounded_envelope() -> None:
    text = reporter._fallback_text("/p" * 5000, "why " * 5000)
    assert len(text.encode()) <= MAX_ENVELOPE_BYTES
    env = decode_envelope(text)
    assert env.status == "invalid" and env.reason is not None and env.reason.startswith("why")


# ------------------------------------------------------------------------------ signal-driven


@pytest.fixture
def sidecar(pod: Pod) -> Iterator[subprocess.Popen[str]]:
    """The reporter as a native sidecar: started first, waiting for SIGTERM."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            MODULE,
            *pod.report_args(),
            "--wait-for-signal",
            "--ready-file",
            str(pod.ready),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def _wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.01)


def test_sigterm_driven_report(pod: Pod, sidecar: subprocess.Popen[str]) -> None:
    """The native sidecar's layout (pods of earlier builds, docs/operations.md#earlier-pods): the
    sidecar ready, the fingerprint taken, the main container, SIGTERM."""
    pod.write_control('{"continue": true}')  # left by the previous iteration
    _wait_for(pod.ready)
    pod.take_fingerprint()
    # The main container runs; the reporter must not report before it is told to.
    pod.write_control('{"continue": false, "outputs": {"remaining_tasks": 0}}')
    time.sleep(0.2)
    assert sidecar.poll() is None
    assert not pod.termination_log.exists()
    sidecar.send_signal(signal.SIGTERM)
    out, err = sidecar.communicate(timeout=30)
    assert sidecar.returncode == 0, err
    assert "got SIGTERM" in err
    message = pod.termination_log.read_text()
    assert out.strip() == message
    env = decode_envelope(message)
    assert env.status == "found"
    assert env.control == {"continue": False, "outputs": {"remaining_tasks": 0}}


def test_sigterm_driven_report_of_a_stale_file(pod: Pod, sidecar: subprocess.Popen[str]) -> None:
    pod.write_control('{"continue": true}')
    _wait_for(pod.ready)
    pod.take_fingerprint()
    sidecar.send_signal(signal.SIGTERM)  # the main container wrote nothing
    sidecar.communicate(timeout=30)
    assert sidecar.returncode == 0
    assert decode_envelope(pod.termination_log.read_text()).status == "stale"


def test_sigterm_right_after_start_is_not_lost(pod: Pod, sidecar: subprocess.Popen[str]) -> None:
    """Once ready, SIGTERM is held pending even while the reporter is still importing."""
    _wait_for(pod.ready)
    sidecar.send_signal(signal.SIGTERM)
    sidecar.communicate(timeout=30)
    assert sidecar.returncode == 0
    assert decode_envelope(pod.termination_log.read_text()).status == "missing"


def _loads_pydantic(args: list[str]) -> bool:
    """Whether `agentrun reporter ARGS`, run to its end in a process of its own, loaded pydantic."""
    code = (
        "import sys, atexit; "
        "atexit.register(lambda: print('pydantic' in sys.modules, file=sys.stderr)); "
        f"from {MODULE} import main; sys.exit(main({args!r}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stderr.strip().splitlines()[-1] != "False"


@pytest.mark.parametrize("found", [True, False], ids=["found", "missing"])
def test_the_reporter_never_imports_pydantic(pod: Pod, found: bool) -> None:
    """Its start (the claim and the fingerprint before `main`) and its end (the envelope after
    `main`) sit on every iteration's critical path: stdlib only, the envelope module included."""
    assert not _loads_pydantic(pod.before_main_args())
    assert json.loads(pod.fingerprint.read_text())["exists"] is False
    if found:  # as `main` would
        pod.write_control('{"continue": true}')
    assert not _loads_pydantic(pod.report_args())
    env = decode_envelope(pod.termination_log.read_text())
    assert env.status == ("found" if found else "missing"), env


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--kill-child", "true"], capture_output=True, timeout=10, check=False
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare --pid` (root or user namespaces)")
def test_sigterm_reaches_the_reporter_as_pid_1(pod: Pod) -> None:
    """In a container the reporter is PID 1, where the kernel drops a default-disposition SIGTERM."""
    outer = subprocess.Popen(
        [
            *("unshare", "--pid", "--fork", "--kill-child", sys.executable, "-m", MODULE),
            *pod.report_args(),
            *("--wait-for-signal", "--ready-file", str(pod.ready)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(pod.ready)
        assert pod.ready.read_text() == "1"  # the pid it wrote: it is init of its namespace
        children = Path(f"/proc/{outer.pid}/task/{outer.pid}/children").read_text().split()
        assert len(children) == 1
        pod.write_control('{"continue": true}')
        os.kill(int(children[0]), signal.SIGTERM)
        _, err = outer.communicate(timeout=30)
        assert outer.returncode == 0, err
        assert decode_envelope(pod.termination_log.read_text()).status == "found"
    finally:
        if outer.poll() is None:
            outer.kill()
            outer.communicate(timeout=10)


@pytest.mark.parametrize("words", [["reporter", "--help"], ["reporter", "report", "--help"]])
def test_agentrun_reporter_help_exits_zero(words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`agentrun reporter --help` once exited 2 ("unrecognized arguments"): argparse.REMAINDER."""
    from agentrun_operator.cli import main as cli_main

    with pytest.raises(SystemExit) as exc:
        cli_main(words)
    assert exc.value.code == 0
    assert "usage: agentrun reporter" in capsys.readouterr().out


@pytest.mark.parametrize("outcome", ["unavailable", "taken"])
def test_the_report_carries_the_claim_when_it_is_news(pod: Pod, outcome: str) -> None:
    """The fingerprint hook's claim report rides in the envelope (docs/design.md#fingerprint-hook)."""
    claim = pod.root / "claim.json"
    claim.write_text(json.dumps({"v": 1, "claim": outcome, "volume": "work", "dir": "/w/c", "detail": "d"}))
    pod.write_control('{"continue": true}')
    proc = pod.run(*pod.report_args(), "--claim-report", str(claim))
    assert proc.returncode == 0, proc.stderr
    env = decode_envelope(pod.termination_log.read_text())
    assert env.status == "found" and env.claim is not None and env.claim["claim"] == outcome


def test_a_claim_taken_as_expected_adds_nothing(pod: Pod) -> None:
    claim = pod.root / "claim.json"
    claim.write_text(json.dumps({"v": 1, "claim": "claimed", "volume": "work", "dir": "/w/c", "detail": ""}))
    pod.write_control('{"continue": true}')
    proc = pod.run(*pod.report_args(), "--claim-report", str(claim))
    assert proc.returncode == 0, proc.stderr
    assert '"claim"' not in pod.termination_log.read_text()


def test_the_claim_never_takes_the_control_s_room() -> None:
    """The control keeps its whole budget: a claim that does not fit beside it is dropped."""
    claim = {"v": 1, "claim": "unavailable", "volume": "w", "dir": "/d", "detail": "x" * 400}
    budget = envelope.max_control_bytes("/p", 10)
    full = {"k": "v" * (budget - len('{"k":""}'))}
    packed = envelope.ControlEnvelope(status="found", path="/p", size=10, control=full, claim=claim)
    text = envelope.encode_envelope(packed)
    assert len(text.encode()) <= MAX_ENVELOPE_BYTES
    assert decode_envelope(text).control == full and '"claim"' not in text
    small = packed.replace(control={"k": 1})
    assert decode_envelope(envelope.encode_envelope(small)).claim == claim
