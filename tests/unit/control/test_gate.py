"""`main`'s gate from the reporter's side (control/gate.py): shut from the reporter's start, opened
by the reporter only when the kubelet went on to `main` without ever completing the postStart hook
(docs/design.md#hook-lost)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

from agentrun_operator.control.gate import (
    HOOK_MARK,
    hook_lost,
    hook_running,
    is_shut,
    open_gate,
    shut_if_missing,
)


def test_the_reporter_shuts_a_missing_gate_and_leaves_one_the_hook_made(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    assert shut_if_missing(str(gate)) is True
    assert gate.is_symlink() and os.readlink(gate) == "/" and is_shut(str(gate))
    assert shut_if_missing(str(gate)) is False  # the hook's, or its own: left as it is
    open_gate(str(gate))
    assert gate.is_dir() and not gate.is_symlink() and not is_shut(str(gate))
    assert shut_if_missing(str(gate)) is False  # an open gate is never shut again by the reporter
    assert gate.is_dir()


def test_the_hook_is_lost_only_when_every_sign_says_so() -> None:
    """Only the one combination: this pod holds the claim, the kubelet knocked, the hook neither
    completed nor failed on purpose, the gate is still shut (so `main` has not run) and no process of
    the hook is left."""
    names = ("claimed", "hook_done", "hook_failed", "knocked", "shut", "hook_alive")
    lost = {"claimed": True, "hook_done": False, "hook_failed": False, "knocked": True, "shut": True}
    for values in itertools.product((False, True), repeat=len(names)):
        case = dict(zip(names, values, strict=True))
        expected = all(case[k] == v for k, v in lost.items()) and not case["hook_alive"]
        assert hook_lost(**case) is expected, case


def test_the_hooks_process_is_known_by_its_mark() -> None:
    """On the host's /proc (a mark of this test's own: other tests' pods run real hooks here): a
    process with the hook's `$0` is the hook's while it lives; the reporter's own pid is left out."""
    mark = f"{HOOK_MARK}-{os.getpid()}"
    me = frozenset({os.getpid()})
    assert not hook_running(me, mark_text=mark)
    hook = subprocess.Popen(["sh", "-c", "read x", mark], stdin=subprocess.PIPE)
    try:
        assert hook_running(me, mark_text=mark)
        assert not hook_running(me | {hook.pid}, mark_text=mark)
    finally:
        hook.communicate(b"\n")
    assert not hook_running(me, mark_text=mark)
    other = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", mark + "x"], stdin=subprocess.PIPE
    )
    try:
        assert not hook_running(me, mark_text=mark)  # a whole argument, not a part of one
    finally:
        other.communicate(b"")
