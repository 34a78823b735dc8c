"""Bad input on the Docker side, each a clear one-line reason, and the process path still working:
no Docker engine (a `DOCKER_HOST` where nothing listens), not root, a failed base build step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentrun_devcluster import baseimages, dockerengine
from agentrun_devcluster.podrunner.runtime import RuntimeUnavailable, make_runtime
from agentrun_devcluster.podrunner.sandbox import SandboxUnavailable, find_bwrap


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    host = f"unix://{tmp_path}/nothing-listens.sock"
    monkeypatch.setenv("DOCKER_HOST", host)
    return host


def one_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, text
    return lines[0]


def test_no_engine_is_one_line(no_engine: str) -> None:
    problem = dockerengine.engine_problem()
    assert problem is not None
    assert one_line(problem).startswith("no Docker engine answers (")


def test_not_root_cannot_start_one(no_engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dockerengine.os, "geteuid", lambda: 1000)
    with pytest.raises(dockerengine.EngineUnavailable) as info:
        dockerengine.ensure_engine()
    assert "not root" in one_line(str(info.value))
    with pytest.raises(dockerengine.EngineUnavailable, match="only root can install"):
        dockerengine.apt_install(["docker.io"], "a Docker engine", print)


def test_docker_runtime_without_an_engine_is_refused(no_engine: str) -> None:
    with pytest.raises(RuntimeUnavailable) as info:
        make_runtime("docker", "node", "/usr/bin")
    assert one_line(str(info.value)).startswith("the docker runtime needs a Docker engine: no Docker engine")


def test_auto_falls_back_to_the_process_runtime(no_engine: str) -> None:
    try:
        find_bwrap()
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))
    assert make_runtime("auto", "node", "/usr/bin").name == "process"


def test_the_pod_runner_says_why_in_one_line(no_engine: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentrun_operator.cli",
            "dev",
            "pod-runner",
            f"--kubeconfig={tmp_path / 'kubeconfig'}",
            f"--state-dir={tmp_path / 'state'}",
            "--runtime=docker",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert one_line(proc.stderr).startswith(
        "agentrun dev pod-runner: the docker runtime needs a Docker engine"
    )


def test_a_failed_build_step_is_one_line() -> None:
    with pytest.raises(baseimages.BaseImageError) as info:
        baseimages._run(["sh", "-c", "echo noise; echo 'E: the real reason' >&2; exit 3"], "debootstrap x")
    assert one_line(str(info.value)) == "debootstrap x failed (exit 3): E: the real reason"
