"""`agentrun status --timeline` (ctl/timeline.py): bars on one time axis, against golden files
(AGENTRUN_UPDATE_GOLDEN=1 rewrites them; review the diff) and what each must show."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from agentrun_operator.ctl.timeline import LEGEND, render_timeline
from tests.unit.ctl import runs
from tests.unit.ctl.test_render import NOW, check_golden


def _rows(text: str) -> dict[str, str]:
    """Each drawn row's label (stripped) and its bar (between the pipes)."""
    rows = {}
    for line in text.splitlines():
        if "|" in line:
            label, bar, _ = line.split("|", 2)
            rows[label.strip()] = bar
    return rows


@pytest.mark.parametrize(
    ("golden", "run"),
    [
        ("timeline-succeeded.txt", runs.conditional(5)),
        ("timeline-nested.txt", runs.nested()),
        ("timeline-waiting.txt", runs.polling()),
        ("timeline-approval.txt", runs.awaiting_approval()),
        ("timeline-forty.txt", runs.forty_with_retries()),
    ],
)
def test_timeline(golden: str, run: dict[str, object]) -> None:
    check_golden(golden, render_timeline(run, NOW))


def test_forty_iterations_with_retries_show_where_the_time_went() -> None:
    text = render_timeline(runs.forty_with_retries(), NOW, width=120)
    rows = _rows(text)
    assert [label for label in rows if label.startswith("#")] == [f"#{k}" for k in range(1, 41)]
    assert all(len(bar) == 120 for bar in rows.values())
    # every 7th iteration: its failed attempts and backoff (r) come before the attempt that succeeded
    for index in (7, 14, 21, 28, 35):
        bar = rows[f"#{index}"].strip()
        assert bar.startswith("r") and bar.endswith("=") and set(bar) == {"r", "="}, (index, bar)
    assert "3 attempts" in text.splitlines()[[*rows].index("#7") + 3]
    last = rows["#40"].strip()
    assert last.startswith("r") and last.endswith("x"), last  # a retry, then the attempt that failed
    # iterations in order on one axis: each starts after the one before it ended
    starts = [len(rows[f"#{k}"]) - len(rows[f"#{k}"].lstrip()) for k in range(1, 41)]
    assert starts == sorted(starts) and starts[0] == 0 and starts[-1] > 100
    # slow iterations are called out: 20 took 20 s against a median of 3 s
    slow = [line.split("|")[0].strip() for line in text.splitlines() if "slow (" in line]
    assert "#20" in slow and "#1" not in slow
    # the loop's row shows the waits between iterations (intervalSeconds) as dots
    assert "." in rows["poll"] and "x" in rows["poll"]
    assert text.rstrip().endswith(LEGEND)


def test_waits_are_visible_approval_and_interval() -> None:
    gate = _rows(render_timeline(runs.awaiting_approval(), NOW))["sign-off (#1)"]
    assert set(gate.strip()) == {"?"} and gate.endswith("?")  # waiting until now
    polling = render_timeline(runs.polling(), NOW)
    assert _rows(polling)["implement"].rstrip().endswith(".")  # waiting for the next iteration now
    assert "next iteration at 2026-11-23T10:00:37Z" in polling


def test_a_retry_waiting_for_its_backoff_is_drawn_as_retries() -> None:
    run = runs.conditional(1)
    step = run["status"]["workflow"]["steps"][0]
    step.pop("loop")
    step.update(phase="Retrying", attempt=2, nextRetryAt="2026-11-23T10:00:20Z")
    text = render_timeline(run, NOW)
    assert set(_rows(text)["implement"].strip()) == {"r"}
    assert "next attempt at 2026-11-23T10:00:20Z" in text and "attempt 2" in text


def test_colour_only_when_asked_and_the_same_glyphs_either_way() -> None:
    run = runs.forty_with_retries()
    plain = render_timeline(run, NOW, colour=False)
    coloured = render_timeline(run, NOW, colour=True)
    assert "\x1b[" not in plain and "\x1b[31mx\x1b[0m" in coloured
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == plain


def test_a_run_not_started_has_no_timeline_and_a_tiny_width_is_raised() -> None:
    assert render_timeline(runs.conditional(0), NOW).endswith(
        "nothing has started yet: no timeline to draw\n"
    )
    rows = _rows(render_timeline(runs.conditional(5), NOW, width=3))
    assert {len(bar) for bar in rows.values()} == {20}


def test_a_running_iteration_ends_at_now() -> None:
    later = datetime(2026, 11, 23, 10, 0, 30, tzinfo=UTC)
    rows = _rows(render_timeline(runs.conditional(3), later))
    assert rows["#3"].endswith(">")
