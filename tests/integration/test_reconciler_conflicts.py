"""The reconciler's answers to the real API server's conflict and refusal branches.

The reconciler runs in-process against the real kube-apiserver (no operator process and no kubelet:
nothing else writes these runs). For the 409 branch the only thing added is a concurrent writer: a
second client changes the run between the reconciler's read and its status write, so the API server
itself answers the write with 409 Conflict. For the refusal branch the run asks for something the
CRD admits but the Job API refuses (requests above limits), so the 422 is the API server's own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_operator import naming
from agentrun_operator.config import OperatorConfig
from agentrun_operator.shell.cache import RunCache
from agentrun_operator.shell.kube import Kube
from agentrun_operator.shell.reconciler import Reconciler
from agentrun_operator.shell.resync import relist
from tests.support.claims import bound_claim
from tests.support.manifests import workflow_run
from tests.support.polling import eventually

NAMESPACE = "conflicts"
CONFIG = OperatorConfig(loops_enabled=True)


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    if not control_plane.kubectl("get", "ns", NAMESPACE, "--ignore-not-found", "-o", "name").strip():
        control_plane.kubectl("create", "namespace", NAMESPACE)
    eventually(
        lambda: control_plane.api_get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")[0] == 200,
        what="the namespace's default ServiceAccount",
    )
    bound_claim(control_plane, NAMESPACE)  # the runs' `ws` claim: the operator starts nothing without it
    yield control_plane
    control_plane.kubectl("delete", "agentruns", "--all", "-n", NAMESPACE, "--wait=false", check=False)


def _create(plane: ControlPlane, manifest: dict[str, Any]) -> None:
    manifest["metadata"]["namespace"] = NAMESPACE
    plane.kubectl("create", "-f", "-", input_text=json.dumps(manifest))


def _get(plane: ControlPlane, kind: str, name: str) -> dict[str, Any]:
    return dict(json.loads(plane.kubectl("get", kind, name, "-n", NAMESPACE, "-o", "json")))


def _jobs(plane: ControlPlane, run: str) -> list[str]:
    out = plane.kubectl("get", "jobs", "-n", NAMESPACE, "-l", f"{naming.LABEL_RUN}={run}", "-o", "json")
    return sorted(j["metadata"]["name"] for j in json.loads(out)["items"])


class RacedKube(Kube):
    """The real client; before its next status write, another writer changes the run."""

    def __init__(self, kube: Kube, plane: ControlPlane) -> None:
        super().__init__(kube.configuration)
        self.plane = plane
        self.race_next_status_write = False
        self.status_answers: list[str] = []

    async def replace_run_status(self, run: dict[str, Any]) -> dict[str, Any]:
        if self.race_next_status_write:
            self.race_next_status_write = False
            name = run["metadata"]["name"]
            await asyncio.to_thread(
                self.plane.kubectl,
                "annotate",
                "agentrun",
                name,
                "-n",
                NAMESPACE,
                "example.com/touched=yes",
                "--overwrite",
            )
        try:
            result = await super().replace_run_status(run)
        except Exception as exc:
            self.status_answers.append(type(exc).__name__ + ": " + str(getattr(exc, "status", "")))
            raise
        self.status_answers.append("ok")
        return result


async def _reconcile_twice_with_a_race(plane: ControlPlane, name: str) -> tuple[Any, Any, list[str]]:
    kube = await Kube.connect(str(plane.kubeconfig))
    raced = RacedKube(kube, plane)
    try:
        cache = RunCache(gates=())
        await relist(kube, cache, (NAMESPACE,))
        reconciler = Reconciler(raced, CONFIG, cache)
        raced.race_next_status_write = True
        first = await reconciler.reconcile(NAMESPACE, name)
        second = await reconciler.reconcile(NAMESPACE, name)
        return first, second, raced.status_answers
    finally:
        await raced.close()
        await kube.close()


def test_status_conflict_is_replanned_from_the_fresh_object_without_a_second_job(plane: ControlPlane) -> None:
    name = "raced"
    _create(plane, workflow_run(name, {"loop": {"maxIterations": 2}}))
    first, second, answers = asyncio.run(_reconcile_twice_with_a_race(plane, name))
    # The real API server refused the stale write with 409; the reconciler asked to re-plan at once.
    assert answers[0] == "KubeError: 409"
    assert first.wrote_status is False and first.requeue_after == 0.0
    # The Job created before the lost write is adopted, not duplicated, when the run is re-planned.
    assert answers[1] == "ok" and second.wrote_status is True
    assert _jobs(plane, name) == [f"{name}-step-1-iter-1-attempt-1"]
    run = _get(plane, "agentrun", name)
    assert run["metadata"]["annotations"]["example.com/touched"] == "yes"  # the other write stands
    step = run["status"]["workflow"]["steps"][0]
    assert step["phase"] == "Running"
    assert step["jobRef"]["name"] == f"{name}-step-1-iter-1-attempt-1"
    assert [it["index"] for it in step["loop"]["iterations"]] == [1]


def test_job_refused_by_the_api_server_fails_the_run_once_with_its_message(
    plane: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    name = "refused"
    manifest = workflow_run(name, {"loop": {"maxIterations": 2}, "retries": 3})
    manifest["spec"]["workload"]["resources"] = {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}
    _create(plane, manifest)

    async def reconcile_three_times() -> tuple[list[Any], int]:
        kube = await Kube.connect(str(plane.kubeconfig))
        try:
            cache = RunCache(gates=())
            await relist(kube, cache, (NAMESPACE,))
            reconciler = Reconciler(kube, CONFIG, cache)
            results = [await reconciler.reconcile(NAMESPACE, name) for _ in range(3)]
            return results, kube.counters.writes
        finally:
            await kube.close()

    with caplog.at_level("WARNING", logger="agentrun.reconciler"):
        results, _writes = asyncio.run(reconcile_three_times())
    run = _get(plane, "agentrun", name)
    status = run["status"]
    assert status["phase"] == "Failed" and status["reason"] == "JobRefused", status
    assert "HTTP 422" in status["message"]
    # main is the pod's second container, after the reporter (docs/design.md#reporter-first)
    assert "spec.template.spec.containers[1].resources.requests" in status["message"], status["message"]
    step = status["workflow"]["steps"][0]
    assert step["reason"] == "JobRefused" and step["attempt"] == 1  # retries are not spent on it
    assert step["loop"]["iterations"][0]["phase"] == "Failed"
    assert _jobs(plane, name) == []
    assert results[0].wrote_status is True
    assert [r.wrote_status for r in results[1:]] == [False, False]  # terminal: nothing asked again
    refused = [r for r in caplog.records if r.getMessage() == "write refused by the API server"]
    assert len(refused) == 1
    selector = f"involvedObject.name={name}"
    events = plane.kubectl("get", "events", "-n", NAMESPACE, "--field-selector", selector)
    assert "JobRefused" in events
