"""A runner killed between starting a container and writing its launch record: the next runner
finds the container by its shim (or the exit file the shim left) instead of starting it again."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrun_devcluster.podrunner import adopt
from tests.support.polling import eventually

UID = "0123456789abcdef"
POD = f"pods/ns/pod/{UID}"


@pytest.fixture
def shim(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A container's shim as the process runtime starts it (its own session), with no record."""
    exit_file = adopt.exit_file(tmp_path / POD, "main", 1)
    exit_file.parent.mkdir(parents=True)
    proc = subprocess.Popen(adopt.shim_argv(["sleep", "60"], exit_file), start_new_session=True)
    eventually(lambda: adopt.running_shims(tmp_path / POD), timeout=10, what="the shim to exec")
    yield proc
    with contextlib.suppress(ProcessLookupError):  # already stopped by the test
        os.killpg(proc.pid, signal.SIGKILL)  # the shim and its command
    proc.wait()


def test_a_running_unrecorded_container_is_found_by_its_shim(
    tmp_path: Path, shim: subprocess.Popen[bytes]
) -> None:
    pod_dir = tmp_path / POD
    recorded = {"main": _record(pod_dir, restart=0)}  # the restart before it was recorded
    found = adopt.unrecorded_launches(pod_dir, UID, ["main", "sidecar"], recorded, "t1")
    assert set(found) == {"main"}
    record = found["main"]
    assert (record.restart, record.pid) == (1, shim.pid)
    assert record.alive()
    assert record.container_id == f"agentrun://{UID[:8]}-main-1"
    assert adopt.any_alive(pod_dir)


def test_dev_down_stops_an_unrecorded_container_too(tmp_path: Path, shim: subprocess.Popen[bytes]) -> None:
    assert adopt.stop_leftovers(tmp_path) == 1
    shim.wait(timeout=10)
    assert not adopt.running_shims(tmp_path / POD)


def test_an_unrecorded_container_that_ended_is_found_by_its_exit_file(tmp_path: Path) -> None:
    exit_file = adopt.exit_file(tmp_path, "main", 0)
    exit_file.parent.mkdir(parents=True)
    subprocess.run(adopt.shim_argv(["sh", "-c", "exit 4"], exit_file), check=False)
    found = adopt.unrecorded_launches(tmp_path, UID, ["main"], {}, "t1")
    assert not found["main"].alive()
    assert found["main"].exit_code() == 4
    assert not adopt.any_alive(tmp_path)


def test_recorded_restarts_and_containers_that_never_started_are_not_found(tmp_path: Path) -> None:
    exit_file = adopt.exit_file(tmp_path, "main", 0)
    exit_file.parent.mkdir(parents=True)
    exit_file.write_text("0\n")
    recorded = {"main": _record(tmp_path, restart=0)}
    assert adopt.unrecorded_launches(tmp_path, UID, ["main", "other"], recorded, "t1") == {}


def _record(pod_dir: Path, restart: int) -> adopt.LaunchRecord:
    return adopt.LaunchRecord(
        name="main",
        restart=restart,
        pid=0,
        pid_start="",
        started_at="t0",
        container_id=f"agentrun://{UID[:8]}-main-{restart}",
        log=str(pod_dir / "logs" / "main" / f"{restart}.log"),
        exit_file=str(adopt.exit_file(pod_dir, "main", restart)),
    )
