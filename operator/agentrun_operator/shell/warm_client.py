"""The operator's end of the warm channel (docs/design.md#warm-channel): calls to a warm pod's
supervisor (control/warm.py), each signed with the run's key, each answer checked against it.

Every way a call can go wrong ends in one `WarmError` whose message says so in a sentence a user
can act on (it lands in the run's status and Events): never a traceback, never an answer taken that
is not the supervisor's, complete and well-formed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import aiohttp
from yarl import URL

from agentrun_operator.control.warm import FIFO_WRITE_SECONDS
from agentrun_operator.control.warm_auth import ANSWER_HEADER, answer_is_signed, authorization, new_nonce

MAX_ANSWER_BYTES: Final = 256 * 1024
CONNECT_SECONDS: Final = 5.0
SLACK_SECONDS: Final = 10.0
"""What a call may take beyond what the supervisor may take for it (a long poll's wait, a start's
wait for `main` to read its FIFO)."""
PHASES: Final = frozenset({"running", "idle", "stopping"})

Phase = Literal["running", "idle", "stopping"]


class WarmError(Exception):
    """A call to a warm pod that did not give a state; `message` says why, for a user."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class WarmRunning:
    id: str
    started_at: str | None
    """None until `main` has taken the id (the pod's first iteration, while its gate opens)."""


@dataclass(frozen=True)
class WarmResult:
    id: str
    exit_code: int | None
    envelope: str
    """The control envelope's text, as a cold reporter writes it to its termination message."""
    finished_at: str
    acked: bool


@dataclass(frozen=True)
class WarmState:
    version: int
    phase: Phase
    running: WarmRunning | None
    result: WarmResult | None


class WarmClient:
    """Calls to one warm pod's supervisor at `host:port` (the pod's IP) over `session`."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        host: str,
        port: int,
        key: bytes,
        *,
        slack: float = SLACK_SECONDS,
    ) -> None:
        self._session = session
        self._netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._key = key
        self._slack = slack
        self.where = f"the warm pod at {self._netloc}"

    async def state(self, wait: float = 0.0, seen: int | None = None) -> WarmState:
        """The state; with `seen`, once its version is another (or after `wait` seconds): a long poll."""
        query = f"wait={wait:g}" + ("" if seen is None else f"&seen={seen}")
        return await self._call("GET", f"/v1/state?{query}", b"", wait + self._slack)

    async def start(self, iteration: str, env: Mapping[str, str]) -> WarmState:
        body = _json({"id": iteration, "env": dict(env)})
        return await self._call("POST", "/v1/start", body, FIFO_WRITE_SECONDS + self._slack)

    async def ack(self, iteration: str) -> WarmState:
        return await self._call("POST", "/v1/ack", _json({"id": iteration}), self._slack)

    async def stop(self, iteration: str) -> WarmState:
        body = _json({"id": iteration})
        return await self._call("POST", "/v1/stop", body, FIFO_WRITE_SECONDS + self._slack)

    async def _call(self, method: str, target: str, body: bytes, seconds: float) -> WarmState:
        nonce = new_nonce()
        headers = {"Authorization": authorization(self._key, method, target, nonce, body)}
        if body:
            headers["Content-Type"] = "application/json"
        timeout = aiohttp.ClientTimeout(total=seconds, sock_connect=CONNECT_SECONDS)
        url = URL(f"http://{self._netloc}{target}", encoded=True)
        try:
            async with self._session.request(
                method, url, data=body or None, headers=headers, timeout=timeout, allow_redirects=False
            ) as answer:
                data = await _read_bounded(answer, self.where)
                status, signature = answer.status, answer.headers.get(ANSWER_HEADER)
        except aiohttp.ConnectionTimeoutError:
            raise WarmError(f"{self.where} did not accept a connection in {CONNECT_SECONDS:g}s") from None
        except TimeoutError:
            raise WarmError(f"{self.where} did not answer in {seconds:g}s") from None
        except aiohttp.ClientConnectorError as exc:
            refused = isinstance(exc.os_error, ConnectionRefusedError)
            why = "refused the connection" if refused else f"cannot be reached: {exc.os_error.strerror}"
            raise WarmError(f"{self.where} {why}") from None
        except aiohttp.ServerDisconnectedError:
            raise WarmError(f"{self.where} closed the connection without an answer") from None
        except aiohttp.ClientError as exc:
            raise WarmError(f"{self.where} failed: {type(exc).__name__}: {exc}") from None
        if not answer_is_signed(self._key, nonce, status, data, signature):
            raise WarmError(f"{self.where} answered without the run's signature (HTTP {status})")
        doc = _json_doc(data, self.where)
        if status != 200:
            error = doc.get("error")
            said = error if isinstance(error, str) else json.dumps(doc)[:200]
            raise WarmError(f"{self.where} refused: {status} {said}")
        try:
            return parse_state(doc)
        except ValueError as exc:
            raise WarmError(f"{self.where} answered garbage: {exc}") from None


def _json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


async def _read_bounded(answer: aiohttp.ClientResponse, where: str) -> bytes:
    """The answer's body, refused as soon as it is over `MAX_ANSWER_BYTES`."""
    declared = answer.content_length
    if declared is not None and declared > MAX_ANSWER_BYTES:
        raise WarmError(f"{where} answered more than {MAX_ANSWER_BYTES // 1024} KiB")
    chunks: list[bytes] = []
    size = 0
    while chunk := await answer.content.read(65536):
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise WarmError(f"{where} answered more than {MAX_ANSWER_BYTES // 1024} KiB")
        chunks.append(chunk)
    return b"".join(chunks)


def _json_doc(data: bytes, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError:
        raise WarmError(f"{where} answered garbage: not JSON") from None
    if not isinstance(doc, dict):
        raise WarmError(f"{where} answered garbage: not a JSON object")
    return doc


def parse_state(doc: dict[str, Any]) -> WarmState:
    """A state document checked field by field; ValueError naming the first field that is wrong."""
    if doc.get("v") != 1:
        raise ValueError(f"v is {doc.get('v')!r}, not 1")
    version, phase = doc.get("version"), doc.get("phase")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise ValueError("version is not a number")
    if phase not in PHASES:
        raise ValueError(f"phase is {str(phase)[:40]!r}")
    return WarmState(version, phase, _running(doc.get("running")), _result(doc.get("result")))


def _running(value: Any) -> WarmRunning | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("running is not an object")
    started_at = value.get("startedAt")
    if started_at is not None and not isinstance(started_at, str):
        raise ValueError("running.startedAt is not a string")
    return WarmRunning(_text(value, "running.id"), started_at)


def _result(value: Any) -> WarmResult | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("result is not an object")
    code = value.get("exitCode")
    if code is not None and not _is_int(code):
        raise ValueError("result.exitCode is not a number")
    acked = value.get("acked")
    if not isinstance(acked, bool):
        raise ValueError("result.acked is not true or false")
    return WarmResult(
        _text(value, "result.id"),
        code,
        _text(value, "result.envelope"),
        _text(value, "result.finishedAt"),
        acked,
    )


def _text(value: dict[str, Any], name: str) -> str:
    field = value.get(name.rsplit(".", 1)[-1])
    if not isinstance(field, str):
        raise ValueError(f"{name} is not a string")
    return field


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
