"""A Docker engine that answers: the one already running, else one we start (root, Debian).

The image build (`agentrun dev image`), the local base images, the docker test tier and the real
node's images all need an engine. When none answers and we are root on a Debian-like
host, Debian's `docker.io` package is installed (apt-get) and `dockerd` is started with the flags
that work without a network of its own: `--iptables=false --bridge=none` (builds and the image tests'
containers use the host's network), and `--storage-driver=overlay2` when the
kernel mounts an overlay here, else `vfs` (which works everywhere but copies a whole image for every
container: a container of the operator image takes seconds to create instead of a fraction). Its
data, exec root, pid file and log live under `<cache>/docker/`; it listens on the default socket,
so the plain `docker` CLI finds it (on `DOCKER_HOST` instead when that names a unix socket). Every
failure is an `EngineUnavailable` with a one-line reason.

Who started it is recorded, so a test run stops only what it started. A test run is a *session*: its
process id in `AGENTRUN_ENGINE_SESSION` (`make test` sets it to its shell's, a pytest run outside
`make test` to its own). Every `ensure_engine` inside a session registers the session as a user of
the engine (`<cache>/docker/sessions/<pid>.json`, with the process's start time, so a pid used again
is not taken for it); a dockerd started inside a session is marked as the tests'
(`<cache>/docker/started-by-tests.json`, naming that dockerd's pid). At its end the session calls
`end_session`: the dockerd is stopped when it is ours, the tests started it, and no other live session
uses it (`end_decision`). An engine that answered without us (the user's own) has no pid record of
ours, and one started outside a session (`agentrun dev engine`, `make image`) has no marker: both
are left running. A dockerd the tests started whose sessions all died (a `kill -9`) is stopped by the
next session that ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from agentrun_devcluster import processes, toolchain
from agentrun_devcluster.processes import exclusive

DOCKERD = "dockerd"
DOCKERD_FLAGS = ("--iptables=false", "--bridge=none")
START_TIMEOUT = 60.0
SESSION_ENV = "AGENTRUN_ENGINE_SESSION"
NOTHING_TO_STOP = "no dockerd of ours runs (an engine that answers is someone else's): nothing to stop"
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


def listen_address() -> str | None:
    """`DOCKER_HOST` when it names a unix socket (where the client will look), else None (the
    default socket)."""
    host = os.environ.get("DOCKER_HOST", "")
    return host if host.startswith("unix://") else None


def dockerd_argv(dockerd: str, state: Path, driver: str, host: str | None = None) -> list[str]:
    """The dockerd command line: our flags, everything it writes under `state`."""
    return [
        dockerd,
        f"--storage-driver={driver}",
        *DOCKERD_FLAGS,
        f"--data-root={state / 'data'}",
        f"--exec-root={state / 'exec'}",
        f"--pidfile={state / 'dockerd.pid'}",
        *([f"--host={host}"] if host else []),
    ]


# ----------------------------------------------------------------------------------- who started it


def current_session() -> int | None:
    """The test session this process belongs to (`AGENTRUN_ENGINE_SESSION`, a pid), or None."""
    value = os.environ.get(SESSION_ENV, "").strip()
    return int(value) if value.isdigit() else None


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat), or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None
    return fields[19] if len(fields) > 19 else None


def _sessions_dir() -> Path:
    return state_dir() / "sessions"


def _marker() -> Path:
    return state_dir() / "started-by-tests.json"


def _read_json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _register(session: int) -> None:
    """Record `session` as a user of the engine (with its start time); under the lock."""
    sessions = _sessions_dir()
    sessions.mkdir(parents=True, exist_ok=True)
    entry = {"pid": session, "start": _start_time(session)}
    (sessions / f"{session}.json").write_text(json.dumps(entry))


def live_sessions() -> list[int]:
    """The registered sessions whose process still runs (the entries of dead ones are removed)."""
    sessions = _sessions_dir()
    alive: list[int] = []
    for path in sorted(sessions.glob("*.json")) if sessions.is_dir() else []:
        entry = _read_json(path)
        pid, start = entry.get("pid"), entry.get("start")
        if isinstance(pid, int) and start is not None and _start_time(pid) == start:
            alive.append(pid)
        else:
            path.unlink(missing_ok=True)
    return alive


def started_by_tests(dockerd_pid: int) -> bool:
    """True when the marker says a test session started the dockerd with this pid."""
    return _read_json(_marker()).get("dockerd") == dockerd_pid


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP back while dockerd is started and recorded: a session
    interrupted at that moment still finds the pid record and the marker of the dockerd it
    started, and stops it. (On exec the child gets the default handlers back.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, lambda signum, _frame: received.append(signum)) for sig in held}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for signum in received:
            signal.raise_signal(signum)


def ensure_engine(progress: Progress | None = None) -> None:
    """Make sure an engine answers: use a running one, else start ours; EngineUnavailable says why not."""
    say = progress or (lambda _m: None)
    session = current_session()
    if session is not None:  # first, so the engine is not stopped by another session's end meanwhile
        with _lock():
            _register(session)
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
        argv = dockerd_argv(dockerd, state, storage_driver(state), listen_address())
        say(f"starting {' '.join(argv[:4])}; data and log under {state}")
        with _signals_deferred():
            proc = processes.start_process(run_dir, DOCKERD, argv, log)
            if session is None:  # started outside the tests: theirs to keep (`agentrun dev engine --stop`)
                _marker().unlink(missing_ok=True)
            else:
                _marker().write_text(json.dumps({"dockerd": proc.pid, "session": session}))
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
    """Stop the dockerd we started (its containers and its containerd stop with it); False when we
    started none."""
    stopped = processes.stop_process(state_dir() / "run", DOCKERD, grace=30)
    _marker().unlink(missing_ok=True)
    if stopped:
        # It leaves the host's network namespace bind-mounted under its exec root (made for
        # `--network host` builds and containers): released, so no mount of it stays behind either.
        netns = state_dir() / "exec" / "netns" / "default"
        if os.path.ismount(netns):
            subprocess.run(["umount", str(netns)], capture_output=True, check=False)
    return stopped


def keep_engine() -> bool:
    """Make a running dockerd the tests started the user's (`agentrun dev engine` outside a
    session): no session's end stops it. True when there was such a dockerd."""
    if not state_dir().is_dir():
        return False
    with _lock():
        record = processes.read_record(state_dir() / "run", DOCKERD)
        if record is None or not record.alive() or not started_by_tests(record.pid):
            return False
        _marker().unlink(missing_ok=True)
        return True


def end_decision(ours_running: bool, started_by_tests: bool, sessions_left: int) -> tuple[bool, str]:
    """At a session's end: stop the engine (True) or leave it, and why.

    `ours_running`: the dockerd our pid record names runs; `started_by_tests`: a test session
    started it; `sessions_left`: other live sessions registered as its users."""
    if not ours_running:
        return False, NOTHING_TO_STOP
    if not started_by_tests:
        return False, "the dockerd that runs was started outside the tests: left running"
    if sessions_left:
        return False, f"the dockerd the tests started is left running for {sessions_left} other session(s)"
    return True, "stopped the dockerd the tests started"


def end_session(session: int) -> str:
    """The end of a test session: unregister it, and stop the dockerd when `end_decision` says so.
    Returns the reason, one line."""
    registered = _sessions_dir() / f"{session}.json"
    if not registered.exists() and not processes.pid_file(state_dir() / "run", DOCKERD).exists():
        return NOTHING_TO_STOP  # without waiting for the lock (another run may be starting an engine)
    with _lock():
        registered.unlink(missing_ok=True)
        record = processes.read_record(state_dir() / "run", DOCKERD)
        running = record is not None and record.alive()
        by_tests = running and record is not None and started_by_tests(record.pid)
        stop, reason = end_decision(running, by_tests, len(live_sessions()))
        if stop:
            stop_engine()
        return reason


def image_exists(ref: str) -> bool:
    return docker("image", "inspect", "--format", "{{.Id}}", ref, timeout=30).returncode == 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m agentrun_devcluster.dockerengine end-session`: the end of the session named by
    `AGENTRUN_ENGINE_SESSION` (`make test` calls it on its way out, also on failure or interrupt)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args != ["end-session"]:
        print("usage: python -m agentrun_devcluster.dockerengine end-session", file=sys.stderr)
        return 2
    session = current_session()
    if session is None:
        print(f"docker engine: {SESSION_ENV} is not set: no session to end", file=sys.stderr)
        return 2
    print(f"docker engine: {end_session(session)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
