"""A test driver that plays the kubelet's part against the real API server.

It registers a Node, binds the Job controller's pods to it, and reports them Running and then
terminated with the exit code and the reporter's termination message the test scenario chooses.
Pods being deleted (a Job's activeDeadlineSeconds, or a cancel) are confirmed gone, as a kubelet
would after killing their processes. No process runs; this is the API-level contract only.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_operator import naming
from agentrun_operator.control.envelope import encode_envelope, parse_control_payload
from agentrun_operator.jobs.builder import ANNOTATION_RUN_NAME
from agentrun_operator.jobs.reporter_container import GATE_REFUSAL

NODE = "agentrun-test-node"


@dataclass(frozen=True)
class PodOutcome:
    """What happens to one pod: how its main container ends and what the reporter reports."""

    exit_code: int = 0
    control: dict[str, Any] | None = None  # becomes a `found` envelope
    envelope: dict[str, Any] | None = None  # a raw envelope, when the test wants full control
    # The bytes of the control file: the envelope is what the reporter's own parser makes of them.
    control_bytes: bytes | None = None
    run_seconds: float = 0.0  # how long the pod stays Running
    hang: bool = False  # never finish (e.g. until activeDeadlineSeconds kills it)
    # How long the pod takes to stop once deleted (a main that ignores SIGTERM, killed after its
    # grace period): it stays Running, with its deletion timestamp, until then.
    stop_seconds: float = 0.0
    # Never start: the pod stays Pending with its containers `ContainerCreating`, as a kubelet keeps
    # a pod whose volume it cannot mount (the test posts the kubelet's `FailedMount` Event itself).
    mounting: bool = False
    # The reporter ends before it is ready with this termination message (it crashed, or its hook
    # gave up): the kubelet then holds `main` at its shut gate, Running, for good.
    reporter_dies: str | None = None


Scenario = Callable[[dict[str, Any]], PodOutcome]
Outcomes = Callable[[int, int], PodOutcome]
"""A run's script: (iteration, attempt) -> what happens to that attempt's pod."""


def _succeeds(_iteration: int, _attempt: int) -> PodOutcome:
    return PodOutcome()


class ScriptedOutcomes:
    """The outcome of each pod, scripted per run by the test: `runs[name] = lambda i, a: ...`.

    Its `outcome` is the driver's Scenario; a run without a script succeeds with no control file.
    """

    def __init__(self) -> None:
        self.runs: dict[str, Outcomes] = {}
        # Scripts that need to know which step a pod is (children of groups and switches): the
        # pod's labels (step name, step-path, iteration, attempt) -> what happens to it.
        self.by_labels: dict[str, Callable[[dict[str, str]], PodOutcome]] = {}

    def outcome(self, pod: dict[str, Any]) -> PodOutcome:
        meta = pod["metadata"]
        labels = meta.get("labels", {})
        run = (meta.get("annotations") or {}).get(ANNOTATION_RUN_NAME) or labels.get(naming.LABEL_RUN)
        if str(run) in self.by_labels:
            return self.by_labels[str(run)](dict(labels))
        fn = self.runs.get(str(run), _succeeds)
        return fn(int(labels.get(naming.LABEL_ITERATION, 1)), int(labels.get(naming.LABEL_ATTEMPT, 1)))


def envelope_for(outcome: PodOutcome, path: str) -> str:
    if outcome.envelope is not None:
        return json.dumps(outcome.envelope)
    if outcome.control_bytes is not None:
        return encode_envelope(parse_control_payload(outcome.control_bytes, path))
    if outcome.control is None:
        return json.dumps({"v": 1, "status": "missing", "path": path, "size": None, "reason": None})
    body = json.dumps(outcome.control, separators=(",", ":"))
    return json.dumps(
        {
            "v": 1,
            "status": "found",
            "path": path,
            "size": len(body),
            "reason": None,
            "control": outcome.control,
        }
    )


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class KubeletDriver:
    plane: ControlPlane
    namespace: str
    scenario: Scenario
    poll: float = 0.05
    # A server-side filter on the pods it plays (e.g. UNFINISHED: at scale, skip the finished ones).
    field_selector: str = ""
    seen: dict[str, float] = field(default_factory=dict)  # pod name -> monotonic time bound
    finished_at: dict[str, float] = field(default_factory=dict)  # pod name -> monotonic time finished
    deleted_since: dict[str, float] = field(default_factory=dict)  # pod name -> monotonic time seen deleted
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    # Pods in a final phase need no kubelet: deleting them is immediate, nothing is left to report.
    UNFINISHED = "status.phase!=Succeeded,status.phase!=Failed"

    def _req(self, method: str, path: str, body: Any = None, ctype: str = "application/json") -> Any:
        code, data = self.plane.api_request(method, path, body, content_type=ctype)
        if code >= 300 and code != 404 and code != 409:
            self.errors.append(f"{method} {path}: {code} {data[:300]!r}")
        return json.loads(data) if data else {}

    def start(self) -> KubeletDriver:
        self._req(
            "POST",
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
            },
        )
        self._thread = threading.Thread(target=self._loop, daemon=True, name="kubelet-driver")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # keep playing; the test reads `errors`
                self.errors.append(repr(exc))
            time.sleep(self.poll)

    def _tick(self) -> None:
        pods = self._req(
            "GET",
            f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={naming.LABEL_RUN}"
            + (f"&fieldSelector={self.field_selector}" if self.field_selector else ""),
        ).get("items", [])
        for pod in pods:
            meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
            name = meta["name"]
            base = f"/api/v1/namespaces/{self.namespace}/pods/{name}"
            if meta.get("deletionTimestamp"):
                # The kubelet kills the containers, then confirms the deletion.
                since = self.deleted_since.setdefault(name, time.monotonic())
                stopping = status.get("phase") not in ("Succeeded", "Failed")
                if stopping and time.monotonic() - since < self.scenario(pod).stop_seconds:
                    continue
                self._req(
                    "DELETE", base, {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
                )
                continue
            if not spec.get("nodeName"):
                self._req(
                    "POST",
                    f"{base}/binding",
                    {
                        "apiVersion": "v1",
                        "kind": "Binding",
                        "metadata": {"name": name},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
                    },
                )
                self.seen[name] = time.monotonic()
                continue
            phase = status.get("phase", "Pending")
            if phase in ("Succeeded", "Failed"):
                continue
            outcome = self.scenario(pod)
            started = self.seen.setdefault(name, time.monotonic())
            if phase == "Pending":
                if outcome.mounting:
                    if not status.get("containerStatuses"):
                        self._set_status(pod, self._creating_status(pod))
                    continue
                if outcome.reporter_dies is not None:
                    self._set_status(pod, self._held_status(pod, outcome.reporter_dies))
                    continue
                self._set_status(pod, self._running_status(pod))
                continue
            if outcome.reporter_dies is not None:
                continue
            if outcome.hang or time.monotonic() - started < outcome.run_seconds:
                continue
            self._set_status(pod, self._terminated_status(pod, outcome))
            self.finished_at[name] = time.monotonic()

    def _control_path(self, pod: dict[str, Any]) -> str:
        for c in pod["spec"].get("containers", []):
            for env in c.get("env") or []:
                if env.get("name") == "AGENTRUN_LOOP_CONTROL_PATH":
                    return str(env.get("value"))
        return "/workspace/.agentrun/loop-control.json"

    def _creating_status(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Pending, every container waiting `ContainerCreating` (the kubelet still mounting)."""
        waiting = [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {"waiting": {"reason": "ContainerCreating"}},
            }
            for c in pod["spec"]["containers"]
        ]
        return {"phase": "Pending", "startTime": _now(), "hostIP": "127.0.0.1", "containerStatuses": waiting}

    def _held_status(self, pod: dict[str, Any], said: str) -> dict[str, Any]:
        """The reporter ended (exit 1) before it was ready; `main` waits at its shut gate with the
        kubelet's `CreateContainerConfigError` (tests/e2e/test_job_claim.py shows the real one)."""
        now = _now()
        gate = {"reason": "CreateContainerConfigError", "message": f'{GATE_REFUSAL}: "gate" is a symlink'}
        reporter = {"exitCode": 1, "reason": "Error", "message": said, "startedAt": now, "finishedAt": now}
        statuses = [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": reporter} if c["name"] == "reporter" else {"waiting": gate},
            }
            for c in pod["spec"]["containers"]
        ]
        return {"phase": "Running", "startTime": now, "hostIP": "127.0.0.1", "containerStatuses": statuses}

    def _running_status(self, pod: dict[str, Any]) -> dict[str, Any]:
        now = _now()
        inits = []
        for c in pod["spec"].get("initContainers") or []:
            if c.get("restartPolicy") == "Always":
                inits.append(
                    {
                        "name": c["name"],
                        "image": c["image"],
                        "imageID": "",
                        "ready": True,
                        "restartCount": 0,
                        "started": True,
                        "state": {"running": {"startedAt": now}},
                    }
                )
            else:
                inits.append(
                    {
                        "name": c["name"],
                        "image": c["image"],
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {
                            "terminated": {
                                "exitCode": 0,
                                "reason": "Completed",
                                "startedAt": now,
                                "finishedAt": now,
                            }
                        },
                    }
                )
        mains = [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": now}},
            }
            for c in pod["spec"]["containers"]
        ]
        return {
            "phase": "Running",
            "startTime": now,
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
            "initContainerStatuses": inits,
            "containerStatuses": mains,
        }

    def _terminated_status(self, pod: dict[str, Any], outcome: PodOutcome) -> dict[str, Any]:
        now = _now()
        message = envelope_for(outcome, self._control_path(pod))
        inits = []
        for c in pod["spec"].get("initContainers") or []:
            term: dict[str, Any] = {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}
            if c.get("restartPolicy") == "Always":
                term["message"] = message
            inits.append(
                {
                    "name": c["name"],
                    "image": c["image"],
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": term},
                }
            )
        # The reporter, a regular container listed before main (docs/design.md#reporter-first),
        # reports the envelope and exits 0; main ends as the scenario says.
        mains = [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {
                    "terminated": (
                        {"exitCode": 0, "reason": "Completed", "message": message}
                        if c["name"] == "reporter"
                        else {
                            "exitCode": outcome.exit_code,
                            "reason": "Completed" if outcome.exit_code == 0 else "Error",
                        }
                    )
                    | {"startedAt": now, "finishedAt": now}
                },
            }
            for c in pod["spec"]["containers"]
        ]
        return {
            "phase": "Succeeded" if outcome.exit_code == 0 else "Failed",
            "startTime": (pod.get("status") or {}).get("startTime", now),
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}],
            "initContainerStatuses": inits,
            "containerStatuses": mains,
        }

    def _set_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        body = {"metadata": {"resourceVersion": pod["metadata"]["resourceVersion"]}, "status": status}
        self._req(
            "PATCH",
            f"/api/v1/namespaces/{self.namespace}/pods/{name}/status",
            body,
            ctype="application/merge-patch+json",
        )
