"""The next iteration's pod prefers the node the last one ran on (docs/design.md#next-pod-placement),
learnt from the watch, against the real API server and Job controller with the operator as a process.

`KubeletDriver` plays the kubelet: it binds each pod to its Node (the `binding` subresource, as the
scheduler does), which reaches the operator as a MODIFIED event carrying `spec.nodeName`. The run
is created after the operator started, and the operator resyncs once an hour, so neither its first
LIST nor a resync can bring the node in: only the decode of a watch event can.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_operator import naming
from tests.integration.kubelet_driver import NODE, KubeletDriver, ScriptedOutcomes
from tests.support import api
from tests.support.api import ready_namespace
from tests.support.claims import bound_claims
from tests.support.manifests import workflow_run
from tests.support.polling import eventually
from tests.support.processes import OperatorProcess

NAMESPACE = "placement"


@pytest.fixture(scope="module")
def cluster(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ControlPlane, KubeletDriver]]:
    plane = control_plane
    ready_namespace(plane, NAMESPACE)
    bound_claims(plane, NAMESPACE, ["ws"])  # ReadWriteOnce, as workflow_run mounts it
    driver = KubeletDriver(plane, NAMESPACE, ScriptedOutcomes().outcome).start()
    operator = OperatorProcess(
        plane,
        tmp_path_factory.mktemp("operator"),
        env={"AGENTS_CONTROLLER_NAMESPACES": NAMESPACE, "AGENTS_CONTROLLER_RESYNC_SECONDS": "3600"},
    ).start()
    try:
        yield plane, driver
    finally:
        operator.stop()
        driver.stop()
        assert not driver.errors, driver.errors[:5]


def _job(plane: ControlPlane, name: str) -> dict[str, Any] | None:
    return next((j for j in api.jobs_of_run(plane, NAMESPACE, "near") if j["metadata"]["name"] == name), None)


def test_iteration_two_prefers_the_node_iteration_one_was_bound_to_by_a_watch_event(
    cluster: tuple[ControlPlane, KubeletDriver],
) -> None:
    plane, driver = cluster
    run = workflow_run("near", {"loop": {"maxIterations": 2}})
    plane.kubectl("create", "-n", NAMESPACE, "-f", "-", input_text=json.dumps(run))
    second = eventually(lambda: _job(plane, naming.job_name("near", 1, 2, 1)), what="iteration 2's Job")
    first = naming.job_name("near", 1, 1, 1)
    assert any(pod.startswith(first + "-") for pod in driver.seen), (
        "iteration 1's pod was never bound",
        driver.seen,
    )
    preference = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
    assert second["spec"]["template"]["spec"].get("affinity") == {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": preference}]
        }
    }
