"""The reconciler's restart-safety contract: the order in which it applies a plan.

Jobs are created (or adopted) and deleted, and the idempotency claim made, before the status that
mentions them is written; Job TTLs, Events and deleting a finished run only after that status is
committed, and not at all when the write is refused. The fake client only records calls: this tests
the order of the shell's calls, not Kubernetes (the integration tests run the real API server).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from agentrun_operator import naming
from agentrun_operator.api import parse_agentrun
from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner.actions import (
    Action,
    ClaimIdempotencyKey,
    CreateJob,
    DeleteJob,
    DeleteRun,
    EmitEvent,
    Requeue,
    SetJobTTL,
)
from agentrun_operator.planner.context import Plan
from agentrun_operator.shell import reconciler as reconciler_module
from agentrun_operator.shell.cache import RunCache
from agentrun_operator.shell.codec import canonical_json
from agentrun_operator.shell.kube import KubeError
from agentrun_operator.shell.reconciler import Reconciler
from tests.support.manifests import WORKSPACE_PVC, agentrun

CONFIG = OperatorConfig(loops_enabled=True, runner_image="busybox", reporter_image="operator:1")


def stored_run(**spec: Any) -> dict[str, Any]:
    manifest = agentrun(
        "run",
        [{"name": "a"}],
        metadata={"namespace": "ns", "uid": "uid-run", "generation": 1},
        workload={"image": "busybox", "volumes": [WORKSPACE_PVC]},
        **spec,
    )
    manifest["metadata"]["creationTimestamp"] = "2026-03-01T12:00:00Z"
    return manifest


class RecordingKube:
    """Answers like an API server holding `run` and its Bound claims and nothing else, and records
    every call in order."""

    def __init__(self, run: dict[str, Any], status_conflict: bool = False) -> None:
        self.run = run
        self.status_conflict = status_conflict
        self.calls: list[tuple[str, str]] = []
        self.events: list[dict[str, Any]] = []
        self.written_status: dict[str, Any] | None = None

    async def get_custom(self, namespace: str, plural: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", f"{plural}/{name}"))
        return (
            copy.deepcopy(self.run)
            if plural == "agentruns" and name == self.run["metadata"]["name"]
            else None
        )

    async def get_pvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", f"persistentvolumeclaims/{name}"))
        volume = {"volumeName": f"pv-{name}"}
        return {"metadata": {"name": name}, "spec": volume, "status": {"phase": "Bound"}}

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", f"leases/{name}"))
        return None

    async def create_job(self, manifest: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        name = manifest["metadata"]["name"]
        self.calls.append(("create", f"jobs/{name}"))
        owned = {**manifest["metadata"], "uid": f"uid-{name}"}
        return True, {**manifest, "metadata": owned}

    async def delete_job(self, namespace: str, name: str, foreground: bool = False) -> None:
        self.calls.append(("delete", f"jobs/{name}"))

    async def delete_job_pods(self, namespace: str, job_uid: str, grace_seconds: int) -> bool:
        self.calls.append(("delete", f"pods?controller-uid={job_uid}&grace={grace_seconds}"))
        return not self.pods_forbidden

    pods_forbidden = False

    async def create_lease(self, namespace: str, manifest: dict[str, Any]) -> bool:
        self.calls.append(("create", f"leases/{manifest['metadata']['name']}"))
        return True

    async def replace_run_status(self, run: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("replace", "agentruns/run/status"))
        if self.status_conflict:
            raise KubeError(409, {"message": "the object has been modified"}, "replace status")
        self.written_status = run["status"]
        return run

    async def set_job_ttl(self, namespace: str, name: str, seconds: int | None) -> None:
        self.calls.append(("patch", f"jobs/{name}"))

    async def create_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", f"events/{event['reason']}"))
        self.events.append(event)
        return {**event, "metadata": {**event.get("metadata", {}), "name": f"event-{len(self.calls)}"}}

    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch", f"events/{name}"))
        return {"metadata": {"name": name}, **patch}

    async def delete_run(self, namespace: str, name: str, uid: str) -> None:
        self.calls.append(("delete", f"agentruns/{name}"))


def reconcile(kube: RecordingKube) -> reconciler_module.ReconcileResult:
    """One reconcile, reading the run from a watch cache that holds it (as the operator's does)."""
    cache = RunCache(gates=())
    cache.runs.upsert(copy.deepcopy(kube.run))
    return asyncio.run(Reconciler(kube, CONFIG, cache).reconcile("ns", "run"))  # type: ignore[arg-type]


def writes(kube: RecordingKube) -> list[tuple[str, str]]:
    return [c for c in kube.calls if c[0] != "get" and c[0] != "list"]


def test_a_new_run_creates_its_job_before_the_status_that_names_it_and_posts_events_after() -> None:
    kube = RecordingKube(stored_run())
    result = reconcile(kube)
    job = "jobs/run-step-1-iter-1-attempt-1"
    assert writes(kube)[:2] == [("create", job), ("replace", "agentruns/run/status")]
    assert {c[0] for c in writes(kube)[2:]} == {"create"}
    assert all(c[1].startswith("events/") for c in writes(kube)[2:]) and writes(kube)[2:]
    assert result.wrote_status
    step = kube.written_status["workflow"]["steps"][0]  # type: ignore[index]
    assert step["jobRef"] == {"name": "run-step-1-iter-1-attempt-1", "uid": f"uid-{job[5:]}"}


def test_the_run_after_our_status_write_is_what_parsing_the_answer_gives() -> None:
    """The reconciler does not validate its own write's answer again (docs/operator.md#performance):
    what it remembers must be exactly what parsing the stored object would give, job uid included."""
    kube = RecordingKube(stored_run())
    cache = RunCache(gates=())
    cache.runs.upsert(copy.deepcopy(kube.run))
    rec = Reconciler(kube, CONFIG, cache)  # type: ignore[arg-type]
    asyncio.run(rec.reconcile("ns", "run"))
    stored = cache.run("ns", "run")
    assert stored is not None and kube.written_status is not None
    remembered, persisted = rec._parse(stored)
    fresh = parse_agentrun(copy.deepcopy(stored))
    assert remembered == fresh
    assert reconciler_module.status_dict(fresh) == kube.written_status
    assert persisted == canonical_json(kube.written_status)
    assert kube.written_status["workflow"]["steps"][0]["jobRef"]["uid"] == "uid-run-step-1-iter-1-attempt-1"


def fixed_plan(monkeypatch: pytest.MonkeyPatch, actions: tuple[Action, ...], change_status: bool) -> None:
    """Make the planner answer with `actions` (in this order), so the shell's ordering is what is tested."""

    def planned(run: Any, observed: Any, now: Any, config: Any) -> Plan:
        status = run.status.model_copy() if run.status is not None else None
        assert status is not None
        if change_status:
            status.message = "changed"
        return Plan(status, actions)

    monkeypatch.setattr(reconciler_module, "plan", planned)


NEW_JOB_LABELS = {naming.LABEL_STEP: "a", naming.LABEL_ITERATION: "1", naming.LABEL_ATTEMPT: "1"}
MIXED: tuple[Action, ...] = (
    EmitEvent("Normal", "First", "an event listed first"),
    SetJobTTL("old-job", 300),
    DeleteRun("uid-run"),
    CreateJob({"metadata": {"name": "new-job", "labels": NEW_JOB_LABELS}}),
    Requeue(5.0),
    DeleteJob("stray-job", "not the active attempt"),
    ClaimIdempotencyKey("claim", "agent", "key"),
    EmitEvent("Warning", "Last", "an event listed last"),
)
BEFORE_STATUS = [("create", "jobs/new-job"), ("delete", "jobs/stray-job"), ("create", "leases/claim")]
AFTER_STATUS = [
    ("patch", "jobs/old-job"),
    ("delete", "agentruns/run"),
    # The reconcile's Events are aggregated into one (docs/operator.md#events): the most telling
    # reason (a Warning wins), each part kept under its own reason in the message.
    ("create", "events/Last"),
]


def running_run() -> dict[str, Any]:
    run = stored_run()
    run["status"] = {"phase": "Running", "startedAt": "2026-03-01T12:00:00Z"}
    return run


def test_writes_before_the_status_and_effects_after_it_whatever_order_the_plan_lists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fixed_plan(monkeypatch, MIXED, change_status=True)
    kube = RecordingKube(running_run())
    result = reconcile(kube)
    done = writes(kube)
    status_at = done.index(("replace", "agentruns/run/status"))
    assert done[:status_at] == [BEFORE_STATUS[0], BEFORE_STATUS[1], BEFORE_STATUS[2]]
    assert sorted(done[status_at + 1 :]) == sorted(AFTER_STATUS)
    # One Event for the reconcile; its parts keep the planner's order.
    assert [c for c in done if c[1].startswith("events/")] == [("create", "events/Last")]
    (event,) = kube.events
    assert event["type"] == "Warning"
    assert event["message"].index("First: an event listed first") < event["message"].index("Last: an event")
    assert result.requeue_after == 0.0  # the claim asks for an immediate look


def test_a_refused_status_write_applies_nothing_that_must_follow_it(monkeypatch: pytest.MonkeyPatch) -> None:
    fixed_plan(monkeypatch, MIXED, change_status=True)
    kube = RecordingKube(running_run(), status_conflict=True)
    result = reconcile(kube)
    done = writes(kube)
    assert done == [*BEFORE_STATUS, ("replace", "agentruns/run/status")]
    assert result.requeue_after == 0.0 and not result.wrote_status


def test_an_unchanged_status_is_not_written_and_the_effects_still_apply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fixed_plan(monkeypatch, MIXED, change_status=False)
    kube = RecordingKube(running_run())
    reconcile(kube)
    done = writes(kube)
    assert ("replace", "agentruns/run/status") not in done
    assert done[:3] == BEFORE_STATUS
    assert sorted(done[3:]) == sorted(AFTER_STATUS)


def test_the_idempotency_claim_and_volume_claims_are_read_only_before_the_first_job() -> None:
    """The planner reads them in admission alone: a started run makes no GET for them."""
    before = RecordingKube(stored_run(idempotencyKey="nightly"))
    reconcile(before)
    reads = [c for c in before.calls if c[0] == "get"]
    assert any(c[1].startswith("persistentvolumeclaims/") for c in reads)
    assert any(c[1].startswith("leases/") for c in reads)
    started = stored_run(idempotencyKey="nightly")
    started["status"] = {"phase": "Running", "startedAt": "2026-03-01T12:00:00Z"}
    after = RecordingKube(started)
    reconcile(after)
    assert [c for c in after.calls if c[0] == "get"] == []


class RefusingKube(RecordingKube):
    """Refuses (HTTP 422) the create of every Job."""

    async def create_job(self, manifest: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        self.calls.append(("create", f"jobs/{manifest['metadata']['name']}"))
        raise KubeError(422, {"message": "refused"}, "create job")


def counted_plans(monkeypatch: pytest.MonkeyPatch, job_of: Any) -> list[int]:
    """Plans that each create the Job `job_of(refusals so far)` and change the status; their count."""
    made: list[int] = []

    def planned(run: Any, observed: Any, now: Any, config: Any) -> Plan:
        made.append(len(observed.refusals))
        status = run.status.model_copy(update={"message": f"plan {len(made)}"})
        return Plan(status, (CreateJob({"metadata": {"name": job_of(len(observed.refusals))}}),))

    monkeypatch.setattr(reconciler_module, "plan", planned)
    return made


def test_each_new_refusal_is_re_planned_once_up_to_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan asking for a new Job after each refusal: one plan per refusal, and no more than the
    bound (docs/design.md#refused-writes)."""
    made = counted_plans(monkeypatch, lambda refused: f"job-{refused}")
    result = reconcile(RefusingKube(running_run()))
    assert made == list(range(reconciler_module.MAX_PLANS_PER_RECONCILE))
    assert not result.wrote_status and result.requeue_after is None


def test_a_refused_write_asked_for_again_stops_the_reconcile(monkeypatch: pytest.MonkeyPatch) -> None:
    made = counted_plans(monkeypatch, lambda refused: "same-job")
    kube = RefusingKube(running_run())
    reconcile(kube)
    assert made == [0, 1]  # the re-plan asked for the refused Job again: no third plan
    assert writes(kube) == [("create", "jobs/same-job")] * 2


@pytest.mark.parametrize("forbidden", [False, True], ids=["granted", "no-deletecollection-grant"])
def test_an_immediate_cancel_deletes_the_jobs_pods_with_its_grace_before_the_job(
    monkeypatch: pytest.MonkeyPatch, forbidden: bool
) -> None:
    """docs/design.md#grace-period: the pods first, so the garbage collector (which gives them their
    own grace once the Job is gone) finds them already terminating; a plain delete leaves them be.
    Without the RBAC grant the Job is deleted all the same."""
    cancel = DeleteJob("live-job", "the run was cancelled (Immediate)", None, 3, "uid-live")
    fixed_plan(monkeypatch, (cancel, DeleteJob("stray-job", "not the active attempt")), change_status=False)
    kube = RecordingKube(running_run())
    kube.pods_forbidden = forbidden
    reconcile(kube)
    assert writes(kube) == [
        ("delete", "pods?controller-uid=uid-live&grace=3"),
        ("delete", "jobs/live-job"),
        ("delete", "jobs/stray-job"),
    ]


def test_a_finished_run_is_not_held_parsed_and_is_parsed_again_when_reconciled() -> None:
    """The parse kept between reconciles is for unfinished runs: a finished one's model would be held
    for nothing (docs/operator.md#scale). Reconciling it again parses it again, to the same model."""
    run = stored_run()
    run["status"] = {"phase": "Succeeded"}
    kube = RecordingKube(run)
    cache = RunCache(gates=())
    cache.runs.upsert(copy.deepcopy(run))
    rec = Reconciler(kube, CONFIG, cache)  # type: ignore[arg-type]
    asyncio.run(rec.reconcile("ns", "run"))
    assert ("ns", "run") not in rec._parsed
    stored = cache.run("ns", "run")
    assert stored is not None
    assert rec._parse(stored)[0] == parse_agentrun(copy.deepcopy(stored))
    assert ("ns", "run") not in rec._parsed
