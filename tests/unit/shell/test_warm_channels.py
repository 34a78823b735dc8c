"""The operator's warm channels (shell/warm_channels.py) against real sockets: a pod's long poll is
opened when it is first seen with its IP, what the pod says reaches the planner's view and enqueues
its run, and a pod that answers garbage is heard as an error that names it (the planner fails the
attempt after WARM_SILENCE_SECONDS of it, tests/unit/planner/test_warm.py)."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from agentrun_operator.control.warm_auth import ANSWER_HEADER, answer_signature
from agentrun_operator.planner.actions import WarmCommand
from agentrun_operator.planner.observed import ObservedPod, ObservedWarm
from agentrun_operator.shell.warm_channels import WarmChannels

KEY = b"0123456789abcdef" * 4
RUN = ("ns", "run")
GUARD_SECONDS = 30.0


class Kube:
    """The one read the channels make of the API: the run's key."""

    async def get_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        assert (namespace, name) == ("ns", "run-warm")
        return {"key": base64.b64encode(KEY).decode()}


async def serve(body: bytes, signed: bool, acked: bytes | None = None) -> tuple[asyncio.Server, int]:
    """A pod that answers every request with `body` (signed with the run's key, or not); an ack with
    `acked` when given."""

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        length = (
            int(head.lower().split("content-length:", 1)[1].split("\r\n", 1)[0])
            if "content-length" in head.lower()
            else 0
        )
        if length:
            await reader.readexactly(length)
        answer = acked if acked is not None and head.startswith("POST /v1/ack") else body
        nonce = head.split('nonce="', 1)[1].split('"', 1)[0] if 'nonce="' in head else ""
        headers = f"Content-Length: {len(answer)}\r\nContent-Type: application/json\r\n"
        if signed:
            headers += f"{ANSWER_HEADER}: {answer_signature(KEY, nonce, 200, answer)}\r\n"
        writer.write(f"HTTP/1.1 200 OK\r\n{headers}\r\n".encode() + answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def heard_until(channels: WarmChannels, pod: ObservedPod, check: Any) -> ObservedWarm:
    deadline = asyncio.get_running_loop().time() + GUARD_SECONDS
    while True:
        heard = (await channels.observe(RUN, "run-warm", (pod,)))[pod.name]
        if check(heard):
            return heard
        assert asyncio.get_running_loop().time() < deadline, heard
        await asyncio.sleep(0.01)


STATE = {
    "v": 1,
    "version": 3,
    "phase": "idle",
    "running": None,
    "result": {
        "id": "2-1",
        "exitCode": 0,
        "envelope": '{"v":1,"status":"missing","path":"/p","size":null,"reason":"r","control":null}',
        "finishedAt": "2026-12-05T10:44:01.723Z",
        "acked": False,
    },
}


def test_what_a_pod_says_reaches_the_planners_view_and_enqueues_its_run() -> None:
    async def go() -> tuple[ObservedWarm, list[Any]]:
        server, port = await serve(json.dumps(STATE).encode(), signed=True)
        enqueued: list[Any] = []
        channels = WarmChannels(Kube(), port, lambda key, lane: enqueued.append((key, lane)))  # type: ignore[arg-type]
        pod = ObservedPod(name="p", job_name="j", phase="Running", warm_ip="127.0.0.1")
        try:
            heard = await heard_until(channels, pod, lambda h: h.result is not None)
        finally:
            await channels.close()
            server.close()
        return heard, enqueued

    heard, enqueued = asyncio.run(go())
    assert heard.phase == "idle" and heard.error is None
    assert heard.result is not None and (heard.result.id, heard.result.exit_code) == ("2-1", 0)
    assert heard.result.finished_at is not None and heard.result.finished_at.year == 2026
    assert enqueued and enqueued[0][0] == RUN


def test_a_pod_that_answers_garbage_or_unsigned_is_heard_as_an_error_naming_it() -> None:
    async def go(body: bytes, signed: bool) -> ObservedWarm:
        server, port = await serve(body, signed)
        channels = WarmChannels(Kube(), port, lambda key, lane: None)  # type: ignore[arg-type]
        pod = ObservedPod(name="p", job_name="j", phase="Running", warm_ip="127.0.0.1")
        try:
            return await heard_until(channels, pod, lambda h: h.error is not None)
        finally:
            await channels.close()
            server.close()

    garbage = asyncio.run(go(b"<html>surprise</html>", signed=True))
    assert "answered garbage" in (garbage.error or "") and garbage.error_since is not None
    unsigned = asyncio.run(go(json.dumps(STATE).encode(), signed=False))
    assert "answered without the run's signature" in (unsigned.error or "")


def test_an_acknowledged_result_is_no_news_and_enqueues_nothing() -> None:
    """The planner acts on a pod's first word, the end of a silence and a new result; the answer to
    its own ack (the same result, acknowledged) re-plans nothing (one reconcile less per iteration)."""
    acked = json.loads(json.dumps(STATE))
    acked["version"], acked["result"]["acked"] = 4, True

    async def go() -> tuple[ObservedWarm, list[Any], list[Any]]:
        server, port = await serve(json.dumps(STATE).encode(), True, json.dumps(acked).encode())
        enqueued: list[Any] = []
        channels = WarmChannels(Kube(), port, lambda key, lane: enqueued.append((key, lane)))  # type: ignore[arg-type]
        pod = ObservedPod(name="p", job_name="j", phase="Running", warm_ip="127.0.0.1")
        try:
            await heard_until(channels, pod, lambda h: h.result is not None)
            first = list(enqueued)
            await channels.send(RUN, WarmCommand("ack", "p", "127.0.0.1", "2-1"))
            heard = (await channels.observe(RUN, "run-warm", (pod,)))["p"]
        finally:
            await channels.close()
            server.close()
        return heard, first, enqueued

    heard, first, enqueued = asyncio.run(go())
    assert heard.result is not None and heard.result.acked  # heard
    assert len(first) == 1 and enqueued == first  # its first word only: the ack's answer is no news
