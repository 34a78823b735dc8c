"""`{{ dotted.path }}` templates of an AgentProvider's runner contract (docs/api.md#runner-contract).

The rules are the original controller's, so a provider written for it renders the same here:

- a placeholder is `{{`, then anything up to the first `}` (at least one character), then `}}`;
  whitespace around the path, and around each dot-separated part, is ignored, and empty parts are
  skipped (`{{ a..b }}` is `a.b`);
- the path is looked up key by key through mappings only: a part that meets a list, a string or a
  missing key ends the lookup, and the placeholder renders as the empty string (as does `null`);
- a string renders as itself; any other value as compact JSON (`{"a":1}`, `[1,2]`, `true`, `3`),
  a float with no fraction as an integer (JSON numbers of the original are JavaScript numbers);
- a path of only whitespace (`{{ }}`) names the whole context, which renders as JSON.

Nothing is evaluated and nothing recurses: a rendered value is never rendered again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

PLACEHOLDER: Final = re.compile(r"\{\{\s*([^}]+)\s*\}\}")


def path_parts(path: str) -> list[str]:
    """The dot-separated parts of a placeholder's path, trimmed, empty ones dropped."""
    return [part.strip() for part in path.split(".") if part.strip()]


def lookup(context: Mapping[str, Any], path: str) -> Any:
    """The value at `path` in `context`, or None when the path names nothing."""
    cursor: Any = context
    for part in path_parts(path):
        if not isinstance(cursor, Mapping):
            return None
        cursor = cursor.get(part)
    return cursor


def _js_numbers(value: Any) -> Any:
    """Floats with no fraction as ints, as JavaScript's JSON.stringify writes them."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): _js_numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_js_numbers(v) for v in value]
    return value


def render_value(value: Any) -> str:
    """How a looked-up value appears in the rendered text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(_js_numbers(value), separators=(",", ":"), ensure_ascii=False)


def render(template: str, context: Mapping[str, Any]) -> str:
    """`template` with every placeholder replaced by its value in `context`."""
    return PLACEHOLDER.sub(lambda match: render_value(lookup(context, match.group(1))), template)


def unresolved_paths(template: str, context: Mapping[str, Any]) -> Iterator[str]:
    """The placeholder paths of `template` that name nothing in `context` (they render empty).

    A path whose value is null counts too: either way the text has a hole there."""
    for match in PLACEHOLDER.finditer(template):
        if lookup(context, match.group(1)) is None:
            yield match.group(1).strip()
