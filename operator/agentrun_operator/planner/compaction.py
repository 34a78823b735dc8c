"""History compaction: the bounded iteration history kept in status."""

from __future__ import annotations

from collections.abc import Iterable

from agentrun_operator.api import IterationRecord, LoopStatus


def compact_history(records: Iterable[IterationRecord], limit: int) -> tuple[list[IterationRecord], int]:
    """Keep the newest `limit` records, plus the newest Failed/Cancelled one if it is older.

    Returns (kept records, number dropped). Pure, so the rule is tested on its own.
    """
    items = list(records)
    if len(items) <= limit:
        return items, 0
    kept = items[len(items) - limit :] if limit > 0 else []
    dropped = items[: len(items) - limit]
    if not any(r.phase in ("Failed", "Cancelled") for r in kept):
        bad = next((r for r in reversed(dropped) if r.phase in ("Failed", "Cancelled")), None)
        if bad is not None:
            kept.insert(0, bad)
            return kept, len(dropped) - 1
    return kept, len(dropped)


def compact(loop: LoopStatus, limit: int) -> None:
    kept, dropped = compact_history(loop.iterations, limit)
    if dropped:
        loop.iterations = kept
        loop.pruned_iterations += dropped
    loop.retained_iterations = len(loop.iterations)
