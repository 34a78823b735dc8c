"""The Job TTL writes pod GC makes (planner/podgc.py), against the real API server: a warm loop's Job
is created with its TTL, and pod GC removes it (a merge patch's null) to keep a dead warm pod, or
changes it (docs/api.md#podgc)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_operator.shell.kube import Kube
from tests.support.api import ready_namespace

NAMESPACE = "job-ttl"


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    ready_namespace(control_plane, NAMESPACE)
    yield control_plane
    control_plane.kubectl("delete", "jobs", "--all", "-n", NAMESPACE, "--wait=false", check=False)


def _job(name: str, ttl: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "suspend": True,  # nothing runs it here; only its spec matters
            "ttlSecondsAfterFinished": ttl,
            "backoffLimit": 0,
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}
            },
        },
    }


def test_a_jobs_creation_ttl_is_removed_or_changed_by_the_operators_patch(plane: ControlPlane) -> None:
    plane.kubectl("create", "-f", "-", input_text=json.dumps(_job("warm-1", 300)))

    async def patch() -> tuple[Any, Any, Any]:
        kube = await Kube.connect(str(plane.kubeconfig))
        try:
            removed = await kube.set_job_ttl(NAMESPACE, "warm-1", None)
            changed = await kube.set_job_ttl(NAMESPACE, "warm-1", 3600)
            gone = await kube.set_job_ttl(NAMESPACE, "no-such-job", None)
            return removed, changed, gone
        finally:
            await kube.close()

    removed, changed, gone = asyncio.run(patch())
    assert removed is not None and "ttlSecondsAfterFinished" not in removed["spec"]
    assert changed is not None and changed["spec"]["ttlSecondsAfterFinished"] == 3600
    assert gone is None  # a Job that is gone: nothing to keep
    stored = json.loads(plane.kubectl("get", "job", "warm-1", "-n", NAMESPACE, "-o", "json"))
    assert stored["spec"]["ttlSecondsAfterFinished"] == 3600
