"""The reporter's watch for `main`'s end, run for real in a pod's shared PID namespace: the pod
runner's own pause-like helper (podrunner/pidns.py) holds it, and the reporter, its postStart hook
(the real script) and a `main` started after it each join it from outside with bwrap, as the kubelet
starts a pod's containers in order (docs/design.md#reporter-first). Root or not: an ordinary user's
namespace is held in a user namespace of its own (docs/local-dev.md#non-root). And a reporter in a
PID namespace of its own container refuses to start `main`, at once, saying why."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentrun_devcluster.podrunner import pidns
from agentrun_devcluster.podrunner.sandbox import SandboxUnavailable, find_bwrap
from agentrun_operator.control.mainwatch import blind_reason
from agentrun_operator.control.reporter import BLIND, BLIND_EXIT
from agentrun_operator.jobs.reporter_container import READY_HOOK_SCRIPT


@pytest.fixture(autouse=True)
def bwrap() -> str:
    """The pod runner's sandbox tool (`make setup` installs it as root)."""
    try:
        return find_bwrap()
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))


@contextlib.contextmanager
def pod_namespace(tmp_path: Path) -> Iterator[tuple[list[str], tuple[int, ...]]]:
    """A shared PID namespace held by the pod runner's helper; yields the bwrap prefix that runs a
    command in it (joining its user namespace first when there is one), as the pod runner does, and
    the open namespace files it names (to pass to it)."""
    bwrap = find_bwrap()
    holder = pidns.start(tmp_path / "pidns.log")
    fds = [os.open(path, os.O_RDONLY) for path in (holder.user_path, holder.path) if path is not None]
    join = ["--userns", str(fds[0]), "--pidns", str(fds[1])] if len(fds) == 2 else ["--pidns", str(fds[0])]
    try:
        yield [bwrap, "--dev-bind", "/", "/", "--proc", "/proc", *join, "--"], tuple(fds)
    finally:
        holder.stop()
        for fd in fds:
            os.close(fd)


def reporter_argv(meta: Path, control: Path) -> list[str]:
    return [
        sys.executable, "-m", "agentrun_operator.cli", "reporter", "report", "--path", str(control),
        "--fingerprint", f"{meta}/fp.json", "--termination-log", f"{meta}/termination-log",
        "--hook-done", f"{meta}/hook-done", "--ready-file", f"{meta}/ready", "--before-main",
    ]  # fmt: skip


def hook_argv(meta: Path) -> list[str]:
    return [
        "sh",
        "-c",
        READY_HOOK_SCRIPT,
        "ready",
        f"{meta}/ready",
        "1500",
        f"{meta}/gate",
        f"{meta}/hook-done",
        f"{meta}/hook-failed",
    ]


def gate_argv(meta: Path) -> list[str]:
    """The reporter's gate arguments (jobs/reporter_container.py): the gate, the knock the kubelet
    makes as it prepares `main`'s mounts, and the hook's word when it fails."""
    return ["--gate", f"{meta}/gate", "--knock", f"{meta}/knock", "--hook-failed", f"{meta}/hook-failed"]


def wait_until(check: Callable[[], bool], reporter: subprocess.Popen[bytes], meta: Path, what: str) -> None:
    """Until `check` holds; fails at once should the reporter end first (a minute is only a guard
    against a hang: each condition comes within milliseconds)."""
    guard = time.monotonic() + 60
    while not check():
        code = reporter.poll()
        assert code is None, (
            f"the reporter ended ({code}) before {what}: {(meta / 'reporter.err').read_text()}"
        )
        assert time.monotonic() < guard, f"no {what}: {(meta / 'reporter.err').read_text()}"
        time.sleep(0.01)


LAUNCH_HELD = r"""
import os, sys
fd, meta, main, held = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
fork = HeldFork(held)  # made outside the pod's namespace: its thread takes no PID there
# From outside, as a container runtime does: this process stays where it is, its children are born
# in the pod's namespace with a parent outside it (the reporter's view of a real pod).
if ctypes.CDLL(None, use_errno=True).setns(fd, 0x20000000) != 0:  # CLONE_NEWPID
    raise OSError(ctypes.get_errno(), "setns")
fork.done_early = lambda: os.path.exists(f"{meta}/termination-log")  # the reporter has ended anyway
status = os.waitpid(fork.run(["sh", "-c", main]), 0)[1]
sys.exit(os.waitstatus_to_exitcode(status))
"""

HELD_FORK = r"""
import ctypes, mmap, os, select, struct, threading, time

# Creates a process whose fork the kernel holds, for `hold` seconds (or until `done_early`), after
# the new PID is allocated and before the process is attached (listed in /proc): clone3 with
# CLONE_PIDFD writes the pidfd to user memory between the two, and that memory is a userfaultfd page
# nobody fills until then. What a fork stalled on a busy machine looks like, made to last.
class HeldFork:
    USERFAULTFD = {"x86_64": 323, "aarch64": 282}  # clone3 is 435 everywhere

    def __init__(self, hold):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.syscall.restype = ctypes.c_long
        number = self.USERFAULTFD[os.uname().machine]
        self.uffd = self._check(self.libc.syscall(number, os.O_CLOEXEC | os.O_NONBLOCK), "userfaultfd")
        self._ioctl(0xC018AA3F, struct.pack("QQQ", 0xAA, 0, 0), "UFFDIO_API")
        self.page = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.page))
        self._ioctl(0xC020AA00, struct.pack("QQQQ", self.addr, mmap.PAGESIZE, 1, 0), "UFFDIO_REGISTER")
        self.hold = hold
        self.done_early = lambda: False  # True lets it go sooner (the reporter has ended anyway)
        threading.Thread(target=self._release, daemon=True).start()

    def _check(self, result, what):
        if result < 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")
        return result

    def _ioctl(self, request, payload, what):
        buffer = ctypes.create_string_buffer(payload)
        self._check(self.libc.ioctl(self.uffd, ctypes.c_ulong(request), buffer), what)

    def _release(self):
        # poll() (a non-blocking uffd: a blocking one polls as an error) waits outside the GIL, so
        # the fork copies this process with the GIL free.
        self._check(self.libc.poll(struct.pack("iHH", self.uffd, 1, 0), 1, -1), "poll")  # the fault
        deadline = time.monotonic() + self.hold
        while time.monotonic() < deadline and not self.done_early():
            time.sleep(0.02)
        self._ioctl(0xC020AA04, struct.pack("QQQq", self.addr, mmap.PAGESIZE, 0, 0), "UFFDIO_ZEROPAGE")

    def run(self, argv):
        args = struct.pack("QQQQQQQQ", 0x1000, self.addr, 0, 0, 17, 0, 0, 0)  # CLONE_PIDFD, SIGCHLD
        pid = self.libc.syscall(435, ctypes.create_string_buffer(args), 64)
        if pid == 0:
            os.execvp(argv[0], argv)
        return self._check(pid, "clone3")
"""


def run_pod(tmp_path: Path, main: str, gap: float = 0.5, held: float = 0.0) -> dict[str, object]:
    """The pod in a shared PID namespace (the pod runner's helper plays the pause): the reporter,
    the hook run to its end, `gap` seconds in which nothing of the pod but the reporter runs (as
    while the kubelet creates `main`), then `main`; with `held`, `main` is forked from outside the
    namespace (as a runtime does) by a process that holds that fork `held` seconds between its PID's
    allocation and its process's appearance in /proc (`HELD_FORK`)."""
    meta, control = tmp_path / "meta", tmp_path / "control.json"
    meta.mkdir()
    with pod_namespace(tmp_path) as (inside, fds), (meta / "reporter.err").open("w") as err:
        reporter = subprocess.Popen(
            [*inside, *reporter_argv(meta, control)], stdout=subprocess.DEVNULL, stderr=err, pass_fds=fds
        )
        try:
            hook = subprocess.run(
                [*inside, *hook_argv(meta)], capture_output=True, text=True, timeout=60, pass_fds=fds
            )
            assert hook.returncode == 0, hook.stderr + (meta / "reporter.err").read_text()
            time.sleep(gap)  # no process in the namespace but PID 1 and the reporter
            if held:
                launch = [
                    sys.executable,
                    "-c",
                    HELD_FORK + LAUNCH_HELD,
                    str(fds[-1]),
                    str(meta),
                    main,
                    str(held),
                ]
            else:
                launch = [*inside, "sh", "-c", main]
            launched = subprocess.run(launch, capture_output=True, text=True, timeout=60, pass_fds=fds)
            assert launched.returncode == 0, launched.stderr
            code = reporter.wait(timeout=60)
        finally:
            reporter.kill()
    assert code == 0, (meta / "reporter.err").read_text()
    assert (meta / "gate").is_dir()  # the hook opened main's gate
    envelope: dict[str, object] = json.loads((meta / "termination-log").read_text())
    envelope["log"] = (meta / "reporter.err").read_text()
    return envelope


def test_the_reporter_waits_for_a_main_that_starts_late_and_reads_what_it_wrote(tmp_path: Path) -> None:
    """Nothing of `main` exists for half a second after the hook: the reporter must not take the
    quiet for `main`'s end (a thread of its own started after the watermark once made it do so)."""
    control = tmp_path / "control.json"
    envelope = run_pod(tmp_path, f"sleep 0.3; echo '{{\"continue\": false}}' > {control}")
    assert envelope["status"] == "found", envelope
    assert envelope["control"] == {"continue": False}, envelope
    assert "main ended (its processes:" in str(envelope["log"]), envelope["log"]


def test_a_main_that_ends_between_two_looks_is_still_seen_by_its_pid(tmp_path: Path) -> None:
    """`main` runs a few milliseconds, likely between two looks: the PID it took says it ran."""
    control = tmp_path / "control.json"
    envelope = run_pod(tmp_path, f"echo '{{\"continue\": true}}' > {control}", gap=0.2)
    assert envelope["status"] == "found" and envelope["control"] == {"continue": True}, envelope


def test_a_main_whose_children_outlive_it_is_waited_for(tmp_path: Path) -> None:
    """A process `main` left behind still counts as `main`'s until it has ended too."""
    control = tmp_path / "control.json"
    main = f"(sleep 0.5; echo '{{\"continue\": false}}' > {control}) & exit 0"
    envelope = run_pod(tmp_path, main, gap=0.1)
    assert envelope["status"] == "found" and envelope["control"] == {"continue": False}, envelope


@pytest.mark.parametrize("as_pid_1", [True, False], ids=["reporter-is-pid-1", "an-init-started-it"])
def test_a_reporter_in_a_pid_namespace_of_its_own_refuses_main_at_once_saying_why(
    tmp_path: Path, as_pid_1: bool
) -> None:
    """Without the pod's shared namespace (a cluster that ignores `shareProcessNamespace`) the
    reporter could never see `main` end: it exits `BLIND_EXIT` before claiming anything, its
    termination message says why and how to fix it, and the real hook keeps `main`'s gate shut."""
    meta, control = tmp_path / "meta", tmp_path / "control.json"
    meta.mkdir()
    alone = [find_bwrap(), "--dev-bind", "/", "/", "--proc", "/proc", "--unshare-pid"]
    alone += ["--as-pid-1", "--"] if as_pid_1 else ["--"]  # else bwrap's init is PID 1
    reporter = subprocess.run(
        [*alone, *reporter_argv(meta, control)], capture_output=True, text=True, timeout=60
    )
    assert reporter.returncode == BLIND_EXIT, reporter.stderr
    why = (meta / "termination-log").read_text()
    assert "cannot see main's processes" in why, why
    assert "docs/troubleshooting.md#reporter-cannot-see-main" in why, why
    assert (meta / "ready").read_text() == BLIND
    assert not (meta / "fp.json").exists()  # nothing done before main: it never starts
    hook = subprocess.run(hook_argv(meta), capture_output=True, text=True, timeout=60)
    assert hook.returncode == 1 and "will not run main (blind)" in hook.stderr, hook.stderr
    assert (meta / "gate").is_symlink()  # shut: the kubelet will not mount it for main
    assert not (meta / "hook-done").exists()


def test_the_reporter_is_blind_only_where_pid_1_is_itself_or_its_ancestor() -> None:
    """The rule, on parent maps: PID 1 reached from the reporter means a namespace of its container
    alone; a line of parents leaving the namespace (0), or unreadable, is no reason to fail a pod."""
    assert blind_reason(1, lambda pid: 0) is not None  # the reporter is PID 1
    assert blind_reason(2, {2: 1, 1: 0}.get) is not None  # bwrap's or tini's init started it
    assert blind_reason(9, {9: 5, 5: 1}.get) is not None  # a shell between
    assert blind_reason(7, {7: 0}.get) is None  # started from outside: a pod's shared namespace
    assert blind_reason(7, {7: 4, 4: 0}.get) is None  # an init of its own, itself started from outside
    assert blind_reason(7, {}.get) is None  # unreadable: never fail a pod on a guess
    assert blind_reason(7, {7: 8, 8: 7}.get) is None  # no loop runs forever


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "aarch64"), reason="HELD_FORK knows userfaultfd's number there only"
)
@pytest.mark.skipif(
    os.geteuid() != 0,
    reason="holding a fork needs userfaultfd, which only root may use here; `make test` runs as root in CI",
)
def test_a_main_whose_fork_is_held_after_its_pid_is_allocated_is_not_taken_for_ended(tmp_path: Path) -> None:
    """The fresh-machine failure (`test_a_stale_control_file_counts_as_missing`, iteration 1's file
    read as missing): `main`'s first process has its PID, but the fork that creates it has not
    finished, so /proc lists nothing. Held two seconds here (let go at once should the reporter end
    meanwhile, as it did), far longer than two looks: the reporter must ask the kernel about that
    PID rather than take the quiet for `main`'s end."""
    control = tmp_path / "control.json"
    envelope = run_pod(tmp_path, f"echo '{{\"continue\": true}}' > {control}", gap=0.1, held=2.0)
    assert envelope["status"] == "found" and envelope["control"] == {"continue": True}, envelope


def _ready(meta: Path) -> bool:
    ready = meta / "ready"
    return ready.exists() and ready.read_text().isdigit()


def test_a_hook_the_kubelet_never_ran_has_the_reporter_open_the_gate_itself(tmp_path: Path) -> None:
    """The kubelet restarted after it started the reporter and before it ran its postStart hook (the
    chaos suite's pod runner restart, docs/design.md#hook-lost): no hook ever runs. The reporter shut
    `main`'s gate as its first act, so the restarted kubelet's try at `main` is refused, but it makes
    the knock first; the reporter, holding the claim, then takes the watermark and opens the gate
    itself, and reports what the `main` started after that wrote -- instead of waiting for the
    hook's last line for good while `main` ran unguarded at a gate the kubelet made."""
    meta, control = tmp_path / "meta", tmp_path / "control.json"
    meta.mkdir()
    with pod_namespace(tmp_path) as (inside, fds), (meta / "reporter.err").open("w") as err:
        reporter = subprocess.Popen(
            [*inside, *reporter_argv(meta, control), *gate_argv(meta)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            pass_fds=fds,
        )
        try:
            wait_until(lambda: _ready(meta), reporter, meta, "the reporter ready")
            assert (meta / "gate").is_symlink() and os.readlink(meta / "gate") == "/"  # shut by the reporter
            (meta / "knock").mkdir()  # the kubelet's try at main: the knock made, the shut gate refused
            gate = meta / "gate"
            wait_until(lambda: not gate.is_symlink() and gate.is_dir(), reporter, meta, "main's gate opened")
            assert not (meta / "hook-done").exists()
            main = f"echo '{{\"continue\": false}}' > {control}"
            launched = subprocess.run(
                [*inside, "sh", "-c", main], capture_output=True, text=True, timeout=60, pass_fds=fds
            )
            assert launched.returncode == 0, launched.stderr
            code = reporter.wait(timeout=60)
        finally:
            reporter.kill()
    log = (meta / "reporter.err").read_text()
    assert code == 0, log
    envelope = json.loads((meta / "termination-log").read_text())
    assert envelope["status"] == "found" and envelope["control"] == {"continue": False}, (envelope, log)
    assert "the postStart hook never completed" in log and "main ended (its processes:" in log, log


def test_a_hook_that_failed_on_purpose_leaves_the_gate_shut_though_the_kubelet_knocks(tmp_path: Path) -> None:
    """A hook that failed (here: it says so in hook-failed, as for a reporter never ready in time)
    has the kubelet kill the reporter and go on to `main`, which knocks: the reporter must not open
    the gate for it. It says what it waits for, and at SIGTERM reports with the gate still shut."""
    meta, control = tmp_path / "meta", tmp_path / "control.json"
    meta.mkdir()
    with pod_namespace(tmp_path) as (inside, fds), (meta / "reporter.err").open("w") as err:
        reporter = subprocess.Popen(
            [*inside, *reporter_argv(meta, control), *gate_argv(meta)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            pass_fds=fds,
        )
        try:
            wait_until(lambda: _ready(meta), reporter, meta, "the reporter ready")
            (meta / "hook-failed").write_text("the reporter was not ready in time; main stays shut\n")
            (meta / "knock").mkdir()
            said = "the postStart hook failed: waiting for the kubelet to stop this container"
            wait_until(lambda: said in (meta / "reporter.err").read_text(), reporter, meta, "its word")
            # The kubelet kills the container of a failed hook: SIGTERM to its process (bwrap's child).
            children = Path(f"/proc/{reporter.pid}/task/{reporter.pid}/children").read_text().split()
            os.kill(int(children[0]), signal.SIGTERM)
            code = reporter.wait(timeout=60)
        finally:
            reporter.kill()
    assert code == 0, (meta / "reporter.err").read_text()
    assert (meta / "gate").is_symlink() and os.readlink(meta / "gate") == "/"
    assert json.loads((meta / "termination-log").read_text())["status"] != "found"
