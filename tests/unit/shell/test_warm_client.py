"""The operator's client of the warm channel (shell/warm_client.py) against small servers made here
that answer well, badly or not at all: every bad answer is one `WarmError` saying what was wrong.
(Against the real supervisor: tests/unit/control/test_warm_supervisor.py.)"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from agentrun_operator.control.warm_auth import answer_signature, parse_authorization, request_is_signed
from agentrun_operator.shell.warm_client import (
    MAX_ANSWER_BYTES,
    WarmClient,
    WarmError,
    WarmResult,
    WarmRunning,
    WarmState,
)

KEY = b"the run's key"
STATE: dict[str, Any] = {
    "v": 1,
    "version": 7,
    "phase": "idle",
    "running": None,
    "result": {
        "id": "i2",
        "exitCode": 3,
        "envelope": '{"v":1,"status":"missing","path":"/c","size":null,"reason":null,"control":null}',
        "finishedAt": "2026-12-05T10:00:00.000Z",
        "acked": False,
    },
}


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    @property
    def nonce(self) -> str:
        signed = parse_authorization(self.headers.get("authorization"))
        return signed[0] if signed else ""

    def is_signed(self) -> bool:
        signed = parse_authorization(self.headers.get("authorization"))
        return signed is not None and request_is_signed(KEY, self.method, self.target, *signed, self.body)


Handler = Callable[[Request, asyncio.StreamWriter], Awaitable[None]]


def answer(status: int, body: bytes, signature: str | None, *, length: bool = True) -> bytes:
    head = f"HTTP/1.1 {status} Whatever\r\nContent-Type: application/json\r\nConnection: close\r\n"
    if length:
        head += f"Content-Length: {len(body)}\r\n"
    if signature is not None:
        head += f"X-AgentRun-Signature: {signature}\r\n"
    return head.encode() + b"\r\n" + body


def signed(status: int, doc: Any, key: bytes = KEY) -> Handler:
    """A handler answering `doc` with `status`, signed with `key` over the request's nonce."""
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()

    async def handle(request: Request, writer: asyncio.StreamWriter) -> None:
        writer.write(answer(status, body, answer_signature(key, request.nonce, status, body)))

    return handle


def call(handler: Handler, method: str, *args: Any, slack: float = 10.0) -> tuple[WarmState, list[Request]]:
    """`method` of a client against a server answering with `handler`; the requests it received."""
    requests: list[Request] = []

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            first, *lines = head.split("\r\n")
            verb, target, _ = first.split(" ")
            headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines if x)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            request = Request(verb, target, headers, body)
            requests.append(request)
            await handler(request, writer)
            await writer.drain()
        finally:
            writer.close()

    async def scenario() -> WarmState:
        server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, aiohttp.ClientSession() as session:
            client = WarmClient(session, "127.0.0.1", port, KEY, slack=slack)
            state: WarmState = await getattr(client, method)(*args)
            return state

    return asyncio.run(scenario()), requests


def refusal(handler: Handler, method: str = "state", *args: Any, slack: float = 10.0) -> str:
    with pytest.raises(WarmError) as caught:
        call(handler, method, *args, slack=slack)
    assert type(caught.value) is WarmError and caught.value.__cause__ is None
    return caught.value.message


# ------------------------------------------------------------------------------------ good answers


def test_a_signed_state_is_parsed_and_every_request_is_signed() -> None:
    state, requests = call(signed(200, STATE), "state", 3, 7)
    assert state == WarmState(
        7,
        "idle",
        None,
        WarmResult("i2", 3, STATE["result"]["envelope"], "2026-12-05T10:00:00.000Z", False),
    )
    assert requests[0].method == "GET" and requests[0].target == "/v1/state?wait=3&seen=7"
    assert requests[0].is_signed() and requests[0].body == b""
    running = {**STATE, "phase": "running", "running": {"id": "i3", "startedAt": None}, "result": None}
    for method, args, target in (
        ("start", ("i3", {"A": "it's"}), "/v1/start"),
        ("ack", ("i2",), "/v1/ack"),
        ("stop", ("i2",), "/v1/stop"),
    ):
        state, requests = call(signed(200, running), method, *args)
        assert state.running == WarmRunning("i3", None) and state.result is None
        assert requests[0].method == "POST" and requests[0].target == target and requests[0].is_signed()
        doc = json.loads(requests[0].body)
        assert doc["id"] == args[0] and doc.get("env") == (args[1] if method == "start" else None)


def test_each_request_has_a_nonce_of_its_own() -> None:
    _, first = call(signed(200, STATE), "state")
    _, second = call(signed(200, STATE), "state")
    assert first[0].nonce and first[0].nonce != second[0].nonce


# ------------------------------------------------------------------------------------- bad answers


def test_an_error_status_is_a_refusal_with_the_supervisors_words() -> None:
    message = refusal(signed(409, {"error": "iteration i2 is running: i3 not started"}), "start", "i3", {})
    assert message.startswith("the warm pod at 127.0.0.1:")
    assert message.endswith(" refused: 409 iteration i2 is running: i3 not started")
    assert refusal(signed(503, {"no": "error field"})).endswith('refused: 503 {"no": "error field"}')


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"<html>hello</html>", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (json.dumps({**STATE, "v": 2}).encode(), "v is 2, not 1"),
        (json.dumps({**STATE, "version": "7"}).encode(), "version is not a number"),
        (json.dumps({**STATE, "version": True}).encode(), "version is not a number"),
        (json.dumps({**STATE, "phase": "dancing"}).encode(), "phase is 'dancing'"),
        (json.dumps({**STATE, "running": []}).encode(), "running is not an object"),
        (json.dumps({**STATE, "running": {"id": 3}}).encode(), "running.id is not a string"),
        (json.dumps({**STATE, "result": {**STATE["result"], "acked": "no"}}).encode(), "result.acked"),
        (json.dumps({**STATE, "result": {**STATE["result"], "exitCode": 1.5}}).encode(), "result.exitCode"),
        (json.dumps({**STATE, "result": {**STATE["result"], "envelope": None}}).encode(), "result.envelope"),
    ],
)
def test_garbage_is_named_as_such(body: bytes, why: str) -> None:
    message = refusal(signed(200, body))
    assert message.startswith("the warm pod at 127.0.0.1:") and f"answered garbage: {why}" in message


@pytest.mark.parametrize("signature", ["missing", "another key", "another nonce", "another status"])
def test_an_answer_without_the_runs_signature_is_not_taken(signature: str) -> None:
    body = json.dumps(STATE).encode()

    async def handle(request: Request, writer: asyncio.StreamWriter) -> None:
        made = {
            "missing": None,
            "another key": answer_signature(b"another run's key", request.nonce, 200, body),
            "another nonce": answer_signature(KEY, "0" * 32, 200, body),
            "another status": answer_signature(KEY, request.nonce, 201, body),
        }[signature]
        writer.write(answer(200, body, made))

    assert refusal(handle).endswith("answered without the run's signature (HTTP 200)")


@pytest.mark.parametrize("length", [True, False], ids=["declared", "streamed"])
def test_an_answer_over_256_kib_is_refused(length: bool) -> None:
    body = b'{"pad": "' + b"x" * MAX_ANSWER_BYTES + b'"}'

    async def handle(request: Request, writer: asyncio.StreamWriter) -> None:
        writer.write(answer(200, body, answer_signature(KEY, request.nonce, 200, body), length=length))

    assert refusal(handle).endswith("answered more than 256 KiB")


def test_a_pod_that_never_answers_is_given_up_on() -> None:
    async def silent(request: Request, writer: asyncio.StreamWriter) -> None:
        await asyncio.Event().wait()  # accepted, read, and never a word: until the client gives up

    assert refusal(silent, "state", 0.0, None, slack=0.3).endswith("did not answer in 0.3s")


def test_a_pod_that_hangs_up_is_said_to() -> None:
    async def hang_up(request: Request, writer: asyncio.StreamWriter) -> None:
        return None

    assert refusal(hang_up).endswith("closed the connection without an answer")


def test_a_port_nobody_listens_on_refuses_the_connection() -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))  # held, never listening: connections to it are refused
    port = holder.getsockname()[1]

    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            await WarmClient(session, "127.0.0.1", port, KEY).state()

    try:
        with pytest.raises(WarmError) as caught:
            asyncio.run(scenario())
    finally:
        holder.close()
    assert caught.value.message == f"the warm pod at 127.0.0.1:{port} refused the connection"


def test_an_ipv6_address_is_bracketed() -> None:
    async def scenario() -> str:
        async with aiohttp.ClientSession() as session:
            return WarmClient(session, "fd00::5", 8471, KEY).where

    assert asyncio.run(scenario()) == "the warm pod at [fd00::5]:8471"
