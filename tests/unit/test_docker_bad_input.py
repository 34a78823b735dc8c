"""Bad input on the image build's Docker side, each a clear one-line reason: no Docker engine (a
`DOCKER_HOST` where nothing listens), not root, a failed base build step."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrun_devcluster import baseimages, dockerengine


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


def test_a_failed_build_step_is_one_line() -> None:
    with pytest.raises(baseimages.BaseImageError) as info:
        baseimages._run(["sh", "-c", "echo noise; echo 'E: the real reason' >&2; exit 3"], "debootstrap x")
    assert one_line(str(info.value)) == "debootstrap x failed (exit 3): E: the real reason"
