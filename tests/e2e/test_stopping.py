"""A timed-out or cancelled attempt stops promptly (docs/design.md#grace-period): the timeout is
recorded when the Job controller declares it, and an immediate cancel leaves no process of the
iteration running a few seconds later -- whatever `main` does with SIGTERM, unless the run asked for
a longer grace.

Only the API server, the host's processes and the runs' claims (their heartbeats) are read, so the
same tests hold on any node that runs the pods. No duration is bounded (a loaded machine is slower):
what the tests wait for and assert are the facts that tell a prompt stop from a slow one -- who
declared the timeout, the exit code SIGTERM leaves, the grace a deletion asked for, the order in
which pods go, no heartbeat after a pod is gone.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

from agentrun_operator import naming
from agentrun_operator.config import IMMEDIATE_CANCEL_GRACE_SECONDS
from tests.e2e.conftest import LocalDefault, step_status
from tests.support.api import get_json, jobs_of_run
from tests.support.polling import eventually
from tests.support.processes import processes_with

DEADLINE = 30
"""The step's timeout: room for the pod to start and run `main` before it (a loaded machine, the real
node's tier beside this one), as in test_examples."""
RUN_LABEL = naming.LABEL_RUN
SIGTERM_EXIT = 128 + signal.SIGTERM
"""A container's exit code when SIGTERM ended it (a SIGKILL at the grace period's end is 137)."""


class PodEnds:
    """The last state the API server gave each pod matching `selector`, the grace periods its
    deletions asked for (in order), and which pods it deleted: a watch, so every change is seen
    however briefly it lasts -- the pod's final status (its containers' ends, written before the
    kubelet or the pod runner confirms the deletion) and the first deletion's grace alike."""

    def __init__(self, local_default: LocalDefault, selector: str) -> None:
        self.plane = local_default.plane
        self.path = f"/api/v1/namespaces/{local_default.namespace}/pods?labelSelector={quote(selector)}"
        self.last: dict[str, dict[str, Any]] = {}
        self.deleted: set[str] = set()
        self.graces: dict[str, list[int]] = {}
        self._version = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pod-ends")

    def __enter__(self) -> PodEnds:
        self._list()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _list(self) -> None:
        listed = get_json(self.plane, self.path)
        for pod in listed["items"]:
            self._seen(pod)
        self._version = str(listed["metadata"]["resourceVersion"])

    def _seen(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        self.last[name] = pod
        grace = pod["metadata"].get("deletionGracePeriodSeconds")
        asked = self.graces.setdefault(name, [])
        if grace is not None and (not asked or asked[-1] != int(grace)):
            asked.append(int(grace))

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a broken stream: resumed from the last version
                self._stream()

    def _stream(self) -> None:
        url = f"{self.plane.server}{self.path}&watch=1&timeoutSeconds=5&resourceVersion={self._version}"
        with urllib.request.urlopen(url, context=self.plane._client_ssl(), timeout=30) as resp:
            for raw in resp:
                event = json.loads(raw)
                pod = event.get("object") or {}
                if event.get("type") == "ERROR":  # 410 Gone: list afresh (a deletion may be missed)
                    self._list()
                    return
                self._version = str(pod["metadata"]["resourceVersion"])
                if event.get("type") != "BOOKMARK":
                    self._seen(pod)
                if event.get("type") == "DELETED":
                    self.deleted.add(pod["metadata"]["name"])

    def all_deleted(self) -> bool:
        return bool(self.last) and set(self.last) == self.deleted


def ended(pod: dict[str, Any], container: str) -> dict[str, Any]:
    """How the pod's `container` terminated (fails naming the pod's status when it did not)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status["name"] == container and (status.get("state") or {}).get("terminated"):
            result: dict[str, Any] = status["state"]["terminated"]
            return result
    raise AssertionError(f"{container} of {pod['metadata']['name']} never ended: {pod.get('status')}")


def test_timeout_without_retries_is_the_job_controllers_and_sigterm_ends_the_process(
    local_default: LocalDefault,
) -> None:
    """examples/timeout.yaml with `retries: 0`: its `main` is `exec sleep` (PID 1 of a container
    of its own would ignore SIGTERM for the whole grace period, Kubernetes' 30 s). No time is
    bounded: the facts say what ended the run. The Job controller declared the Job's deadline
    exceeded (its `activeDeadlineSeconds` the step's timeout), and the iteration records that
    verdict (not the planner's fallback, which deletes a Job that outlived its deadline 30 s
    later); the pod the controller deleted went only once its `main` ended, and SIGTERM ended it
    (143; a SIGKILL at the grace period's end is 137); no `sleep` of it is left."""
    sleep = local_default.own_sleep("7786")

    def no_retry(text: str) -> str:
        return (
            text.replace("name: timeout\n", "name: timeout-bound\n")
            .replace("retries: 1", "retries: 0")
            .replace("timeout-workspace", "timeout-bound-workspace")
            .replace("sleep 7777", f"sleep {sleep}")
            .replace("timeoutSeconds: 10\n", f"timeoutSeconds: {DEADLINE}\n")
        )

    with PodEnds(local_default, f"{RUN_LABEL}=timeout-bound") as pods:
        text = local_default.apply_example("timeout.yaml", edit=no_retry)
        assert f"timeoutSeconds: {DEADLINE}\n" in text
        eventually(lambda: processes_with("sleep", sleep), timeout=120, what="the attempt's sleep to run")
        run = local_default.wait_for_end("timeout-bound", timeout=240)
        eventually(pods.all_deleted, timeout=120, what="the attempt's pod to be gone")
    assert run["status"]["phase"] == "Failed", run["status"]
    step = step_status(run)
    assert step["loop"]["stopReason"] == "LoopIterationFailed"
    (iteration,) = step["loop"]["iterations"]
    assert iteration["phase"] == "Failed", iteration
    assert f"timed out after {DEADLINE}s (activeDeadlineSeconds)" in iteration["message"], iteration
    (job,) = jobs_of_run(local_default.plane, local_default.namespace, "timeout-bound")
    assert job["spec"]["activeDeadlineSeconds"] == DEADLINE, job["spec"]
    verdicts = {
        c["type"]: c["reason"] for c in job["status"].get("conditions") or [] if c["status"] == "True"
    }
    assert verdicts.get("FailureTarget", verdicts.get("Failed")) == "DeadlineExceeded", job["status"]
    (pod,) = pods.last.values()
    assert ended(pod, "main")["exitCode"] == SIGTERM_EXIT, pod["status"]
    assert not processes_with("sleep", sleep), "the timed-out attempt's sleep still runs"


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

    with PodEnds(local_default, f"{RUN_LABEL}={name}") as pods:
        cancelled = time.monotonic()
        local_default.patch_run(name, {"spec": {"cancel": "Immediate"}})
        eventually(pods.all_deleted, timeout=120, what="the run's pod to be gone", every=0.05)
        gone = time.monotonic()
        beat.poll(gone)
        at_gone = beat.last
    print(f"pod seen gone {gone - cancelled:.1f}s after the cancel; deletion graces {pods.graces}")
    # The operator's delete came first and asked for the short grace, not the pod's 30 s (a later
    # delete may shorten a grace, never lengthen it); the pod went only once its processes ended.
    (graces,) = pods.graces.values()
    assert graces[0] == IMMEDIATE_CANCEL_GRACE_SECONDS, pods.graces
    run = local_default.wait_for_end(name)
    assert run["status"]["phase"] == "Cancelled", run["status"]
    beat.poll(time.monotonic())
    assert beat.last == at_gone, "the workload beat on after its pod was gone"
