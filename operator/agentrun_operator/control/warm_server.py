"""The warm channel's server: the supervisor's HTTP endpoints (docs/design.md#warm-channel), every
request and every answer signed with the run's key (control/warm_auth.py). Standard library only.

A thread per connection (`ThreadingHTTPServer`): a long poll waits in its own thread while others
are answered. HTTP/1.1 with keep-alive, so the operator's client reuses its connection.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final
from urllib.parse import parse_qs

from agentrun_operator.control.warm import Refusal, Supervisor, log, valid_env, valid_id
from agentrun_operator.control.warm_auth import (
    ANSWER_HEADER,
    NonceMemory,
    answer_signature,
    parse_authorization,
    request_is_signed,
)

MAX_BODY_BYTES: Final = 1 << 20
MAX_WAIT_SECONDS: Final = 60.0
IDLE_CONNECTION_SECONDS: Final = 75.0
"""A connection that sends nothing for this long is closed (longer than aiohttp keeps one idle)."""
STATE_PATH: Final = "/v1/state"
POSTS: Final = frozenset({"/v1/start", "/v1/ack", "/v1/stop"})


class ChannelServer(ThreadingHTTPServer):
    """The channel's listening socket and what every handler shares: the supervisor, the key, the
    nonces seen; and a count of the answers under way, so the supervisor ends after its last one."""

    daemon_threads = True

    def server_bind(self) -> None:
        """`TCPServer`'s bind, without `HTTPServer`'s reverse DNS lookup of the address (the pod IP's)."""
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def __init__(self, address: tuple[str, int], supervisor: Supervisor, key: bytes) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.supervisor = supervisor
        self.key = key
        self.nonces = NonceMemory()
        self._answering = 0
        self._answered = threading.Condition()
        super().__init__(address, ChannelHandler)

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        with self._answered:
            self._answering += 1
        try:
            yield
        finally:
            with self._answered:
                self._answering -= 1
                self._answered.notify_all()

    def wait_answered(self, timeout: float) -> bool:
        """Until no answer is under way (at most `timeout` seconds)."""
        with self._answered:
            return self._answered.wait_for(lambda: self._answering == 0, timeout=timeout)


class ChannelHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = IDLE_CONNECTION_SECONDS
    disable_nagle_algorithm = True
    """TCP_NODELAY on every connection: an answer is written as its headers, then its body; with
    Nagle's algorithm the body waited for the client's delayed ACK of the headers, about 40 ms on
    Linux, on every answer of a kept-alive connection (the long poll's among them)."""
    server: ChannelServer

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def log_message(self, format: str, *args: Any) -> None:
        """No access log: the supervisor logs what it does and what it refuses."""

    def _serve(self, method: str) -> None:
        with self.server.answering():
            nonce = ""
            try:
                signed = parse_authorization(self.headers.get("Authorization"))
                nonce = signed[0] if signed else ""
                body = self._body()
                if signed is None or not request_is_signed(self.server.key, method, self.path, *signed, body):
                    raise Refusal(401, "the request is not signed with this run's key")
                if not self.server.nonces.first_use(nonce):
                    raise Refusal(401, "the request's nonce was used before (a replay)")
                status, doc = 200, self._route(method, body)
            except Refusal as refusal:
                status, doc = refusal.status, {"error": refusal.message}
                log(f"refused {method} {self.path[:200]}: {status} {refusal.message}")
            except Exception as exc:  # a bug here must not end the supervisor: say it, go on
                status, doc = 500, {"error": f"the supervisor failed: {type(exc).__name__}: {exc}"}
                log(f"failed {method} {self.path[:200]}: {type(exc).__name__}: {exc}")
            self._answer(nonce, status, doc)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise Refusal(400, "a request body must come with Content-Length")
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        if not length.strip().isdigit():
            self.close_connection = True
            raise Refusal(400, f"Content-Length {length[:32]!r} is not a number")
        size = int(length)
        if size > MAX_BODY_BYTES:
            self.close_connection = True
            raise Refusal(400, f"the request body is over {MAX_BODY_BYTES} bytes")
        return self.rfile.read(size)

    def _route(self, method: str, body: bytes) -> dict[str, Any]:
        path, _, query = self.path.partition("?")
        supervisor = self.server.supervisor
        if method == "GET" and path == STATE_PATH:
            seen, wait = state_query(query)
            return supervisor.wait_for_change(seen, wait)
        if method == "POST" and path in POSTS:
            doc = json_object(body)
            iteration = valid_id(doc.get("id"))
            if path == "/v1/start":
                return supervisor.start(iteration, valid_env(doc.get("env")))
            if path == "/v1/ack":
                return supervisor.ack(iteration)
            return supervisor.stop(iteration)
        raise Refusal(404, f"no endpoint {method} {path[:200]}")

    def _answer(self, nonce: str, status: int, doc: dict[str, Any]) -> None:
        data = json.dumps(doc, separators=(",", ":")).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header(ANSWER_HEADER, answer_signature(self.server.key, nonce, status, data))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


def state_query(query: str) -> tuple[int | None, float]:
    """(`seen`, `wait` in seconds, at most `MAX_WAIT_SECONDS`) of a long poll (the KWOK plane's
    simulated supervisor reads it with this too, tests/bench/warm_sim.py)."""
    try:
        fields = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise Refusal(400, f"bad query: {exc}") from None
    seen_text, wait_text = fields.get("seen", [None])[-1], fields.get("wait", ["0"])[-1]
    if seen_text is not None and not seen_text.isdigit():
        raise Refusal(400, f"seen must be a version number, got {seen_text[:32]!r}")
    try:
        wait = float(wait_text or "0")
    except ValueError:
        raise Refusal(400, f"wait must be a number of seconds, got {wait_text[:32]!r}") from None
    if not math.isfinite(wait) or wait < 0:
        raise Refusal(400, f"wait must be 0 or more seconds, got {wait_text[:32]!r}")
    return (None if seen_text is None else int(seen_text)), min(wait, MAX_WAIT_SECONDS)


def json_object(body: bytes) -> dict[str, Any]:
    """A request's body as a JSON object, else a 400 naming why (the KWOK plane's simulated
    supervisor reads its bodies with this too, tests/bench/warm_sim.py)."""
    try:
        doc = json.loads(body)
    except ValueError:
        raise Refusal(400, "the request body is not JSON") from None
    if not isinstance(doc, dict):
        raise Refusal(400, "the request body is not a JSON object")
    return doc


def listen(host: str, port: int, supervisor: Supervisor, key: bytes) -> ChannelServer:
    """Bind the channel (raises OSError when it cannot)."""
    return ChannelServer((host, port), supervisor, key)


def serve_in_background(server: ChannelServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    return thread
