"""A planner-level simulation of the cluster for the planner tests (not a fake Kubernetes API).

`PlannerWorld` holds plain `ObservedJob`/`ObservedPod` values and a persisted status. `plan()` calls the
real planner with them and applies its actions the way the shell would (create = adopt when the
name exists, delete marks pods as terminating, TTLs are recorded). Tests then finish pods with
`succeed`/`fail`/`deadline`/`vanish` and move the clock with `advance`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from agentrun_operator import naming
from agentrun_operator.api import DEFAULT_CONTROL_PATH, AgentRun, AgentRunStatus, parse_agentrun
from agentrun_operator.config import OperatorConfig
from agentrun_operator.control.envelope import ControlEnvelope, encode_envelope, parse_control_payload
from agentrun_operator.planner.actions import (
    ClaimIdempotencyKey,
    CreateJob,
    DeleteJob,
    DeleteRun,
    EmitEvent,
    Requeue,
    SetJobTTL,
    WarmCommand,
)
from agentrun_operator.planner.observed import (
    IdempotencyClaim,
    Observed,
    ObservedJob,
    ObservedPod,
    ObservedWarm,
    Refusal,
)
from agentrun_operator.planner.plan import Plan, plan
from tests.support.manifests import WORKSPACE_PVC, agentrun

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
LOOPS_ON = OperatorConfig(loops_enabled=True)


def manifest(
    steps: list[dict[str, Any]] | None = None,
    *,
    name: str = "run",
    volumes: list[dict[str, Any]] | None = None,
    image: str | None = "busybox",
    **spec: Any,
) -> dict[str, Any]:
    """An AgentRun manifest with a `workspace` PVC; `steps=None` gives one plain step `a`."""
    workload: dict[str, Any] = {"volumes": volumes if volumes is not None else [WORKSPACE_PVC]}
    if image is not None:
        workload["image"] = image
    metadata = {
        "namespace": "ns",
        "uid": f"uid-{name}",
        "generation": 1,
        "creationTimestamp": "2026-03-01T12:00:00Z",
    }
    return agentrun(
        name, steps if steps is not None else [{"name": "a"}], metadata=metadata, workload=workload, **spec
    )


def loop_step(
    name: str = "a",
    max_iterations: int = 3,
    *,
    expression: str | None = None,
    until: str | None = None,
    on_missing: str = "stop",
    on_invalid: str = "fail",
    **extra: Any,
) -> dict[str, Any]:
    """A looped step; with `expression`/`until` it is conditional, else fixed."""
    loop: dict[str, Any] = {"maxIterations": max_iterations}
    if expression is not None or until is not None:
        condition: dict[str, Any] = {
            "type": "cel",
            "source": {"onMissing": on_missing, "onInvalid": on_invalid},
        }
        if expression is not None:
            condition["expression"] = expression
        if until is not None:
            condition["until"] = until
        loop["condition"] = condition
    loop.update(extra.pop("loop", {}))
    return {"name": name, "loop": loop, **extra}


def envelope_found(control: dict[str, Any], path: str = DEFAULT_CONTROL_PATH) -> str:
    return encode_envelope(
        ControlEnvelope(status="found", path=path, size=len(str(control)), control=control)
    )


def envelope_from_bytes(data: bytes, path: str = DEFAULT_CONTROL_PATH) -> str:
    """What the reporter would report for a control file with exactly these bytes."""
    return encode_envelope(parse_control_payload(data, path))


def envelope_status(status: str, reason: str, path: str = DEFAULT_CONTROL_PATH) -> str:
    return encode_envelope(ControlEnvelope(status=status, path=path, reason=reason))  # type: ignore[arg-type]


@dataclass
class PlannerWorld:
    """Jobs, pods, referenced objects and the persisted status of one AgentRun."""

    spec_manifest: dict[str, Any]
    config: OperatorConfig = LOOPS_ON
    now: datetime = T0
    status: AgentRunStatus | None = None
    jobs: dict[str, ObservedJob] = field(default_factory=dict)
    pods: dict[str, ObservedPod] = field(default_factory=dict)
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    agents: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    providers: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    implementation_specs: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    pvc_names: frozenset[str] | None = None
    pvc_unbound: dict[str, str] = field(default_factory=dict)
    object_keys: dict[str, frozenset[str] | None] = field(default_factory=dict)
    vcs_providers: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    claim: IdempotencyClaim | None = None
    claim_checked: bool = True
    events: list[EmitEvent] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    plans: list[Plan] = field(default_factory=list)
    run_deleted: bool = False
    last_requeue: float | None = None
    # Writes the API server refuses for good: Job name -> (HTTP status, message); the status update.
    refuse_job: dict[str, tuple[int, str]] = field(default_factory=dict)
    refuse_status: tuple[int, str] | None = None
    # What each warm pod's supervisor last said (planner/warm.py), and the commands it was sent.
    warm: dict[str, ObservedWarm] = field(default_factory=dict)
    commands: list[WarmCommand] = field(default_factory=list)
    _uids: int = 0

    # ------------------------------------------------------------------ planning

    def agentrun(self) -> AgentRun:
        obj = copy.deepcopy(self.spec_manifest)
        if self.status is not None:
            obj["status"] = self.status.model_dump(by_alias=True, exclude_none=True, mode="json")
        return parse_agentrun(obj)

    def observed(self) -> Observed:
        return Observed(
            jobs=tuple(self.jobs.values()),
            pods=tuple(self.pods.values()),
            claim=self.claim,
            claim_checked=self.claim_checked,
            agents=self.agents,
            providers=self.providers,
            implementation_specs=self.implementation_specs,
            pvc_names=self.pvc_names,
            pvc_unbound=self.pvc_unbound,
            object_keys=self.object_keys,
            vcs_providers=self.vcs_providers,
            warm=dict(self.warm),
        )

    def plan(self, *, persist: bool = True, apply: bool = True) -> Plan:
        """One reconcile: plan, apply the actions, persist the status (unless the write is 'lost').

        Like the shell, a write the API server refuses for good (`refuse_job`, `refuse_status`) is
        reported to the planner as a `Refusal` and the run re-planned before anything is applied.
        """
        observed = self.observed()
        result = plan(self.agentrun(), observed, self.now, self.config)
        for _ in range(3):
            refusal = self._refusal_of(result, observed)
            if refusal is None:
                break
            observed = replace(observed, refusals=(*observed.refusals, refusal))
            result = plan(self.agentrun(), observed, self.now, self.config)
        self.plans.append(result)
        if apply:
            self.apply(result, persisted=persist)
        if persist:
            self.status = result.status
        return result

    def _refusal_of(self, result: Plan, observed: Observed) -> Refusal | None:
        for action in result.actions:
            refused = isinstance(action, CreateJob) and action.name in self.refuse_job
            if refused and observed.refusal("Job", action.name) is None and action.name not in self.jobs:
                code, message = self.refuse_job[action.name]
                return Refusal("Job", action.name, code, message)
        if self.refuse_status is not None and result.status != self.status:
            name = str(self.spec_manifest["metadata"]["name"])
            if observed.refusal("Status", name) is None:
                return Refusal("Status", name, *self.refuse_status)
        return None

    def apply(self, result: Plan, persisted: bool = True) -> None:
        """Apply the plan's actions; as the shell does, a TTL only once the status is committed."""
        self.last_requeue = None
        for action in result.actions:
            if isinstance(action, SetJobTTL) and not persisted:
                continue
            if isinstance(action, CreateJob):
                self._create(action)
            elif isinstance(action, DeleteJob):
                self._delete(action.name)
            elif isinstance(action, SetJobTTL):
                if action.name in self.jobs:
                    self.jobs[action.name] = replace(
                        self.jobs[action.name], ttl_seconds_after_finished=action.seconds
                    )
            elif isinstance(action, ClaimIdempotencyKey):
                if self.claim is None:
                    meta = self.spec_manifest["metadata"]
                    self.claim = IdempotencyClaim(action.name, meta["uid"], meta["name"])
            elif isinstance(action, EmitEvent):
                self.events.append(action)
            elif isinstance(action, DeleteRun):
                self.run_deleted = True
            elif isinstance(action, Requeue):
                self.last_requeue = action.after_seconds
            elif isinstance(action, WarmCommand) and persisted:
                self.commands.append(action)

    def _create(self, action: CreateJob) -> None:
        name = action.name
        if name in self.jobs:
            return  # adopt: the shell treats AlreadyExists as success
        labels = action.manifest["metadata"]["labels"]
        self._uids += 1
        self.jobs[name] = ObservedJob(
            name=name,
            uid=f"job-uid-{self._uids}",
            step_index=int(labels["agents.proompteng.ai/step-index"]),
            iteration=int(naming.job_iteration(labels) or 1),
            attempt=int(labels["agents.proompteng.ai/attempt"]),
            path=labels.get("agents.proompteng.ai/step-path", ""),
            label=(action.manifest["metadata"].get("annotations") or {}).get("agents.proompteng.ai/step", ""),
            outcome="Active",
            started_at=self.now,
            completions=int(action.manifest["spec"].get("completions") or 1),
            ttl_seconds_after_finished=action.manifest["spec"].get("ttlSecondsAfterFinished"),
            warm_template=(action.manifest["metadata"].get("annotations") or {}).get(
                naming.ANNOTATION_WARM_TEMPLATE
            ),
        )
        if action.manifest["spec"].get("completionMode") == "Indexed":  # a loop's candidates
            for index in range(int(action.manifest["spec"]["completions"])):
                pod = f"{name}-pod-{index}"
                self.pods[pod] = ObservedPod(name=pod, job_name=name, phase="Running", completion_index=index)
        else:
            warm = naming.LABEL_WARM in action.manifest["spec"]["template"]["metadata"]["labels"]
            ip = f"10.244.0.{self._uids}" if warm else None
            self.pods[f"{name}-pod"] = ObservedPod(
                name=f"{name}-pod", job_name=name, phase="Running", warm_ip=ip
            )
        self.manifests[name] = action.manifest
        self.created.append(name)

    def _delete(self, name: str) -> None:
        if name in self.jobs:
            del self.jobs[name]
            self.deleted.append(name)
        for pod_name, pod in list(self.pods.items()):
            if pod.job_name == name and not pod.terminal:
                self.pods[pod_name] = replace(pod, deleting=True)
            elif pod.job_name == name:
                del self.pods[pod_name]

    # ------------------------------------------------------------------ the cluster moves

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def settle(self) -> None:
        """Terminating pods finish terminating (the kubelet killed them); a Job whose pods have all
        ended then gets its terminal condition (`Failed`/`Complete` after `FailureTarget`)."""
        for pod_name, pod in list(self.pods.items()):
            if pod.deleting:
                del self.pods[pod_name]
        for name, job in list(self.jobs.items()):
            if job.settling and all(p.terminal for p in self.pods.values() if p.job_name == name):
                self.jobs[name] = replace(job, settling=False)

    def live_jobs(self) -> list[str]:
        return [j.name for j in self.jobs.values() if not j.finished]

    def active(self) -> str:
        live = self.live_jobs()
        assert len(live) == 1, f"expected exactly one live Job, got {live}"
        return live[0]

    def _finish(self, name: str, outcome: str, pod_phase: str, **pod_fields: Any) -> None:
        job = self.jobs[name]
        self.jobs[name] = replace(job, outcome=outcome, finished_at=self.now)  # type: ignore[arg-type]
        pod_name = f"{name}-pod"
        if pod_name in self.pods:
            self.pods[pod_name] = replace(
                self.pods[pod_name], phase=pod_phase, finished_at=self.now, **pod_fields
            )

    def succeed(
        self,
        name: str | None = None,
        *,
        control: dict[str, Any] | None = None,
        message: str | None = None,
    ) -> None:
        """The attempt succeeds; the reporter reports `control` (or the raw envelope `message`)."""
        name = name or self.active()
        if message is None:
            message = (
                envelope_found(control)
                if control is not None
                else envelope_status("missing", "no file at /workspace/.agentrun/loop-control.json")
            )
        self._finish(name, "Succeeded", "Succeeded", reporter_message=message, main_exit_code=0)

    def fail(
        self,
        name: str | None = None,
        exit_code: int = 1,
        message: str | None = None,
        reason: str = "Error",
        *,
        control: dict[str, Any] | None = None,
        report: str | None = None,
    ) -> None:
        """The attempt fails: main exits with `exit_code`, leaving `message` as its termination message;
        the reporter reports `control` (or the raw envelope `report`), else nothing."""
        name = name or self.active()
        if report is None and control is not None:
            report = envelope_found(control)
        self._finish(
            name,
            "Failed",
            "Failed",
            main_exit_code=exit_code,
            main_reason=reason,
            main_message=message,
            reporter_message=report,
        )

    def deadline(self, name: str | None = None) -> None:
        """activeDeadlineSeconds fired: the Job controller sets `FailureTarget` (DeadlineExceeded) and
        deletes the pod, which is still being killed; `Failed` follows once it is gone (`settle`)."""
        name = name or self.active()
        job = self.jobs[name]
        self.jobs[name] = replace(
            job, outcome="DeadlineExceeded", finished_at=self.now, message="deadline", settling=True
        )
        pod_name = f"{name}-pod"
        if pod_name in self.pods:
            self.pods[pod_name] = replace(self.pods[pod_name], deleting=True)

    def vanish(self, name: str | None = None) -> None:
        """Someone deleted the Job and its pods."""
        name = name or self.active()
        self.jobs.pop(name, None)
        for pod_name, pod in list(self.pods.items()):
            if pod.job_name == name:
                del self.pods[pod_name]

    def ttl_sweep(self) -> None:
        """The TTL controller removes finished Jobs that have a TTL (the TTL is taken as elapsed)."""
        for name, job in list(self.jobs.items()):
            if job.finished and job.ttl_seconds_after_finished is not None:
                self.vanish(name)

    # ------------------------------------------------------------------ driving

    @property
    def phase(self) -> str | None:
        return self.status.phase if self.status else None

    def step_status(self, index: int = 0) -> Any:
        assert self.status is not None and self.status.workflow is not None
        return self.status.workflow.steps[index]

    def event_reasons(self) -> list[str]:
        return [e.reason for e in self.events]

    def drive(self, outcome: Callable[[PlannerWorld, str], None], max_plans: int = 500) -> None:
        """Plan until the run is finished; `outcome(world, job)` finishes each live Job."""
        for _ in range(max_plans):
            self.plan()
            if self.phase in ("Succeeded", "Failed", "Cancelled"):
                return
            live = self.live_jobs()
            if live:
                outcome(self, live[0])
            else:
                self.settle()
                self.advance(self.last_requeue or 1.0)
        raise AssertionError(f"run did not finish within {max_plans} plans: {self.status}")
