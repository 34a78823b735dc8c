"""The warm channel's connections (control/warm_server.py) send each answer at once: TCP_NODELAY on
every accepted connection. Found by the real-node benchmark (docs/operator.md#performance-warm):
an answer is written as its headers, then its body, and with Nagle's algorithm the body waited for
the operator's delayed ACK of the headers, about 40 ms on Linux, on every answer of a kept-alive
connection: the long poll's answer that carries an iteration's result among them."""

from __future__ import annotations

import http.client
import socket
from pathlib import Path

import pytest

from agentrun_operator.control import warm_server
from agentrun_operator.control.envelope import ControlEnvelope
from agentrun_operator.control.warm import Settings, Supervisor
from agentrun_operator.control.warm_auth import authorization, new_nonce


class _Reports:
    def fingerprint_again(self) -> None:
        return None

    def report(self, first: bool) -> ControlEnvelope:
        return ControlEnvelope(status="missing", path="/w/c.json", reason="none")


def test_every_connection_of_the_channel_sends_without_waiting_for_acks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    setup = warm_server.ChannelHandler.setup

    def setup_and_look(handler: warm_server.ChannelHandler) -> None:
        setup(handler)
        seen.append(handler.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    monkeypatch.setattr(warm_server.ChannelHandler, "setup", setup_and_look)
    supervisor = Supervisor(Settings(str(tmp_path), "1-1", 300, "/w/c.json"), _Reports())
    key = b"the run's key"
    server = warm_server.listen("127.0.0.1", 0, supervisor, key)
    warm_server.serve_in_background(server)
    try:
        for _ in range(2):
            connection = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=30)
            nonce = new_nonce()
            header = authorization(key, "GET", "/v1/state", nonce, b"")
            connection.request("GET", "/v1/state", headers={"Authorization": header})
            assert connection.getresponse().status == 200
            connection.close()
    finally:
        server.shutdown()
        server.server_close()
    assert len(seen) == 2 and all(seen), seen
