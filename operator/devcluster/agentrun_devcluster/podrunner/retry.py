"""Retry with capped exponential backoff and full jitter, as a kubelet retries its API writes.

A bind or a status write that fails (the API server frozen, restarted, overloaded) is not dropped:
it is tried again until it lands or the pod is gone. The delays are pure (`backoff_delays`) so the
schedule can be tested; `retry_until` is the loop the runner's threads use.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """First delay, growth factor and cap (seconds); every delay is drawn in [0, min(cap, d)]."""

    first: float = 0.5
    factor: float = 2.0
    cap: float = 10.0


def backoff_delays(
    policy: Backoff, draw: Callable[[float, float], float] = random.uniform
) -> Iterator[float]:
    """Endless delays: full jitter over a ceiling that grows by `factor` up to `cap`."""
    ceiling = policy.first
    while True:
        yield draw(0.0, ceiling)
        ceiling = min(policy.cap, ceiling * policy.factor)


def retry_until(
    attempt: Callable[[], T],
    retriable: Callable[[Exception], bool],
    sleep: Callable[[float], None],
    policy: Backoff = Backoff(),
    on_retry: Callable[[Exception, float], None] | None = None,
) -> T:
    """`attempt()` until it returns; a retriable exception waits the next jittered delay via `sleep`
    (which may raise to stop, e.g. when the pod is gone), any other exception propagates."""
    delays = backoff_delays(policy)
    while True:
        try:
            return attempt()
        except Exception as exc:
            if not retriable(exc):
                raise
            delay = next(delays)
            if on_retry is not None:
                on_retry(exc, delay)
            sleep(delay)
