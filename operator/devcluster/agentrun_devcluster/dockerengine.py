"""A Docker engine that answers: the one already running, else one we start (root, Debian).

The image build (`agentrun dev image`), the local base images, the docker test tier and the real
node's images all need an engine. When none answers and we are root on a Debian-like
host, Debian's `docker.io` package is installed (apt-get) and `dockerd` is started with the flags
that work without a network of its own: `--iptables=false --bridge=none` (builds and the image tests'
containers use the host's network), and `--storage-driver=overlay2` when the
kernel mounts an overlay here, else `vfs` (which works everywhere but copies a whole image for every
container: a container of the operator image takes seconds to create instead of a fraction). Its
data, exec root, pid file and log live under `<cache>/docker/`; it listens on the default socket,
so the plain `docker` CLI finds it. Every failure is an `EngineUnavailable` with a one-line reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from agentrun_devcluster import processes, toolchain
from agentrun_devcluster.processes import exclusive

DOCKERD = "dockerd"
DOCKERD_FLAGS = ("--iptables=false", "--bridge=none")
START_TIMEOUT = 60.0
Progress = Callable[[str], None]


class EngineUnavailable(RuntimeError):
    """No Docker engine answers and none can be started here; the message says why, in one line."""


def state_dir() -> Path:
    """Where a dockerd we start keeps its data, exec root, pid file and log."""
    return toolchain.cache_root() / "docker"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def docker_cli() -> str:
    """The `docker` client, or EngineUnavailable."""
    path = shutil.which("docker") or next(
        (p for p in ("/usr/local/bin/docker", "/usr/bin/docker") if os.access(p, os.X_OK)), None
    )
    if path is None:
        raise EngineUnavailable(
            "no docker client on PATH (install Debian's docker.io, or run `agentrun dev engine` as root)"
        )
    return path


def docker(
    *args: str, timeout: float = 60.0, input_bytes: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the docker client; never raises on a non-zero exit (callers read returncode and stderr)."""
    try:
        return subprocess.run(
            [docker_cli(), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            input=None if input_bytes is None else input_bytes.decode(),
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess([docker_cli(), *args], 124, "", f"docker {args[0]} timed out")


def engine_problem() -> str | None:
    """Why no engine answers, or None when one does."""
    try:
        proc = docker("version", "--format", "{{.Server.Version}}", timeout=20)
    except EngineUnavailable as exc:
        return str(exc)
    if proc.returncode == 0 and proc.stdout.strip():
        return None
    return f"no Docker engine answers ({_last_line(proc.stderr)})"


def _lock() -> contextlib.AbstractContextManager[None]:
    """One engine start (or base build) at a time across processes (pytest and make may race)."""
    return exclusive(state_dir() / ".lock")


def apt_install(packages: Sequence[str], what: str, progress: Progress) -> None:
    """Install Debian packages as root (one `apt-get update` first when the install fails)."""
    if os.geteuid() != 0:
        raise EngineUnavailable(f"{what} needs {', '.join(packages)}, and only root can install them")
    if shutil.which("apt-get") is None:
        raise EngineUnavailable(f"{what} needs {', '.join(packages)}; this host has no apt-get (not Debian)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]
    progress(f"installing {' '.join(packages)} (apt-get) for {what}")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env, check=False)
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise EngineUnavailable(f"apt-get install {' '.join(packages)} failed: {_last_line(proc.stderr)}")


def overlay_works(scratch: Path) -> bool:
    """True when an overlay filesystem can be mounted here (root, a kernel with overlay, a backing
    filesystem that supports it); probed with a real mount under `scratch`."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    dirs = {name: scratch / name for name in ("lower", "upper", "work", "merged")}
    try:
        for directory in dirs.values():
            directory.mkdir(parents=True, exist_ok=True)
        options = f"lowerdir={dirs['lower']},upperdir={dirs['upper']},workdir={dirs['work']}"
        mounted = subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", options, str(dirs["merged"])],
            capture_output=True,
            check=False,
        )
        if mounted.returncode != 0:
            return False
        subprocess.run(["umount", str(dirs["merged"])], capture_output=True, check=False)
        return True
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def storage_driver(state: Path) -> str:
    """overlay2 where it works, else vfs; `AGENTRUN_DOCKER_STORAGE_DRIVER` overrides."""
    chosen = os.environ.get("AGENTRUN_DOCKER_STORAGE_DRIVER")
    if chosen:
        return chosen
    return "overlay2" if overlay_works(state / "overlay-probe") else "vfs"


def dockerd_argv(dockerd: str, state: Path, driver: str) -> list[str]:
    """The dockerd command line: our flags, everything it writes under `state`."""
    return [
        dockerd,
        f"--storage-driver={driver}",
        *DOCKERD_FLAGS,
        f"--data-root={state / 'data'}",
        f"--exec-root={state / 'exec'}",
        f"--pidfile={state / 'dockerd.pid'}",
    ]


def ensure_engine(progress: Progress | None = None) -> None:
    """Make sure an engine answers: use a running one, else start ours; EngineUnavailable says why not."""
    say = progress or (lambda _m: None)
    if engine_problem() is None:
        return
    with _lock():
        problem = engine_problem()
        if problem is None:
            return
        if os.geteuid() != 0:
            raise EngineUnavailable(
                f"{problem}; not root, so none can be started here (start one, or run as root)"
            )
        if shutil.which(DOCKERD) is None:
            apt_install(["docker.io"], "a Docker engine", say)
        dockerd = shutil.which(DOCKERD)
        if dockerd is None:
            raise EngineUnavailable("docker.io was installed but dockerd is not on PATH")
        state = state_dir()
        run_dir = state / "run"
        log = state / "dockerd.log"
        processes.stop_process(run_dir, DOCKERD)  # a stale record of one that died
        argv = dockerd_argv(dockerd, state, storage_driver(state))
        say(f"starting {' '.join(argv[:4])}; data and log under {state}")
        proc = processes.start_process(run_dir, DOCKERD, argv, log)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if engine_problem() is None:
                say(f"dockerd ready (pid {proc.pid}, log {log})")
                return
            if proc.poll() is not None:
                tail = log.read_text(errors="replace") if log.exists() else ""
                raise EngineUnavailable(
                    f"dockerd exited {proc.returncode} at start: {_last_line(tail)} (log {log})"
                )
            time.sleep(0.5)
        processes.stop_process(run_dir, DOCKERD)
        raise EngineUnavailable(f"dockerd did not answer within {START_TIMEOUT:.0f}s (log {log})")


def stop_engine() -> bool:
    """Stop the dockerd we started (its containers stop with it); False when we started none."""
    return processes.stop_process(state_dir() / "run", DOCKERD, grace=30)


def image_exists(ref: str) -> bool:
    return docker("image", "inspect", "--format", "{{.Id}}", ref, timeout=30).returncode == 0
