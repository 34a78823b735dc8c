"""The warm channel's signatures (control/warm_auth.py): the exact strings of
docs/design.md#warm-channel, what a change to any part does, and the memory of nonces."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from agentrun_operator.control.warm_auth import (
    REMEMBERED_NONCES,
    NonceMemory,
    answer_is_signed,
    answer_signature,
    authorization,
    body_digest,
    new_nonce,
    parse_authorization,
    request_is_signed,
    request_signature,
)

KEY = b"the run's key"
NONCE = "0123456789abcdef0123456789abcdef"


def _hmac(text: str) -> str:
    return hmac.new(KEY, text.encode(), hashlib.sha256).hexdigest()


def test_a_request_is_signed_over_the_documented_string() -> None:
    body = b'{"id":"i2"}'
    digest = hashlib.sha256(body).hexdigest()
    expected = _hmac(f"agentrun-warm-v1 request\nPOST\n/v1/start\n{NONCE}\n{digest}")
    assert request_signature(KEY, "POST", "/v1/start", NONCE, body) == expected
    assert authorization(KEY, "POST", "/v1/start", NONCE, body) == (
        f'AgentRun-HMAC nonce="{NONCE}", signature="{expected}"'
    )


def test_an_answer_is_signed_over_the_documented_string() -> None:
    body = b'{"error":"no"}'
    expected = _hmac(f"agentrun-warm-v1 response\n{NONCE}\n409\n{hashlib.sha256(body).hexdigest()}")
    assert answer_signature(KEY, NONCE, 409, body) == expected
    assert answer_is_signed(KEY, NONCE, 409, body, expected)


def test_an_empty_body_is_hashed_too() -> None:
    assert body_digest(b"") == hashlib.sha256(b"").hexdigest()
    target = "/v1/state?wait=30&seen=4"
    signature = request_signature(KEY, "GET", target, NONCE, b"")
    assert request_is_signed(KEY, "GET", target, NONCE, signature, b"")


@pytest.mark.parametrize(
    "change",
    ["key", "method", "target", "query", "nonce", "body"],
)
def test_any_change_to_a_signed_request_breaks_its_signature(change: str) -> None:
    parts = {"key": KEY, "method": "GET", "target": "/v1/state?wait=1&seen=2", "nonce": NONCE, "body": b""}
    signature = request_signature(KEY, "GET", "/v1/state?wait=1&seen=2", NONCE, b"")
    changed = {
        "key": {"key": b"another run's key"},
        "method": {"method": "POST"},
        "target": {"target": "/v1/ack?wait=1&seen=2"},
        "query": {"target": "/v1/state?wait=1&seen=3"},
        "nonce": {"nonce": "f" * 32},
        "body": {"body": b"{}"},
    }[change]
    p = {**parts, **changed}
    assert not request_is_signed(p["key"], p["method"], p["target"], p["nonce"], signature, p["body"])


@pytest.mark.parametrize("change", ["key", "nonce", "status", "body", "missing"])
def test_any_change_to_a_signed_answer_breaks_its_signature(change: str) -> None:
    signature: str | None = answer_signature(KEY, NONCE, 200, b"{}")
    key, nonce, status, body = KEY, NONCE, 200, b"{}"
    if change == "key":
        key = b"a stranger's key"
    elif change == "nonce":
        nonce = new_nonce()
    elif change == "status":
        status = 201
    elif change == "body":
        body = b'{"v":1}'
    else:
        signature = None
    assert not answer_is_signed(key, nonce, status, body, signature)


def test_nonces_are_32_hex_digits_and_never_the_same() -> None:
    nonces = {new_nonce() for _ in range(1000)}
    assert len(nonces) == 1000
    assert all(len(n) == 32 and int(n, 16) >= 0 and n == n.lower() for n in nonces)


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        f'Bearer nonce="{NONCE}", signature="{"a" * 64}"',
        f'AgentRun-HMAC nonce="{NONCE[:-1]}", signature="{"a" * 64}"',
        f'AgentRun-HMAC nonce="{NONCE.upper()}", signature="{"a" * 64}"',
        f'AgentRun-HMAC nonce="{NONCE}", signature="{"a" * 63}"',
        f'AgentRun-HMAC signature="{"a" * 64}", nonce="{NONCE}"',
        f'AgentRun-HMAC nonce="{NONCE}"',
    ],
)
def test_only_the_documented_authorization_header_is_read(header: str | None) -> None:
    assert parse_authorization(header) is None


def test_the_documented_authorization_header_is_read() -> None:
    header = authorization(KEY, "GET", "/v1/state", NONCE, b"")
    assert parse_authorization(header) == (NONCE, request_signature(KEY, "GET", "/v1/state", NONCE, b""))


def test_a_replayed_nonce_is_refused_while_it_is_among_the_last_remembered() -> None:
    memory = NonceMemory()
    first = new_nonce()
    assert memory.first_use(first)
    assert not memory.first_use(first)
    for _ in range(REMEMBERED_NONCES - 1):
        assert memory.first_use(new_nonce())
    assert not memory.first_use(first)  # still among the last 4096
    assert memory.first_use(new_nonce())  # pushes `first` out
    assert memory.first_use(first)


def test_the_memory_keeps_exactly_its_limit() -> None:
    memory = NonceMemory(limit=3)
    for nonce in ("a", "b", "c", "d"):
        assert memory.first_use(nonce)
    assert memory.first_use("a")  # forgotten: the oldest
    assert not memory.first_use("d")
