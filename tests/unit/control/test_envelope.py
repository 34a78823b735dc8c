"""The control envelope and the payload rules (docs/control-file.md, docs/design.md#iteration-pod)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun_operator.api import DEFAULT_CONTROL_PATH
from agentrun_operator.control.envelope import (
    MAX_CONTROL_DEPTH,
    MAX_CONTROL_FILE_BYTES,
    MAX_ENVELOPE_BYTES,
    ControlEnvelope,
    decode_envelope,
    effective_status,
    encode_envelope,
    fit_envelope,
    max_control_bytes,
    parse_control_payload,
)

PATH = DEFAULT_CONTROL_PATH


def wire_size(env: ControlEnvelope) -> int:
    return len(encode_envelope(env).encode("utf-8"))


def assert_well_formed(env: ControlEnvelope) -> None:
    """Every envelope we produce encodes to compact JSON within the cap and reads back unchanged."""
    text = encode_envelope(env)
    assert len(text.encode("utf-8")) <= MAX_ENVELOPE_BYTES
    doc = json.loads(text)
    assert list(doc) == ["v", "status", "path", "size", "reason", "control"]
    assert doc["v"] == 1
    assert (doc["control"] is not None) == (doc["status"] == "found")
    assert decode_envelope(text) == fit_envelope(env)


# ------------------------------------------------------------------------------------ found


def test_found_payload_round_trips() -> None:
    data = (
        b'{\n  "continue": true,\n  "outputs": {"summary": "first pass", "remaining_tasks": 3},\n'
        b'  "x": null\n}\n'
    )
    env = parse_control_payload(data, PATH)
    assert env.status == "found"
    assert env.size == len(data)
    assert env.reason is None
    assert env.control == {
        "continue": True,
        "outputs": {"summary": "first pass", "remaining_tasks": 3},
        "x": None,
    }
    text = encode_envelope(env)
    assert " " not in text.replace("first pass", "")  # compact
    assert decode_envelope(text) == env
    assert effective_status(env) == "found"


def test_unknown_fields_and_unicode_are_kept() -> None:
    env = parse_control_payload('{"ünïcode": "✓ 完成", "continue": false}'.encode(), PATH)
    assert env.status == "found"
    assert env.control == {"ünïcode": "✓ 完成", "continue": False}
    assert "✓ 完成" in encode_envelope(env)  # not \u-escaped: fits more text in the 4096 bytes


def test_utf8_bom_is_ignored() -> None:
    env = parse_control_payload(b'\xef\xbb\xbf{"continue": true}', PATH)
    assert env.status == "found" and env.control == {"continue": True}


def test_depth_limit_is_inclusive() -> None:
    ok = "{" + '"a":{' * (MAX_CONTROL_DEPTH - 1) + "}" * MAX_CONTROL_DEPTH
    assert parse_control_payload(ok.encode(), PATH).status == "found"
    too_deep = "{" + '"a":{' * MAX_CONTROL_DEPTH + "}" * (MAX_CONTROL_DEPTH + 1)
    env = parse_control_payload(too_deep.encode(), PATH)
    assert env.status == "invalid"
    assert env.reason == f"nested deeper than {MAX_CONTROL_DEPTH} levels"


# ------------------------------------------------------------------------------ bad payloads


@pytest.mark.parametrize(
    ("data", "reason_part"),
    [
        (b"", "empty file"),
        (b" \n\t ", "only whitespace"),
        (b"continue=true", "invalid JSON at line 1 column 1"),
        (b"[1, 2, 3]", "root must be a JSON object, got array"),
        (b'"done"', "root must be a JSON object, got string"),
        (b"42", "root must be a JSON object, got number"),
        (b"true", "root must be a JSON object, got boolean"),
        (b"null", "root must be a JSON object, got null"),
        (b'{"continue": true, "outputs": {"n": 1', "unexpected end of input"),
        (b'{"continue": tru', "truncated file?"),
        (b'{"a": 1}\n{"b": 2}', "invalid JSON at line 2 column 1: Extra data"),
        (b"{'a': 1}", "invalid JSON at line 1 column 2"),
        (b'{"a": NaN}', "NaN is not valid JSON"),
        (b'{"a": -Infinity}', "-Infinity is not valid JSON"),
        (b'{"a": 1e400}', "out of range"),
        (b'{"a": ' + b"9" * 5000 + b"}", "invalid JSON"),
        (b'{"a": "\\ud800"}', "unpaired UTF-16 surrogate"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary data (NUL byte at offset 8)"),
        (b'{"a": "caf\xe9"}', "not UTF-8 text: invalid byte 0xe9 at offset 10"),
        (b"\xff\xfe{\x00}\x00", "binary data"),
        (b"[" * 100_000, "control file is 100000 bytes; at most"),  # over the read cap: not parsed
        (b"[" * 5000 + b"]" * 5000, "root must be a JSON object, got array"),
        (b'{"a":' * 5000 + b"1" + b"}" * 5000, f"nested deeper than {MAX_CONTROL_DEPTH} levels"),
    ],
)
def test_bad_payloads_are_invalid_with_a_reason(data: bytes, reason_part: str) -> None:
    env = parse_control_payload(data, PATH)
    assert env.status in ("invalid", "tooLarge")
    assert env.control is None
    assert env.reason is not None and reason_part in env.reason, env.reason
    assert env.size == len(data)
    assert effective_status(env) == "invalid"
    assert_well_formed(env)


def test_oversized_payload_is_too_large_with_the_real_limit() -> None:
    data = json.dumps({"summary": "x" * 5000}, separators=(",", ":")).encode()
    env = parse_control_payload(data, PATH)
    assert env.status == "tooLarge"
    assert env.size == len(data)
    budget = max_control_bytes(PATH, len(data))
    assert env.reason == (
        f"control file is {len(data)} bytes; at most {budget} bytes fit in the 4096-byte termination message"
    )
    assert 3900 < budget < MAX_ENVELOPE_BYTES
    assert effective_status(env) == "invalid"


def test_pretty_printed_payload_counts_its_compact_size() -> None:
    """Whitespace is not transported: a pretty file over the budget still fits when compact."""
    control = {f"k{i}": i for i in range(300)}
    pretty = json.dumps(control, indent=8).encode()
    assert len(pretty) > MAX_ENVELOPE_BYTES
    env = parse_control_payload(pretty, PATH)
    assert env.status == "found" and env.control == control
    assert wire_size(env) <= MAX_ENVELOPE_BYTES

    bigger = {f"k{i}": i for i in range(600)}
    env = parse_control_payload(json.dumps(bigger, indent=2).encode(), PATH)
    assert env.status == "tooLarge"
    assert env.reason is not None and "as compact JSON" in env.reason


def test_envelope_limit_is_exact() -> None:
    """The largest control that fits produces exactly 4096 bytes; one byte more is tooLarge."""
    size = 4000
    budget = max_control_bytes(PATH, size)
    filler = budget - len(b'{"s":""}')
    fits = ControlEnvelope(status="found", path=PATH, size=size, control={"s": "x" * filler})
    assert len(encode_envelope(fits).encode()) == MAX_ENVELOPE_BYTES
    assert fit_envelope(fits) == fits
    over = ControlEnvelope(status="found", path=PATH, size=size, control={"s": "x" * (filler + 1)})
    assert fit_envelope(over).status == "tooLarge"
    assert f"at most {budget} bytes" in (fit_envelope(over).reason or "")


def test_file_larger_than_the_read_cap_is_too_large_without_parsing() -> None:
    env = parse_control_payload(b"{" * (MAX_CONTROL_FILE_BYTES + 1), PATH, file_size=10**9)
    assert env.status == "tooLarge"
    assert env.size == 10**9
    assert env.reason is not None and "control file is 1000000000 bytes" in env.reason
    assert "not even read" in env.reason


def test_long_paths_and_reasons_are_shortened_to_fit() -> None:
    long_path = "/workspace/" + "d/" * 3000 + "loop-control.json"
    env = parse_control_payload(b"[]", long_path)
    assert env.status == "invalid"
    assert_well_formed(env)
    assert wire_size(env) <= MAX_ENVELOPE_BYTES
    huge = ControlEnvelope(status="missing", path=long_path, reason="r" * 10_000)
    assert wire_size(huge) <= MAX_ENVELOPE_BYTES
    assert encode_envelope(huge).count("…") >= 1


def test_surrogates_in_path_are_made_encodable() -> None:
    env = ControlEnvelope(status="missing", path="/w/\udcff.json", reason="no file")
    assert env.path == "/w/?.json"
    assert_well_formed(env)


def test_unencodable_control_becomes_invalid() -> None:
    env = ControlEnvelope(status="found", path=PATH, size=10, control={"x": float("nan")})
    fitted = fit_envelope(env)
    assert fitted.status == "invalid" and fitted.control is None
    assert_well_formed(env)


def test_model_invariants() -> None:
    with pytest.raises(ValueError):
        ControlEnvelope(status="found", path=PATH)
    with pytest.raises(ValueError):
        ControlEnvelope(status="missing", path=PATH, control={})


@pytest.mark.parametrize(
    ("status", "effective"),
    [
        ("found", "found"),
        ("missing", "missing"),
        ("stale", "missing"),
        ("invalid", "invalid"),
        ("tooLarge", "invalid"),
    ],
)
def test_effective_status(status: Any, effective: str) -> None:
    env = ControlEnvelope(status=status, path=PATH, control={} if status == "found" else None)
    assert effective_status(env) == effective


# ---------------------------------------------------------------------------------- decoding


@pytest.mark.parametrize(
    ("message", "reason_part"),
    [
        (None, "reporter left no termination message"),
        ("", "reporter left no termination message"),
        ("  \n", "reporter left no termination message"),
        ("Error: exec format error", "termination message is not a control envelope: not JSON"),
        ('{"v":1,"status":"found","path":"/p","si', "not a control envelope"),
        ("[1,2]", "a JSON array, not an object"),
        ('{"hello": "world"}', "status: Field required"),
        ('{"v":2,"status":"found"}', "unsupported envelope version 2"),
        ('{"v":1,"status":"exploded","path":"/p"}', "status"),
        (
            '{"v":1,"status":"found","path":"/p","size":1,"reason":null,"control":null}',
            "must carry a control",
        ),
        ('{"v":1,"status":"found","path":"/p","size":1,"reason":null,"control":[1]}', "control"),
        ('{"v":1,"status":"found","path":"/p","size":"1","reason":null,"control":{}}', "size"),
        ('{"v":1,"status":"missing","path":"/p","size":-1}', "size"),
        ("[" * 5000, "not a control envelope"),
        ('{"v":1,"status":"found","path":"/p","control":{"a":NaN}}', "not JSON"),
    ],
)
def test_decode_rejects_anything_but_an_envelope(message: str | None, reason_part: str) -> None:
    env = decode_envelope(message, path=PATH)
    assert env.status == "invalid"
    assert env.reason is not None and reason_part in env.reason, env.reason
    assert env.control is None
    assert_well_formed(env)


def test_decode_keeps_the_envelope_path_and_ignores_unknown_fields() -> None:
    message = (
        '{"v":1,"status":"missing","path":"/w/c.json","size":null,"reason":"no file","control":null,"x":1}'
    )
    env = decode_envelope(message, path="/other")
    assert env == ControlEnvelope(status="missing", path="/w/c.json", reason="no file")
    bad = decode_envelope('{"v":1,"status":"nope","path":"/w/c.json"}', path="/other")
    assert bad.path == "/w/c.json"
    assert decode_envelope(None, path="/other").path == "/other"


def test_decode_applies_the_payload_rules_to_control() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(MAX_CONTROL_DEPTH + 2):
        node["a"] = {}
        node = node["a"]
    message = json.dumps({"v": 1, "status": "found", "path": "/p", "size": 1, "control": deep})
    env = decode_envelope(message)
    assert env.status == "invalid" and env.reason == f"nested deeper than {MAX_CONTROL_DEPTH} levels"


# -------------------------------------------------------------------------------- properties

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=10), children, max_size=6)
    ),
    max_leaves=60,
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=6000), path=st.text(min_size=1, max_size=300))
def test_arbitrary_bytes_always_give_a_well_formed_envelope(data: bytes, path: str) -> None:
    env = parse_control_payload(data, path)
    assert isinstance(env, ControlEnvelope)
    assert env.status in ("found", "invalid", "tooLarge")
    assert env.size == len(data)
    assert_well_formed(env)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(value=json_values, indent=st.sampled_from([None, 2]), pad=st.integers(min_value=0, max_value=5000))
def test_json_documents_are_found_exactly_when_they_are_small_objects(
    value: Any, indent: int | None, pad: int
) -> None:
    if isinstance(value, dict):
        value = {**value, "pad": "p" * pad}
    data = json.dumps(value, indent=indent).encode()
    env = parse_control_payload(data, PATH)
    assert_well_formed(env)
    if not isinstance(value, dict):
        assert env.status == "invalid" and "root must be a JSON object" in (env.reason or "")
        return
    compact = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    if compact <= max_control_bytes(PATH, len(data)):
        assert env.status == "found"
        assert env.control == value
    else:
        assert env.status == "tooLarge"


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=json_values.map(lambda v: json.dumps(v)), cut=st.integers(min_value=1))
def test_truncated_json_never_raises(data: str, cut: int) -> None:
    raw = data.encode()
    env = parse_control_payload(raw[: cut % (len(raw) + 1)], PATH)
    assert_well_formed(env)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(message=st.one_of(st.none(), st.text(max_size=5000), json_values.map(json.dumps)))
def test_decode_never_raises(message: str | None) -> None:
    env = decode_envelope(message)
    assert isinstance(env, ControlEnvelope)
    assert wire_size(env) <= MAX_ENVELOPE_BYTES


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    status=st.sampled_from(["missing", "stale", "invalid", "tooLarge"]),
    path=st.text(max_size=6000),
    reason=st.none() | st.text(max_size=6000),
    size=st.none() | st.integers(min_value=0, max_value=2**63),
)
def test_any_envelope_encodes_within_the_cap(
    status: Any, path: str, reason: str | None, size: int | None
) -> None:
    env = ControlEnvelope(status=status, path=path, reason=reason, size=size)
    text = encode_envelope(env)
    assert len(text.encode("utf-8")) <= MAX_ENVELOPE_BYTES
    back = decode_envelope(text)
    assert back.status == status and back.size == size
