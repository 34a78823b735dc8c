"""The built image, run for real with `docker run` (the `docker_image` fixture builds it once, or
skips with the reason where no Docker engine answers and none can be started)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from agentrun_devcluster.dockerengine import docker_cli
from agentrun_operator import __version__
from agentrun_operator.control.envelope import decode_envelope

CONTROL = "/workspace/.agentrun/loop-control.json"
FINGERPRINT = "/meta/fingerprint.json"
TERMINATION = "/meta/termination-log"


def docker_run(image: str, *args: str, mounts: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    argv = [docker_cli(), "run", "--rm", "--network", "none"]
    for mount in mounts:
        argv += ["--mount", mount]
    return subprocess.run([*argv, image, *args], capture_output=True, text=True, timeout=180, check=False)


def test_version_runs_as_the_non_root_user(docker_image: str) -> None:
    proc = docker_run(docker_image, "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"agentrun {__version__}"
    ids = subprocess.run(
        [
            docker_cli(),
            "run",
            "--rm",
            "--entrypoint",
            "sh",
            docker_image,
            "-c",
            "id -u; id -g; agentrun --version",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert ids.returncode == 0, ids.stderr
    assert ids.stdout.split("\n")[:3] == ["10001", "10001", f"agentrun {__version__}"]


def test_operator_command_is_there(docker_image: str) -> None:
    proc = docker_run(docker_image, "operator", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--liveness-port" in proc.stdout


def test_the_image_holds_no_dev_cluster_and_no_cryptography(docker_image: str) -> None:
    """The image installs the operator's wheel only (docs/development.md#dev-cluster-package)."""
    probe = (
        "import importlib.util as u;"
        "print([m for m in ('agentrun_operator', 'agentrun_devcluster', 'cryptography') if u.find_spec(m)])"
    )
    found = subprocess.run(
        [
            docker_cli(),
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            "python",
            docker_image,
            "-c",
            probe,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "['agentrun_operator']"
    dev = docker_run(docker_image, "dev", "status")
    assert dev.returncode == 2
    assert "pip install -e operator/devcluster" in dev.stderr


class PodFiles:
    """A workspace (the PVC) and a meta directory (the emptyDir) on the host, mounted as a pod would."""

    def __init__(self, root: Path) -> None:
        self.workspace = root / "workspace"
        self.meta = root / "meta"
        for directory in (self.workspace, self.meta):
            directory.mkdir()
            directory.chmod(0o777)  # the image runs as uid 10001

    @property
    def control(self) -> Path:
        return self.workspace / ".agentrun" / "loop-control.json"

    def write_control(self, doc: object) -> None:
        self.control.parent.mkdir(parents=True, exist_ok=True)
        self.control.write_text(json.dumps(doc))

    def mounts(self) -> list[str]:
        return [
            f"type=bind,source={self.workspace},target=/workspace,readonly",
            f"type=bind,source={self.meta},target=/meta",
        ]

    def reporter(self, image: str, *args: str) -> None:
        proc = docker_run(image, "reporter", *args, mounts=self.mounts())
        assert proc.returncode == 0, proc.stderr

    def fingerprint(self, image: str) -> None:
        self.reporter(image, "fingerprint", "--path", CONTROL, "--out", FINGERPRINT)

    def report(self, image: str) -> dict[str, object]:
        self.reporter(
            image, "report", "--path", CONTROL, "--fingerprint", FINGERPRINT, "--termination-log", TERMINATION
        )
        envelope = decode_envelope((self.meta / "termination-log").read_text())
        return dataclasses.asdict(envelope)


@pytest.fixture
def pod(tmp_path: Path) -> PodFiles:
    tmp_path.chmod(0o755)
    return PodFiles(tmp_path)


def test_reporter_found(docker_image: str, pod: PodFiles) -> None:
    pod.fingerprint(docker_image)
    pod.write_control({"continue": False, "outputs": {"n": 3}})
    envelope = pod.report(docker_image)
    assert envelope["status"] == "found", envelope
    assert envelope["control"] == {"continue": False, "outputs": {"n": 3}}


def test_reporter_missing(docker_image: str, pod: PodFiles) -> None:
    pod.fingerprint(docker_image)
    envelope = pod.report(docker_image)
    assert envelope["status"] == "missing", envelope
    assert CONTROL in str(envelope["reason"])


def test_reporter_stale(docker_image: str, pod: PodFiles) -> None:
    pod.write_control({"continue": True})
    pod.fingerprint(docker_image)  # the file is already there before "main" runs, and is not rewritten
    envelope = pod.report(docker_image)
    assert envelope["status"] == "stale", envelope
