"""The chaos suite's accounting of one run's PVC log (tests/chaos/run.py)."""

from __future__ import annotations

from pathlib import Path

from agentrun_operator.jobs.reporter_container import REPORTER_CONTAINER
from tests.chaos.run import NODE_KINDS, PROCESS_KINDS, Config, iteration_counts, schedule


def test_each_iteration_exactly_once_is_clean() -> None:
    log = "".join(f"start {k}\ndone {k}\n" for k in (1, 2, 3))
    assert iteration_counts(log, 3) == ([], [])


def test_a_repeated_and_a_lost_iteration_are_counted() -> None:
    log = "start 1\ndone 1\nstart 2\nstart 2\ndone 2\nstart 3\n"
    assert iteration_counts(log, 3) == ([2], [3])


def test_the_schedule_has_each_kind_the_asked_number_of_times() -> None:
    for kinds in (PROCESS_KINDS, NODE_KINDS):
        order = schedule(Config(faults=4, seed=7, kinds=kinds))
        assert sorted(order) == sorted(list(kinds) * 4)
        assert all(set(order[i : i + len(kinds)]) == set(kinds) for i in range(0, len(order), len(kinds)))


def test_duplicate_pods_are_counted_from_their_reporters_logs(tmp_path: Path) -> None:
    """The reporter, a regular container listed before `main`, claims the Job and logs a duplicate
    (docs/design.md#reporter-first); the pod runner and the kubelet keep its log by container name."""
    from tests.chaos.run import DUPLICATE_SAID, duplicates_held

    for pod, said in (
        ("a", "claimed Job j for this pod"),
        ("b", f"Job j already runs in pod x: {DUPLICATE_SAID}"),
    ):
        log = (
            tmp_path
            / "pods"
            / "default"
            / f"job-{pod}"
            / f"uid-{pod}"
            / "logs"
            / REPORTER_CONTAINER
            / "0.log"
        )
        log.parent.mkdir(parents=True)
        log.write_text(f"agentrun reporter: {said}\n")
    # The real node's kubelet keeps them as <podLogsDir>/<namespace>_<pod>_<uid>/<container>/<n>.log
    kubelet_log = tmp_path / "node" / "pod-logs" / "default_job-c_uid-c" / REPORTER_CONTAINER / "0.log"
    kubelet_log.parent.mkdir(parents=True)
    kubelet_log.write_text(f"agentrun reporter: Job j already runs in pod y: {DUPLICATE_SAID}\n")
    assert duplicates_held(tmp_path) == 2
