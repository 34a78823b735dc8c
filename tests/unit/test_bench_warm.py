"""The warm benchmark's parts (tests/bench/node_warm.py, `bench_iterations --runtime kubelet --warm`):
the runs, the command's own log, the supervisor's marks from the kubelet's CRI log files, the
per-iteration rows and the per-mode costs, and the lost/repeated check of a warm run's one Job."""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agentrun_operator import naming
from agentrun_operator.api import agentrun_errors
from tests.bench import node_warm
from tests.bench.bench_iterations import JobWatch, lost_and_repeated


def test_the_runs_come_in_pairs_and_differ_only_in_warm() -> None:
    names = node_warm.run_names(2)
    assert node_warm.interleaved(names) == ["bench-cold-0", "bench-warm-0", "bench-cold-1", "bench-warm-1"]
    cold = node_warm.agentrun("bench-cold-0", "bench", 10, warm=False)
    warm = node_warm.agentrun("bench-warm-0", "bench", 10, warm=True)
    assert agentrun_errors(cold) == [] and agentrun_errors(warm) == []
    cold_loop, warm_loop = (r["spec"]["workflow"]["steps"][0]["loop"] for r in (cold, warm))
    assert cold_loop == {"maxIterations": 10}
    assert warm_loop == {"maxIterations": 10, "warm": {"idleSeconds": node_warm.IDLE_SECONDS}}
    assert cold["spec"]["workload"]["args"] == warm["spec"]["workload"]["args"] == [node_warm.SCRIPT]


@pytest.mark.skipif(shutil.which("busybox") is None, reason="busybox is not installed (make setup)")
def test_the_command_stamps_its_first_and_last_line_with_microseconds(tmp_path: Path) -> None:
    """busybox's `ts '%.s'` (its `date` has no `%N`), as the real node's busybox:1.36 runs it."""
    script = node_warm.SCRIPT.replace("/workspace", str(tmp_path))
    for k in (1, 2):
        env = dict(os.environ, AGENTRUN_ITERATION=str(k), AGENTRUN_ATTEMPT="1", PATH=_busybox_path(tmp_path))
        subprocess.run(["busybox", "sh", "-c", script], env=env, check=True)
    lines = node_warm.parse_log((tmp_path / node_warm.LOG_FILE).read_text())
    assert sorted(lines) == [("end", 1, 1), ("end", 2, 1), ("start", 1, 1), ("start", 2, 1)]
    stamp = (tmp_path / node_warm.LOG_FILE).read_text().split()[0]
    assert len(stamp.partition(".")[2]) == 6  # microseconds
    assert lines["start", 1, 1][0] <= lines["end", 1, 1][0] <= lines["start", 2, 1][0]
    assert node_warm.log_check((tmp_path / node_warm.LOG_FILE).read_text(), 2) == ([], [])


def _busybox_path(tmp_path: Path) -> str:
    """A PATH whose `ts` is busybox's (the host may have moreutils' `ts` first)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    busybox = shutil.which("busybox")
    assert busybox is not None
    if not (bin_dir / "ts").exists():
        (bin_dir / "ts").symlink_to(busybox)
    return f"{bin_dir}:{os.environ.get('PATH', '')}"


def test_the_log_check_finds_a_lost_a_repeated_and_a_retried_iteration() -> None:
    log = "1.0 start 1 1\n1.1 end 1 1\n2.0 start 2 1\n2.1 start 2 1\n2.2 end 2 1\n3.0 start 3 2\n"
    lost, repeated = node_warm.log_check(log, 3)
    assert lost == ["iteration 3: no end line"]
    assert repeated == ["iteration 2: 2 start lines", "iteration 3: attempt 2 ran"]
    assert node_warm.log_check("1.0 start 1 1\n1.1 end 1 1\n2.0 start 2 1\n2.1 end 2 1\n", 1)[1] == [
        "iteration 2 ran (the loop has 1)"
    ]


def test_a_cri_log_time_keeps_its_nanoseconds() -> None:
    assert node_warm.cri_time("2026-12-05T11:04:47.318300123Z") == pytest.approx(1796468687.3183, abs=1e-6)
    assert node_warm.cri_time("2026-12-05T11:04:47Z") == 1796468687.0


def _cri(at: str, text: str) -> str:
    return f"2026-12-05T11:04:{at}Z stderr F {text}\n"


def test_pod_logs_are_followed_with_their_cri_times_and_a_partial_line_waits(tmp_path: Path) -> None:
    pod = tmp_path / "bench_bench-warm-0-step-1-iter-1-attempt-1-abcde_uid"
    (pod / "reporter").mkdir(parents=True)
    (pod / "main").mkdir()
    (tmp_path / "other_x_uid" / "reporter").mkdir(parents=True)
    (tmp_path / "other_x_uid" / "reporter" / "0.log").write_text(_cri("47.0", "not ours"))
    reporter = pod / "reporter" / "0.log"
    reporter.write_text(_cri("47.100000000", "agentrun reporter: warm: iteration 1-1 ended: exit code 0"))
    (pod / "main" / "0.log").write_text(_cri("47.250000000", "agentrun: iteration 2-1"))
    logs = node_warm.PodLogs(tmp_path, "bench", ("reporter", "main"), poll=3600)
    logs._read_all()
    with reporter.open("a") as handle:
        handle.write(_cri("47.240000000", "agentrun reporter: warm: started iteration 2-1")[:-1])
    logs._read_all()  # the line has no end yet: it waits
    assert len(logs.lines) == 2
    with reporter.open("a") as handle:
        handle.write("\n")
    lines = logs.start().stop()
    job = naming.job_name("bench-warm-0", 1, 1, 1)
    marks = node_warm.supervisor_marks(lines, job)
    assert marks["1-1"]["exit_seen"] == pytest.approx(1796468687.1)
    assert marks["2-1"]["handed"] == pytest.approx(1796468687.24)
    assert marks["2-1"]["loop_read"] == pytest.approx(1796468687.25)
    assert node_warm.supervisor_marks(lines, "another-job") == {}


def test_each_iteration_row_splits_the_gap_from_the_commands_end_to_the_next_start() -> None:
    log = node_warm.parse_log("10.000 start 1 1\n10.010 end 1 1\n10.150 start 2 1\n10.160 end 2 1\n")
    recorded = {1: 10.100, 2: 10.300}
    marks = {"1-1": {"exit_seen": 10.020}, "2-1": {"handed": 10.140, "loop_read": 10.145}}
    (row,) = node_warm.iteration_rows(log, recorded, 2, marks)
    assert {key: round(value * 1000, 3) for key, value in row.items()} == {
        "overhead": 50.0,
        "end_to_next_start": 140.0,
        "end_to_recorded": 90.0,
        "end_to_exit_seen": 10.0,
        "exit_seen_to_recorded": 80.0,
        "recorded_to_start_handed": 40.0,
        "handed_to_loop_read": 5.0,
        "loop_read_to_command_start": 5.0,
    }
    (cold,) = node_warm.iteration_rows(log, recorded, 2, None)
    assert set(cold) == {"overhead", "end_to_next_start", "end_to_recorded"}
    assert node_warm.iteration_rows(log, {2: 10.3}, 2, None) == []  # iteration 1 never recorded
    figures = node_warm.summarize([cold], [row])
    assert figures["overhead_ms"]["p50"] == pytest.approx(50.0)
    assert figures["cold_overhead_ms"]["n"] == 1
    assert figures["warm_ms"]["handed_to_loop_read"]["p50"] == pytest.approx(5.0)


def test_each_mode_pays_for_its_runs_until_the_next_one_starts() -> None:
    def metrics(job: float, status: float, gets: float) -> dict[str, float]:
        return {
            'agentrun_api_requests_total{verb="POST",resource="jobs"}': job,
            'agentrun_api_requests_total{verb="PUT",resource="agentruns/status"}': status,
            'agentrun_api_requests_total{verb="GET",resource="jobs"}': gets,
            "agentrun_reconcile_duration_seconds_count": status * 2,
            "agentrun_reconcile_duration_seconds_sum": status * 0.01,
        }

    starts = [
        ("bench-cold-0", metrics(0, 0, 0), 1.0),
        ("bench-warm-0", metrics(10, 11, 50), 1.2),
    ]
    costs = node_warm.per_mode_costs(starts, (metrics(11, 22, 60), 1.25), frozenset({"bench-warm-0"}), 10)
    assert costs["cold"]["writes_per_iteration"] == pytest.approx(2.1)
    assert costs["cold"]["cpu_ms_per_iteration"] == pytest.approx(20.0)
    assert costs["warm"]["writes_per_iteration_by_resource"] == {
        'verb="POST",resource="jobs"': pytest.approx(0.1),
        'verb="PUT",resource="agentruns/status"': pytest.approx(1.1),
    }
    assert costs["warm"]["cpu_ms_per_iteration"] == pytest.approx(5.0)
    assert costs["warm"]["reconciles_per_iteration"] == pytest.approx(2.2)
    assert costs["warm"]["reconcile_ms_mean"] == pytest.approx(5.0)
    assert costs["cold"]["planner_ms_per_iteration"] == 0.0  # no such series scraped


def _status(records: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "phase": "Succeeded",
        "workflow": {"steps": [{"loop": {"completedIterations": len(records), "iterations": records}}]},
    }


def test_a_warm_run_has_one_job_and_every_later_record_is_warm_in_its_pod() -> None:
    records = [{"index": 1, "attempts": 1, "pod": "p"}] + [
        {"index": k, "attempts": 1, "pod": "p", "warm": True} for k in (2, 3)
    ]
    runs = [{"metadata": {"name": "w"}, "status": _status(records)}]
    watch = JobWatch(None)  # type: ignore[arg-type]  # never started: the check reads what it holds
    first = naming.job_name("w", 1, 1, 1)
    watch.added, watch.adds = {first: 1.0}, collections.Counter({first: 1})
    check = lost_and_repeated(runs, ["w"], 3, watch, warm=frozenset({"w"}))
    assert (check["lost"], check["repeated"], check["not_warm"]) == (0, 0, 0)
    cold_check = lost_and_repeated(runs, ["w"], 3, watch)  # as a cold run: a Job per iteration
    assert cold_check["lost"] == 2
    second = naming.job_name("w", 1, 2, 1)
    watch.added[second], watch.adds[second] = 2.0, 1
    records[2] = {"index": 3, "attempts": 1, "pod": "q", "warm": True}
    check = lost_and_repeated(
        [{"metadata": {"name": "w"}, "status": _status(records)}], ["w"], 3, watch, warm=frozenset({"w"})
    )
    assert check["not_warm"] == 2 and (check["lost"], check["repeated"]) == (0, 0)
