"""The reporter's watch for `main`'s end, run for real in a PID namespace of its own (as a pod's shared
one): the reporter, its postStart hook (the real script) and a `main` started after it, as the
kubelet orders them (docs/design.md#reporter-first). Root only (a PID namespace needs it): a
machine where it is not root skips, saying so."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrun_operator.jobs.reporter_container import READY_HOOK_SCRIPT

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a PID namespace of its own needs root and util-linux's unshare",
)

POD = r"""
import os, subprocess, sys, time
meta, control, gap, main, held = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], float(sys.argv[5])
if held:
    fork = HeldFork(held)  # its thread is made before the hook's watermark, as the reporter's is
with open(f"{meta}/reporter.err", "w") as err:
    reporter = subprocess.Popen(
        [os.environ["PYTHON"], "-m", "agentrun_operator.cli", "reporter", "report", "--path", control,
         "--fingerprint", f"{meta}/fp.json", "--termination-log", f"{meta}/termination-log",
         "--hook-done", f"{meta}/hook-done", "--ready-file", f"{meta}/ready", "--before-main"],
        stdout=subprocess.DEVNULL, stderr=err,
    )
    hook = [os.environ["HOOK"], "ready", f"{meta}/ready", "1500", f"{meta}/gate", f"{meta}/hook-done"]
    subprocess.run(["sh", "-c", *hook], check=True)
    time.sleep(gap)  # no process in the namespace but PID 1 (this one) and the reporter
    if held:
        fork.done_early = lambda: reporter.poll() is not None
        assert os.waitpid(fork.run(["sh", "-c", main]), 0)[1] == 0
    else:
        subprocess.run(["sh", "-c", main], check=True)
    sys.exit(reporter.wait())
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
    """The pod in a new PID namespace (a Python PID 1 plays the pause and the kubelet): the reporter,
    the hook run to its end, `gap` seconds in which nothing of the pod but the reporter runs (as
    while the kubelet creates `main`), then `main`; with `held`, its fork held that long between
    its PID's allocation and its process's appearance (`HELD_FORK`)."""
    meta, control = tmp_path / "meta", tmp_path / "control.json"
    meta.mkdir()
    env = dict(os.environ, PYTHON=sys.executable, HOOK=READY_HOOK_SCRIPT)
    done = subprocess.run(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            sys.executable,
            "-c",
            HELD_FORK + POD,
            str(meta),
            str(control),
            str(gap),
            main,
            str(held),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr + (meta / "reporter.err").read_text()
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


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "aarch64"), reason="HELD_FORK knows userfaultfd's number there only"
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
