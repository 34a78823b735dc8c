"""How the reporter learns that `main` has ended, from the pod's shared PID namespace.

The reporter is a regular container listed before `main` (docs/design.md#reporter-first): the
kubelet stops nobody when `main` ends, so the reporter watches for it itself. The pod shares one
PID namespace (`shareProcessNamespace`), so the reporter's /proc lists every process of the pod: the
sandbox's pause (PID 1), its own, and `main`'s. Two facts decide:

- **`main` has started** once a process that is not the reporter's (nor PID 1, nor its postStart
  hook, which is exiting, nor one already there when the hook ended: `before_main`) is seen, or
  once the namespace has allocated a PID after the hook's watermark (the last PID of
  /proc/loadavg, which the kernel gives per the reader's namespace): a
  `main` such as `true` may start and end between two looks, and still leaves its PID behind.
  Nothing else creates processes in the pod after the hook (an exec into a container would count).
- **`main` has ended** once it has started and two looks in a row find no such process, no PID
  allocated since the look before, and no PID being created.

A process is allocated its PID well before /proc lists it: the kernel moves the namespace's last PID
at the start of the fork and attaches the new process at its end, and a fork stalled in between (a
busy machine, a cgroup migration elsewhere) can take any time. `main`'s first process is created
from outside the pod (the runtime), so nothing of `main` is listed meanwhile; were that quiet taken
for its end, the reporter would report a control file `main` has not yet written. So a look also
asks the kernel which of the latest PIDs past the watermark are in use though unlisted
(`pid_in_use`): such a PID is a process being created, and no look with one counts as quiet.

`MainWatch` is the pure rule over those looks; `look` reads /proc.

All of this needs the shared namespace. Where the pod does not get one (a cluster or runtime that
ignores `shareProcessNamespace`; the local pod runner without it), the reporter would see only its
own container and wait for a `main` it can never see. It checks before `main` may start
(`blind_reason`): a container's first process is started by its runtime from outside a shared
namespace, so walking up the reporter's parents ends at a parent outside it (PID 0), never at PID 1
(the pause). A namespace made for the reporter's container alone has the reporter, or the init that
started it, as PID 1. Then the reporter fails the pod at once, saying why (reporter.py).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

QUIET_LOOKS: Final = 2
"""Looks in a row with no process of `main` (and no new PID) before `main` counts as ended."""
FORMING_SPAN: Final = 64
"""How many of the latest PIDs past the watermark a quiet look asks about. A process created from
outside the pod (`main`'s first, an exec) is the only kind that can be unlisted while nothing of
`main` is listed, and nothing else allocates a PID meanwhile, so it is among the latest."""
_GONE_STATES: Final = frozenset({"Z", "X", "x"})
"""/proc states of a process that has exited (a zombie awaiting its reaper, or dead)."""


@dataclass(frozen=True)
class Look:
    """One look at the pod's processes: the PIDs of live processes other than PID 1, the reporter's
    own and its hook's, the namespace's last allocated PID (None when it cannot be read), and the
    PIDs past the watermark in use though not listed (processes being created)."""

    others: frozenset[int]
    last_pid: int | None
    forming: frozenset[int] = frozenset()


@dataclass
class MainWatch:
    """Decides from successive looks when `main` has started and ended. Pure."""

    watermark: int | None
    """The namespace's last PID when the postStart hook finished (before `main` could start)."""
    started: bool = False
    quiet: int = 0
    seen: set[int] = field(default_factory=set)
    """Every PID seen as `main`'s (for the reporter's log)."""
    _last_seen: int | None = field(default=None, repr=False)
    _looked: bool = field(default=False, repr=False)

    def observe(self, look: Look) -> bool:
        """Take one look; True once `main` has ended."""
        newer = look.last_pid is not None and self.watermark is not None and look.last_pid > self.watermark
        moved = look.last_pid != (self._last_seen if self._looked else self.watermark)
        self.seen |= look.others
        if look.others or look.forming or newer:
            self.started = True
        if not self.started or look.others or look.forming or moved:
            self.quiet = 0  # a PID allocated since the last look: its process may not be listed yet
        else:
            self.quiet += 1
        self._last_seen = look.last_pid
        self._looked = True
        return self.quiet >= QUIET_LOOKS


def last_pid(proc: str = "/proc") -> int | None:
    """The last PID allocated in the reader's PID namespace (/proc/loadavg's fifth field)."""
    try:
        with open(os.path.join(proc, "loadavg"), encoding="ascii") as handle:
            return int(handle.read().split()[4])
    except (OSError, ValueError, IndexError):
        return None


def live_identity(proc: str, pid: int) -> tuple[int, str] | None:
    """A live process as (PID, start time in clock ticks), so a PID used again is another process;
    None for one that has ended (a zombie awaiting its reaper, or dead) or is gone."""
    try:
        with open(os.path.join(proc, str(pid), "stat"), encoding="utf-8", errors="replace") as handle:
            stat = handle.read()
    except OSError:  # gone meanwhile
        return None
    fields = stat.rpartition(")")[2].split()  # from the state on: field 3 of proc_pid_stat(5)
    if not fields or fields[0] in _GONE_STATES:
        return None
    return pid, fields[19] if len(fields) > 19 else ""


def listed_pids(proc: str) -> set[int]:
    return {int(name) for name in os.listdir(proc) if name.isdigit()}


def before_main(
    ignore: frozenset[int], watermark: int | None, proc: str = "/proc"
) -> frozenset[tuple[int, str]]:
    """The processes that were there before `main` could start: those listed now (but PID 1 and
    `ignore`) whose PIDs are the watermark's or older. Taken right after the hook's last line, they
    are never `main`'s. On a node that is nothing; the local pod runner's sandbox helper for the
    hook's container can still be on its way out (the reporter once took its last moment for
    `main`, and `main`'s end, before `main` had run)."""
    if watermark is None:
        return frozenset()
    found = (
        live_identity(proc, p) for p in listed_pids(proc) if p != 1 and p not in ignore and p <= watermark
    )
    return frozenset(i for i in found if i is not None)


def pid_in_use(pid: int, probe: int) -> bool:
    """Whether `pid` is allocated in the reader's PID namespace, even to a process /proc does not list
    yet. `F_SETOWN` on any open file (`probe`) looks the PID up among those allocated, not among the
    processes: it fails with ESRCH only for a PID nobody holds (checked on the running kernel by
    tests/unit/control/test_reporter_watch.py, with a fork held halfway)."""
    try:
        fcntl.fcntl(probe, fcntl.F_SETOWN, pid)
    except OSError:
        return False
    return True


def look(
    ignore: frozenset[int],
    proc: str = "/proc",
    watermark: int | None = None,
    before: frozenset[tuple[int, str]] = frozenset(),
) -> Look:
    """The live processes of the namespace but PID 1, `ignore` and those there `before` main
    (`before_main`, by identity: a PID used again counts), its last PID, and (when none is listed)
    which of the latest PIDs past `watermark` are in use though unlisted (`FORMING_SPAN`)."""
    latest = last_pid(proc)
    listed = listed_pids(proc)
    live = (live_identity(proc, p) for p in listed if p != 1 and p not in ignore)
    others = frozenset(i[0] for i in live if i is not None and i not in before)
    forming: frozenset[int] = frozenset()
    if not others and latest is not None and watermark is not None and latest > watermark:
        try:
            probe = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # no /dev/null: the quiet looks alone decide, as before this check
            return Look(others, latest)
        try:
            span = range(max(watermark, latest - FORMING_SPAN) + 1, latest + 1)
            forming = frozenset(p for p in span if p not in listed and pid_in_use(p, probe))
        finally:
            os.close(probe)
    return Look(others, latest, forming)


def read_hook_done(path: str) -> tuple[int | None, int | None] | None:
    """(the watermark, the hook's PID) from the hook's last line, once it is complete; None before."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    if not text.endswith("\n"):
        return None
    parts = text.split()

    def number(i: int) -> int | None:
        return int(parts[i]) if len(parts) > i and parts[i].isdigit() else None

    return number(0), number(1)


BLIND_ANCHOR: Final = "docs/troubleshooting.md#reporter-cannot-see-main"
"""How every refusal of a blind reporter ends: the operator knows one by it as well as by its exit code."""
BLIND: Final = (
    "the reporter cannot see main's processes: this pod's containers do not share one PID namespace "
    "(PID 1 of the reporter's namespace is {what}, so the namespace is its container's alone; "
    "shareProcessNamespace is ignored here). Fix: run the iteration pods where their containers share "
    "one PID namespace (a Kubernetes node does; the local pod runner does as root, or as an ordinary "
    "user where unprivileged user namespaces are allowed); " + BLIND_ANCHOR
)
"""Why the reporter fails a pod in which it could never see `main` end (`blind_reason`)."""


def blind_reason(pid: int, parent_of: Callable[[int], int | None]) -> str | None:
    """Why the reporter (`pid`) cannot see `main`: PID 1 of its namespace is itself or one of its
    ancestors, so the namespace was made for its container alone. None when its line of parents
    leaves the namespace (PID 0: started from outside, as in a pod's shared namespace) or cannot be
    read (a pod is never failed on a guess). Pure: `parent_of` gives a PID's parent."""
    seen: set[int] = set()
    current: int | None = pid
    while current is not None and current not in seen:
        if current == 1:
            return BLIND.format(what="the reporter itself" if pid == 1 else "the reporter's own ancestor")
        seen.add(current)
        current = parent_of(current) or None  # 0: the parent is outside the namespace
    return None


def parent_pid(pid: int, proc: str = "/proc") -> int | None:
    """A process's parent as its namespace numbers it (0: outside it), None when unreadable."""
    try:
        with open(os.path.join(proc, str(pid), "stat"), encoding="utf-8", errors="replace") as handle:
            fields = handle.read().rpartition(")")[2].split()
        return int(fields[1])
    except (OSError, ValueError, IndexError):
        return None
