"""Which runtime `agentrun dev up` runs the pods with (docs/local-dev.md#real-node): the pod runner
(`process`) or the real node (`kubelet`); what runs keeps running until `dev down`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrun_devcluster import dev
from agentrun_devcluster.controlplane import ControlPlaneError


def heartbeat(home: Path, runtime: str) -> None:
    (home / "run").mkdir(parents=True, exist_ok=True)
    (home / "run" / "pod-runner.health.json").write_text(json.dumps({"watching": True, "runtime": runtime}))


@pytest.mark.parametrize(
    ("requested", "running", "chosen"),
    [
        (None, None, "process"),
        ("kubelet", None, "kubelet"),
        (None, "process", "process"),
        ("process", "process", "process"),
        (None, "kubelet", "kubelet"),
    ],
)
def test_up_keeps_the_runtime_that_runs(requested: str | None, running: str | None, chosen: str) -> None:
    assert dev.choose_runtime(requested, running) == chosen


def test_asking_up_for_another_runtime_while_one_runs_is_refused() -> None:
    with pytest.raises(ControlPlaneError) as refused:
        dev.choose_runtime("kubelet", "process")
    assert "--runtime process" in str(refused.value)
    assert "`agentrun dev down`, then `agentrun dev up --runtime kubelet`" in str(refused.value)


def test_the_runtime_is_read_from_the_heartbeat_until_down_removes_it(tmp_path: Path) -> None:
    assert dev.running_runtime(tmp_path) is None
    heartbeat(tmp_path, "process")
    assert dev.running_runtime(tmp_path) == "process"
    heartbeat(tmp_path, "docker")  # a runner of a version that still had the docker runtime
    assert dev.running_runtime(tmp_path) is None
    (tmp_path / "run" / "pod-runner.health.json").write_text("not json")
    assert dev.running_runtime(tmp_path) is None


def test_dev_up_asks_for_no_runtime_unless_given_and_knows_only_the_two() -> None:
    from agentrun_operator.cli import build_parser

    assert build_parser().parse_args(["dev", "up"]).runtime is None
    assert build_parser().parse_args(["dev", "up", "--runtime", "kubelet"]).runtime == "kubelet"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["dev", "up", "--runtime", "docker"])
