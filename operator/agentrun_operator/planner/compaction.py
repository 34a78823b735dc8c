"""Compaction: the bounded iteration history of each loop, and the whole status within its budget
(docs/concepts.md#status-budget)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from functools import partial
from typing import Any, Final

from agentrun_operator.api import AgentRunStatus, IterationRecord, LoopStatus, StepStatus
from agentrun_operator.planner.conditions import exact_size, size_upper_bound
from agentrun_operator.planner.context import TERMINAL_STEP_PHASES, clip


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


BUDGET_RESERVE_BYTES: Final = 2048
"""Room kept under the status budget for what is decided after compaction (the conditions); at
most a tenth of the budget, so a status past 80 % of it is warned about before it is compacted."""

MIN_CLIPPED_MESSAGE_CHARS: Final = 64
"""Compaction clips no message to fewer characters than this (its `…` included)."""

_TERMINAL_RECORD_PHASES: Final = frozenset({"Succeeded", "Failed", "Cancelled"})
_NEVER: Final = datetime.max.replace(tzinfo=UTC)


def _json_len(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), default=str).encode())


def _record_len(record: IterationRecord) -> int:
    return len(record.model_dump_json(by_alias=True, exclude_none=True).encode()) + 1  # and its comma


def _droppable(loop: LoopStatus) -> list[IterationRecord]:
    """Finished records that may go: never a running one, never the loop's newest failure."""
    newest_bad = next((r for r in reversed(loop.iterations) if r.phase in ("Failed", "Cancelled")), None)
    return [r for r in loop.iterations if r.phase in _TERMINAL_RECORD_PHASES and r is not newest_bad]


def fit_to_budget(status: AgentRunStatus, budget_bytes: int, bound: int | None = None) -> int:
    """Shrink `status` under `budget_bytes` (less a reserve for its conditions) without failing the run.

    The per-loop history limit keeps a status small in the common case; this is the bound for the
    whole status (large messages, many looped steps, large collected outputs). It drops, oldest first
    across all loops, finished iteration records (counted in each loop's `prunedIterations`, the
    newest failure of each loop always kept); then, if still too big, the oldest collected output
    values (counted in `workflow.prunedOutputs`); then, if still too big, it clips messages
    (`_clip_messages`): a failure deep in groups, loop bodies and switches is repeated by every entry
    above it, so messages alone can outgrow a small budget when nothing is left to drop. Returns the
    bytes it removed (0: nothing to do). `bound` is `size_upper_bound(status)` when the caller has it
    already.
    """
    target = budget_bytes - min(BUDGET_RESERVE_BYTES, budget_bytes // 10)
    if (size_upper_bound(status) if bound is None else bound) <= target:
        return 0
    start = size = exact_size(status)
    # Each pass shrinks by estimated sizes, then measures: a pass drops an entry or shortens a
    # message while any is left to, so this ends; two passes are the rule (the estimate is off by the
    # odd counter digit).
    while size > target and (
        _drop_records(status, size - target)
        or _drop_outputs(status, size - target)
        or _clip_messages(status, size - target)
    ):
        size = exact_size(status)
    return start - size


def _drop_records(status: AgentRunStatus, excess: int) -> bool:
    """Drop the oldest finished records across all loops until about `excess` bytes are gone."""
    loops = [s.loop for s in _entries(status.workflow.steps if status.workflow is not None else []) if s.loop]
    candidates = [
        (record.finished_at or record.started_at or _NEVER, record.index, order, record)
        for order, loop in enumerate(loops)
        for record in _droppable(loop)
    ]
    candidates.sort(key=lambda c: c[:3])
    gone: set[int] = set()
    for _, _, _, record in candidates:
        if excess <= 0:
            break
        excess -= _record_len(record)
        gone.add(id(record))
    for loop in loops:
        kept = [r for r in loop.iterations if id(r) not in gone]
        if len(kept) != len(loop.iterations):
            loop.pruned_iterations += len(loop.iterations) - len(kept)
            loop.iterations = kept
            loop.retained_iterations = len(kept)
    return bool(gone)


def _entries(steps: list[StepStatus]) -> Iterator[StepStatus]:
    """Every step entry, the children of groups and switches included (depth first)."""
    for step in steps:
        yield step
        yield from _entries(step.steps or [])


def _drop_outputs(status: AgentRunStatus, excess: int) -> bool:
    """Drop the oldest values of the largest output lists until about `excess` bytes are gone."""
    workflow = status.workflow
    if workflow is None or not workflow.outputs:
        return False
    outputs = {name: list(values) for name, values in workflow.outputs.items()}
    pruned = dict(workflow.pruned_outputs or {})
    dropped = False
    while excess > 0:
        name = max((n for n in outputs if outputs[n]), key=lambda n: _json_len(outputs[n]), default=None)
        if name is None:
            break
        excess -= _json_len(outputs[name].pop(0)) + 1
        pruned[name] = pruned.get(name, 0) + 1
        dropped = True
    workflow.outputs = outputs
    workflow.pruned_outputs = pruned or None
    return dropped


_Message = tuple[str, Callable[[str], None]]
"""A message of the status and how to replace it."""


def _clip_messages(status: AgentRunStatus, excess: int) -> bool:
    """Clip the messages of the first tier that still has one over `MIN_CLIPPED_MESSAGE_CHARS`: every
    one longer than a common length is clipped to it (the longest lose most), the length chosen so
    that about `excess` bytes go. False when no message is left to clip.

    The tiers, in order (`_message_tiers`): finished entries (step entries at any depth with their
    last failures, iteration records), whose failure text the entries above them repeat; then
    unfinished ones, which say what is happening now; the run's own message, the headline its
    conditions repeat, last. A clipped message keeps its head (the chain of failed steps) and ends
    with `…`. Later plans do not write a finished entry's message again, so it stays clipped; an
    unfinished one written anew is clipped again while the status needs it.
    """
    for tier in _message_tiers(status):
        long = [(text, put) for text, put in tier if len(text) > MIN_CLIPPED_MESSAGE_CHARS]
        if not long:
            continue
        cap = _clip_length([text for text, _ in long], excess)
        for text, put in long:
            if len(text) > cap:
                put(clip(text, cap))
        return True
    return False


def _clip_length(texts: list[str], excess: int) -> int:
    """The longest length (characters) that, every longer text clipped to it, removes `excess` bytes;
    `MIN_CLIPPED_MESSAGE_CHARS` when none does. Below the longest text, so a text always shrinks."""

    def saved(cap: int) -> int:
        return sum(_text_len(t) - _text_len(clip(t, cap)) for t in texts if len(t) > cap)

    low, high = MIN_CLIPPED_MESSAGE_CHARS, max(len(t) for t in texts) - 1
    if high <= low or saved(low) < excess:
        return low
    while low < high:  # saved(low) >= excess: the longest such length (saved falls as the length grows)
        mid = (low + high + 1) // 2
        if saved(mid) >= excess:
            low = mid
        else:
            high = mid - 1
    return low


def _text_len(text: str) -> int:
    """The bytes of `text` as a JSON string in the status (UTF-8, as written)."""
    return len(json.dumps(text, ensure_ascii=False).encode())


def _message_tiers(status: AgentRunStatus) -> list[list[_Message]]:
    """The status's messages in the order `_clip_messages` clips them. A record or a last failure is
    replaced by a copy (the planner's working copy shares them with the status it was given)."""
    finished: list[_Message] = []
    unfinished: list[_Message] = []
    for st in _entries(status.workflow.steps if status.workflow is not None else []):
        tier = finished if st.phase in TERMINAL_STEP_PHASES else unfinished
        if st.message:
            tier.append((st.message, partial(setattr, st, "message")))
        if st.last_failure is not None and st.last_failure.message:
            tier.append((st.last_failure.message, partial(_set_failure_message, st)))
        for i, record in enumerate(st.loop.iterations if st.loop is not None else []):
            if record.message:
                record_tier = finished if record.phase in _TERMINAL_RECORD_PHASES else unfinished
                record_tier.append((record.message, partial(_set_record_message, st, i)))
    run: list[_Message] = [(status.message, partial(setattr, status, "message"))] if status.message else []
    return [finished, unfinished, run]


def _set_failure_message(st: StepStatus, text: str) -> None:
    assert st.last_failure is not None
    st.last_failure = st.last_failure.model_copy(update={"message": text})


def _set_record_message(st: StepStatus, index: int, text: str) -> None:
    assert st.loop is not None
    st.loop.iterations[index] = st.loop.iterations[index].model_copy(update={"message": text})
