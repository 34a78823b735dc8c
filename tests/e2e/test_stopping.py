"""A timed-out or cancelled attempt stops promptly (docs/design.md#grace-period): the timeout is
recorded when the Job controller declares it, and an immediate cancel leaves no process of the
iteration running a few seconds later -- whatever `main` does with SIGTERM, unless the run asked for
a longer grace.

Only the fixture's public methods are used (the runs' heartbeats are read from their claims), so the
same tests hold on any node that runs the pods.
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

from agentrun_operator import naming
from agentrun_operator.config import IMMEDIATE_CANCEL_GRACE_SECONDS
from tests.e2e.conftest import LocalDefault, step_status
from tests.support.polling import eventually

DEADLINE = 10
RUN_LABEL = naming.LABEL_RUN
KUBERNETES_GRACE = 30
"""Kubernetes' default terminationGracePeriodSeconds. The bounds below are what tells a short grace,
or SIGTERM delivered, from this one (or from a PID 1 that ignores SIGTERM): generous on a loaded
machine and still meaningful; the figures themselves are printed."""


def test_timeout_without_retries_ends_failed_before_a_default_grace_would(
    local_default: LocalDefault,
) -> None:
    """examples/timeout.yaml with `retries: 0`: its `main` is `exec sleep` (PID 1 of a container
    of its own would ignore SIGTERM for the whole grace period): the run fails before the deadline
    plus Kubernetes' default grace could have passed."""

    def no_retry(text: str) -> str:
        return (
            text.replace("name: timeout\n", "name: timeout-bound\n")
            .replace("retries: 1", "retries: 0")
            .replace("timeout-workspace", "timeout-bound-workspace")
        )

    applied = time.monotonic()
    text = local_default.apply_example("timeout.yaml", edit=no_retry)
    assert f"timeoutSeconds: {DEADLINE}\n" in text
    run = local_default.wait_for_end("timeout-bound", timeout=3 * DEADLINE + 60)
    took = time.monotonic() - applied
    print(f"timeout.yaml (retries 0, deadline {DEADLINE}s) ended after {took:.1f}s")
    assert run["status"]["phase"] == "Failed", run["status"]
    assert took < DEADLINE + KUBERNETES_GRACE, f"the run took {took:.1f}s to fail"
    step = step_status(run)
    assert step["loop"]["stopReason"] == "LoopIterationFailed"
    message = step["loop"]["iterations"][0]["message"]
    assert f"timed out after {DEADLINE}s (activeDeadlineSeconds)" in message, message


BEATING = """
i=0
while true; do
  i=$((i+1))
  echo "$i" > /workspace/beat
  sleep 0.2
done
"""


def beating_run(
    local_default: LocalDefault, name: str, prelude: str = "", grace: int | None = None, loop: bool = True
) -> None:
    """A run whose `main` writes a heartbeat to its claim every 0.2 s until it is stopped."""
    claim = f"{name}-workspace"
    local_default.create_claim(claim)
    step: dict[str, Any] = {"name": "beat", "loop": {"maxIterations": 2}} if loop else {"name": "beat"}
    if grace is not None:
        step["terminationGracePeriodSeconds"] = grace
    manifest = {
        "apiVersion": "agents.proompteng.ai/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "runtime": {"type": "workflow"},
            "workload": {
                "image": "busybox:1.36",
                "command": ["sh", "-c"],
                "args": [prelude + BEATING],
                "volumes": [
                    {"name": "workspace", "type": "pvc", "claimName": claim, "mountPath": "/workspace"}
                ],
            },
            "workflow": {"steps": [step]},
        },
    }
    local_default.apply(json.dumps(manifest))


class Heartbeat:
    """The moments (test clock) the heartbeat file of a claim changed."""

    def __init__(self, root: Path) -> None:
        self.file = root / "beat"
        self.last = ""
        self.changed_at = 0.0

    def poll(self, now: float) -> None:
        try:
            value = self.file.read_text().strip()
        except OSError:
            return
        if value and value != self.last:
            self.last, self.changed_at = value, now


class Pods:
    """The runs' pods as the API server has them, looked at again and again: the look at which each
    one was first gone (the kubelet, or the pod runner, removes a pod only once its processes have
    ended), its heartbeat then, and the grace periods its deletions asked for, in order (the one
    that stopped it first; the runtime's confirming delete of grace 0 may follow)."""

    def __init__(self, local_default: LocalDefault, beats: dict[str, Heartbeat]) -> None:
        self.local_default = local_default
        self.beats = beats
        self.looks = 0
        self.seen: set[str] = set()
        self.graces: dict[str, list[int]] = {}  # run -> its pod's deletionGracePeriodSeconds seen
        self.gone_at: dict[str, int] = {}  # run -> the look that first found its pod gone
        self.gone_seen: dict[str, float] = {}  # run -> the test's clock at that look (printed only)
        self.last_beat: dict[str, str] = {}  # run -> its heartbeat at that look

    def look(self) -> bool:
        """Look once; whether the API server answered."""
        runs = ",".join(f"stop-{name}" for name in self.beats)
        code, body = self.local_default.plane.api_get(
            f"/api/v1/namespaces/{self.local_default.namespace}/pods"
            f"?labelSelector={quote(f'{RUN_LABEL} in ({runs})')}"
        )
        if code != 200:
            return False  # no answer (a busy API server) is no news
        self.looks += 1
        now = time.monotonic()
        pods = {
            str(pod["metadata"]["labels"][RUN_LABEL]).removeprefix("stop-"): pod
            for pod in json.loads(body)["items"]
        }
        for name, beat in self.beats.items():
            beat.poll(now)
            pod = pods.get(name)
            if pod is not None:
                self.seen.add(name)
                grace = pod["metadata"].get("deletionGracePeriodSeconds")
                asked = self.graces.setdefault(name, [])
                if grace is not None and (not asked or asked[-1] != int(grace)):
                    asked.append(int(grace))
            elif name in self.seen and name not in self.gone_at:
                self.gone_at[name] = self.looks
                self.gone_seen[name] = now
                self.last_beat[name] = beat.last
        return True

    def deleting(self, name: str) -> bool:
        """Whether the run's pod is being deleted (or already gone)."""
        return self.look() and (bool(self.graces.get(name)) or name in self.gone_at)

    def all_gone(self) -> bool:
        return self.look() and len(self.gone_at) == len(self.beats)


def test_immediate_cancel_stops_the_iterations_processes_before_their_grace_ends(
    local_default: LocalDefault,
) -> None:
    """Three runs beat on their claims, then are cancelled, one after the other: `plain` is `sh -c`
    with a 9 s grace (as PID 1 of its container, without the shared process namespace, it would
    ignore SIGTERM and live those 9 s); `deaf` ignores SIGTERM: the short default grace (3 s) ends
    it; `patient` ignores it and asked for a 9 s grace, which it gets, not Kubernetes' 30 s.

    No lifetime is timed (a shared machine may be slower): each cancel waits until the previous
    run's pod is being deleted, so each grace period starts after the one before, and the order in
    which the pods go tells the graces apart. `plain` is gone before `deaf`, whose 3 s started after
    `plain`'s deletion: `plain` did not live out its 9 s. `deaf` is gone before `patient`, whose 9 s
    started after `deaf`'s deletion: `deaf` did not live 9 s, let alone 30. The deletions asked for
    the graces meant (3 s for `deaf`, 9 s for `patient`), and no heartbeat moves once its pod is gone.
    (Typically each pod goes within ~1 s of its grace's end: printed, not bounded.)"""
    runs = {"plain": ("", 9), "deaf": ("trap '' TERM\n", None), "patient": ("trap '' TERM\n", 9)}
    for name, (prelude, grace) in runs.items():
        beating_run(local_default, f"stop-{name}", prelude, grace)
    beats = {name: Heartbeat(local_default.claim_dir(f"stop-{name}-workspace")) for name in runs}

    def all_beating() -> bool:
        now = time.monotonic()
        for beat in beats.values():
            beat.poll(now)
        return all(beat.last and int(beat.last) >= 5 for beat in beats.values())

    eventually(all_beating, timeout=180, what="every run's heartbeat", every=0.1)
    pods = Pods(local_default, beats)
    eventually(lambda: pods.look() and pods.seen == set(runs), timeout=30, what="every run's pod")
    cancelled: dict[str, float] = {}
    for name in ("plain", "deaf", "patient"):  # each grace starts after the one before
        cancelled[name] = time.monotonic()
        local_default.patch_run(f"stop-{name}", {"spec": {"cancel": "Immediate"}})
        eventually(partial(pods.deleting, name), timeout=60, what=f"stop-{name}'s pod deleted", every=0.05)
    eventually(pods.all_gone, timeout=120, what="every run's pod to be gone", every=0.05)
    print("looks at which the pods were gone:", pods.gone_at, "deletion graces:", pods.graces)
    print("pods seen gone after their cancel:", {n: f"{pods.gone_seen[n] - cancelled[n]:.1f}s" for n in runs})
    assert pods.gone_at["plain"] < pods.gone_at["deaf"], pods.gone_at  # SIGTERM ended it
    assert pods.gone_at["deaf"] < pods.gone_at["patient"], pods.gone_at  # the short grace ended it
    assert pods.graces["deaf"][0] == IMMEDIATE_CANCEL_GRACE_SECONDS, pods.graces
    assert pods.graces["patient"][0] == 9, pods.graces  # its own grace, not the short one nor 30 s
    for name in runs:
        run = local_default.wait_for_end(f"stop-{name}")
        assert run["status"]["phase"] == "Cancelled", run["status"]
        assert [it["phase"] for it in step_status(run)["loop"]["iterations"]] == ["Cancelled"]
    now = time.monotonic()
    for beat in beats.values():
        beat.poll(now)
    # No process of an iteration outlived its pod: no heartbeat moved since (plain's and deaf's for
    # as long as the pods after them took to go).
    assert {n: b.last for n, b in beats.items()} == pods.last_beat


KUBERNETES_DEFAULT_GRACE = 30


def test_a_run_without_loops_keeps_kubernetes_grace_and_an_immediate_cancel_still_ends_it_at_once(
    local_default: LocalDefault,
) -> None:
    """docs/migration.md#runner-pod: the pod of a run without loops is the one Kubernetes would give
    it -- no grace period of the operator's (the API server's 30 s), its workload container named
    `agent-runner` as the original's. An immediate cancel of it, whose workload ignores SIGTERM,
    still ends the process long before those 30 s: the operator deletes the Job's pods with a short
    grace (docs/design.md#grace-period); left to the garbage collector, it would live the 30 s."""
    name = "stop-plain-run"
    beating_run(local_default, name, "trap '' TERM\n", loop=False)
    beat = Heartbeat(local_default.claim_dir(f"{name}-workspace"))

    def beating() -> bool:
        beat.poll(time.monotonic())
        return bool(beat.last) and int(beat.last) >= 5

    eventually(beating, timeout=180, what="the run's heartbeat", every=0.1)
    code, body = local_default.plane.api_get(
        f"/api/v1/namespaces/{local_default.namespace}/pods?labelSelector=agents.proompteng.ai/agent-run={name}"
    )
    assert code == 200, body[:300]
    (pod,) = json.loads(body)["items"]
    assert pod["spec"]["terminationGracePeriodSeconds"] == KUBERNETES_DEFAULT_GRACE, pod["spec"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["reporter", "agent-runner"]
    assert pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] == "agent-runner"

    cancelled = time.monotonic()
    local_default.patch_run(name, {"spec": {"cancel": "Immediate"}})
    # Until the heartbeat has been still for 3 s (15 missed beats), or the default grace is over.
    while True:
        now = time.monotonic()
        beat.poll(now)
        if now - beat.changed_at >= 3 or now - cancelled >= KUBERNETES_DEFAULT_GRACE + 3:
            break
        time.sleep(0.05)
    lived = beat.changed_at - cancelled
    print(f"last heartbeat {lived:.1f}s after the immediate cancel (pod grace {KUBERNETES_DEFAULT_GRACE}s)")
    assert lived < KUBERNETES_DEFAULT_GRACE, f"the workload lived {lived:.1f}s: its pod's whole grace"
    run = local_default.wait_for_end(name)
    assert run["status"]["phase"] == "Cancelled", run["status"]
