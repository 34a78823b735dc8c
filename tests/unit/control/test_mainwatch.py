"""The reporter's rule for `main`'s end in the pod's shared PID namespace (control/mainwatch.py):
started by a process of another container or by a PID allocated after the hook's watermark, ended
after two quiet looks in a row with no newer PID."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from agentrun_operator.control.mainwatch import QUIET_LOOKS, Look, MainWatch, last_pid, look, read_hook_done


def run(watch: MainWatch, looks: list[Look]) -> list[bool]:
    return [watch.observe(one) for one in looks]


def test_a_main_seen_running_ends_after_two_quiet_looks() -> None:
    watch = MainWatch(watermark=10)
    assert run(watch, [Look(frozenset(), 10), Look(frozenset({11}), 11), Look(frozenset({11}), 11)]) == [
        False,
        False,
        False,
    ]
    assert run(watch, [Look(frozenset(), 11), Look(frozenset(), 11)]) == [False, True]


def test_a_main_that_came_and_went_between_looks_is_known_by_its_pid() -> None:
    """`true` may live less than a look: the PID it was allocated says it ran."""
    watch = MainWatch(watermark=10)
    assert run(watch, [Look(frozenset(), 12), Look(frozenset(), 12)]) == [False, True]


def test_nothing_has_started_while_no_pid_passes_the_watermark() -> None:
    watch = MainWatch(watermark=10)
    assert not any(run(watch, [Look(frozenset(), 10)] * 50))
    assert not watch.started


def test_a_pid_allocated_since_the_last_look_restarts_the_quiet_count() -> None:
    """A process being created has its PID a moment before /proc lists it: not ended yet."""
    watch = MainWatch(watermark=10)
    assert run(watch, [Look(frozenset(), 11), Look(frozenset(), 12), Look(frozenset(), 12)]) == [
        False,
        False,
        True,
    ]


def test_without_a_watermark_only_a_process_seen_counts() -> None:
    watch = MainWatch(watermark=None)
    assert not any(run(watch, [Look(frozenset(), 99)] * 5))
    assert run(watch, [Look(frozenset({100}), 100), Look(frozenset(), 100), Look(frozenset(), 100)]) == [
        False,
        False,
        True,
    ]


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3)), max_size=40))
def test_never_ended_while_a_process_is_listed_and_never_before_a_start(
    steps: list[tuple[bool, int]],
) -> None:
    watch = MainWatch(watermark=10)
    pid = 10
    listed_in_last: list[bool] = []
    for alive, new_pids in steps:
        pid += new_pids
        one = Look(frozenset({pid}) if alive else frozenset(), pid)
        ended = watch.observe(one)
        listed_in_last = [*listed_in_last[-(QUIET_LOOKS - 1) :], alive]
        if ended:
            assert watch.started and not any(listed_in_last)
            assert pid > 10


def test_read_hook_done_wants_a_complete_line(tmp_path: Path) -> None:
    path = tmp_path / "hook-done"
    assert read_hook_done(str(path)) is None
    path.write_text("12 7")
    assert read_hook_done(str(path)) is None  # still being written
    path.write_text("12 7\n")
    assert read_hook_done(str(path)) == (12, 7)
    path.write_text(" 7\n")  # /proc/loadavg unreadable in the hook
    assert read_hook_done(str(path)) == (7, None)


def test_look_lists_live_processes_but_pid_1_and_the_ignored(tmp_path: Path) -> None:
    """On the host's /proc: a child is listed until it has been reaped; a zombie is not alive."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        seen = look(frozenset({os.getpid()}))
        assert child.pid in seen.others and 1 not in seen.others and os.getpid() not in seen.others
        assert seen.last_pid is not None
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # a zombie until reaped
        assert child.pid not in look(frozenset({os.getpid()})).others
    finally:
        child.kill()
        child.wait()
    assert isinstance(last_pid(), int)
    (tmp_path / "loadavg").write_text("garbage")
    assert last_pid(str(tmp_path)) is None
