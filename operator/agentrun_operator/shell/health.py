"""What `/healthz` reports beyond kopf's own liveness (docs/operations.md#metrics).

kopf answers `/healthz` from its probe handlers (`kopf.on.probe`, shell/handlers.py); a handler
that raises makes the answer a 500, and the liveness probe restarts the pod. kopf only sees its own
tasks, so the operator's own parts are checked here:

- an informer that stopped receiving: no LIST, watch response or event for `SILENT_SECONDS` (a
  healthy watch is renewed every 270 s, so a healthy informer hears from the API server at least
  that often), or whose task has died;
- a work queue that stopped draining: keys have waited `STALLED_SECONDS` while no reconcile
  finished (a standby's queue, and one waiting for the cache to fill, are paused, not stalled),
  or a worker has died.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Final, Protocol

import kopf

log = logging.getLogger("agentrun.health")

SILENT_SECONDS: Final = 600.0
"""More than twice a watch's lifetime (270 s) plus its timeout margin: a missed renewal is not enough."""

STALLED_SECONDS: Final = 300.0
"""A reconcile mostly waits on the API server; five minutes without one finishing while keys wait is
a stuck operator (every API request of a reconcile gives up well before)."""


class Watched(Protocol):
    plural: str

    def silent_for(self, now: float) -> float | None: ...


class Drained(Protocol):
    def stalled_for(self, now: float) -> float | None: ...


def problems(
    informers: Iterable[Watched],
    queue: Drained | None,
    now: float,
    silent_seconds: float = SILENT_SECONDS,
    stalled_seconds: float = STALLED_SECONDS,
) -> list[str]:
    """What is wrong, one sentence each; empty when healthy. `silent_for`/`stalled_for` return None
    for a task that has died."""
    found: list[str] = []
    for informer in informers:
        silent = informer.silent_for(now)
        if silent is None:
            found.append(f"the {informer.plural} informer has stopped")
        elif silent > silent_seconds:
            found.append(f"the {informer.plural} informer has received nothing for {silent:.0f} s")
    if queue is not None:
        stalled = queue.stalled_for(now)
        if stalled is None:
            found.append("a work queue worker has stopped")
        elif stalled > stalled_seconds:
            found.append(f"the work queue has not drained for {stalled:.0f} s (no reconcile finished)")
    return found


def probe(
    informers: Iterable[Watched], queue: Drained | None, sizes: dict[str, int], now: float
) -> dict[str, int]:
    """kopf's probe handler's answer: the cache's `sizes` when healthy; else kopf's permanent error,
    which makes `/healthz` fail (500) at once."""
    found = problems(informers, queue, now)
    if found:
        log.error("unhealthy: %s", "; ".join(found))
        raise kopf.PermanentError("; ".join(found))
    return sizes
