"""The chaos suite at the size `make test` runs (any size by hand: docs/development.md#chaos)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.run import WARM_KINDS, Config, run


def _require_the_local_default() -> None:
    from agentrun_devcluster import toolchain
    from agentrun_devcluster.podrunner.sandbox import SandboxUnavailable, find_bwrap

    if not all(toolchain.is_built(t) for t in toolchain.TOOLS):
        pytest.skip(
            f"the local control plane is not built (cache: {toolchain.bin_dir()}); `agentrun dev tools`"
        )
    try:
        find_bwrap()
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))


def test_runs_survive_one_fault_of_each_kind(tmp_path: Path) -> None:
    _require_the_local_default()
    # Held in iteration 1 until every fault is in: each fault meets running containers (the
    # restarted runner adopts them), however fast or slow this machine is.
    # Every kind still goes in once, each after the one before has healed (its recovery command
    # returned); the freeze is short but real: requests hang while the API server is stopped.
    config = Config(
        runs=2,
        iterations=2,
        faults=1,
        iteration_seconds=1.0,
        freeze_seconds=2.0,
        gap=0.5,
        timeout=600,
        hold=True,
    )
    report = run(config, tmp_path / "dev")
    print(report.summary())
    assert sum(report.injected.values()) == len(config.kinds), report.summary()
    assert len(report.phases) == 2
    assert report.adopted >= 2, report.summary()  # the two held pods, after the runner restart
    assert report.wrong_terminal == {}, report.summary()
    assert not any(report.repeated.values()), report.summary()
    assert not any(report.lost.values()), report.summary()


def test_every_retry_starts_from_its_iterations_checkpoint_under_faults(tmp_path: Path) -> None:
    """`--checkpoints` at a small size (docs/development.md#chaos): each run's loop records a
    checkpoint per iteration and restores it for a retry; one iteration's first attempt per run
    dirties the workspace and fails (iterations 3, 1, 1 from seed 0). Held in iteration 1 while the
    operator, the API server and the pod runner are killed, so the faults meet the failing attempts
    of two runs. Every retry must start with its iteration's start hash, each iteration done once."""
    _require_the_local_default()
    config = Config(
        runs=3,
        iterations=3,
        faults=1,
        kinds=("operator-kill", "apiserver-restart", "runner-restart"),
        iteration_seconds=1.0,
        gap=0.5,
        timeout=600,
        hold=True,
        checkpoints=True,
    )
    report = run(config, tmp_path / "dev")
    print(report.summary())
    assert not report.error, report.summary()
    assert sum(report.injected.values()) == 3, report.summary()
    assert report.fail_iterations == {"chaos-000": 3, "chaos-001": 1, "chaos-002": 1}
    assert report.wrong_terminal == {}, report.summary()
    assert report.retries_checked == 3, report.summary()
    assert not any(report.restore_mismatch.values()), report.summary()
    assert report.not_retried == [], report.summary()
    assert not any(report.repeated.values()), report.summary()
    assert not any(report.lost.values()), report.summary()
    assert report.ok


def test_every_candidate_runs_once_and_the_winners_chain_survives_faults(tmp_path: Path) -> None:
    """`--candidates 2` at a small size (docs/development.md#chaos-candidates): each iteration runs two
    candidates on copies of its start and promotes the higher score. Held in iteration 1 (both
    candidates' pods running) while the operator and the pod runner are killed. Every candidate must
    run once, each iteration start from the previous winner's files, the workspace end as the
    winners' chain and every record say its winner was promoted."""
    _require_the_local_default()
    config = Config(
        runs=2,
        iterations=3,
        faults=1,
        kinds=("operator-kill", "runner-restart"),
        iteration_seconds=1.0,
        gap=0.5,
        timeout=600,
        hold=True,
        candidates=2,
    )
    report = run(config, tmp_path / "dev")
    print(report.summary())
    assert not report.error, report.summary()
    assert sum(report.injected.values()) == 2, report.summary()
    assert report.wrong_terminal == {}, report.summary()
    assert not any(report.repeated.values()), report.summary()
    assert not any(report.lost.values()), report.summary()
    assert not any(report.candidates_wrong.values()), report.summary()
    assert report.ok


def test_warm_iterations_run_once_each_seeing_the_last_under_faults(tmp_path: Path) -> None:
    """`--warm` at a small size (docs/development.md#chaos-warm): each run's loop runs its
    iterations in one live pod. Held in iteration 2 (a pod's second iteration, started over the
    channel) while the operator is killed and a warm pod is deleted mid-iteration: every iteration
    must be recorded once, each recorded attempt's command start once (the deleted pod's attempt
    retried in a new pod), and each iteration see the previous one's control and state."""
    _require_the_local_default()
    config = Config(
        runs=2,
        iterations=3,
        faults=1,
        kinds=WARM_KINDS,
        iteration_seconds=1.0,
        gap=0.5,
        timeout=600,
        hold=True,
        hold_iteration=2,
        warm=True,
    )
    report = run(config, tmp_path / "dev")
    print(report.summary())
    assert not report.error, report.summary()
    assert sum(report.injected.values()) == 2, report.summary()
    assert len(report.warm_pods_killed) == 1, report.summary()
    assert report.wrong_terminal == {}, report.summary()
    assert not any(report.repeated.values()), report.summary()
    assert not any(report.lost.values()), report.summary()
    assert not any(report.warm_wrong.values()), report.summary()
    assert report.warm_iterations >= 2, report.summary()  # each run's iteration 2 in its first pod
    assert report.warm_attempts == 7, report.summary()  # 6 iterations, one retried after the kill
    assert report.ok
