"""`main`'s loop in a warm pod (jobs/warm.py `WARM_LOOP_SCRIPT`), run for real with the system's `sh`
and with busybox's when there is one, fed through its FIFO as the supervisor feeds it
(control/warm.py: the same functions write the env files and the ids)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrun_operator.control.warm import (
    FIFO_NAME,
    STOP_WORD,
    make_channel,
    read_exit,
    write_fifo,
    write_iteration,
)
from agentrun_operator.jobs.warm import WARM_LOOP_SCRIPT, WARM_MARK, WARM_MOUNT, warm_main_command

SHELLS = [
    pytest.param(["sh"], id="sh"),
    pytest.param(
        ["busybox", "sh"],
        id="busybox",
        marks=pytest.mark.skipif(
            shutil.which("busybox") is None,
            reason="busybox is not installed (`make setup` installs busybox-static as root)",
        ),
    ),
]
GUARD_SECONDS = 60.0
"""Only a guard against a hang: every condition waited for comes within milliseconds."""

COMMAND = 'printf %s "$X" > "$OUT/$ID.x"; echo "$ID" >> "$OUT/runs"; exit "${CODE:-0}"'
TRAPS = (
    "trap 'echo TERM > \"$OUT/got\"; exit 7' TERM; trap 'echo INT > \"$OUT/got\"; exit 8' INT; "
    ': > "$OUT/started"; while :; do sleep 0.01; done'
)


class Loop:
    """One loop process over a warm directory of its own."""

    def __init__(self, shell: list[str], root: Path, command: list[str], env: dict[str, str] | None = None):
        self.dir = root / "warm"
        self.out = root / "out"
        self.out.mkdir()
        make_channel(str(self.dir))
        self.stderr = root / "loop.err"
        with self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                [*shell, "-c", WARM_LOOP_SCRIPT, WARM_MARK, *command],
                env={**os.environ, "AGENTRUN_WARM_DIR": str(self.dir), "OUT": str(self.out), **(env or {})},
                stdin=subprocess.DEVNULL,
                stderr=err,
            )

    def hand(self, iteration: str, env: dict[str, str] | None = None) -> None:
        write_iteration(str(self.dir), iteration, env or {})
        assert write_fifo(str(self.dir / FIFO_NAME), iteration, self._give_up())

    def send(self, word: str) -> None:
        assert write_fifo(str(self.dir / FIFO_NAME), word, self._give_up())

    def _give_up(self):  # type: ignore[no-untyped-def]
        guard = time.monotonic() + GUARD_SECONDS

        def give_up() -> bool:
            assert self.proc.poll() is None, f"the loop ended ({self.proc.returncode}): {self.err()}"
            assert time.monotonic() < guard, "the loop never read its FIFO"
            time.sleep(0.005)
            return False

        return give_up

    def exit_code(self, iteration: str) -> int | None:
        guard = time.monotonic() + GUARD_SECONDS
        while True:
            ended, code = read_exit(str(self.dir), iteration)
            if ended:
                return code
            assert time.monotonic() < guard, f"iteration {iteration} never ended: {self.err()}"
            time.sleep(0.005)

    def wait_for(self, path: Path) -> None:
        guard = time.monotonic() + GUARD_SECONDS
        while not path.exists():
            assert self.proc.poll() is None, f"the loop ended ({self.proc.returncode}): {self.err()}"
            assert time.monotonic() < guard, f"no {path}"
            time.sleep(0.005)

    def end(self) -> int:
        return self.proc.wait(timeout=GUARD_SECONDS)

    def err(self) -> str:
        return self.stderr.read_text()


@pytest.fixture
def loops(tmp_path: Path) -> Iterator[list[Loop]]:
    made: list[Loop] = []
    yield made
    for loop in made:
        if loop.proc.poll() is None:
            loop.proc.kill()
            loop.proc.wait()


@pytest.fixture(params=SHELLS)
def shell(request: pytest.FixtureRequest) -> list[str]:
    return list(request.param)


def start(loops: list[Loop], shell: list[str], root: Path, script: str, **env: str) -> Loop:
    loop = Loop(shell, root, ["sh", "-c", script], env)
    loops.append(loop)
    return loop


def test_each_iteration_runs_once_with_its_own_env_and_keeps_its_exit_code(
    loops: list[Loop], shell: list[str], tmp_path: Path
) -> None:
    loop = start(loops, shell, tmp_path, COMMAND, X="from the container", ID="first")
    loop.hand("i1")  # the pod's first: an empty env file, the container's variables
    assert loop.exit_code("i1") == 0
    assert (loop.out / "first.x").read_text() == "from the container"
    odd = "it's $HOME `id` \"quoted\" \\ back\nslash; $(echo no) '' end"
    loop.hand("i2", {"X": odd, "ID": "second", "CODE": "3"})
    assert loop.exit_code("i2") == 3
    assert (loop.out / "second.x").read_text() == odd
    loop.hand("i3", {"ID": "third", "CODE": "0"})  # X not set again: the container's
    assert loop.exit_code("i3") == 0
    assert (loop.out / "third.x").read_text() == "from the container"
    loop.send(STOP_WORD)
    assert loop.end() == 0
    assert (loop.out / "runs").read_text().split() == ["first", "second", "third"]
    assert loop.err() == "agentrun: iteration i1\nagentrun: iteration i2\nagentrun: iteration i3\n"
    assert not list(loop.dir.glob("*/exit.tmp"))


def test_a_command_that_cannot_run_has_the_shells_exit_code(
    loops: list[Loop], shell: list[str], tmp_path: Path
) -> None:
    loop = Loop(shell, tmp_path, ["/no/such/command"])
    loops.append(loop)
    loop.hand("i1")
    assert loop.exit_code("i1") in (126, 127)
    loop.send(STOP_WORD)
    assert loop.end() == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_signal_reaches_the_running_command_and_ends_the_loop_with_its_exit_code(
    loops: list[Loop], shell: list[str], tmp_path: Path, signum: signal.Signals
) -> None:
    """TERM as TERM; INT as TERM too, since a background command starts with INT ignored."""
    loop = start(loops, shell, tmp_path, TRAPS)
    loop.hand("i1")
    loop.wait_for(loop.out / "started")
    loop.proc.send_signal(signum)
    assert loop.end() == 7
    assert loop.exit_code("i1") == 7
    assert (loop.out / "got").read_text() == "TERM\n"


def test_a_command_killed_by_the_forwarded_term_reports_143(
    loops: list[Loop], shell: list[str], tmp_path: Path
) -> None:
    loop = start(loops, shell, tmp_path, ': > "$OUT/started"; exec sleep 600')
    loop.hand("i1")
    loop.wait_for(loop.out / "started")
    loop.proc.send_signal(signal.SIGTERM)
    assert loop.end() == 143
    assert loop.exit_code("i1") == 143


def test_a_signal_while_it_waits_for_an_id_ends_the_loop(
    loops: list[Loop], shell: list[str], tmp_path: Path
) -> None:
    loop = start(loops, shell, tmp_path, COMMAND, ID="first")
    loop.hand("i1")
    assert loop.exit_code("i1") == 0  # its traps are set: the next signal finds them
    loop.proc.send_signal(signal.SIGTERM)
    assert loop.end() == 143


@pytest.mark.parametrize("word", [STOP_WORD, None], ids=["stop", "end-of-file"])
def test_stop_or_the_end_of_the_fifo_ends_the_loop_with_0(
    loops: list[Loop], shell: list[str], tmp_path: Path, word: str | None
) -> None:
    loop = start(loops, shell, tmp_path, COMMAND, ID="first")
    loop.hand("i1")
    assert loop.exit_code("i1") == 0
    if word is not None:
        loop.send(word)
    else:  # a writer that opens the FIFO and closes it without a word
        give_up = loop._give_up()
        while True:
            try:
                os.close(os.open(loop.dir / FIFO_NAME, os.O_WRONLY | os.O_NONBLOCK))
                break
            except OSError:
                give_up()
    assert loop.end() == 0
    assert loop.err() == "agentrun: iteration i1\n"


def test_a_loop_without_its_fifo_says_so(shell: list[str], tmp_path: Path) -> None:
    proc = subprocess.run(
        [*shell, "-c", WARM_LOOP_SCRIPT, WARM_MARK, "true"],
        env={**os.environ, "AGENTRUN_WARM_DIR": str(tmp_path / "nothing")},
        capture_output=True,
        text=True,
        timeout=GUARD_SECONDS,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr == f"agentrun: no warm channel at {tmp_path}/nothing/{FIFO_NAME}\n"


def test_main_runs_the_loop_around_the_workloads_command_and_args() -> None:
    assert warm_main_command(["agent", "--task"], ["x y"]) == [
        "sh",
        "-c",
        WARM_LOOP_SCRIPT,
        "agentrun-warm",
        "agent",
        "--task",
        "x y",
    ]
    assert warm_main_command(["agent"], None)[-1] == "agent"
    assert f"${{AGENTRUN_WARM_DIR:-{WARM_MOUNT}}}" in WARM_LOOP_SCRIPT
