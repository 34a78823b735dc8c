"""The CLI's rendering, against golden files (AGENTRUN_UPDATE_GOLDEN=1 rewrites them; review the diff)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from agentrun_operator.ctl import render
from tests.unit.ctl import runs

GOLDEN = Path(__file__).resolve().parent / "golden"
NOW = datetime(2026, 11, 23, 10, 0, 12, tzinfo=UTC)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("AGENTRUN_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with AGENTRUN_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"rendering differs from {path}"


@pytest.mark.parametrize(
    ("golden", "run"),
    [
        ("status-running.txt", runs.conditional(3)),
        ("status-succeeded.txt", runs.conditional(5)),
        ("status-invalid.txt", runs.invalid()),
        ("status-cancelled.txt", runs.cancelled()),
        ("status-created.txt", runs.conditional(0)),
        ("status-nested.txt", runs.nested()),
        ("status-waiting.txt", runs.polling()),
        ("status-best-of.txt", runs.best_of()),
    ],
)
def test_status_table(golden: str, run: dict[str, object]) -> None:
    check_golden(golden, render.render_status(run, NOW))


def test_watch_prints_each_change_once_and_every_iteration() -> None:
    lines: list[str] = []
    previous = None
    for stage in range(6):
        current = runs.conditional(stage)
        lines.extend(render.progress_lines(previous, current, NOW))
        previous = current
    text = "\n".join(lines) + "\n"
    check_golden("watch-conditional.txt", text)
    for index in (1, 2, 3):
        assert sum(f"iteration {index}/8: Succeeded" in line for line in lines) == 1
    assert lines[-1].endswith("after 9s")


def test_watch_says_when_a_waiting_loop_starts_its_next_iteration() -> None:
    lines = render.progress_lines(runs.conditional(2), runs.polling(), NOW)
    assert lines == [
        '10:00:12 step implement iteration 2/8: Succeeded (1 attempt, 3s); control {"ready":false}; '
        "iteration 3 starts at 10:00:37"
    ]


def test_watch_of_a_finished_run_prints_its_whole_story() -> None:
    check_golden("watch-cancelled.txt", "\n".join(render.progress_lines(None, runs.cancelled(), NOW)) + "\n")


def test_watch_names_nested_steps_by_their_path() -> None:
    check_golden("watch-nested.txt", "\n".join(render.progress_lines(None, runs.nested(), NOW)) + "\n")


def test_an_unchanged_observation_prints_nothing() -> None:
    run = runs.conditional(3)
    assert render.progress_lines(run, json.loads(json.dumps(run)), NOW) == []


def test_no_control_codes_without_colour_and_colour_only_when_asked() -> None:
    plain = render.render_status(runs.conditional(5), NOW, colour=False)
    assert "\x1b" not in plain
    coloured = render.render_status(runs.conditional(5), NOW, colour=True)
    assert "\x1b[32mSucceeded\x1b[0m" in coloured
    assert [line for line in plain.splitlines()] == [
        line.replace("\x1b[32m", "").replace("\x1b[0m", "") for line in coloured.splitlines()
    ]
    lines = render.progress_lines(None, runs.cancelled(), NOW, colour=False)
    assert not any("\x1b" in line for line in lines)


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_object_output_round_trips(output: str) -> None:
    run = runs.conditional(5)
    text = render.render_object(run, output)
    assert (json.loads(text) if output == "json" else yaml.safe_load(text)) == run


@pytest.mark.parametrize(
    ("phase", "code"),
    [("Succeeded", 0), ("Failed", 1), ("Cancelled", 2), ("Running", None), ("Pending", None), (None, None)],
)
def test_watch_exit_codes(phase: str | None, code: int | None) -> None:
    assert render.exit_code(phase) == code


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.25, "250ms"), (3, "3s"), (59.9, "59s"), (184, "3m04s"), (7500, "2h05m")]
)
def test_durations(seconds: float, text: str) -> None:
    assert render.format_duration(seconds) == text


def test_the_status_table_lists_children_of_groups_by_path() -> None:
    from tests.unit.planner.world import PlannerWorld, manifest

    body = {"name": "dev", "loop": {"maxIterations": 2}, "steps": [{"name": "implement"}, {"name": "review"}]}
    world = PlannerWorld(manifest([body]))
    world.drive(lambda w, job: w.succeed(job, control={}))
    assert world.status is not None
    run = {
        **world.spec_manifest,
        "status": world.status.model_dump(by_alias=True, exclude_none=True, mode="json"),
    }
    text = render.render_status(run, NOW)
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("STEP"))
    width = lines[header].index("PHASE")  # the STEP column: a path may hold spaces
    rows = [line[:width].rstrip() for line in lines[header + 1 : header + 4]]
    # the children of the body's last iteration, named as Events name them
    assert rows == ["dev", "dev/iteration 2/implement", "dev/iteration 2/review"]


def test_watch_names_the_approve_command_the_gate_accepts() -> None:
    """The line for a gate that starts waiting carries the commands of the run's condition, the
    approve command with the gate's required input as a flag."""
    lines = render.progress_lines(None, runs.awaiting_approval(), NOW)
    gate = next(line for line in lines if "step develop/iteration 1/sign-off: AwaitingApproval" in line)
    assert gate.endswith(
        "awaiting approval: Review change.log in /workspace and approve; approve with `agentrun approve "
        "approval-loop -n e2e --step develop/sign-off --input verdict=VALUE` (required: verdict: revise "
        "(another iteration) or final), reject with `agentrun reject approval-loop -n e2e --step "
        "develop/sign-off --reason TEXT`"
    ), gate
