"""Who stops the Docker engine: a dockerd a test session started is stopped at the session's end, one
that was running before is left alone (agentrun_devcluster.dockerengine, docs/development.md#docker).

The decision itself is a pure function; the rest runs `ensure_engine` and `end_session` for real on a
state directory of the test's own, with a stand-in dockerd (`sleep` under the name `dockerd`, so the
pid record's check of the executable holds) and stand-in sessions (live and dead processes). The real
dockerd, the Makefile's `test` target and a pytest run are checked in tests/docker/test_engine_session.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentrun_devcluster import dockerengine, processes


@pytest.mark.parametrize(
    ("ours_running", "by_tests", "left", "stop", "why"),
    [
        (True, True, 0, True, "stopped the dockerd the tests started"),
        (True, True, 2, False, "left running for 2 other session(s)"),
        (True, False, 0, False, "started outside the tests: left running"),
        (False, False, 0, False, "no dockerd of ours runs"),
        (False, True, 0, False, "no dockerd of ours runs"),
    ],
)
def test_end_decision(ours_running: bool, by_tests: bool, left: int, stop: bool, why: str) -> None:
    decided, reason = dockerengine.end_decision(ours_running, by_tests, left)
    assert decided is stop
    assert why in reason


@dataclass
class Host:
    """A state directory of the test's own, a stand-in dockerd, and an engine that answers when
    the stand-in runs (or when `users_engine` says one of someone else's does)."""

    state: Path
    users_engine: bool = False

    def ours(self) -> processes.ProcessRecord | None:
        record = processes.read_record(self.state / "run", dockerengine.DOCKERD)
        return record if record is not None and record.alive() else None

    def answers(self) -> bool:
        return self.users_engine or self.ours() is not None


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    sleep = shutil.which("sleep")
    assert sleep is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dockerd").symlink_to(sleep)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("AGENTRUN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AGENTRUN_DOCKER_STORAGE_DRIVER", "vfs")
    monkeypatch.delenv(dockerengine.SESSION_ENV, raising=False)
    monkeypatch.setattr(dockerengine.os, "geteuid", lambda: 0)
    monkeypatch.setattr(dockerengine, "dockerd_argv", lambda dockerd, *_args: [dockerd, "600"])
    state = Host(tmp_path / "cache" / "docker")
    monkeypatch.setattr(dockerengine, "engine_problem", lambda: None if state.answers() else "none answers")
    yield state
    dockerengine.stop_engine()


@pytest.fixture
def spawn() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Stand-in session processes (each a `sleep`), stopped at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def session(spawn: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch) -> int:
    """A new live session, made this process's (AGENTRUN_ENGINE_SESSION)."""
    proc = subprocess.Popen(["sleep", "600"])
    spawn.append(proc)
    monkeypatch.setenv(dockerengine.SESSION_ENV, str(proc.pid))
    return proc.pid


def test_a_dockerd_the_session_started_is_stopped_at_its_end(
    host: Host, spawn: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = session(spawn, monkeypatch)
    dockerengine.ensure_engine()
    record = host.ours()
    assert record is not None
    assert json.loads((host.state / "started-by-tests.json").read_text()) == {
        "dockerd": record.pid,
        "session": mine,
    }
    assert dockerengine.live_sessions() == [mine]
    assert dockerengine.end_session(mine) == "stopped the dockerd the tests started"
    assert host.ours() is None and not record.alive()
    assert not (host.state / "started-by-tests.json").exists()
    assert dockerengine.live_sessions() == []


def test_an_engine_running_before_the_session_is_left_alone(
    host: Host, spawn: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    host.users_engine = True  # answers, and is no dockerd of ours
    mine = session(spawn, monkeypatch)
    dockerengine.ensure_engine()
    assert host.ours() is None, "nothing was started"
    assert "no dockerd of ours runs" in dockerengine.end_session(mine)
    assert host.answers()


def test_a_dockerd_started_outside_a_session_is_left_running(
    host: Host, spawn: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    dockerengine.ensure_engine()  # `agentrun dev engine`, `make image`: no session
    record = host.ours()
    assert record is not None
    assert not (host.state / "started-by-tests.json").exists()
    mine = session(spawn, monkeypatch)
    dockerengine.ensure_engine()  # the tests find it running
    assert "started outside the tests: left running" in dockerengine.end_session(mine)
    assert record.alive()


def test_the_last_session_using_it_stops_it(
    host: Host, spawn: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = session(spawn, monkeypatch)
    dockerengine.ensure_engine()
    record = host.ours()
    assert record is not None
    second = session(spawn, monkeypatch)  # another checkout's run, on the same engine
    dockerengine.ensure_engine()
    assert host.ours() == record, "the second found it running"
    assert "left running for 1 other session(s)" in dockerengine.end_session(first)
    assert record.alive()
    assert dockerengine.end_session(second) == "stopped the dockerd the tests started"
    assert not record.alive()


def test_a_dockerd_whose_sessions_died_is_stopped_by_the_next_session_to_end(
    host: Host, spawn: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    killed = session(spawn, monkeypatch)
    dockerengine.ensure_engine()
    record = host.ours()
    assert record is not None
    spawn[0].kill()  # `kill -9` of the session: it never ends its session
    spawn[0].wait()
    # A session entry whose pid runs but is another process (a pid used again) is no session either.
    recycled = session(spawn, monkeypatch)
    (host.state / "sessions" / f"{recycled}.json").write_text(json.dumps({"pid": recycled, "start": "1"}))
    assert dockerengine.live_sessions() == []
    assert killed != recycled
    nxt = session(spawn, monkeypatch)
    assert dockerengine.end_session(nxt) == "stopped the dockerd the tests started"
    assert not record.alive()


def test_agentrun_dev_engine_keeps_the_tests_dockerd(
    host: Host, spawn: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = session(spawn, monkeypatch)
    dockerengine.ensure_engine()
    record = host.ours()
    assert record is not None
    assert dockerengine.keep_engine()  # what `agentrun dev engine` does outside a session
    assert not dockerengine.keep_engine(), "already the user's"
    assert "started outside the tests" in dockerengine.end_session(mine)
    assert record.alive()


def test_a_start_in_an_interrupted_session_is_recorded_first() -> None:
    """SIGINT/SIGTERM while dockerd is started and recorded are held back until both are done."""
    done = []
    with pytest.raises(KeyboardInterrupt), dockerengine._signals_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        done.append("recorded")
    assert done == ["recorded"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_it_listens_where_the_client_looks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert dockerengine.listen_address() is None
    assert not any(a.startswith("--host") for a in dockerengine.dockerd_argv("dockerd", tmp_path, "vfs"))
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.1:2375")
    assert dockerengine.listen_address() is None
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/d.sock")
    host = dockerengine.listen_address()
    assert (
        dockerengine.dockerd_argv("dockerd", tmp_path, "vfs", host)[-1] == f"--host=unix://{tmp_path}/d.sock"
    )


def test_end_session_command(
    host: Host,
    spawn: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert dockerengine.main(["end-session"]) == 2
    assert "AGENTRUN_ENGINE_SESSION is not set" in capsys.readouterr().err
    session(spawn, monkeypatch)
    dockerengine.ensure_engine()
    assert dockerengine.main(["end-session"]) == 0
    assert capsys.readouterr().out == "docker engine: stopped the dockerd the tests started\n"
    assert dockerengine.main(["stop"]) == 2


def test_a_session_that_used_no_engine_ends_without_waiting(
    host: Host, spawn: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make unit`, `pytest --co`: no wait for the lock another run holds while it starts an engine."""
    mine = session(spawn, monkeypatch)
    ended: list[str] = []
    with processes.exclusive(host.state / ".lock"):
        thread = threading.Thread(target=lambda: ended.append(dockerengine.end_session(mine)), daemon=True)
        thread.start()
        thread.join(timeout=10)
        assert ended == [dockerengine.NOTHING_TO_STOP], "it waited for the lock"
    thread.join()
