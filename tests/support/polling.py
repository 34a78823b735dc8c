"""Polling for a condition: the one `eventually` of every test tier (never a timed assertion)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T], timeout: float = 60.0, what: str = "", every: float = 0.1) -> T:
    """Poll `check` until it returns something truthy, and return that; fail naming `what` when
    `timeout` seconds run out (generous timeouts: the machine may be busy)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
