"""`main`'s gate, from the reporter's side: shut from the reporter's start, and opened by the
reporter itself when the kubelet went on to `main` without ever completing the reporter's postStart
hook (docs/design.md#hook-lost). Standard library only, like the reporter.

The hook (jobs/reporter_container.py `READY_HOOK_SCRIPT`) opens the gate for a reporter that holds
the Job's claim, then writes its watermark (`hook-done`), and the reporter watches `main` from it.
But the kubelet runs a postStart hook only as it starts the container: a kubelet that restarts
after it started the reporter and before the hook completed (killed with it, or never run) goes on
to `main` after its restart, and never runs the hook again. Were the gate left to the hook alone,
`main` would then meet a gate nobody made, which the kubelet makes as an empty directory: an open
gate, `main` running before the claim and the checkpoint; and the reporter would wait for `hook-done`
for good, the pod never ending. So:

- the reporter shuts the gate (the symlink out of the volume the hook makes) as its first act, when
  there is none yet (`shut_if_missing`): a `main` the kubelet starts without the hook waits at it;
- `main` mounts a second subPath of the meta volume before the gate, the **knock**, which only the
  kubelet makes (a missing subPath is made as a directory, in the order of the mounts, before the
  gate is refused): it exists only once the kubelet has tried to start `main`, which it does only
  after the hook ended or when it will never run it;
- the hook says when it fails (`hook-failed`), as it does on purpose for a duplicate pod, a reporter
  that cannot see `main`, or one never ready: the kubelet then kills the reporter, which must not
  open the gate.

So a reporter that holds the claim, finds the knock, no `hook-done`, no `hook-failed`, the gate
shut and no process of the hook left (`hook_lost`) knows the hook will never come: `main` has not
run (the gate is shut), nothing else of the pod makes a process, so it takes the namespace's last
PID as the watermark and opens the gate itself (`open`); the kubelet starts `main` at its next try.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

from agentrun_operator.control.mainwatch import listed_pids, live_identity

SHUT_TARGET: Final = "/"
"""A shut gate is a symlink to `/`, out of the volume: the kubelet will not mount it for `main`."""
HOOK_MARK: Final = "agentrun-ready"
"""The hook's `$0` (`sh -c SCRIPT agentrun-ready …`): how its process is known among the pod's."""


@dataclass(frozen=True)
class GateFiles:
    """The meta volume's paths the reporter watches and changes (jobs/reporter_container.py)."""

    gate: str
    knock: str
    hook_failed: str


def shut_if_missing(gate: str) -> bool:
    """Make the shut gate unless the gate exists already (the hook made it, shut or open): True when
    this call made it."""
    try:
        os.symlink(SHUT_TARGET, gate)
    except FileExistsError:
        return False
    return True


def is_shut(gate: str) -> bool:
    try:
        return os.path.islink(gate) and os.readlink(gate) == SHUT_TARGET
    except OSError:
        return False


def hook_running(ignore: frozenset[int], proc: str = "/proc", mark_text: str = HOOK_MARK) -> bool:
    """A live process of the pod (but PID 1 and `ignore`) whose arguments hold `HOOK_MARK`: the
    processes as control/mainwatch.py lists them, then each one's command line."""
    mark = mark_text.encode()
    for pid in listed_pids(proc):
        if pid == 1 or pid in ignore or live_identity(proc, pid) is None:
            continue
        try:
            with open(os.path.join(proc, str(pid), "cmdline"), "rb") as handle:
                args = handle.read().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if mark in args:
            return True
    return False


def hook_lost(
    *,
    claimed: bool,
    hook_done: bool,
    hook_failed: bool,
    knocked: bool,
    shut: bool,
    hook_alive: bool,
) -> bool:
    """Whether the hook will never complete and the reporter may open the gate itself. Pure.

    `claimed`: the reporter holds the Job's claim (ready with its pid: never in a duplicate pod, nor
    after a refusal). `knocked`: the kubelet has tried to start `main`, so it is past the hook. Not
    with `hook_done` (the hook completed: the usual way) or `hook_failed` (it failed on purpose: the
    kubelet kills the reporter). `shut`: `main` cannot have run (an open gate without `hook_done` is a
    hook killed between opening it and its last line: `main` may have run, the watermark is lost).
    `hook_alive`: a hook the runtime did not stop with its kubelet may still complete."""
    return claimed and knocked and not hook_done and not hook_failed and shut and not hook_alive


def open_gate(gate: str) -> None:
    """Open the shut gate as the hook does: an empty directory in place of the symlink."""
    os.unlink(gate)
    os.mkdir(gate)
