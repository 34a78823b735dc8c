"""A pod whose volume the node cannot mount says so in the step's message while it waits, and the
step's timeout still ends it (docs/design.md#pod-waits), against the real API server and Job
controller with the operator as a process.

`KubeletDriver` plays the kubelet: it keeps the attempt's pod `ContainerCreating` (`mounting`), and
the test posts the Event a kubelet posts then, a core/v1 `FailedMount` on the pod in the kubelet's
words. The operator watches its namespace only (`AGENTS_CONTROLLER_NAMESPACES`) and resyncs once an
hour, so only its Events watch can bring the wait in.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agentrun_devcluster.controlplane import ControlPlane
from tests.integration.kubelet_driver import KubeletDriver, PodOutcome, ScriptedOutcomes
from tests.support import api
from tests.support.api import ready_namespace
from tests.support.claims import bound_claims
from tests.support.manifests import workflow_run
from tests.support.polling import eventually
from tests.support.processes import OperatorProcess

NAMESPACE = "volume-waits"
MESSAGE = (
    'MountVolume.NewMounter initialization failed for volume "pv-gone" : path "/srv/gone" does not exist'
)
TIMEOUT = 20
"""The step's timeout: the wait must be named while the attempt waits, before this ends it (the
message then says "timed out"), whatever the machine's load; the delay is printed, not bounded."""


@pytest.fixture(scope="module")
def cluster(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ControlPlane, OperatorProcess, ScriptedOutcomes]]:
    plane = control_plane
    ready_namespace(plane, NAMESPACE)
    bound_claims(plane, NAMESPACE, ["ws"])
    outcomes = ScriptedOutcomes()
    driver = KubeletDriver(plane, NAMESPACE, outcomes.outcome).start()
    operator = OperatorProcess(
        plane,
        tmp_path_factory.mktemp("operator"),
        env={"AGENTS_CONTROLLER_NAMESPACES": NAMESPACE, "AGENTS_CONTROLLER_RESYNC_SECONDS": "3600"},
    ).start()
    try:
        yield plane, operator, outcomes
    finally:
        operator.stop()
        driver.stop()
        assert not driver.errors, driver.errors[:5]


def _post_event(plane: ControlPlane, pod: dict[str, Any], name: str, count: int, message: str) -> None:
    """The kubelet's Event (core/v1, as the kubelet's recorder posts it), created or, as the
    kubelet's correlator does for a repeat, its count and last timestamp updated."""
    meta = pod["metadata"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": NAMESPACE,
            "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"],
        },
        "reason": "FailedMount",
        "message": message,
        "type": "Warning",
        "source": {"component": "kubelet", "host": "agentrun-test-node"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": count,
        "reportingComponent": "kubelet",
        "reportingInstance": "agentrun-test-node",
    }
    path = f"/api/v1/namespaces/{NAMESPACE}/events"
    if count == 1:
        code, data = plane.api_request("POST", path, body)
    else:
        patch = {"count": count, "lastTimestamp": now, "message": message}
        code, data = plane.api_request(
            "PATCH", f"{path}/{name}", patch, content_type="application/merge-patch+json"
        )
    assert code in (200, 201), (code, data[:300])


def _step(plane: ControlPlane, name: str) -> dict[str, Any]:
    run = api.agentrun(plane, NAMESPACE, name)
    steps = ((run.get("status") or {}).get("workflow") or {}).get("steps") or [{}]
    return dict(steps[0])


def test_a_failed_mount_event_is_named_while_the_pod_waits_and_the_timeout_ends_the_run(
    cluster: tuple[ControlPlane, OperatorProcess, ScriptedOutcomes],
) -> None:
    plane, operator, outcomes = cluster
    name = "mount-wait"
    outcomes.runs[name] = lambda _i, _a: PodOutcome(mounting=True)
    manifest = workflow_run(name, {"loop": {"maxIterations": 1}, "timeoutSeconds": TIMEOUT, "retries": 0})
    manifest["metadata"]["namespace"] = NAMESPACE
    plane.kubectl("create", "-f", "-", input_text=json.dumps(manifest))

    def creating() -> dict[str, Any] | None:
        pods = api.items(plane, "/api/v1", NAMESPACE, "pods", f"job-name={name}-step-1-iter-1-attempt-1")
        statuses = [(p.get("status") or {}).get("containerStatuses") for p in pods]
        return pods[0] if pods and statuses[0] else None

    pod = eventually(creating, timeout=30, what="the attempt's pod ContainerCreating")

    def running() -> str | None:
        message = str(_step(plane, name).get("message") or "")
        return message if " running (Job " in message else None

    # An ordinary start: the step says only "running" (and no IterationWaiting Event is posted for
    # it: the one Event counted at the end is the volume's).
    assert ": waiting, " not in eventually(running, timeout=30, what="the step's running message")

    posted = time.monotonic()
    _post_event(plane, pod, f"{pod['metadata']['name']}.mount1", 1, MESSAGE)

    def waiting() -> str | None:
        message = str(_step(plane, name).get("message") or "")
        return message if ": waiting, " in message else None

    message = eventually(waiting, timeout=2 * TIMEOUT, what="the step's message to name the volume")
    seen = time.monotonic() - posted
    print(f"volume wait seen {seen:.2f} s after the FailedMount Event")
    pod_name = pod["metadata"]["name"]
    assert f"pod {pod_name} cannot start: volume pv-gone cannot be mounted (FailedMount: " in message, message
    assert 'path "/srv/gone" does not exist' in message, message

    # The kubelet's retry: the same Event, count 2: one wait, one IterationWaiting Event.
    _post_event(plane, pod, f"{pod_name}.mount1", 2, MESSAGE)

    run: dict[str, Any] = {}

    def ended() -> bool:
        run.update(api.agentrun(plane, NAMESPACE, name))
        return (run.get("status") or {}).get("phase") in ("Succeeded", "Failed")

    try:
        eventually(ended, timeout=60, what="the run to end by its timeout")
    except AssertionError:
        print(operator.logs()[-5000:])
        raise
    assert run["status"]["phase"] == "Failed", run["status"]
    step = run["status"]["workflow"]["steps"][0]
    assert step["loop"]["stopReason"] == "LoopIterationFailed", step
    assert (
        f"timed out after {TIMEOUT}s (activeDeadlineSeconds); its pod never started: pod" in step["message"]
    )
    assert "volume pv-gone cannot be mounted (FailedMount" in step["message"], step

    events = json.loads(
        plane.kubectl(
            "get", "events", "-n", NAMESPACE, "--field-selector", "reason=IterationWaiting", "-o", "json"
        )
    )["items"]
    about = [e for e in events if e["involvedObject"]["name"] == name]
    assert len(about) == 1, [e["message"] for e in about]
    assert "volume pv-gone cannot be mounted" in about[0]["message"]
