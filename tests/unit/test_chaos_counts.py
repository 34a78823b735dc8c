"""The chaos suite's accounting of one run's PVC log (tests/chaos/run.py)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from pathlib import Path

import yaml

from agentrun_operator.cli import main
from agentrun_operator.control import checkpoint as store
from agentrun_operator.jobs.reporter_container import REPORTER_CONTAINER
from tests.chaos.run import (
    CHECKPOINT_EXCLUDE,
    NODE_KINDS,
    PROCESS_KINDS,
    WARM_IDLE_SECONDS,
    WARM_KINDS,
    Config,
    candidates_check,
    fail_iterations,
    iteration_counts,
    manifest,
    restore_check,
    schedule,
    status_check,
    warm_check,
    warm_iterations,
    winner_of,
)


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


# --- `--checkpoints` ----------------------------------------------------------------------------


def test_a_failed_attempt_and_its_retry_are_one_start() -> None:
    log = "start 1 1\ndone 1 1\nstart 2 1\nfail 2 1\nstart 2 2\ndone 2 2\nstart 3 1\ndone 3 1\n"
    assert iteration_counts(log, 3) == ([], [])


def test_an_attempt_started_twice_or_a_retry_without_a_failure_is_repeated() -> None:
    # A duplicate of the failing attempt (both failed) and a retry of an attempt that never said it
    # failed: `main` ran twice either way.
    log = (
        "start 1 1\nfail 1 1\nstart 1 1\nfail 1 1\nstart 1 2\ndone 1 2\n"
        "start 2 1\nstart 2 2\ndone 2 2\nstart 3 1\n"
    )
    assert iteration_counts(log, 3) == ([1, 2], [3])


def test_every_retry_is_compared_with_its_iterations_start() -> None:
    log = "start 1 1\ndone 1 1\nstart 2 1\nfail 2 1\nstart 2 2\ndone 2 2\n"
    same = {(1, 1): "a" * 64, (2, 1): "b" * 64, (2, 2): "b" * 64}
    assert restore_check(log, same, 2) == (1, [], True)
    checked, problems, exercised = restore_check(log, {**same, (2, 2): "c" * 64}, 2)
    assert (checked, exercised) == (1, True)
    assert problems == [f"iteration 2 attempt 2: start hash {'c' * 12} != the iteration's start {'b' * 12}"]
    assert restore_check(log, {(1, 1): "a" * 64, (2, 2): "b" * 64}, 2)[1] == [
        "iteration 2 attempt 2: no start hash of attempt 1"
    ]


def test_a_failing_iteration_that_never_failed_or_never_ran_again_is_reported() -> None:
    clean = "start 1 1\ndone 1 1\nstart 2 1\ndone 2 1\n"
    assert restore_check(clean, {(1, 1): "a", (2, 1): "b"}, 2) == (0, [], False)
    unretried = "start 1 1\ndone 1 1\nstart 2 1\nfail 2 1\n"
    assert restore_check(unretried, {(1, 1): "a", (2, 1): "b"}, 2) == (0, [], False)


def test_the_failing_iterations_come_from_the_seed_alone() -> None:
    names = [f"chaos-{i:03d}" for i in range(50)]
    chosen = fail_iterations(Config(iterations=5, seed=3, checkpoints=True), names)
    assert chosen == fail_iterations(Config(iterations=5, seed=3, checkpoints=True), names)
    assert set(chosen.values()) == {1, 2, 3, 4, 5}
    assert chosen != fail_iterations(Config(iterations=5, seed=4, checkpoints=True), names)


def test_the_checkpoint_runs_are_valid(tmp_path: Path) -> None:
    for control_off_volume in (False, True):
        config = Config(checkpoints=True, control_off_volume=control_off_volume, hold=True)
        path = tmp_path / f"runs-{control_off_volume}.yaml"
        path.write_text(manifest(config, "chaos-000", 2))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(["validate", str(path)])
        assert status == 0, out.getvalue() + err.getvalue()


def test_the_workload_hashes_the_start_a_restore_gives_back(tmp_path: Path) -> None:
    """The run's script by hand on a directory (sh and coreutils standing in for busybox), with the
    checkpoint store doing the reporter's part: the retry of the failing iteration starts with its
    iteration's start hash, and without the restore it would not."""
    doc = list(yaml.safe_load_all(manifest(Config(checkpoints=True, iteration_seconds=0), "c", 2)))[1]
    script = doc["spec"]["workload"]["args"][0].replace("/workspace", str(tmp_path))
    excluded = [".agentrun", ".agentrun-claims", *CHECKPOINT_EXCLUDE]

    def attempt(iteration: int, number: int) -> int:
        env = dict(os.environ, AGENTRUN_ITERATION=str(iteration), AGENTRUN_ATTEMPT=str(number))
        return subprocess.run(["sh", "-c", script], env=env, check=False).returncode

    def start(iteration: int, number: int) -> str:
        return (tmp_path / "chaos-hashes" / f"i{iteration}-a{number}").read_text()

    for iteration in (1, 2):
        store.record(str(tmp_path), f"c_{iteration}", excluded)
        assert attempt(iteration, 1) == (1 if iteration == 2 else 0)
    assert attempt(2, 2) == 0
    assert start(2, 2) != start(2, 1)  # the failed attempt's dirt, seen by the hash
    store.restore(str(tmp_path), "c_2", excluded)
    assert attempt(2, 3) == 0
    assert start(2, 3) == start(2, 1)
    log = (tmp_path / "chaos.log").read_text()
    assert log.count("fail 2 1") == 1 and "done 2 3" in log


def _run(*records: dict[str, object]) -> dict[str, object]:
    return {"status": {"workflow": {"steps": [{"loop": {"iterations": list(records)}}]}}}


def test_the_status_says_what_the_volume_saw() -> None:
    log = "start 1 1\ndone 1 1\nstart 2 1\nfail 2 1\nstart 2 2\ndone 2 2\n"
    one = {"index": 1, "attempts": 1, "checkpoint": {"id": "r_1_1"}}
    two = {"index": 2, "attempts": 2, "checkpoint": {"id": "r_1_2", "restored": "r_1_2"}}
    assert status_check(_run(one, two), log) == []
    unrestored = {"index": 2, "attempts": 2, "checkpoint": {"id": "r_1_2"}}
    assert status_check(_run(one, unrestored), log) == [
        "iteration 2: retried, but its status says it restored None"
    ]
    assert status_check(_run({**one, "attempts": 2}, two), log) == [
        "iteration 1: status says 2 attempts, the volume 1"
    ]
    restored_once = {**one, "checkpoint": {"id": "r_1_1", "restored": "r_1_1"}}
    assert status_check(_run(restored_once, two), log) == [
        "iteration 1: one attempt, but its status says it restored 'r_1_1'"
    ]


def _candidates_run(winners: list[int], promoted: bool = True) -> dict[str, object]:
    records = [
        {"index": k, "candidates": {"winner": w, "promoted": promoted}} for k, w in enumerate(winners, 1)
    ]
    return {"status": {"workflow": {"steps": [{"loop": {"iterations": records}}]}}}


def test_candidates_each_once_from_the_winners_is_clean() -> None:
    log = "".join(f"start {k} {c}\ndone {k} {c}\n" for k in (1, 2, 3) for c in (0, 1))
    assert [winner_of(k, 2) for k in (1, 2, 3)] == [0, 1, 0]
    seen = "1 0 saw none\n1 1 saw none\n2 0 saw 1 by 0\n2 1 saw 1 by 0\n3 0 saw 2 by 1\n3 1 saw 2 by 1\n"
    state = "1 by 0\n2 by 1\n3 by 0\n"
    assert candidates_check(log, seen, state, _candidates_run([0, 1, 0]), 3, 2) == ([], [], [])


def test_candidates_repeated_lost_and_wrong_are_each_found() -> None:
    log = "start 1 0\ndone 1 0\nstart 1 1\nstart 1 1\ndone 1 1\nstart 2 0\ndone 2 0\nstart 2 1\n"
    seen = "1 0 saw none\n2 0 saw 1 by 1\n"
    repeated, lost, wrong = candidates_check(log, seen, "1 by 0\n", _candidates_run([0, 0], False), 2, 2)
    assert repeated == [1] and lost == [2]
    assert any("candidate 0 started from '1 by 1', not '1 by 0'" in w for w in wrong)
    assert any("not the winners' chain" in w for w in wrong)
    assert any(w.startswith("iteration 2: its record says") for w in wrong)


def test_the_candidates_manifest_is_a_valid_run_with_a_shared_logs_claim() -> None:
    docs = list(yaml.safe_load_all(manifest(Config(candidates=3, iterations=2), "chaos-000")))
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim", "PersistentVolumeClaim", "AgentRun"]
    run = docs[2]
    assert [v["mountPath"] for v in run["spec"]["workload"]["volumes"]] == ["/workspace", "/logs"]
    loop = run["spec"]["workflow"]["steps"][0]["loop"]
    assert loop["candidates"]["count"] == 3 and loop["checkpoint"] == {"mode": "Files"}
    from agentrun_operator.api import agentrun_errors

    assert agentrun_errors(run) == []


def _warm_run(*attempts: int, phase: str = "Succeeded") -> dict[str, object]:
    records = [{"index": k, "attempts": a, "phase": phase, "warm": k > 1} for k, a in enumerate(attempts, 1)]
    return {"status": {"workflow": {"steps": [{"loop": {"iterations": records}}]}}}


def _seen(k: int, a: int, state: str, control: str) -> str:
    return f"{k} {a}|{state}|{control}\n"


def test_warm_iterations_each_once_seeing_the_previous_control_and_state_are_clean() -> None:
    # Iteration 2's first attempt was killed mid-iteration (no done); its retry saw iteration 1's.
    log = "start 1 1 p 1\ndone 1 1\nstart 2 1 p 2\nstart 2 2 q 1\ndone 2 2\nstart 3 1 q 2\ndone 3 1\n"
    seen = (
        _seen(1, 1, "none", "null")
        + _seen(2, 1, "1 1", '{"a":1,"n":1}')
        + _seen(2, 2, "1 1", '{"a":1,"n":1}')
        + _seen(3, 1, "2 2", '{"a":2,"n":2}')
    )
    assert warm_check(log, seen, _warm_run(1, 2, 1), 3) == ([], [], [])
    assert warm_iterations(log) == 2  # iteration 2 attempt 1 and iteration 3: the second in their pods
    # An attempt killed after writing its state line: its retry starts from it, which is no fault.
    killed_late = _seen(2, 2, "2 1", '{"a":1,"n":1}')
    assert (
        warm_check(
            log, seen.replace(_seen(2, 2, "1 1", '{"a":1,"n":1}'), killed_late), _warm_run(1, 2, 1), 3
        )[2]
        == []
    )


def test_warm_repeated_lost_and_wrong_are_each_found() -> None:
    log = (
        "start 1 1 p 1\ndone 1 1\nstart 2 1 p 2\ndone 2 1\nstart 2 2 q 1\ndone 2 2\n"
        "start 3 1 q 2\nstart 3 1 q 3\n"
    )
    seen = _seen(1, 1, "none", "null") + _seen(2, 1, "none", '{"a":1,"n":1}') + _seen(3, 1, "2 2", '{"n":2}')
    repeated, lost, wrong = warm_check(log, seen, _warm_run(1, 2, 1), 3)
    assert repeated == [2, 3]  # 2: its failed attempt finished too; 3: started twice
    assert lost == [3]  # never done
    assert any("a failed attempt's command finished too" in w for w in wrong)
    assert "iteration 2 attempt 1 started from state 'none', not '1 1'" in wrong
    assert any(w.startswith("iteration 3 attempt 1 saw the previous control") for w in wrong)
    _, lost, wrong = warm_check("start 1 2 p 1\ndone 1 2\n", "", _warm_run(2), 1)
    assert wrong == ["iteration 1: recorded attempt(s) [1] never started their command"] and lost == []
    repeated, lost, wrong = warm_check("start 1 1 p 1\nstart 1 2 p 2\ndone 1 2\n", "", _warm_run(1), 1)
    assert repeated == [1] and lost == [1]
    assert wrong == ["iteration 1: attempts [1, 2] ran, the status records 1"]
    _, lost, _ = warm_check("", "", _warm_run(1, phase="Failed"), 1)
    assert lost == [1]


def test_the_warm_manifest_is_a_valid_warm_run_with_a_retry_per_pod_kill() -> None:
    config = Config(warm=True, kinds=WARM_KINDS, faults=6, hold=True, hold_iteration=5, iterations=5)
    (claim, run) = yaml.safe_load_all(manifest(config, "chaos-000"))
    assert claim["kind"] == "PersistentVolumeClaim"
    step = run["spec"]["workflow"]["steps"][0]
    assert step["retries"] == 7 and step["retryBackoffSeconds"] == 0
    assert step["loop"]["warm"] == {"idleSeconds": WARM_IDLE_SECONDS}
    assert run["spec"]["workload"]["command"] == ["sh", "-c"]
    from agentrun_operator.api import agentrun_errors

    assert agentrun_errors(run) == []


def test_the_warm_workload_logs_what_it_saw(tmp_path: Path) -> None:
    """The run's script by hand (sh standing in for busybox), the operator's part played here: each
    iteration gets the previous one's control as AGENTRUN_PREVIOUS_CONTROL; a container's count
    (in its own /tmp, here a directory of the test's) goes on across the iterations it runs."""
    doc = list(yaml.safe_load_all(manifest(Config(warm=True, iteration_seconds=0), "c")))[1]
    script = doc["spec"]["workload"]["args"][0].replace("/workspace", str(tmp_path))
    script = script.replace("/tmp/chaos-count", str(tmp_path / "count"))
    control = tmp_path / ".agentrun" / "control.json"
    previous = "null"
    for k in (1, 2, 3):
        env = dict(
            os.environ,
            AGENTRUN_ITERATION=str(k),
            AGENTRUN_ATTEMPT="1",
            AGENTRUN_PREVIOUS_CONTROL=previous,
            AGENTRUN_LOOP_CONTROL_PATH=str(control),
        )
        subprocess.run(["sh", "-c", script], env=env, check=True)
        previous = json.dumps(json.loads(control.read_text()), separators=(",", ":"), sort_keys=True)
    log, seen = (tmp_path / "chaos.log").read_text(), (tmp_path / "seen.log").read_text()
    assert warm_check(log, seen, _warm_run(1, 1, 1), 3) == ([], [], [])
    assert warm_iterations(log) == 2
