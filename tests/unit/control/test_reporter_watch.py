"""The reporter's watch for `main`'s end, run for real in a PID namespace of its own (as a pod's shared
one): the reporter, its postStart hook (the real script) and a `main` started after it, as the
kubelet orders them (docs/design.md#reporter-first). Root only (a PID namespace needs it): a
machine where it is not root skips, saying so."""

from __future__ import annotations

import json
import os
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
meta, control, gap, main = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
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
    subprocess.run(["sh", "-c", main], check=True)
    sys.exit(reporter.wait())
"""


def run_pod(tmp_path: Path, main: str, gap: float = 0.5) -> dict[str, object]:
    """The pod in a new PID namespace (a Python PID 1 plays the pause and the kubelet): the reporter,
    the hook run to its end, `gap` seconds in which nothing of the pod but the reporter runs (as
    while the kubelet creates `main`), then `main`."""
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
            POD,
            str(meta),
            str(control),
            str(gap),
            main,
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
