"""A pod's shared PID namespace, for pods with `shareProcessNamespace: true` (process runtime).

On a kubelet such a pod's containers (and their postStart hooks) all live in one PID namespace held
by the pause process, its PID 1, which reaps what it inherits: a container's /proc lists the other
containers' processes, and /proc/loadavg's last-pid field counts the whole pod's allocations.
Here one helper process per pod does the pause process's job (docs/local-dev.md#pod-runner-signals):
it unshares a PID namespace and forks; the child is PID 1 there and only reaps (it ignores SIGTERM
and SIGINT, so only SIGKILL ends it, and with it everything in the namespace); the parent stays
outside, prints the child's host pid, and waits for it. Each container's bwrap then joins the
namespace with `--pidns FD` (sandbox.py): bwrap's own monitor stays outside, so the namespace holds
only PID 1, the containers' processes and the hooks', as on a node.

The helper runs in a session of its own and is recorded in `<pod>/pidns.json`, so it outlives a
restart of the runner as the containers in it do, and a new runner keeps it (`adopt_or_start`).

Entering another process's PID namespace needs CAP_SYS_ADMIN over the user namespace that owns it.
Root has it over the host's. An ordinary user gets it from a user namespace of its own
(docs/local-dev.md#non-root): the helper unshares a user namespace together with the PID namespace,
mapping only its own uid and gid (to themselves, so files keep their owners and a container runs as
the runner's user, as bwrap's own user namespace would have it), and each container's bwrap joins
both (`--userns FD --pidns FD`); the owner of a user namespace may enter it. A host that allows an
ordinary user no user namespace fails the helper's start with the kernel's answer in one line, and
the pod fails at once with it (`FailedCreatePodSandBox`), never waiting.

`AGENTRUN_PODRUNNER_PIDNS=off` gives pods no shared namespace (`unavailable`): each container keeps
its own, as on a cluster that ignores `shareProcessNamespace`, and the reporter, which then cannot
see `main`, fails the pod at once saying why (control/mainwatch.py `blind_reason`). A switch of the
dev cluster's tests, not of the product.

    python -m agentrun_devcluster.podrunner.pidns
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from agentrun_devcluster.podrunner.procfs import process_start

CLONE_NEWPID = 0x20000000
CLONE_NEWUSER = 0x10000000
READY = "pod pid namespace ready"
RECORD = "pidns.json"
SWITCH = "AGENTRUN_PODRUNNER_PIDNS"
"""`off`: pods get no shared PID namespace (a test switch of the dev cluster, see above)."""


def unavailable() -> str | None:
    """Why pods cannot share one PID namespace here (None when they can, or may: a host that refuses
    an ordinary user a user namespace is found out when the helper starts, `start`)."""
    if os.environ.get(SWITCH) == "off":
        return f"{SWITCH}=off: the containers of a pod with shareProcessNamespace each keep their own"
    return None


def needs_user_namespace() -> bool:
    """Not root: the helper makes a user namespace too, and containers join it (module docstring)."""
    return os.geteuid() != 0


@dataclass(frozen=True)
class PidNamespaceRecord:
    """The helper (its session leader, the parent) and PID 1 of the namespace, with start times."""

    pid: int
    pid_start: str
    namespace_pid: int
    namespace_start: str
    user_namespace: bool = False
    """The helper made a user namespace owning the PID namespace (not root): containers join both."""

    def alive(self) -> bool:
        return (
            process_start(self.pid) == self.pid_start
            and process_start(self.namespace_pid) == self.namespace_start
        )


class PodPidNamespace:
    """The helper process holding one pod's PID namespace (see the module docstring)."""

    def __init__(self, record: PidNamespaceRecord) -> None:
        self.record = record

    @property
    def namespace_pid(self) -> int:
        return self.record.namespace_pid

    @property
    def path(self) -> str:
        """The namespace's file, which a container's bwrap opens and joins."""
        return f"/proc/{self.record.namespace_pid}/ns/pid"

    @property
    def user_path(self) -> str | None:
        """The file of the user namespace that owns it, which a container's bwrap joins first (None
        when the runner is root: the host's owns it)."""
        return f"/proc/{self.record.namespace_pid}/ns/user" if self.record.user_namespace else None

    def stop(self) -> None:
        """SIGKILL PID 1 (the kernel kills everything in the namespace) and the helper."""
        if self.record.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.record.namespace_pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.record.pid, signal.SIGKILL)


def start(log_path: Path, timeout: float = 15.0) -> PodPidNamespace:
    """A new helper (OSError when it does not come up, with the helper's own words: e.g. a host
    that allows an ordinary user no user namespace)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    user = needs_user_namespace()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", __name__, *(["--user"] if user else [])],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,  # outlives a restart of the runner, as the containers in it do
        )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        line = proc.stdout.readline()
        if line.startswith(READY.encode()):
            child = int(line.split()[-1])
            proc.stdout.close()
            record = PidNamespaceRecord(
                proc.pid, process_start(proc.pid) or "", child, process_start(child) or "", user
            )
            if record.alive():
                return PodPidNamespace(record)
            break
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    raise OSError(f"the pod's PID namespace did not come up: {log_path.read_text().strip()[-500:]}")


def write_record(pod_dir: Path, holder: PodPidNamespace) -> None:
    (pod_dir / RECORD).write_text(json.dumps(asdict(holder.record)))


def read_record(pod_dir: Path) -> PidNamespaceRecord | None:
    try:
        return PidNamespaceRecord(**json.loads((pod_dir / RECORD).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def adopt_or_start(pod_dir: Path) -> PodPidNamespace:
    """The pod's helper: the one an earlier runner process recorded when it still runs (its
    containers may run in it), else a new one, recorded."""
    record = read_record(pod_dir)
    if record is not None and record.alive():
        return PodPidNamespace(record)
    holder = start(pod_dir / "pidns.log")
    write_record(pod_dir, holder)
    return holder


def stop_recorded(pod_dir: Path) -> None:
    record = read_record(pod_dir)
    if record is not None:
        PodPidNamespace(record).stop()


# -- the helper process ------------------------------------------------------------------------
def _pause() -> None:
    """PID 1 of the namespace: reap every child it inherits, ignore SIGTERM/SIGINT (only SIGKILL
    ends it, and the namespace with it)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    while True:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        signal.sigwait({signal.SIGCHLD})  # pending while blocked, so none is lost between the two


def _map_own_ids(uid: int, gid: int) -> None:
    """In a new user namespace: map the caller's uid and gid to themselves (the one mapping an
    unprivileged process may write; setgroups must be denied before the gid map)."""
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")


def main(argv: list[str] | None = None) -> int:
    """`--user`: make the PID namespace inside a new user namespace (not root, see the module)."""
    user = "--user" in (sys.argv[1:] if argv is None else argv)
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWPID | (CLONE_NEWUSER if user else 0)
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        what = "unshare(CLONE_NEWUSER | CLONE_NEWPID)" if user else "unshare(CLONE_NEWPID)"
        hint = (
            " (this host allows an ordinary user no user namespace: see docs/local-dev.md#non-root)"
            if user
            else ""
        )
        print(f"{what}: {os.strerror(errno)}{hint}", file=sys.stderr, flush=True)
        return 1
    if user:
        _map_own_ids(uid, gid)
    child = os.fork()
    if child == 0:
        try:
            _pause()
        finally:
            os._exit(1)
    print(f"{READY} {child}", flush=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.waitpid(child, 0)
    return 1


if __name__ == "__main__":
    sys.exit(main())
