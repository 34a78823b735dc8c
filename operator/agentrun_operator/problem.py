"""A validation problem: one thing wrong with a spec, with everything a user needs to fix it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from agentrun_operator.api.base import DOCS_API

REASON_INVALID_SPEC: Final = "InvalidSpec"

DOCS_CONCEPTS: Final = "docs/concepts.md"

_MAX_VALUE_CHARS: Final = 120


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec, with everything a user needs to fix it.

    `missing` is set (to `Kind/name`) when the problem is a referenced object that was not found:
    the planner waits a little for those (users `kubectl apply -f dir/` in any order) before it
    calls the run invalid.
    """

    path: str
    value: Any
    message: str
    fix: str
    docs: str
    reason: str = REASON_INVALID_SPEC
    missing: str | None = None

    def render(self) -> str:
        """`path: message (value: …; fix: …; see docs/…#anchor)` — one actionable line."""
        value = format_value(self.value)
        return f"{self.path}: {self.message} (value: {value}; fix: {self.fix}; see {self.docs})"


def format_value(value: Any) -> str:
    """A short JSON rendering of a bad value (long values are cut with an ellipsis)."""
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 1] + "…"


def concepts(anchor: str) -> str:
    return f"{DOCS_CONCEPTS}#{anchor}"


def api(anchor: str) -> str:
    return f"{DOCS_API}#{anchor}"
