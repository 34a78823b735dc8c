"""A warm pod's termination message: the control envelope with `warm` (its iteration and exit code),
kept within the 4096 bytes by the envelope's own rules (control/envelope.py `attach_warm`)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun_operator.control.envelope import (
    MAX_ENVELOPE_BYTES,
    ControlEnvelope,
    attach_warm,
    decode_envelope,
    encode_envelope,
    fit_envelope,
    max_control_bytes,
)

PATH = "/workspace/.agentrun/loop-control.json"
WARM = {"id": "my-run-s1-i12", "exitCode": 0}
CLAIM = {"v": 1, "claim": "unavailable", "volume": "work", "dir": "/w/.agentrun-claims", "detail": "ro"}


def found(control: dict[str, Any], **extra: Any) -> ControlEnvelope:
    return ControlEnvelope(status="found", path=PATH, size=1, control=control, **extra)


def test_warm_is_encoded_only_when_set_and_read_back() -> None:
    plain = encode_envelope(found({"continue": True}))
    assert "warm" not in json.loads(plain)
    text = encode_envelope(attach_warm(found({"continue": True}), WARM))
    doc = json.loads(text)
    assert list(doc) == ["v", "status", "path", "size", "reason", "control", "warm"]
    assert doc["warm"] == WARM
    back = decode_envelope(text)
    assert back.warm == WARM and back.control == {"continue": True} and back.status == "found"
    null_code = decode_envelope(encode_envelope(attach_warm(found({}), {"id": "i1", "exitCode": None})))
    assert null_code.warm == {"id": "i1", "exitCode": None}


@pytest.mark.parametrize(
    "warm",
    [
        {"id": "i1"},
        {"id": "", "exitCode": 0},
        {"id": "i" * 254, "exitCode": 0},
        {"id": "i1", "exitCode": "0"},
        {"id": "i1", "exitCode": True},
        {"id": "i1", "exitCode": 0, "more": 1},
    ],
)
def test_a_malformed_warm_is_no_envelope(warm: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        found({}, warm=warm)
    message = json.dumps({"v": 1, "status": "missing", "path": PATH, "size": None, "reason": None,
                          "control": None, "warm": warm})  # fmt: skip
    decoded = decode_envelope(message)
    assert decoded.status == "invalid" and decoded.warm is None
    assert (decoded.reason or "").startswith("termination message is not a control envelope")


def test_a_control_that_fits_alone_but_not_beside_warm_becomes_too_large_keeping_warm() -> None:
    budget = max_control_bytes(PATH, 1)
    control = {"pad": "x" * (budget - len('{"pad":""}'))}
    alone = fit_envelope(found(control))
    assert alone.status == "found" and len(encode_envelope(alone).encode()) == MAX_ENVELOPE_BYTES
    with_warm = attach_warm(alone, WARM)
    assert with_warm.status == "tooLarge" and with_warm.warm == WARM
    assert f"at most {max_control_bytes(PATH, 1, warm=WARM)} bytes fit" in (with_warm.reason or "")
    assert len(encode_envelope(with_warm).encode()) <= MAX_ENVELOPE_BYTES
    assert decode_envelope(encode_envelope(with_warm)).warm == WARM


def test_the_claim_and_the_extras_give_way_to_warm_before_the_control_does() -> None:
    artifacts = [{"name": f"a{i}", "path": "/p", "size": 1, "digest": "sha256:" + "0" * 64} for i in range(3)]
    room = max_control_bytes(PATH, 1) - len('{"pad":""}')
    extras_size = len(json.dumps({"claim": CLAIM, "artifacts": artifacts, "commit": "c" * 40}))
    control = {"pad": "x" * (room - extras_size)}
    env = found(control, claim=CLAIM, artifacts=artifacts, commit="c" * 40)
    assert len(json.dumps(control)) + extras_size < MAX_ENVELOPE_BYTES
    with_warm = attach_warm(env, WARM)
    assert with_warm.status == "found" and with_warm.control == control and with_warm.warm == WARM
    assert with_warm.claim is None  # the claim first
    assert len(encode_envelope(with_warm).encode()) <= MAX_ENVELOPE_BYTES
    small = attach_warm(found({"continue": True}, claim=CLAIM, artifacts=artifacts, commit="c" * 40), WARM)
    assert small.claim == CLAIM and small.artifacts == artifacts and small.commit == "c" * 40


@settings(max_examples=100)
@given(
    pad=st.integers(min_value=0, max_value=5000),
    iteration=st.text(alphabet="abcdefghij-0123456789", min_size=1, max_size=253),
    code=st.none() | st.integers(min_value=0, max_value=255),
    reason=st.none() | st.text(max_size=3000),
)
def test_any_warm_envelope_fits_and_keeps_warm(
    pad: int, iteration: str, code: int | None, reason: str | None
) -> None:
    warm = {"id": iteration, "exitCode": code}
    for env in (
        fit_envelope(found({"pad": "x" * pad})),
        ControlEnvelope(status="missing", path=PATH * 40, reason=reason),
    ):
        attached = attach_warm(env, warm)
        text = encode_envelope(attached)
        assert len(text.encode()) <= MAX_ENVELOPE_BYTES
        assert json.loads(text)["warm"] == warm and decode_envelope(text).warm == warm
