"""`agentrun status NAME --timeline`: each step's iterations and attempts as bars on one time axis.

A pure function of the AgentRun object (as the API server returns it), `now` (the end of anything
still running), the width of the bars and whether colour is wanted (only on a terminal, never with
NO_COLOR). Every glyph means the same with or without colour, so piped output reads the same:

- `=` an attempt that succeeded (or, for a step without a loop, the step's run), `>` one running,
  `x` one that failed, `/` one cancelled;
- `r` failed attempts and their backoff before an iteration's last attempt (its record's
  `lastAttemptStartedAt`), or the backoff now (`nextRetryAt`);
- `.` the loop waiting between iterations (`loop.intervalSeconds`, or the hand-over), and until
  `nextIterationAt` while it waits;
- `?` an approval gate waiting for a person.

An iteration more than twice as long as the median of its step's kept iterations is marked `slow`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from agentrun_operator.ctl.render import format_duration, paint, parse_time, status_of

DEFAULT_WIDTH: Final = 60
MIN_WIDTH: Final = 20
MAX_LABEL: Final = 36
SLOW_FACTOR: Final = 2.0

GLYPH_BY_PHASE: Final = {
    "Succeeded": "=",
    "Running": ">",
    "Failed": "x",
    "Cancelled": "/",
    "Retrying": "r",
    "AwaitingApproval": "?",
}
RETRIES: Final = "r"
WAIT: Final = "."
_COLOUR_OF_GLYPH: Final = {
    "=": "Succeeded",
    ">": "Running",
    "x": "Failed",
    "/": "Cancelled",
    "r": "Retrying",
    "?": "AwaitingApproval",
}
LEGEND: Final = (
    "= succeeded  > running  x failed  / cancelled  r failed attempts and backoff  "
    ". waiting between iterations  ? awaiting approval"
)


@dataclass(frozen=True)
class Segment:
    start: datetime
    end: datetime
    glyph: str


@dataclass
class Row:
    label: str
    segments: list[Segment]
    note: str


class _Axis:
    """Maps moments to columns of a `width`-column bar area from `start` to `end`."""

    def __init__(self, start: datetime, end: datetime, width: int) -> None:
        self.start = start
        self.seconds = max((end - start).total_seconds(), 1.0)
        self.width = width

    def column(self, moment: datetime) -> int:
        offset = (moment - self.start).total_seconds() / self.seconds * self.width
        return min(max(int(offset), 0), self.width - 1)

    def draw(self, segments: list[Segment]) -> list[str]:
        """Each column shows what took most of its time (work over waiting on a tie); a piece of
        work shorter than a column still gets the column it started in, so none is hidden."""
        step = self.seconds / self.width
        cover: list[dict[str, float]] = [{} for _ in range(self.width)]
        for seg in segments:
            begin = (seg.start - self.start).total_seconds()
            end = (seg.end - self.start).total_seconds()
            for col in range(self.column(seg.start), self.column(seg.end) + 1):
                overlap = min(end, (col + 1) * step) - max(begin, col * step)
                if overlap > 0:
                    cover[col][seg.glyph] = cover[col].get(seg.glyph, 0.0) + overlap
        cells = [max(c, key=lambda glyph: (c[glyph], glyph != WAIT)) if c else " " for c in cover]
        for seg in segments:
            first, last = self.column(seg.start), self.column(seg.end)
            if seg.glyph != WAIT and seg.glyph not in cells[first : last + 1]:
                cells[first] = seg.glyph
        return cells

    def ticks(self) -> str:
        """`0s`, then the elapsed time at a quarter, half, three quarters and the end."""
        cells = [" "] * self.width
        for quarter in range(5):
            col = min(quarter * self.width // 4, self.width - 1)
            text = format_duration(self.seconds * quarter / 4) if quarter else "0s"
            at = max(0, min(col, self.width - len(text))) if quarter else 0
            if quarter and any(c != " " for c in cells[max(at - 1, 0) : at + len(text)]):
                continue
            cells[at : at + len(text)] = list(text)
        return "".join(cells).rstrip()


def _iteration_segments(record: Mapping[str, Any], now: datetime) -> list[Segment]:
    start = parse_time(record.get("startedAt"))
    if start is None:
        return []
    end = parse_time(record.get("finishedAt")) or now
    phase = str(record.get("phase") or "Running")
    last = parse_time(record.get("lastAttemptStartedAt"))
    segments = []
    if last is not None and start < last <= end:
        segments.append(Segment(start, last, RETRIES))
        start = last
    segments.append(Segment(start, end, GLYPH_BY_PHASE.get(phase, ">")))
    return segments


def _median_seconds(records: list[Mapping[str, Any]]) -> float | None:
    spans = [
        (f - s).total_seconds()
        for r in records
        if (s := parse_time(r.get("startedAt"))) is not None
        and (f := parse_time(r.get("finishedAt"))) is not None
    ]
    return statistics.median(spans) if len(spans) >= 3 else None


def _iteration_note(record: Mapping[str, Any], now: datetime, median: float | None, order: list[str]) -> str:
    start = parse_time(record.get("startedAt"))
    end = parse_time(record.get("finishedAt"))
    took = (end or now) - start if start is not None else None
    parts = [str(record.get("phase") or "Running")]
    if took is not None:
        parts.append(format_duration(took.total_seconds()) + ("" if end else "+"))
    attempts = int(record.get("attempts") or 0)
    if attempts > 1:
        parts.append(f"{attempts} attempts")
    if median and took is not None and end is not None and took.total_seconds() > SLOW_FACTOR * median:
        parts.append(f"slow ({took.total_seconds() / median:.1f}x the median {format_duration(median)})")
    children = record.get("steps")
    if isinstance(children, Mapping) and children:  # in the body's order (the API server sorts keys)
        names = [n for n in order if n in children] + sorted(n for n in children if n not in order)
        parts.append(" ".join(f"{name}={children[name]}" for name in names))
    return "  ".join(parts)


def _step_rows(step: Mapping[str, Any], suffix: str, depth: int, now: datetime) -> list[Row]:
    """The step's row (a loop's: its iterations with the waits between them), then one per kept
    iteration, then its children's, indented (a loop body's children: in the `suffix` iteration)."""
    name = f"{step.get('name')}{suffix}"
    indent = "  " * depth
    phase = str(step.get("phase") or "Pending")
    start = parse_time(step.get("startedAt"))
    end = parse_time(step.get("finishedAt"))
    loop = step.get("loop") if isinstance(step.get("loop"), Mapping) else None
    rows: list[Row] = []
    segments: list[Segment] = []
    note = [phase]
    if start is not None:
        note.append(format_duration(((end or now) - start).total_seconds()) + ("" if end else "+"))
    if step.get("reason") and phase not in ("Running", "Pending"):
        note.append(str(step["reason"]))
    if loop is not None:
        records = [r for r in loop.get("iterations") or [] if isinstance(r, Mapping)]
        done = int(loop.get("completedIterations") or 0)
        note.insert(1, f"{loop.get('currentIteration', 0)}/{loop.get('maxIterations', '?')}")
        pruned = int(loop.get("prunedIterations") or 0)
        if pruned:
            note.append(f"{pruned} earlier iterations pruned (not drawn)")
        previous_end: datetime | None = start if not pruned else None
        for record in sorted(records, key=lambda r: int(r.get("index") or 0)):
            drawn = _iteration_segments(record, now)
            if drawn and previous_end is not None and previous_end < drawn[0].start:
                segments.append(Segment(previous_end, drawn[0].start, WAIT))
            segments.extend(drawn)
            previous_end = parse_time(record.get("finishedAt")) or (drawn[-1].end if drawn else previous_end)
        due = parse_time(loop.get("nextIterationAt"))
        if due is not None and end is None and previous_end is not None:
            segments.append(Segment(previous_end, max(now, previous_end), WAIT))
            note.append(f"next iteration at {loop['nextIterationAt']}")
        rows.append(Row(indent + name, segments, "  ".join(note) + f"  ({done} completed)"))
        median = _median_seconds(records)
        order = [str(c.get("name")) for c in step.get("steps") or [] if isinstance(c, Mapping)]
        for record in sorted(records, key=lambda r: int(r.get("index") or 0)):
            rows.append(
                Row(
                    f"{indent}  #{record.get('index')}",
                    _iteration_segments(record, now),
                    _iteration_note(record, now, median, order),
                )
            )
        current = loop.get("currentIteration")
        child_suffix = f" (#{current})" if current else ""
    else:
        if start is not None:
            retry = parse_time(step.get("nextRetryAt"))
            if phase == "Retrying":
                segments.append(Segment(start, now, RETRIES))
                if retry is not None:
                    note.append(f"next attempt at {step['nextRetryAt']}")
            else:
                segments.append(Segment(start, end or now, GLYPH_BY_PHASE.get(phase, ">")))
        attempt = int(step.get("attempt") or 0)
        if attempt > 1:
            note.append(f"attempt {attempt}")
        if phase == "AwaitingApproval":
            note.append("awaiting approval")
        rows.append(Row(indent + name, segments, "  ".join(note)))
        child_suffix = ""
    for child in step.get("steps") or []:
        if isinstance(child, Mapping):
            rows.extend(_step_rows(child, child_suffix, depth + 1, now))
    return rows


def _bounds(run: Mapping[str, Any], rows: list[Row], now: datetime) -> tuple[datetime, datetime] | None:
    status = status_of(run)
    moments = [m for row in rows for seg in row.segments for m in (seg.start, seg.end)]
    start = parse_time(status.get("startedAt")) or (min(moments) if moments else None)
    if start is None:
        return None
    end = parse_time(status.get("finishedAt")) or now
    return min([start, *moments]), max([end, *moments])


def _clip_label(text: str) -> str:
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "…"


def render_timeline(
    run: Mapping[str, Any], now: datetime, width: int = DEFAULT_WIDTH, colour: bool = False
) -> str:
    """The run's steps, loops and iterations as bars on one time axis (see the module's docstring)."""
    meta = run.get("metadata") or {}
    status = status_of(run)
    phase = str(status.get("phase") or "Pending")
    head = f"AgentRun {meta.get('name')} (namespace {meta.get('namespace')}): {paint(phase, phase, colour)}"
    if status.get("reason"):
        head += f" ({status['reason']})"
    workflow = status.get("workflow")
    steps = workflow.get("steps") if isinstance(workflow, Mapping) else None
    rows = [r for s in steps or [] if isinstance(s, Mapping) for r in _step_rows(s, "", 0, now)]
    bounds = _bounds(run, rows, now)
    if bounds is None:
        return f"{head}\nnothing has started yet: no timeline to draw\n"
    width = max(width, MIN_WIDTH)
    axis = _Axis(bounds[0], bounds[1], width)
    took = format_duration(axis.seconds)
    head += f"; {took} from {status.get('startedAt') or bounds[0].isoformat()}"
    head += f", one column = {format_duration(axis.seconds / width)}"
    labels = [_clip_label(r.label) for r in rows]
    pad = max([len("STEP"), *map(len, labels)])
    lines = [head, "", f"{'STEP'.ljust(pad)}  {axis.ticks()}"]
    for label, row in zip(labels, rows, strict=True):
        bar = _paint_bar(axis.draw(row.segments), colour)
        lines.append(f"{label.ljust(pad)}  |{bar}|  {row.note}".rstrip())
    lines.extend(["", LEGEND])
    return "\n".join(lines) + "\n"


def _paint_bar(cells: list[str], colour: bool) -> str:
    """The cells, each run of one glyph in its colour when `colour`."""
    runs: list[str] = []
    for cell in cells:
        if runs and runs[-1][0] == cell:
            runs[-1] += cell
        else:
            runs.append(cell)
    return "".join(paint(r, _COLOUR_OF_GLYPH.get(r[0]), colour) for r in runs)
