"""The reporter's rule for `main`'s end in the pod's shared PID namespace (control/mainwatch.py):
started by a process of another container or by a PID allocated after the hook's watermark, ended
after two quiet looks in a row: no process listed, no PID allocated since the look before, none
being created."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from agentrun_operator.control.mainwatch import (
    QUIET_LOOKS,
    Look,
    MainWatch,
    before_main,
    last_pid,
    look,
    pid_in_use,
    read_hook_done,
)


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
    """`true` may live less than a look: the PID it was allocated says it ran. The look that finds
    the new PID is not a quiet one (its process may not be listed yet); the two after it are."""
    watch = MainWatch(watermark=10)
    assert run(watch, [Look(frozenset(), 12), Look(frozenset(), 12), Look(frozenset(), 12)]) == [
        False,
        False,
        True,
    ]


def test_nothing_has_started_while_no_pid_passes_the_watermark() -> None:
    watch = MainWatch(watermark=10)
    assert not any(run(watch, [Look(frozenset(), 10)] * 50))
    assert not watch.started


def test_a_pid_allocated_since_the_last_look_restarts_the_quiet_count() -> None:
    """A process being created has its PID a moment before /proc lists it: not ended yet."""
    watch = MainWatch(watermark=10)
    looks = [Look(frozenset(), 11), Look(frozenset(), 11), Look(frozenset(), 12), Look(frozenset(), 12)]
    assert run(watch, looks) == [False, False, False, False]
    assert run(watch, [Look(frozenset(), 12)]) == [True]


def test_a_main_whose_process_is_still_being_created_has_not_ended() -> None:
    """The fresh-machine failure: `main`'s first PID allocated, its fork not done, so nothing is
    listed, for as long as the fork takes. Each look finds the PID in use (`forming`): started,
    never quiet, until its process is listed and then gone."""
    watch = MainWatch(watermark=10)
    assert not any(run(watch, [Look(frozenset(), 11, forming=frozenset({11}))] * 50))
    assert watch.started
    assert run(watch, [Look(frozenset({11}), 11), Look(frozenset(), 11), Look(frozenset(), 11)]) == [
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


@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.integers(0, 3)), max_size=40))
def test_never_ended_while_a_process_is_listed_or_created_and_never_before_a_start(
    steps: list[tuple[bool, bool, int]],
) -> None:
    watch = MainWatch(watermark=10)
    pid = 10
    busy_in_last: list[bool] = []
    listed_ever = False
    for alive, forming, new_pids in steps:
        pid += new_pids
        one = Look(
            frozenset({pid}) if alive else frozenset(), pid, frozenset({pid}) if forming else frozenset()
        )
        ended = watch.observe(one)
        listed_ever = listed_ever or alive or forming
        busy_in_last = [*busy_in_last[-(QUIET_LOOKS - 1) :], alive or forming or new_pids > 0]
        if ended:
            assert watch.started and not any(busy_in_last)
            assert pid > 10 or listed_ever


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


def test_pid_in_use_knows_allocated_pids_from_free_ones() -> None:
    """On the running kernel: this process's PID is in use, a reaped child's is not. (A PID whose
    process is still being created: tests/unit/control/test_reporter_watch.py holds such a fork.)"""
    probe = os.open(os.devnull, os.O_RDONLY)
    try:
        assert pid_in_use(os.getpid(), probe)
        child = subprocess.Popen(["true"])
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        assert pid_in_use(child.pid, probe)  # a zombie still holds its PID (and is listed as one)
        child.wait()
        assert not pid_in_use(child.pid, probe)
    finally:
        os.close(probe)


def test_every_state_of_a_live_process_counts_as_alive(tmp_path: Path) -> None:
    """A `main` in uninterruptible sleep (D, I/O on a busy machine), stopped or traced is still
    running; only a zombie or a dead process has ended (a /proc of its own, one process per state)."""
    (tmp_path / "loadavg").write_text("0.00 0.00 0.00 1/99 20\n")
    states = {11: "R", 12: "S", 13: "D", 14: "T", 15: "t", 16: "Z", 17: "X", 18: "x", 19: "W"}
    for pid, state in states.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (a (odd) name) {state} 1 {pid} {pid} 0\n")
    seen = look(frozenset(), str(tmp_path))
    assert seen.others == {11, 12, 13, 14, 15, 19}
    assert seen.last_pid == 20


def _fake_proc(root: Path, last: int, processes: dict[int, str]) -> None:
    """A /proc of its own: the last PID and each process's stat line with its start time (field 22)."""
    (root / "loadavg").write_text(f"0.00 0.00 0.00 1/99 {last}\n")
    for pid in [int(p.name) for p in root.iterdir() if p.name.isdigit()]:
        if pid not in processes:
            (root / str(pid) / "stat").unlink()
            (root / str(pid)).rmdir()
    for pid, start in processes.items():
        (root / str(pid)).mkdir(exist_ok=True)
        rest = " ".join(["0"] * 15)  # fields 7 to 21
        (root / str(pid) / "stat").write_text(f"{pid} (sh) S 0 {pid} {pid} {rest} {start} 0\n")


def test_a_process_there_before_the_hook_ended_is_not_mains(tmp_path: Path) -> None:
    """The pod runner's helper for the hook's container (PID 3, older than the watermark) can still
    be exiting at the reporter's first look: it is not `main`, and its going is not `main`'s end
    (once, `main` was reported ended before it ran). A PID used again later is a new process."""
    proc = str(tmp_path)
    _fake_proc(tmp_path, 12, {2: "100", 3: "101"})  # the reporter (ignored) and the exiting helper
    before = before_main(frozenset({2}), 12, proc)
    assert before == {(3, "101")}
    watch = MainWatch(watermark=12)
    assert not watch.observe(look(frozenset({2}), proc, 12, before))
    _fake_proc(tmp_path, 12, {2: "100"})  # the helper gone, `main` not yet made
    assert not any(watch.observe(look(frozenset({2}), proc, 12, before)) for _ in range(5))
    assert not watch.started
    _fake_proc(tmp_path, 13, {2: "100", 13: "105"})  # `main`
    assert not watch.observe(look(frozenset({2}), proc, 12, before))
    assert watch.started and watch.seen == {13}
    _fake_proc(tmp_path, 13, {2: "100", 3: "900"})  # PID 3 again, another process: counts
    assert look(frozenset({2}), proc, 12, before).others == {3}
    assert before_main(frozenset({2}), None, proc) == frozenset()  # no watermark: nothing known
