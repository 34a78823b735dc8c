"""What the tests start, they stop: a real dockerd (Debian's docker.io, as `agentrun dev engine` starts
it) started by the Makefile's `test` target or by a pytest run is gone when they end, with its
containerd, also when the tests fail or the run is interrupted; a dockerd that was running before is
left running (docs/development.md#docker).

Each test has an engine of its own (`AGENTRUN_CACHE_DIR` and a `DOCKER_HOST` socket in a directory
of its own), so the engine the rest of the docker tier uses is never touched. The Makefile's `test`
target runs for real with its tools replaced by stand-ins: the image step and pytest each only make
sure an engine answers (what `agentrun dev image` and the `docker_image` fixture do first), the rest
succeed at once. The decision itself and its corner cases (other sessions still using the engine, a
session killed with -9, a pid used again) are tested in tests/unit/test_docker_engine_session.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentrun_devcluster import dockerengine, processes

REPO = Path(__file__).resolve().parents[2]
ENSURE = "from agentrun_devcluster import dockerengine; dockerengine.ensure_engine(print)"


@dataclass(frozen=True)
class Engine:
    """The test's own engine: its state directory and the environment that points at it."""

    state: Path
    env: dict[str, str]

    def answers(self) -> bool:
        proc = subprocess.run(
            [dockerengine.docker_cli(), "version", "--format", "{{.Server.Version}}"],
            env=self.env,
            capture_output=True,
            timeout=20,
            check=False,
        )
        return proc.returncode == 0

    def processes(self) -> list[str]:
        """The command lines of the processes that belong to it (dockerd, its containerd, shims)."""
        found = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if str(self.state) in cmdline:
                    found.append(f"{proc.name}: {cmdline}")
        return found

    def assert_gone(self) -> None:
        assert not self.answers(), "the engine still answers"
        deadline = time.monotonic() + 10  # its processes are reaped by whoever is their parent
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert self.processes() == []
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        assert [m for m in mounts if str(self.state) in m] == [], "a mount of it stays"


@pytest.fixture(scope="module")
def dockerd() -> str:
    """Debian's dockerd, installed (as the engine start does) where it is missing and we are root."""
    if os.environ.get("AGENTRUN_DOCKER") == "0":
        pytest.skip("AGENTRUN_DOCKER=0: the Docker tiers are switched off")
    if os.geteuid() != 0:
        pytest.skip("starting a dockerd needs root")
    for tool in ("make", "setsid"):
        if shutil.which(tool) is None:
            pytest.skip(f"no {tool} on PATH")
    try:
        dockerengine.docker_cli()
        # Under the lock the engine start installs with: not beside another apt-get of these tests.
        with processes.exclusive(dockerengine.state_dir() / ".lock"):
            if shutil.which(dockerengine.DOCKERD) is None:
                dockerengine.apt_install(["docker.io"], "a Docker engine", print)
    except dockerengine.EngineUnavailable as exc:
        pytest.skip(f"no Docker engine can run here: {exc}")
    path = shutil.which(dockerengine.DOCKERD)
    assert path is not None
    return path


@pytest.fixture
def engine(dockerd: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    # Short: containerd's sockets live under the engine's exec root (a unix socket path has 107 bytes).
    home = Path(tempfile.mkdtemp(prefix="agentrun-engine-", dir="/tmp"))
    monkeypatch.setenv("AGENTRUN_CACHE_DIR", str(home))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{home}/docker.sock")
    for name in (dockerengine.SESSION_ENV, "AGENTRUN_DOCKER", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"):
        monkeypatch.delenv(name, raising=False)
    for name in [n for n in os.environ if n.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))]:
        monkeypatch.delenv(name)  # the runs below are not this run's workers
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    own = Engine(dockerengine.state_dir(), dict(os.environ))
    try:
        yield own
    finally:
        dockerengine.stop_engine()
        shutil.rmtree(home, ignore_errors=True)


def stand_in_tools(venv: Path, pytest_does: str) -> None:
    """A venv for the Makefile whose `agentrun dev image` and `pytest` only make sure an engine
    answers; pytest then fails, succeeds, or waits to be interrupted (`pytest_does`)."""
    bin_dir = venv / "bin"
    bin_dir.mkdir(parents=True)
    python = sys.executable
    scripts = {
        "agentrun": f'[ "$*" = "dev image --with-busybox" ] && exec {python} -c "{ENSURE}"; exit 0',
        "python": f'[ "$2" = agentrun_devcluster.dockerengine ] && exec {python} "$@"; exit 0',
        "pytest": f'{python} -c "{ENSURE}" || exit 3; {pytest_does}',
        "ruff": "exit 0",
        "mypy": "exit 0",
        "coverage": "exit 0",
        "bwrap": "exit 0",
    }
    for name, body in scripts.items():
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
    (bin_dir / ".installed").touch()  # newer than pyproject.toml: `setup` has nothing to do


def make_test(venv: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["make", "-C", str(REPO), "--no-print-directory", "test", f"VENV={venv}"],
        env={**env, "PATH": f"{venv / 'bin'}:{env['PATH']}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, like a terminal's foreground job
    )


def test_make_test_stops_the_engine_it_started_when_its_tests_fail(engine: Engine, tmp_path: Path) -> None:
    stand_in_tools(tmp_path / "venv", "exit 1")
    assert not engine.answers()
    run = make_test(tmp_path / "venv", engine.env)
    out, _ = run.communicate(timeout=300)
    assert run.returncode != 0, out
    assert "docker engine: stopped the dockerd the tests started" in out, out
    engine.assert_gone()


def test_make_test_stops_the_engine_it_started_when_interrupted(engine: Engine, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    stand_in_tools(tmp_path / "venv", f"touch {ready}; exec sleep 600")
    run = make_test(tmp_path / "venv", engine.env)
    deadline = time.monotonic() + 240
    while not ready.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ready.exists(), run.communicate(timeout=30)[0]
    assert engine.answers()
    os.killpg(run.pid, signal.SIGINT)  # Ctrl-C: make, its shell and the foreground pytest
    out, _ = run.communicate(timeout=120)
    assert run.returncode != 0, out
    assert "docker engine: stopped the dockerd the tests started" in out, out
    engine.assert_gone()


def test_make_test_leaves_an_engine_that_was_running_before(engine: Engine, tmp_path: Path) -> None:
    dockerengine.ensure_engine(print)  # the user's own: `agentrun dev engine`, no test session
    record = processes.read_record(engine.state / "run", dockerengine.DOCKERD)
    assert record is not None and record.alive()
    stand_in_tools(tmp_path / "venv", "exit 0")
    run = make_test(tmp_path / "venv", engine.env)
    out, _ = run.communicate(timeout=300)
    assert run.returncode == 0, out
    assert "docker engine: the dockerd that runs was started outside the tests: left running" in out, out
    assert record.alive() and engine.answers()


def test_a_pytest_run_stops_the_engine_it_started_when_terminated(engine: Engine, tmp_path: Path) -> None:
    """A pytest run outside `make test`, with an xdist worker as in the suite: the worker starts the
    engine, a SIGTERM to pytest (a CI timeout) ends the run, and the run's end stops the engine."""
    ready = tmp_path / "ready"
    tests = tmp_path / "run"
    tests.mkdir()
    # The session hooks of the suite's own conftest, on a test file of their own.
    (tests / "conftest.py").write_text("from tests.conftest import pytest_configure, pytest_unconfigure\n")
    (tests / "test_uses_the_engine.py").write_text(
        "import pathlib, time\n"
        "def test_uses_the_engine():\n"
        f"    {ENSURE.replace('; ', chr(10) + '    ')}\n"
        f"    pathlib.Path({str(ready)!r}).touch()\n"
        "    time.sleep(600)\n"
    )
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "1",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tests),
            str(tests),
        ],
        cwd=tests,
        env=engine.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not ready.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready.exists(), run.communicate(timeout=30)[0]
        assert engine.answers()
        run.send_signal(signal.SIGTERM)  # to pytest only, not to its worker
        out, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert "docker engine: stopped the dockerd the tests started" in out, out
    engine.assert_gone()
