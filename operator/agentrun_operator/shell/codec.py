"""The operator's JSON codec: pydantic-core's encoder and decoder, and the byte-level shortcuts the
profile asked for, all in one place (docs/operator.md#performance).

The shortcuts read the API server's JSON text before it is decoded: `decode_object_json` cuts
`metadata.managedFields` (nearly half of a Job's or Pod's bytes, never read), `decode_status_json`
decodes of a Job's or Pod's spec only the fields the planner reads, and `builtin_head` reads a Job's
or Pod's identity from the start of a watch event, so the echo of an object the cache already holds
is not decoded at all. Each depends on the field order kube-apiserver writes: text of any other shape
is decoded whole, so a cut can make a decode cheaper, never different in what is read
(tests/unit/shell/test_decode.py, test_informer_head.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from typing import Any, Final

from pydantic_core import from_json, to_json


def decode_json(data: bytes | str) -> Any:
    """JSON text to plain dicts and lists (ValueError when it is not JSON)."""
    return from_json(data)


_MANAGED_FIELDS: Final = b',"managedFields":['
_METADATA_END: Final = b']},"spec":'


def _managed_fields(data: bytes) -> tuple[int, int] | None:
    """Where `metadata.managedFields` is in the text (`data[start:stop]`, its key's comma included),
    or None when the text is not of the shape `decode_object_json` relies on."""
    start = data.find(_MANAGED_FIELDS)
    if start < 0:
        return None
    end = data.find(_METADATA_END, start)
    if end < 0 or data.find(b'"metadata":', start, end) >= 0:  # not one object's metadata
        return None
    return start, end + 1


def decode_object_json(data: bytes) -> Any:
    """`decode_json` of an object or a watch event, without `metadata.managedFields`.

    managedFields (server-side apply's bookkeeping, which the operator never reads) are nearly half
    the bytes of every Job and Pod, and decoding was the largest cost per watch event in the profile
    (docs/operator.md#performance); they are cut out of the text before it is decoded. The API
    server writes `managedFields` as metadata's last field and `spec` right after metadata, and in
    JSON text a `"` inside a string is always escaped, so `,"managedFields":[` is that key and
    the first `]},"spec":` after it ends it: nothing inside the list (its keys are `manager`,
    `fieldsV1`, `f:…`, …) can spell either. Text of any other shape is decoded whole."""
    cut = _managed_fields(data)
    if cut is None:
        return decode_json(data)
    try:
        return decode_json(data[: cut[0]] + data[cut[1] :])
    except ValueError:
        return decode_json(data)


_SPEC: Final = b',"spec":{'
_STATUS: Final = b'},"status":{'
_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_SCALAR: Final = re.compile(
    rb'(?:-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null|"[^"\\]*(?:\\.[^"\\]*)*")(?=[,}])', re.DOTALL
)
_FIELD_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@cache
def _key_text(key: str) -> bytes:
    """`"key":` as the API server writes it; only plain field names, whose text is the name itself
    (the API server escapes some characters differently from us, and a key it spelled otherwise
    would be taken for absent)."""
    if not _FIELD_NAME.fullmatch(key):
        raise ValueError(f"not a plain field name: {key!r}")
    return b'"' + key.encode() + b'":'


def _depth(text: bytes, at: int) -> int:
    """How many brackets of a JSON value's text enclose position `at` (1: the value's own fields),
    counted on the shorter side of `at` with the strings (which may hold brackets) taken out."""
    if at <= len(text) - at:
        rest = _STRING.sub(b"", text[:at])
        return rest.count(b"{") + rest.count(b"[") - rest.count(b"}") - rest.count(b"]")
    rest = _STRING.sub(b"", text[at:])
    return rest.count(b"}") + rest.count(b"]") - rest.count(b"{") - rest.count(b"[")


def _scalar_fields(spec: bytes, keys: tuple[str, ...]) -> bytes | None:
    """The JSON text of an object holding those of `keys` that are fields of the object `spec`
    (its text) with a scalar value, or None when one is there with another value (or twice).

    `"key":` right after `{` or `,` is a key (that quote is unescaped, so it opens a string); it is
    one of spec's own fields when one bracket encloses it: a Job's template may hold the same name."""
    fields = []
    for key in keys:
        name = _key_text(key)
        found: bytes | None = None
        at = spec.find(name)
        while at >= 0:
            if spec[at - 1] in b"{," and _depth(spec, at) == 1:
                value = _SCALAR.match(spec, at + len(name))
                if found is not None or value is None:
                    return None
                found = value.group()
            at = spec.find(name, at + len(name))
        if found is not None:
            fields.append(name + found)
    return b"{" + b",".join(fields) + b"}"


def decode_status_json(data: bytes, spec_keys: tuple[str, ...] = ()) -> Any:
    """`decode_object_json` of an object or a watch event whose reader wants its metadata and status
    but of its spec only the scalar fields `spec_keys`: `spec` holds just those that are set.

    A Pod's spec is about half its bytes once managedFields are gone, and the informers decode every
    Pod and Job watch event (docs/operator.md#performance), so the spec's text is cut out before
    decoding. The API server writes an object's fields in the order kind, apiVersion, metadata,
    spec, status, with nothing after status; `,"spec":{` (its quote unescaped, so outside any
    string) cannot occur in metadata, whose maps hold strings only, so its first occurrence is the
    object's spec; the last `},"status":{` ends it unless status holds a `status` object, and then
    the cut text's brackets do not pair up and it fails to decode. Any text of another shape (no
    status, no spec, a spec field that is not a scalar, not JSON at all) is decoded by
    `decode_object_json`: the result is never wrong, at worst fuller. The spec's own text is not
    checked: a spec that is not valid JSON goes unnoticed. ValueError for a key that is not a plain
    field name (`[A-Za-z_][A-Za-z0-9_]*`), whatever the text."""
    for key in spec_keys:
        _key_text(key)
    start, stop = _managed_fields(data) or (0, 0)
    spec_at = data.find(_SPEC, stop)
    status_at = data.rfind(_STATUS)
    if spec_at < 0 or status_at < spec_at:
        return decode_object_json(data)
    spec = b"{}"
    if spec_keys:
        found = _scalar_fields(data[spec_at + len(_SPEC) - 1 : status_at + 1], spec_keys)
        if found is None:
            return decode_object_json(data)
        spec = found
    try:
        decoded = decode_json(
            b"".join((data[:start], data[stop:spec_at], b',"spec":', spec, data[status_at + 1 :]))
        )
    except ValueError:
        return decode_object_json(data)
    obj = decoded.get("object") if isinstance(decoded, dict) and data.startswith(b'{"type":') else decoded
    if not isinstance(obj, dict) or "spec" not in obj or "status" not in obj:  # the cut was elsewhere
        return decode_object_json(data)
    return decoded


def decode_job_event(data: bytes) -> Any:
    """A Job or its watch event as the operator reads it: metadata, status and the TTL."""
    return decode_status_json(data, ("ttlSecondsAfterFinished",))


def decode_pod_event(data: bytes) -> Any:
    """A Pod or its watch event as the operator reads it: metadata and status (`spec` is `{}`)."""
    return decode_status_json(data)


def encode_json(value: Any) -> bytes:
    """Plain dicts and lists to compact JSON."""
    return to_json(value)


Identity = tuple[str, str, str, int]  # namespace, name, uid, resourceVersion
Head = Callable[[bytes], Identity | None]

_BUILTIN_HEAD = re.compile(
    rb'\{"type":"(?:ADDED|MODIFIED)","object":\{"kind":"[^"\\]*","apiVersion":"[^"\\]*",'
    rb'"metadata":\{"name":"([^"\\]*)",(?:"generateName":"[^"\\]*",)?"namespace":"([^"\\]*)",'
    rb'"uid":"([^"\\]*)","resourceVersion":"(\d+)"'
)


def builtin_head(line: bytes) -> Identity | None:
    """The identity of a built-in object's ADDED/MODIFIED event, read from the start of its text.

    kube-apiserver writes built-in kinds (Jobs, Pods) from Go structs, so their fields come in a
    fixed order: kind, apiVersion, then metadata's name, generateName, namespace, uid,
    resourceVersion. Text of any other shape gives None (the event is decoded as usual)."""
    match = _BUILTIN_HEAD.match(line)
    if match is None:
        return None
    name, namespace, uid, version = match.groups()
    return namespace.decode(), name.decode(), uid.decode(), int(version)
