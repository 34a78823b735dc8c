"""The operator's JSON codec: pydantic-core's encoder and decoder, in one place
(docs/operator.md#performance).

Every object the API server sends is decoded whole: what a reader of an observed object reads
(shell/observe.py, the watch cache's indexes) is never cut from its text first, so no field a
reader comes to need can be lost on one path and kept on another, whatever order the server writes
the fields in (tests/unit/shell/test_decode.py). The one shortcut, `builtin_head`, decides only
whether to decode an event at all: the echo of an object the cache already holds at that version
(tests/unit/shell/test_informer_head.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pydantic_core import from_json, to_json


def decode_json(data: bytes | str) -> Any:
    """JSON text to plain dicts and lists (ValueError when it is not JSON)."""
    return from_json(data)


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
    resourceVersion. Text of any other shape gives None (the event is decoded as usual); a match
    gives what decoding the text would, for a string without `"` or `\\` is its own value. It only
    spares the decode of an object held at that version or newer (`Store.holds`), so it never
    changes what is read of an object, only whether an echo is read again."""
    match = _BUILTIN_HEAD.match(line)
    if match is None:
        return None
    name, namespace, uid, version = match.groups()
    return namespace.decode(), name.decode(), uid.decode(), int(version)
