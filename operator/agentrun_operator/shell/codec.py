"""The operator's JSON codec, in one place (docs/operator.md#performance).

Every object the API server sends is decoded whole, with orjson: no field is cut from an event's
text first and no shortcut reads its text by position, so nothing a reader of an observed object
reads (shell/observe.py, the watch cache's indexes) depends on the order in which the server writes
fields (tests/unit/shell/test_decode.py). Encoding stays with pydantic-core, whose output for the
operator's own bodies (timestamps, models dumped to dicts) is what the API server has always been
sent.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic_core import to_json


def decode_json(data: bytes | str) -> Any:
    """JSON text to plain dicts and lists (ValueError when it is not JSON)."""
    return orjson.loads(data)


def encode_json(value: Any) -> bytes:
    """Plain dicts and lists to compact JSON."""
    return to_json(value)


def canonical_json(value: Any) -> bytes:
    """Compact JSON with sorted keys: equal for equal values whatever their key order (the API
    server answers with its own), and a third of the memory of the dicts it stands for."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
