"""Polling for a condition: the one `eventually` of every test tier (never a timed assertion)."""

from __future__ import annotations

import asyncio
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


async def until(check: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """`eventually` inside an event loop: give the loop's other tasks turns until `check` holds (a
    wait on the condition, never on the clock; the timeout is for a hung task only)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what or 'the condition'}")
        await asyncio.sleep(0.001)
