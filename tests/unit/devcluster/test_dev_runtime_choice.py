"""Which runtime `agentrun dev up` and `dev restart pod-runner` run the pod runner with
(docs/local-dev.md#docker-runtime): the runner keeps its runtime until `dev down`."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agentrun_devcluster import dev, processes
from agentrun_devcluster.controlplane import ControlPlaneError


def heartbeat(home: Path, runtime: str) -> None:
    (home / "run").mkdir(parents=True, exist_ok=True)
    (home / "run" / "pod-runner.health.json").write_text(json.dumps({"watching": True, "runtime": runtime}))


@pytest.mark.parametrize(
    ("requested", "running", "chosen"),
    [
        (None, None, "process"),
        ("docker", None, "docker"),
        ("auto", None, "auto"),
        (None, "docker", "docker"),
        ("auto", "docker", "docker"),
        ("docker", "docker", "docker"),
        ("process", "process", "process"),
    ],
)
def test_up_keeps_the_runtime_of_the_runner_it_started(
    requested: str | None, running: str | None, chosen: str
) -> None:
    assert dev.choose_runtime(requested, running) == chosen


def test_asking_up_for_another_runtime_while_the_runner_has_one_is_refused() -> None:
    with pytest.raises(ControlPlaneError) as refused:
        dev.choose_runtime("docker", "process")
    assert "--runtime process" in str(refused.value)
    assert "`agentrun dev down`, then `agentrun dev up --runtime docker`" in str(refused.value)


def test_the_runtime_is_read_from_the_heartbeat_until_down_removes_it(tmp_path: Path) -> None:
    assert dev.running_runtime(tmp_path) is None
    heartbeat(tmp_path, "docker")
    assert dev.running_runtime(tmp_path) == "docker"
    (tmp_path / "run" / "pod-runner.health.json").write_text("not json")
    assert dev.running_runtime(tmp_path) is None


def test_restart_starts_the_runner_again_with_its_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    heartbeat(tmp_path, "docker")
    plane = SimpleNamespace(home=tmp_path, run_dir=tmp_path / "run", is_up=lambda: True)
    started: list[str] = []

    def start_runner(_plane: Any, namespaces: tuple[str, ...] = (), runtime: str = "process") -> None:
        started.append(runtime)

    monkeypatch.setattr(dev, "control_plane", lambda home=None: plane)
    monkeypatch.setattr(dev, "start_runner", start_runner)
    monkeypatch.setattr(processes, "stop_process", lambda *a, **k: True)
    monkeypatch.setattr(processes, "read_record", lambda *a, **k: None)
    assert dev.restart("pod-runner") == 0
    assert started == ["docker"]


def test_dev_up_asks_for_no_runtime_unless_given() -> None:
    from agentrun_operator.cli import build_parser

    assert build_parser().parse_args(["dev", "up"]).runtime is None
    assert build_parser().parse_args(["dev", "up", "--runtime", "docker"]).runtime == "docker"
