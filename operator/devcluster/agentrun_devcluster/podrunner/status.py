"""Pure status building: what the runner knows about each container → the pod's `status`.

The phase follows the kubelet's rules for the pods the runner runs: Pending until the init
containers are done and a main container started; Running while a container runs; Succeeded when
every main container ended with 0 (restartPolicy Never, or OnFailure), Failed when one did not or a
regular init container failed under restartPolicy Never. A pod is never reported terminal while any
container (a sidecar included) is still running, so the reporter's termination message is always
in the status that first says Succeeded or Failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from agentrun_devcluster.podrunner.spec import HOST_IP, start_order

StateKind = Literal["waiting", "running", "terminated"]


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class State:
    """One container state, as in `ContainerStatus.state`."""

    kind: StateKind
    reason: str | None = None
    message: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    started_at: str | None = None
    finished_at: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "waiting":
            body: dict[str, Any] = {"reason": self.reason or "ContainerCreating"}
            if self.message:
                body["message"] = self.message
            return {"waiting": body}
        if self.kind == "running":
            return {"running": {"startedAt": self.started_at}}
        term: dict[str, Any] = {"exitCode": self.exit_code if self.exit_code is not None else 0}
        if self.signal:
            term["signal"] = self.signal
        if self.reason:
            term["reason"] = self.reason
        if self.message:
            term["message"] = self.message
        term["startedAt"] = self.started_at
        term["finishedAt"] = self.finished_at
        return {"terminated": term}


WAITING_INIT = State("waiting", reason="PodInitializing")


@dataclass(frozen=True)
class ContainerRecord:
    """What the runner knows about one container (`kind`: init, sidecar or main)."""

    name: str
    image: str
    kind: str
    state: State = WAITING_INIT
    last_state: State | None = None
    restart_count: int = 0
    container_id: str = ""

    @property
    def running(self) -> bool:
        return self.state.kind == "running"

    @property
    def succeeded(self) -> bool:
        return self.state.kind == "terminated" and self.state.exit_code == 0

    @property
    def terminated(self) -> bool:
        return self.state.kind == "terminated"

    @property
    def ready(self) -> bool:
        if self.kind == "init":
            return self.succeeded
        return self.running

    def to_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": self.running,
            "state": self.state.to_dict(),
            "lastState": self.last_state.to_dict() if self.last_state else {},
        }
        if self.container_id:
            status["containerID"] = self.container_id
        return status


def initial_records(pod_spec: Mapping[str, Any]) -> dict[str, ContainerRecord]:
    """Every container waiting: init ones `PodInitializing`... as the kubelet reports a new pod."""
    records: dict[str, ContainerRecord] = {}
    for step in start_order(pod_spec):
        records[step.name] = ContainerRecord(step.name, str(step.spec.get("image", "")), step.kind)
    return records


@dataclass(frozen=True)
class PodVerdict:
    """A decision about the whole pod that overrides the computed phase (deadline, bad volume, ...)."""

    phase: Literal["Failed", "Succeeded"]
    reason: str
    message: str


@dataclass
class PodView:
    """Inputs of `build_status` besides the records."""

    restart_policy: str = "Always"
    start_time: str | None = None
    verdict: PodVerdict | None = None
    previous_conditions: Sequence[Mapping[str, Any]] = field(default_factory=list)
    pod_ip: str | None = None
    """The pod's own address (addresses.py); None leaves the status's podIP as it is (a pod of an
    earlier runner process that had none of its own, a pod whose state is gone)."""


def init_done(records: Sequence[ContainerRecord]) -> bool:
    """Regular init containers all succeeded and every sidecar has been started."""
    for rec in records:
        if rec.kind == "init" and not rec.succeeded:
            return False
        if rec.kind == "sidecar" and rec.state.kind == "waiting" and rec.restart_count == 0:
            return False
    return True


def pod_phase(records: Sequence[ContainerRecord], restart_policy: str) -> str:
    """The kubelet's phase for the records (see the module docstring)."""
    mains = [r for r in records if r.kind == "main"]
    anything_running = any(r.running for r in records)
    failed_init = restart_policy == "Never" and any(
        r.kind == "init" and r.terminated and not r.succeeded for r in records
    )
    if failed_init:
        return "Running" if anything_running else "Failed"
    if not init_done(records):
        return "Pending"
    if mains and all(m.terminated for m in mains) and restart_policy != "Always":
        if restart_policy == "OnFailure" and not all(m.succeeded for m in mains):
            return "Running"
        if anything_running:
            return "Running"
        return "Succeeded" if all(m.succeeded for m in mains) else "Failed"
    if any(m.running or m.terminated for m in mains):
        return "Running"
    return "Pending"


def _condition(
    kind: str,
    ok: bool,
    previous: Mapping[str, Mapping[str, Any]],
    now: str,
    reason: str | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    status = "True" if ok else "False"
    old = previous.get(kind)
    since = old.get("lastTransitionTime") if old and old.get("status") == status else None
    cond: dict[str, Any] = {
        "type": kind,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": since or now,
    }
    # Always present (null removes an old value: the status is written as a strategic merge patch).
    cond["reason"] = reason if not ok and reason else None
    cond["message"] = message if not ok and message else None
    return cond


def build_status(records: Sequence[ContainerRecord], view: PodView, now: str | None = None) -> dict[str, Any]:
    """The pod `status` for a strategic-merge patch of `pods/status`."""
    now = now or now_rfc3339()
    phase = view.verdict.phase if view.verdict else pod_phase(records, view.restart_policy)
    terminal = phase in ("Succeeded", "Failed")
    previous = {str(c.get("type")): c for c in view.previous_conditions}
    inits = [r for r in records if r.kind != "main"]
    mains = [r for r in records if r.kind == "main"]
    incomplete = [r.name for r in inits if not r.ready and (r.kind == "init" or not terminal)]
    unready = [r.name for r in mains if not r.ready]
    completed = "PodCompleted" if terminal else None
    initialized = init_done(records)
    containers_ready = not unready and bool(mains)
    conditions = [
        _condition(
            "PodReadyToStartContainers", not terminal or any(r.running for r in records), previous, now
        ),
        _condition(
            "Initialized",
            initialized,
            previous,
            now,
            "ContainersNotInitialized",
            f"containers with incomplete status: [{' '.join(incomplete)}]",
        ),
        _condition(
            "ContainersReady",
            containers_ready,
            previous,
            now,
            completed or "ContainersNotReady",
            None if completed else f"containers with unready status: [{' '.join(unready)}]",
        ),
        _condition(
            "Ready",
            containers_ready,
            previous,
            now,
            completed or "ContainersNotReady",
            None if completed else f"containers with unready status: [{' '.join(unready)}]",
        ),
    ]
    status: dict[str, Any] = {
        "phase": phase,
        "hostIP": HOST_IP,
        "hostIPs": [{"ip": HOST_IP}],
        "conditions": conditions,
        "initContainerStatuses": [within_pod_budget(r.to_status(), len(records)) for r in inits],
        "containerStatuses": [within_pod_budget(r.to_status(), len(records)) for r in mains],
    }
    if view.pod_ip is not None:
        status["podIP"] = view.pod_ip
        status["podIPs"] = [{"ip": view.pod_ip}]
    if view.start_time:
        status["startTime"] = view.start_time
    if view.verdict is not None:
        status["reason"] = view.verdict.reason
        status["message"] = view.verdict.message
    return status


POD_MESSAGE_BUDGET = 12 * 1024
"""Bytes of termination messages one pod may report (the kubelet's MaxPodTerminationMessageLogLength):
each container gets an equal share, and a longer message keeps its first bytes."""


def within_pod_budget(container_status: dict[str, Any], containers: int) -> dict[str, Any]:
    """A container status with its termination message cut to its share of the pod's budget, as
    the kubelet's status manager cuts it before writing (a pod of 3 containers: 4096 bytes each)."""
    share = POD_MESSAGE_BUDGET // max(1, containers)
    terminated = (container_status.get("state") or {}).get("terminated")
    message = terminated.get("message") if terminated else None
    if terminated is not None and message and len(message.encode()) > share:
        terminated["message"] = message.encode()[:share].decode("utf-8", "replace")
    return container_status
