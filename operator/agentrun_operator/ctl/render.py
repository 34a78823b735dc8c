"""What `agentrun status` and `agentrun watch` print, as pure functions of AgentRun objects (dicts).

No I/O and no clock: the caller passes `now` (durations of running things) and whether colour is
wanted (only on a terminal, never with NO_COLOR), so every rendering is checked by golden files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import yaml

TERMINAL_PHASES: Final = ("Succeeded", "Failed", "Cancelled")

EXIT_SUCCEEDED: Final = 0
EXIT_FAILED: Final = 1
EXIT_CANCELLED: Final = 2
EXIT_TIMEOUT: Final = 3
EXIT_ERROR: Final = 4
"""A command that could not do its job (not found, forbidden, no credentials, bad arguments)."""

_EXIT_BY_PHASE: Final = {"Succeeded": EXIT_SUCCEEDED, "Failed": EXIT_FAILED, "Cancelled": EXIT_CANCELLED}

_COLOURS: Final = {
    "Succeeded": "32",  # green
    "Failed": "31",  # red
    "Cancelled": "33",  # yellow
    "Retrying": "33",
    "Running": "36",  # cyan
    "AwaitingApproval": "35",  # magenta: a person is asked
}

MAX_CONTROL_CHARS: Final = 300
MAX_MESSAGE_CHARS: Final = 200


def exit_code(phase: str | None) -> int | None:
    """The exit code of `watch` for a finished run (0 Succeeded, 1 Failed, 2 Cancelled); None if running."""
    return _EXIT_BY_PHASE.get(phase or "")


def is_finished(run: Mapping[str, Any]) -> bool:
    return status_of(run).get("phase") in TERMINAL_PHASES


# ----------------------------------------------------------------------------------- helpers


def status_of(run: Mapping[str, Any]) -> Mapping[str, Any]:
    status = run.get("status")
    return status if isinstance(status, Mapping) else {}


def _steps(run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every step entry of the run, depth first, a nested one named by its path as Events name it
    (`develop/iteration 2/review`: the children of a loop body are those of its current or last
    iteration; `route/fix`: the children of a switch are those of the branch it took)."""
    workflow = status_of(run).get("workflow")
    steps = workflow.get("steps") if isinstance(workflow, Mapping) else None
    return _flatten(steps, "")


steps_of = _steps


def _flatten(steps: Any, prefix: str) -> list[Mapping[str, Any]]:
    result: list[Mapping[str, Any]] = []
    for step in steps if isinstance(steps, list) else []:
        if not isinstance(step, Mapping):
            continue
        path = f"{prefix}{step.get('name')}"
        result.append({**step, "name": path} if prefix else step)
        loop = step.get("loop")
        if isinstance(loop, Mapping) and loop.get("currentIteration"):
            path += f"/iteration {loop['currentIteration']}"
        result.extend(_flatten(step.get("steps"), f"{path}/"))
    return result


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


parse_time = _parse_time
"""An RFC 3339 timestamp of the status as an aware datetime (None when absent or unreadable)."""


def format_duration(seconds: float) -> str:
    """`850ms`, `12s`, `3m04s`, `2h05m` — the precision a person reading progress wants."""
    if seconds < 0:
        seconds = 0
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    if seconds < 60:
        return f"{int(seconds)}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def _duration(started: Any, finished: Any, now: datetime) -> str:
    start = _parse_time(started)
    if start is None:
        return "-"
    end = _parse_time(finished) or now
    text = format_duration((end - start).total_seconds())
    return text if _parse_time(finished) else f"{text}+"


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def paint(text: str, phase: str | None, colour: bool) -> str:
    """`text` in the colour of `phase` when `colour` (a terminal); unchanged otherwise."""
    code = _COLOURS.get(phase or "")
    return f"\x1b[{code}m{text}\x1b[0m" if colour and code else text


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "") -> list[str]:
    rows = [list(r) for r in rows]
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [list(header), *rows]:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def _iteration_column(step: Mapping[str, Any]) -> str:
    loop = step.get("loop")
    if not isinstance(loop, Mapping):
        return "-"
    return f"{loop.get('currentIteration', 0)}/{loop.get('maxIterations', '?')}"


# ----------------------------------------------------------------------------------- status


def render_status(run: Mapping[str, Any], now: datetime, colour: bool = False) -> str:
    """The human view of one run: phase, conditions, a row per step, each loop's iterations."""
    meta = run.get("metadata") or {}
    status = status_of(run)
    phase = str(status.get("phase") or "Pending")
    lines = [f"AgentRun {meta.get('name')} (namespace {meta.get('namespace')})"]
    headline = paint(phase, phase, colour)
    if status.get("reason"):
        headline += f" ({status['reason']})"
    lines.append(f"Phase:       {headline}")
    if status.get("message"):
        lines.append(f"Message:     {_clip(str(status['message']), 4 * MAX_MESSAGE_CHARS)}")
    if status.get("startedAt"):
        ended = f", finished {status['finishedAt']}" if status.get("finishedAt") else ""
        took = _duration(status.get("startedAt"), status.get("finishedAt"), now)
        lines.append(f"Started:     {status['startedAt']}{ended} ({took})")
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    if conditions:
        shown = ", ".join(
            f"{c.get('type')}={c.get('status')}" + (f" ({c['reason']})" if c.get("reason") else "")
            for c in conditions
        )
        lines.append(f"Conditions:  {shown}")
    waiting = next(
        (c for c in conditions if c.get("type") == "AwaitingApproval" and c.get("status") == "True"), None
    )
    if waiting is not None and phase not in TERMINAL_PHASES:
        lines.append(
            f"Approval:    {paint('awaiting', 'AwaitingApproval', colour)}: {waiting.get('message')}"
        )
    steps = _steps(run)
    if not steps:
        return "\n".join(lines) + "\n"
    lines.append("")
    rows = []
    for step in steps:
        loop = step.get("loop") if isinstance(step.get("loop"), Mapping) else {}
        step_phase = str(step.get("phase") or "Pending")
        rows.append(
            [
                str(step.get("name")),
                step_phase,
                _iteration_column(step),
                str(step.get("attempt") or "-"),
                str((loop or {}).get("stopReason") or step.get("reason") or "-"),
                _duration(step.get("startedAt"), step.get("finishedAt"), now),
            ]
        )
    table = _table(["STEP", "PHASE", "ITERATION", "ATTEMPT", "STOP REASON", "DURATION"], rows)
    lines.append(table[0])
    for row, line in zip(rows, table[1:], strict=True):
        lines.append(line.replace(row[1], paint(row[1], row[1], colour), 1) if colour else line)
    for step in steps:
        lines.extend(_step_details(step, now))
    return "\n".join(lines) + "\n"


def _step_details(step: Mapping[str, Any], now: datetime) -> list[str]:
    name = step.get("name")
    loop = step.get("loop")
    lines: list[str] = []
    if step.get("message"):
        lines.append(f"  message: {_clip(str(step['message']), 2 * MAX_MESSAGE_CHARS)}")
    if step.get("case"):
        lines.append(f"  case: {step['case']}")
    if isinstance(loop, Mapping):
        records = [r for r in loop.get("iterations") or [] if isinstance(r, Mapping)]
        pruned = int(loop.get("prunedIterations") or 0)
        done = loop.get("completedIterations", 0)
        lines.append(f"  iterations: {done} completed, {len(records)} kept, {pruned} pruned")
        body = any(isinstance(r.get("steps"), Mapping) for r in records)  # a loop body's records
        best_of = any(isinstance(r.get("candidates"), Mapping) for r in records)  # loop.candidates
        order = [str(c.get("name")) for c in step.get("steps") or [] if isinstance(c, Mapping)]
        rows = [
            [
                str(r.get("index")),
                str(r.get("phase")),
                str(r.get("attempts", 0)),
                _duration(r.get("startedAt"), r.get("finishedAt"), now),
                *([_children(r.get("steps"), order)] if body else []),
                *([_winner(r.get("candidates"))] if best_of else []),
                _clip(str(r.get("message") or ""), MAX_MESSAGE_CHARS),
            ]
            for r in records
        ]
        header = [
            "#",
            "PHASE",
            "ATTEMPTS",
            "DURATION",
            *(["STEPS"] if body else []),
            *(["WINNER"] if best_of else []),
            "MESSAGE",
        ]
        if rows:
            lines.extend(_table(header, rows, indent="    "))
        if loop.get("lastControl") is not None:
            lines.append(f"  last control: {_clip(_compact_json(loop['lastControl']), MAX_CONTROL_CHARS)}")
        waiting = _next_iteration(step, loop, now)
        if waiting:
            lines.append(f"  next iteration: {waiting}")
    elif step.get("control") is not None:
        lines.append(f"  control: {_clip(_compact_json(step['control']), MAX_CONTROL_CHARS)}")
    if not lines:
        return []
    return ["", f"{name}:", *lines]


def _next_iteration(step: Mapping[str, Any], loop: Mapping[str, Any], now: datetime) -> str | None:
    """`3 at 2026-…Z (in 25s; loop.intervalSeconds)` while a loop waits between iterations (no pod
    runs); None otherwise."""
    due = _parse_time(loop.get("nextIterationAt"))
    if due is None or step.get("phase") in (*TERMINAL_PHASES, "Skipped"):
        return None
    index = int(loop.get("currentIteration") or 0) + 1
    left = (due - now).total_seconds()
    when = f"in {format_duration(left)}" if left > 0 else "due now"
    return f"{index} at {loop['nextIterationAt']} ({when}, loop.intervalSeconds)"


def _winner(candidates: Any) -> str:
    """loop.candidates: `1 of 3`, `1 of 3 (promoting)` until its files are the workspace, `-` before
    the pick."""
    if not isinstance(candidates, Mapping) or candidates.get("winner") is None:
        return "-"
    promoting = "" if candidates.get("promoted") else " (promoting)"
    return f"{candidates['winner']} of {candidates.get('count', '?')}{promoting}"


def _children(phases: Any, order: list[str]) -> str:
    """A body iteration's children as `implement=Succeeded test=Failed review=Skipped`, in the body's
    order (the API server returns the map's keys sorted)."""
    if not isinstance(phases, Mapping):
        return "-"
    names = [n for n in order if n in phases] + sorted(n for n in phases if n not in order)
    return " ".join(f"{name}={phases[name]}" for name in names)


def render_object(run: Mapping[str, Any], output: str) -> str:
    """`-o json` / `-o yaml`: the AgentRun object as the API server returned it."""
    if output == "json":
        return json.dumps(run, indent=2, sort_keys=False, ensure_ascii=False) + "\n"
    return str(yaml.safe_dump(dict(run), sort_keys=False, allow_unicode=True))


# ----------------------------------------------------------------------------------- watch


@dataclass(frozen=True)
class Snapshot:
    """What `watch` compares between two observations of a run, to print only what changed."""

    run: tuple[str, str]
    steps: dict[str, tuple[str, str, str]]
    iterations: dict[tuple[str, int], tuple[str, int]]


def snapshot(run: Mapping[str, Any]) -> Snapshot:
    status = status_of(run)
    steps: dict[str, tuple[str, str, str]] = {}
    iterations: dict[tuple[str, int], tuple[str, int]] = {}
    for step in _steps(run):
        name = str(step.get("name"))
        loop = step.get("loop") if isinstance(step.get("loop"), Mapping) else None
        stop = str((loop or {}).get("stopReason") or step.get("reason") or "")
        steps[name] = (str(step.get("phase") or "Pending"), stop, str(step.get("attempt") or ""))
        for record in (loop or {}).get("iterations") or []:
            if isinstance(record, Mapping) and isinstance(record.get("index"), int):
                iterations[(name, record["index"])] = (
                    str(record.get("phase")),
                    int(record.get("attempts") or 0),
                )
    run_state = (str(status.get("phase") or "Pending"), str(status.get("reason") or ""))
    return Snapshot(run_state, steps, iterations)


def progress_lines(
    previous: Mapping[str, Any] | None, current: Mapping[str, Any], now: datetime, colour: bool = False
) -> list[str]:
    """One line per change from `previous` to `current` (all of `current` when `previous` is None).

    Changes are reported run first, then per step: the step's phase, then each iteration that
    appeared or changed (so every retained iteration is printed at least once when it ends).
    """
    before = snapshot(previous) if previous is not None else Snapshot(("", ""), {}, {})
    after = snapshot(current)
    stamp = now.astimezone(UTC).strftime("%H:%M:%S")
    status = status_of(current)
    lines: list[str] = []
    finished = after.run[0] in TERMINAL_PHASES
    for step in _steps(current):
        lines.extend(_step_changes(step, before, after, now, colour, approval_waits(current)))
    run_line = None
    if after.run != before.run:
        phase, reason = after.run
        run_line = f"run {paint(phase, phase, colour)}" + (f" ({reason})" if reason else "")
        message = status.get("message")
        if message and (finished or phase == "Pending"):
            run_line += f": {_clip(str(message), 2 * MAX_MESSAGE_CHARS)}"
        if finished and status.get("startedAt"):
            run_line += f" after {_duration(status.get('startedAt'), status.get('finishedAt'), now)}"
    # A run that starts is announced before its steps; a run that ends after them.
    if run_line is not None:
        lines = [*lines, run_line] if finished else [run_line, *lines]
    return [f"{stamp} {line}" for line in lines]


def _gate_commands(waiting: str | None, path: str) -> str | None:
    """This gate's `approve with `…` (required: …), reject with `…`` from the run's AwaitingApproval
    condition (`waiting`), so `watch` names the command the gate accepts; None when not there."""
    if not waiting:
        return None
    found = re.search(rf"step {re.escape(path)}: .*?(approve with `[^`]*`.*?reject with `[^`]*`)", waiting)
    return found.group(1) if found else None


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _step_changes(
    step: Mapping[str, Any],
    before: Snapshot,
    after: Snapshot,
    now: datetime,
    colour: bool,
    waiting: str | None = None,
) -> list[str]:
    name = str(step.get("name"))
    lines: list[str] = []
    loop = step.get("loop") if isinstance(step.get("loop"), Mapping) else None
    maximum = (loop or {}).get("maxIterations", "?")
    old, new = before.steps.get(name), after.steps[name]
    phase, stop, attempt = new
    changed = old is None or old[0] != phase or (old[2] != attempt and loop is None)
    if changed and phase != "Pending":  # a step is Pending only before it starts
        line = f"step {name}: {paint(phase, phase, colour)}"
        if loop is None and attempt and phase in ("Running", "Retrying"):
            line += f" (attempt {attempt})"
        if phase in TERMINAL_PHASES or phase == "Skipped":
            line += f" ({stop})" if stop else ""
            if step.get("message"):
                line += f": {_clip(str(step['message']), MAX_MESSAGE_CHARS)}"
        elif phase == "AwaitingApproval" and step.get("message"):
            line += f": {_clip(str(step['message']), 2 * MAX_MESSAGE_CHARS)}"
            commands = _gate_commands(waiting, name)
            if commands:
                line += f"; {commands}"
        lines.append(line)
    step_line = lines.pop() if lines else None
    if step_line is not None and phase not in (*TERMINAL_PHASES, "Skipped"):
        lines.append(step_line)  # a step that starts comes before its iterations, one that ends after
        step_line = None
    records = [r for r in (loop or {}).get("iterations") or [] if isinstance(r, Mapping)]
    succeeded = [r.get("index") for r in records if r.get("phase") == "Succeeded"]
    newest = succeeded[-1] if succeeded else None  # lastControl is the newest successful one's
    for record in records:
        index = record.get("index")
        if not isinstance(index, int):
            continue
        key = (name, index)
        now_state = after.iterations[key]
        if before.iterations.get(key) == now_state:
            continue
        rec_phase, attempts = now_state
        line = f"step {name} iteration {index}/{maximum}: {paint(rec_phase, rec_phase, colour)}"
        if rec_phase in ("Running", "Retrying"):
            line += f" (attempt {attempts})"
        else:
            line += f" ({_plural(attempts, 'attempt')}"
            if record.get("finishedAt"):
                line += f", {_duration(record.get('startedAt'), record.get('finishedAt'), now)}"
            line += ")"
        if rec_phase in ("Failed", "Retrying", "Cancelled") and record.get("message"):
            line += f": {_clip(str(record['message']), MAX_MESSAGE_CHARS)}"
        if rec_phase == "Succeeded" and index == newest and (loop or {}).get("lastControl") is not None:
            line += f"; control {_clip(_compact_json((loop or {})['lastControl']), MAX_CONTROL_CHARS)}"
        due = _parse_time((loop or {}).get("nextIterationAt"))
        if rec_phase == "Succeeded" and index == (loop or {}).get("currentIteration") and due is not None:
            line += f"; iteration {index + 1} starts at {due.astimezone(UTC).strftime('%H:%M:%S')}"
        lines.append(line)
    if step_line is not None:
        lines.append(step_line)
    return lines


# ----------------------------------------------------------------------------------- follow (dev run)

ACTIVE_PHASES: Final = ("Running", "Retrying", "AwaitingApproval")


def active_path(run: Mapping[str, Any]) -> str | None:
    """The path of the step being executed, through every group, loop body and switch on the way, as
    Events name it (`develop/iteration 2/sign-off`); the last step run when none is active; None
    before any starts."""
    steps = _steps(run)
    active = [s for s in steps if s.get("phase") in ACTIVE_PHASES]
    if active:  # the deepest active one: its groups are active too and come first
        return str(active[-1].get("name"))
    started = [s for s in steps if s.get("startedAt")]
    return str(started[-1].get("name")) if started else None


def approval_waits(run: Mapping[str, Any]) -> str | None:
    """What the run's `AwaitingApproval` condition says while a gate waits (what it asks, the exact
    approve command with its required inputs, the reject command); None when none waits."""
    status = status_of(run)
    if status.get("phase") in TERMINAL_PHASES:
        return None
    for condition in status.get("conditions") or []:
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == "AwaitingApproval"
            and condition.get("status") == "True"
        ):
            return str(condition.get("message") or "a gate awaits approval (agentrun status NAME)")
    return None


def outcome_reason(run: Mapping[str, Any]) -> str:
    """Why the run is where it is, always a real value: its reason; else, for a run not finished,
    what it is doing (`still Running: develop/iteration 1/sign-off AwaitingApproval`)."""
    status = status_of(run)
    phase = str(status.get("phase") or "Pending")
    if status.get("reason"):
        return str(status["reason"])
    if phase in TERMINAL_PHASES:
        return phase
    path = active_path(run)
    if path is None:
        return f"still {phase}: no step has started"
    step = next((s for s in _steps(run) if s.get("name") == path), {})
    return f"still {phase}: step {path} {step.get('phase') or 'Pending'}"
