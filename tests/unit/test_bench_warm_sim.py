"""The KWOK plane's simulated warm supervisor (tests/bench/warm_sim.py): it reads a warm pod as the
operator's Job builder makes it, and answers the channel as docs/design.md#warm-channel says, over a
real socket on a loopback address, every request signed with the run's key and every answer signed
back."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import replace
from typing import Any

import aiohttp

from agentrun_devcluster.kwok_stages import CONTROL_ENV, HANG_ENV
from agentrun_operator import naming
from agentrun_operator.api import DEFAULT_CONTROL_PATH
from agentrun_operator.control import warm_auth
from agentrun_operator.control.envelope import ControlEnvelope, decode_envelope, encode_envelope
from agentrun_operator.shell.warm_client import WarmClient, WarmError
from tests.bench.warm_sim import (
    SECONDS_ENV,
    Ledger,
    Served,
    Supervisor,
    WarmPod,
    closed,
    envelope_for,
    warm_pod_of,
)
from tests.unit.planner.world import PlannerWorld, loop_step, manifest

KEY = b"0123456789abcdef" * 4
CONTROL = '{"continue":true}'


def warm_job_pod(env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """The pod of the first Job of a warm loop, as the operator's builder makes its template, Running
    with a loopback IP as KWOK gives it."""
    workload = {
        "command": ["true"],
        "env": env if env is not None else [{"name": CONTROL_ENV, "value": CONTROL}],
    }
    step = loop_step(max_iterations=5, loop={"warm": {"idleSeconds": 60}}, workload=workload)
    world = PlannerWorld(manifest([step]))
    world.plan()
    template = world.manifests[world.active()]["spec"]["template"]
    meta = {**template["metadata"], "name": "run-pod", "namespace": "ns", "uid": "uid-pod"}
    status = {"phase": "Running", "podIP": "127.192.0.7"}
    return {"metadata": meta, "spec": template["spec"], "status": status}


def test_a_warm_pod_is_read_as_the_builder_makes_it() -> None:
    pod = warm_pod_of(warm_job_pod())
    assert pod is not None
    assert (pod.namespace, pod.name, pod.run, pod.ip) == ("ns", "run-pod", "run", "127.192.0.7")
    assert (pod.port, pod.first_id, pod.idle_seconds, pod.hang) == (8471, "1-1", 60.0, False)
    assert pod.secret == naming.warm_secret_name("run")
    assert {name for name, _ in pod.containers} == {"reporter", "main"}
    envelope = decode_envelope(pod.envelope)
    assert (envelope.status, envelope.control) == ("found", {"continue": True})
    assert warm_pod_of(warm_job_pod(env=[{"name": HANG_ENV, "value": "true"}])).hang  # type: ignore[union-attr]
    slow = warm_pod_of(warm_job_pod(env=[{"name": SECONDS_ENV, "value": "2.5"}]))
    assert slow is not None and slow.seconds == 2.5 and pod.seconds == 0.0


def test_a_pod_not_warm_not_running_or_deleting_is_not_served() -> None:
    pending = warm_job_pod()
    pending["status"] = {"phase": "Pending"}
    deleting = warm_job_pod()
    deleting["metadata"]["deletionTimestamp"] = "2026-03-01T12:00:00Z"
    cold = warm_job_pod()
    del cold["metadata"]["labels"][naming.LABEL_WARM]
    no_ip = warm_job_pod()
    del no_ip["status"]["podIP"]
    assert [warm_pod_of(p) for p in (pending, deleting, cold, no_ip)] == [None] * 4


def test_the_envelope_is_the_one_kwok_and_the_reporter_write() -> None:
    found = ControlEnvelope(
        status="found", path=DEFAULT_CONTROL_PATH, size=len(CONTROL), control={"continue": True}
    )
    assert envelope_for(CONTROL, DEFAULT_CONTROL_PATH) == encode_envelope(found)
    missing = decode_envelope(envelope_for(None, DEFAULT_CONTROL_PATH))
    assert (missing.status, missing.path) == ("missing", DEFAULT_CONTROL_PATH)


class Channel:
    """The operator's side, by hand: signed requests, and answers checked against the key."""

    def __init__(self, session: aiohttp.ClientSession, pod: WarmPod, key: bytes = KEY) -> None:
        self.session, self.pod, self.key = session, pod, key

    async def call(
        self, method: str, target: str, doc: Any = None, *, nonce: str | None = None, sign: bool = True
    ) -> tuple[int, dict[str, Any]]:
        body = json.dumps(doc).encode() if doc is not None else b""
        nonce = nonce or warm_auth.new_nonce()
        headers = (
            {"Authorization": warm_auth.authorization(self.key, method, target, nonce, body)} if sign else {}
        )
        url = f"http://{self.pod.ip}:{self.pod.port}{target}"
        async with self.session.request(method, url, data=body, headers=headers) as resp:
            text = await resp.read()
            signed = warm_auth.answer_is_signed(
                KEY, nonce, resp.status, text, resp.headers.get(warm_auth.ANSWER_HEADER)
            )
            assert signed or not sign, (resp.status, text)
            return resp.status, json.loads(text)


def loopback_pod(**changes: Any) -> WarmPod:
    """A warm pod on a loopback address of its own (tests may run side by side)."""
    ip = f"127.207.{random.randrange(1, 255)}.{random.randrange(1, 255)}"
    base = WarmPod(
        namespace="ns",
        name="run-pod",
        uid="uid-pod",
        run="run",
        ip=ip,
        port=8471,
        first_id="1-1",
        idle_seconds=300.0,
        envelope=envelope_for(CONTROL, DEFAULT_CONTROL_PATH),
        hang=False,
        secret="run-warm",
        containers=(("reporter", "agentrun"), ("main", "busybox")),
    )
    return replace(base, **changes)


async def serving(
    pod: WarmPod,
    ledger: Ledger,
    ended: list[tuple[str, str]],
    event: asyncio.Event,
    former: tuple[bytes, ...] = (),
) -> Served:
    async def end(_supervisor: Supervisor, why: str, message: str) -> None:
        ended.append((why, message))
        event.set()

    served = Served(Supervisor(pod, KEY, ledger, end, lambda _ip: list(former)))
    await served.listen()
    return served


async def _channel_scenario() -> tuple[Ledger, list[tuple[str, str]]]:
    ended: list[tuple[str, str]] = []
    pod, ledger, done = loopback_pod(), Ledger(), asyncio.Event()
    served = await serving(pod, ledger, ended, done)
    try:
        async with aiohttp.ClientSession() as session:
            channel = Channel(session, pod)
            # The first iteration finished as soon as the pod ran: its result waits to be recorded.
            code, state = await channel.call("GET", "/v1/state")
            assert code == 200 and state["phase"] == "idle" and state["running"] is None, state
            assert {k: state["result"][k] for k in ("id", "exitCode", "acked")} == {
                "id": "1-1",
                "exitCode": 0,
                "acked": False,
            }
            assert state["result"]["envelope"] == pod.envelope
            # A long poll on the version seen waits for news; the start of the next iteration is news.
            poll = asyncio.create_task(channel.call("GET", f"/v1/state?wait=30&seen={state['version']}"))
            code, started = await channel.call(
                "POST", "/v1/start", {"id": "2-1", "env": {"AGENTRUN_ITERATION": "2"}}
            )
            assert code == 200 and started["running"]["id"] == "2-1", started
            assert started["result"]["id"] == "1-1" and started["result"]["acked"], started
            code, news = await poll
            assert code == 200 and news["version"] > state["version"], news
            # It runs at once; the long poll from there sees its result.
            code, now = await channel.call("GET", f"/v1/state?wait=30&seen={started['version']}")
            assert now["phase"] == "idle" and now["result"]["id"] == "2-1" and not now["result"]["acked"], now
            # The same id again is a no-op; an id acknowledged before, or a request not right, is refused.
            assert (await channel.call("POST", "/v1/start", {"id": "2-1", "env": {}}))[1] == now
            assert (await channel.call("POST", "/v1/start", {"id": "1-1", "env": {}}))[0] == 409
            assert (await channel.call("POST", "/v1/start", {"id": 2}))[0] == 400
            assert (await channel.call("POST", "/v1/nothing", {}))[0] == 404
            assert (await channel.call("POST", "/v1/ack", {"id": "9-1"}))[0] == 404
            assert (await Channel(session, pod, key=b"another run's key").call("GET", "/v1/state"))[0] == 401
            assert (await channel.call("GET", "/v1/state", sign=False))[0] == 401
            nonce = warm_auth.new_nonce()
            assert (await channel.call("GET", "/v1/state", nonce=nonce))[0] == 200
            assert (await channel.call("GET", "/v1/state", nonce=nonce))[0] == 401  # a replay
            # Acknowledged and stopped: the pod ends as a kubelet would say, with the last result.
            code, acked = await channel.call("POST", "/v1/ack", {"id": "2-1"})
            assert code == 200 and acked["result"]["acked"], acked
            code, stopping = await channel.call("POST", "/v1/stop", {"id": "2-1"})
            assert code == 200 and stopping["phase"] == "stopping", stopping
            await asyncio.wait_for(done.wait(), 30)
    finally:
        await served.close()
    return ledger, ended


def test_the_channel_as_the_design_says() -> None:
    ledger, ended = asyncio.run(_channel_scenario())
    assert ledger.ran == {"run/1-1": 1, "run/2-1": 1}
    assert ledger.duplicate_starts == 1
    assert len(ledger.first_turnarounds) == 1 and ledger.turnarounds == []
    assert ledger.requests["GET /v1/state 401"] == 3 and ledger.requests["POST /v1/start 409"] == 1
    assert ledger.refused == {"wrong signature": 1, "no signature": 1, "replayed nonce": 1}
    [(why, message)] = ended
    doc = json.loads(message)
    assert why == "stop" and doc["warm"] == {"id": "2-1", "exitCode": 0}
    envelope = decode_envelope(message)
    assert (envelope.status, envelope.control) == ("found", {"continue": True})


async def _hung_and_idle() -> tuple[list[int], list[tuple[str, str]]]:
    codes: list[int] = []
    ended: list[tuple[str, str]] = []
    hung, ledger, done = loopback_pod(hang=True), Ledger(), asyncio.Event()
    served = await serving(hung, ledger, ended, done)
    try:
        async with aiohttp.ClientSession() as session:
            channel = Channel(session, hung)
            state = (await channel.call("GET", "/v1/state"))[1]
            assert state["phase"] == "running" and state["running"]["id"] == "1-1", state
            codes.append((await channel.call("POST", "/v1/start", {"id": "2-1", "env": {}}))[0])
            codes.append((await channel.call("POST", "/v1/stop", {"id": "1-1"}))[0])
    finally:
        await served.close()
    idle = loopback_pod(idle_seconds=0.05)
    served = await serving(idle, Ledger(), ended, done)
    try:
        async with aiohttp.ClientSession() as session:
            channel = Channel(session, idle)
            codes.append((await channel.call("POST", "/v1/ack", {"id": "1-1"}))[0])
            await asyncio.wait_for(done.wait(), 30)  # the idle clock ran out after the acknowledgement
    finally:
        await served.close()
    return codes, ended


def test_a_hung_iteration_refuses_the_next_and_an_idle_pod_ends() -> None:
    codes, ended = asyncio.run(_hung_and_idle())
    assert codes == [409, 409, 200]
    assert [why for why, _ in ended] == ["idle"]
    assert json.loads(ended[0][1])["warm"] == {"id": "1-1", "exitCode": 0}


async def _moved() -> tuple[int, dict[str, Any], bool]:
    ended: list[tuple[str, str]] = []
    pod, done = loopback_pod(), asyncio.Event()
    served = await serving(pod, Ledger(), ended, done)
    try:
        async with aiohttp.ClientSession() as session:
            code, _ = await Channel(session, pod).call("POST", "/v1/start", {"id": "2-1", "env": {}})
            assert code == 200
            moved = replace(pod, ip=loopback_pod().ip)
            await served.move(moved.ip)
            code, state = await Channel(session, moved).call("GET", "/v1/state")
            try:
                await Channel(session, pod).call("GET", "/v1/state")
                refused = False
            except aiohttp.ClientConnectionError:
                refused = True
    finally:
        await served.close()
        await closed()
    return code, state, refused


def test_a_pod_whose_ip_changed_is_served_at_the_new_one_with_its_state() -> None:
    code, state, refused = asyncio.run(_moved())
    assert code == 200 and state["result"]["id"] == "2-1", state
    assert refused


async def _stale() -> Ledger:
    pod, ledger, done = loopback_pod(), Ledger(), asyncio.Event()
    served = await serving(pod, ledger, [], done, former=(b"the key of the pod this IP had before",))
    try:
        async with aiohttp.ClientSession() as session:
            stale = Channel(session, pod, key=b"the key of the pod this IP had before")
            assert (await stale.call("GET", "/v1/state"))[0] == 401
            assert (await Channel(session, pod, key=b"nobody's").call("GET", "/v1/state"))[0] == 401
    finally:
        await served.close()
        await closed()
    return ledger


def test_a_request_meant_for_the_pod_this_ip_had_before_is_refused_and_told_apart() -> None:
    """KWOK gives a deleted pod's IP to a later pod: a channel the operator has not let go of yet
    reaches the new pod, whose supervisor refuses it (another run's key), as a stranger's."""
    ledger = asyncio.run(_stale())
    assert ledger.refused == {"signed for the pod this IP had before": 1, "wrong signature": 1}


async def _with_the_operators_client() -> tuple[list[Any], list[tuple[str, str]]]:
    ended: list[tuple[str, str]] = []
    pod, done = loopback_pod(), asyncio.Event()
    served = await serving(pod, Ledger(), ended, done)
    seen: list[Any] = []
    try:
        async with aiohttp.ClientSession() as session:
            client = WarmClient(session, pod.ip, pod.port, KEY)
            first = await client.state()
            seen.append(first)
            seen.append(await client.start("2-1", {"AGENTRUN_ITERATION": "2"}))
            seen.append(await client.state(30, seen[-1].version))
            seen.append(await client.ack("2-1"))
            seen.append(await client.stop("2-1"))
            try:
                await client.start("1-1", {})
            except WarmError as exc:
                seen.append(exc.message)
            await asyncio.wait_for(done.wait(), 30)
    finally:
        await served.close()
        await closed()
    return seen, ended


def test_the_operators_own_client_takes_its_answers() -> None:
    """shell/warm_client.py, the operator's end, against the simulated supervisor: every answer
    signed, parsed and as the channel says."""
    seen, ended = asyncio.run(_with_the_operators_client())
    first, started, finished, acked, stopped, refused = seen
    assert first.phase == "idle" and first.result.id == "1-1" and first.result.exit_code == 0
    assert started.running.id == "2-1" and started.result.acked
    assert finished.phase == "idle" and finished.result.id == "2-1" and not finished.result.acked
    assert acked.result.acked and stopped.phase == "stopping"
    assert "refused: 409" in refused
    assert [why for why, _ in ended] == ["stop"]
