"""The iteration pod's reporter when the pod runner (a kubelet) restarts while the reporter's postStart
hook runs: the new runner adopts the reporter and never runs the hook again, as a kubelet does, and
goes on to `main` (docs/design.md#hook-lost). The chaos suite met it (`--checkpoints`, 6 of 50 runs
left `Running`: `main` started at a gate the runner made open, the reporter waited for the hook's
last line for good). Here made to happen every time: the pod's hook waits for a file nobody
writes, so it is still running when the runner is killed, and is killed with it; the reporter must
open the gate itself, and report what `main` wrote."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from agentrun_operator.config import OperatorConfig
from agentrun_operator.control.gate import HOOK_MARK
from agentrun_operator.jobs.reporter_container import (
    META_MOUNT,
    META_VOLUME,
    REPORTER_READY_FILE,
    gate_mount,
    knock_mount,
    ready_hook,
    reporter_container,
)
from tests.e2e.conftest import LocalDefault
from tests.e2e.test_kubelet_behaviours import container, create_pod, wait_terminal
from tests.support.polling import eventually
from tests.support.processes import processes_with

NEVER_READY = f"{META_MOUNT}/never-written"


def _pod_dir(env: LocalDefault, name: str) -> Path | None:
    found = list(env.state_dir.glob(f"pods/{env.namespace}/{name}/*"))
    return found[0] if found else None


def test_a_hook_killed_with_the_runner_has_the_reporter_open_the_gate(local_default: LocalDefault) -> None:
    env = local_default
    mounts = [{"name": META_VOLUME, "mountPath": META_MOUNT}, {"name": "work", "mountPath": "/data"}]
    reporter = reporter_container("/data/control.json", mounts, OperatorConfig())
    hook = ready_hook()
    at = hook.index(REPORTER_READY_FILE)
    hook[at : at + 2] = [NEVER_READY, "100000"]  # the hook waits on, past the runner's death
    reporter["lifecycle"] = {"postStart": {"exec": {"command": hook}}}
    main = {
        "name": "main",
        "image": "busybox",
        "command": [
            "sh",
            "-c",
            "echo ran >> /data/main.log; echo '{\"continue\": false}' > /data/control.json",
        ],
        "volumeMounts": [{"name": "work", "mountPath": "/data"}, knock_mount(), gate_mount()],
    }
    create_pod(
        env,
        "hook-lost",
        {
            "shareProcessNamespace": True,
            "terminationGracePeriodSeconds": 5,
            "containers": [reporter, main],
            "volumes": [{"name": META_VOLUME, "emptyDir": {}}, {"name": "work", "emptyDir": {}}],
        },
    )

    def meta() -> Path | None:
        pod = _pod_dir(env, "hook-lost")
        return pod / "volumes" / META_VOLUME if pod is not None else None

    def hook_waits() -> bool:
        found = meta()
        ready = found / "reporter-ready" if found is not None else None
        return (
            found is not None
            and ready is not None
            and ready.exists()
            and ready.read_text().isdigit()
            and (found / "gate").is_symlink()
            and bool(processes_with(*hook))
        )

    eventually(hook_waits, timeout=120, what="the reporter ready, its hook waiting, main's gate shut")
    env.runner.kill()  # the reporter, a container, lives on
    try:
        # The hook goes with its kubelet on a node (the runtime stops an exec whose caller is gone);
        # the pod runner's outlives it, so stop it here as the runtime would.
        for pid in processes_with(*hook):
            os.kill(pid, signal.SIGKILL)
        eventually(lambda: not processes_with(*hook), timeout=60, what="the hook gone")
    finally:
        env.runner.start()  # adopts the reporter, never runs its hook again, goes on to main

    ended = wait_terminal(env, "hook-lost")
    folder = meta()
    assert folder is not None
    assert (folder / "knock").is_dir() and (folder / "gate").is_dir() and not (folder / "gate").is_symlink()
    assert not (folder / "hook-done").exists() and not (folder / "hook-failed").exists()
    assert ended["status"]["phase"] == "Succeeded", ended["status"]
    said = container(ended, "reporter")["state"]["terminated"]["message"]
    envelope = json.loads(said)
    assert envelope["status"] == "found" and envelope["control"] == {"continue": False}, envelope
    pod = _pod_dir(env, "hook-lost")
    assert pod is not None
    log = (pod / "logs" / "reporter" / "0.log").read_text()
    assert "the postStart hook never completed" in log and "main ended (its processes:" in log, log
    assert (pod / "volumes" / "work" / "main.log").read_text() == "ran\n"  # once
    assert HOOK_MARK in hook  # how the reporter knew the hook gone: no process of it left
    assert "adopted reporter (running)" in env.runner.logs()
