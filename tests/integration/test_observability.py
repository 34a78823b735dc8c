"""What the operator tells about its runs, against the real control plane: the Prometheus metrics it
serves on `--metrics-port`, its JSON decision log, what a pod gets from an ImplementationSpec, and
what happens to a forbidden spec change of a running run.

The operator runs as its own process, watching only this module's namespace; `KubeletDriver` plays
the kubelet (docs/operator.md#observability, docs/api.md#immutability).
"""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agentrun_devcluster.controlplane import ControlPlane, ControlPlaneError
from agentrun_operator import naming
from tests.integration.kubelet_driver import KubeletDriver, PodOutcome
from tests.support import api
from tests.support.api import ready_namespace
from tests.support.claims import bound_claim
from tests.support.manifests import workflow_run
from tests.support.metrics import Samples, delta, scrape, value
from tests.support.polling import eventually
from tests.support.processes import OperatorProcess

NAMESPACE = "observe"
TERMINAL = ("Succeeded", "Failed", "Cancelled")

Outcome = Callable[[int, int], PodOutcome]  # (iteration, attempt) -> outcome


@dataclass
class Pods:
    """Per-run pod outcomes, and the env of every `main` container the driver ran."""

    runs: dict[str, Outcome] = field(default_factory=dict)
    env: dict[str, dict[str, str]] = field(default_factory=dict)  # pod name -> main's env

    def outcome(self, pod: dict[str, Any]) -> PodOutcome:
        meta = pod["metadata"]
        labels = meta.get("labels", {})
        main = next(c for c in pod["spec"]["containers"] if c["name"] == "main")
        self.env[meta["name"]] = {e["name"]: e.get("value", "") for e in main.get("env") or []}
        run = (meta.get("annotations") or {}).get(f"{naming.GROUP}/agent-run-name", "")
        fn = self.runs.get(run, lambda _i, _a: PodOutcome())
        return fn(int(labels[naming.LABEL_ITERATION]), int(labels[naming.LABEL_ATTEMPT]))


@dataclass
class Cluster:
    plane: ControlPlane
    operator: OperatorProcess
    pods: Pods
    metrics_url: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    plane = control_plane
    ready_namespace(plane, NAMESPACE)
    bound_claim(plane, NAMESPACE)  # workflow_run's `ws`: the operator starts a run once its claim is Bound
    pods = Pods()
    driver = KubeletDriver(plane, NAMESPACE, pods.outcome).start()
    port = _free_port()
    operator = OperatorProcess(
        plane,
        tmp_path_factory.mktemp("operator"),
        env={"AGENTS_CONTROLLER_NAMESPACES": NAMESPACE},
        args=(f"--metrics-port={port}",),
    ).start()
    try:
        yield Cluster(plane, operator, pods, f"http://127.0.0.1:{port}/metrics")
    finally:
        operator.stop()
        driver.stop()


# ----------------------------------------------------------------------------------- helpers


def _create(plane: ControlPlane, manifest: dict[str, Any]) -> None:
    manifest = copy.deepcopy(manifest)
    manifest["metadata"]["namespace"] = NAMESPACE
    plane.kubectl("create", "-f", "-", input_text=json.dumps(manifest))


def _get(plane: ControlPlane, name: str) -> dict[str, Any]:
    return api.agentrun(plane, NAMESPACE, name)


def _wait_finished(cluster: Cluster, name: str, timeout: float = 90) -> dict[str, Any]:
    result: dict[str, Any] = {}

    def done() -> bool:
        result.clear()
        result.update(_get(cluster.plane, name))
        return (result.get("status") or {}).get("phase") in TERMINAL

    try:
        eventually(done, timeout, f"agentrun {name} to finish")
    except AssertionError:
        print(json.dumps(result.get("status"), indent=1))
        print(cluster.operator.logs()[-5000:])
        raise
    return result


def _jobs(plane: ControlPlane, run: str) -> list[dict[str, Any]]:
    return api.jobs_of_run(plane, NAMESPACE, run)


def _events(plane: ControlPlane, uid: str) -> list[dict[str, Any]]:
    out = plane.kubectl(
        "get", "events", "-n", NAMESPACE, "--field-selector", f"involvedObject.uid={uid}", "-o", "json"
    )
    return list(json.loads(out)["items"])


# ----------------------------------------------------------------------------------- metrics


def test_metrics_move_as_the_runs_go(cluster: Cluster) -> None:
    """After a 3-iteration loop that succeeds and a loop whose iteration fails twice, each metric of
    docs/operator.md#observability moved by exactly what happened."""
    before = scrape(cluster.metrics_url)
    _create(cluster.plane, workflow_run("m-fixed", {"loop": {"maxIterations": 3}}))
    cluster.pods.runs["m-failing"] = lambda _i, _a: PodOutcome(exit_code=3)
    _create(
        cluster.plane,
        workflow_run("m-failing", {"loop": {"maxIterations": 2}, "retries": 1, "retryBackoffSeconds": 0}),
    )
    assert _wait_finished(cluster, "m-fixed")["status"]["phase"] == "Succeeded"
    assert _wait_finished(cluster, "m-failing")["status"]["phase"] == "Failed"

    # The operator counts a reconcile's facts once its status write has landed, so a client can see
    # the phase a moment before the counters: wait until the last outcomes are counted, then check
    # that every metric moved by exactly what happened.
    def counted_outcomes() -> Samples | None:
        now = scrape(cluster.metrics_url)
        transitions = "agentrun_run_phase_transitions_total"
        done = delta(before, now, transitions, phase="Succeeded", reason="Completed")
        failed = delta(before, now, transitions, phase="Failed", reason="LoopIterationFailed")
        return now if done >= 1 and failed >= 1 else None

    after = eventually(counted_outcomes, 30, "the counters to count both runs' ends")

    def moved(name: str, **labels: str) -> float:
        return delta(before, after, name, **labels)

    assert moved("agentrun_iterations_total", result="Succeeded") == 3
    assert moved("agentrun_iterations_total", result="Retrying") == 1
    assert moved("agentrun_iterations_total", result="Failed") == 1
    assert moved("agentrun_loop_stops_total", reason="LoopMaxIterationsReached") == 1
    assert moved("agentrun_loop_stops_total", reason="LoopIterationFailed") == 1
    assert moved("agentrun_run_phase_transitions_total", phase="Running", reason="") == 2
    assert moved("agentrun_run_phase_transitions_total", phase="Succeeded", reason="Completed") == 1
    assert moved("agentrun_run_phase_transitions_total", phase="Failed", reason="LoopIterationFailed") == 1
    # Turnaround: one sample per iteration that followed a succeeded one (2 of the fixed loop; a
    # retry is not a turnaround), each the time from the pod's end to the next Job's creation.
    assert moved("agentrun_iteration_turnaround_seconds_count") == 2
    print("turnaround samples: 2, sum", moved("agentrun_iteration_turnaround_seconds_sum"), "s")
    assert moved("agentrun_iteration_turnaround_seconds_sum") >= 0
    # Every reconcile is timed, every status write is measured (at least one per iteration).
    assert moved("agentrun_reconcile_duration_seconds_count") >= 5
    assert moved("agentrun_status_size_bytes_count") >= 5
    assert moved("agentrun_status_size_bytes_sum") > 5 * 200  # a status is a few hundred bytes at least
    assert moved("agentrun_api_requests_total", verb="POST", resource="jobs") == 5  # 3 + 2 attempts
    # Iteration durations, one sample per attempt (its Job started -> its pod's main ended), by result.
    assert moved("agentrun_iteration_duration_seconds_count", result="Succeeded") == 3
    assert moved("agentrun_iteration_duration_seconds_count", result="Retrying") == 1
    assert moved("agentrun_iteration_duration_seconds_count", result="Failed") == 1
    assert moved("agentrun_iteration_duration_seconds_sum", result="Succeeded") >= 0
    # The work queue: every reconcile was dequeued once (its wait observed), pods that stopped were
    # taken from the turnaround lane, and at rest nothing waits and no worker is busy.
    waits = {
        lane: moved("agentrun_workqueue_queue_duration_seconds_count", lane=lane)
        for lane in ("turnaround", "front", "background")
    }
    assert sum(waits.values()) >= moved("agentrun_reconcile_duration_seconds_count") > 0
    assert waits["turnaround"] >= 1
    assert value(after, "agentrun_workqueue_workers") >= 1
    assert moved("agentrun_reconcile_errors_total") == 0

    # The gauge of runs by phase is refreshed by the resync (every 5 s in these tests).
    def counted() -> bool:
        now = scrape(cluster.metrics_url)
        return (
            value(now, "agentrun_runs", phase="Succeeded") >= 1
            and value(now, "agentrun_runs", phase="Failed") >= 1
        )

    eventually(counted, 30, "agentrun_runs{phase} to count the finished runs")

    def at_rest() -> bool:
        now = scrape(cluster.metrics_url)
        return (
            value(now, "agentrun_workqueue_busy_workers") == 0
            and value(now, "agentrun_workqueue_depth", lane="front") == 0
            and value(now, "agentrun_workqueue_depth", lane="turnaround") == 0
            and value(now, "agentrun_run_no_progress_seconds_max") == 0  # every run here has finished
        )

    eventually(at_rest, 30, "an idle work queue and no unfinished run")


def test_no_metric_label_takes_its_values_from_object_names(cluster: Cluster) -> None:
    """Labels are bounded sets (result, phase, reason, lane, ...): a label whose values were run, Job,
    pod or namespace names would add series with every run (docs/operator.md#metrics). After the runs
    of this module, no label value of any metric the operator serves is, or contains, such a name."""
    _create(cluster.plane, workflow_run("m-names", {"loop": {"maxIterations": 2}}))
    assert _wait_finished(cluster, "m-names")["status"]["phase"] == "Succeeded"
    names = {NAMESPACE}
    for kind in ("agentruns", "jobs", "pods"):
        listed = json.loads(cluster.plane.kubectl("get", kind, "-n", NAMESPACE, "-o", "json"))["items"]
        names |= {item["metadata"]["name"] for item in listed} | {item["metadata"]["uid"] for item in listed}
    assert len(names) > 10, names
    samples = scrape(cluster.metrics_url)
    offending = sorted(
        (name, label, value)
        for (name, labels), _ in samples.items()
        for label, value in labels
        if value in names or any(len(n) >= 8 and n in value for n in names)
    )
    assert offending == []
    # and the label names are the documented, bounded ones
    label_names = {label for (name, labels) in samples if name.startswith("agentrun_") for label, _ in labels}
    assert label_names <= {
        "result",
        "reason",
        "phase",
        "construct",
        "loop",
        "case",
        "decision",
        "verb",
        "resource",
        "lane",
        "le",
    }, label_names


# ----------------------------------------------------------------------------------- logs


def test_one_log_line_per_decision_with_its_fields(cluster: Cluster) -> None:
    """docs/operator.md#observability: every decision is one JSON line with correlation_id, run, step,
    iteration, attempt and decision: one per Job created, one per Event posted."""
    name = "logged"
    cluster.pods.runs[name] = lambda i, a: PodOutcome(exit_code=1 if (i, a) == (2, 1) else 0)
    _create(
        cluster.plane,
        workflow_run(name, {"loop": {"maxIterations": 3}, "retries": 1, "retryBackoffSeconds": 0}),
    )
    run = _wait_finished(cluster, name)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    uid = run["metadata"]["uid"]

    def ttl_decisions() -> list[tuple[int, int]]:
        lines = cluster.operator.decision_lines(uid)
        return sorted(
            (line["iteration"], line["attempt"]) for line in lines if line["decision"] == "set-job-ttl"
        )

    # Under the default pod GC (`OnPodSuccess`, docs/api.md#podgc) the three succeeded attempts' Jobs
    # get the Job TTL and the failed one (iteration 2, attempt 1) keeps its pod: no decision for it.
    eventually(lambda: len(ttl_decisions()) >= 3, what="the Job TTL decisions")
    assert ttl_decisions() == [(1, 1), (2, 2), (3, 1)]
    lines = cluster.operator.decision_lines(uid)
    for line in lines:
        assert {"correlation_id", "run", "step", "path", "iteration", "attempt", "decision"} <= set(line), (
            line
        )
        assert line["run"] == f"{NAMESPACE}/{name}"
        assert line["path"] == line["step"]  # a top-level step: its path is its name (or null for the run)

    jobs = _jobs(cluster.plane, name)
    created = sorted(
        (line["step"], line["iteration"], line["attempt"])
        for line in lines
        if line["decision"] == "create-job"
    )
    assert created == sorted(
        (
            j["metadata"]["labels"][naming.LABEL_STEP],
            int(j["metadata"]["labels"][naming.LABEL_ITERATION]),
            int(j["metadata"]["labels"][naming.LABEL_ATTEMPT]),
        )
        for j in jobs
    )
    assert created == [("implement", 1, 1), ("implement", 2, 1), ("implement", 2, 2), ("implement", 3, 1)]

    events = _events(cluster.plane, uid)
    event_lines = [line for line in lines if line["decision"] in {e["reason"] for e in events}]
    # Events are aggregated (docs/operator.md#events): each Event says, under its reason, what a
    # logged decision of that reason said; repeats of a reason fold into one series.
    for event in events:
        assert any(
            line["decision"] == event["reason"] and line["msg"].rstrip(".") in event["message"]
            for line in event_lines
        ), event
    started = sorted(
        (line["iteration"], line["attempt"]) for line in event_lines if line["decision"] == "IterationStarted"
    )
    assert started == [(1, 1), (2, 1), (2, 2), (3, 1)]
    retrying = [line for line in event_lines if line["decision"] == "IterationRetrying"]
    assert [(r["step"], r["iteration"], r["attempt"]) for r in retrying] == [("implement", 2, 1)]
    finished = [line for line in event_lines if line["decision"] == "RunSucceeded"]
    assert [(f["step"], f["iteration"], f["attempt"]) for f in finished] == [(None, None, None)]


# ----------------------------------------------------------------------------------- the pod's task


def test_acceptance_criteria_reach_the_pod(cluster: Cluster) -> None:
    criteria = ["tests pass", "the README says how to run it"]
    _create(
        cluster.plane,
        {
            "apiVersion": "agents.proompteng.ai/v1alpha1",
            "kind": "ImplementationSpec",
            "metadata": {"name": "obs-task"},
            "spec": {"text": "Do the thing.", "summary": "thing", "acceptanceCriteria": criteria},
        },
    )
    manifest = workflow_run("criteria", {"loop": {"maxIterations": 1}})
    manifest["spec"]["implementationSpecRef"] = {"name": "obs-task"}
    _create(cluster.plane, manifest)
    assert _wait_finished(cluster, "criteria")["status"]["phase"] == "Succeeded"
    pod_env = next(env for pod, env in cluster.pods.env.items() if pod.startswith("criteria-step-1-"))
    assert json.loads(pod_env["AGENTRUN_ACCEPTANCE_CRITERIA"]) == criteria
    assert pod_env["AGENTRUN_IMPLEMENTATION_TEXT"] == "Do the thing."


# ----------------------------------------------------------------------------------- immutability


def test_a_forbidden_spec_change_is_refused_and_the_run_goes_on(cluster: Cluster, tmp_path: Path) -> None:
    """docs/api.md#immutability: the API server refuses the change; the stored run, its generation and
    its progress are untouched; `spec.cancel` still may change."""
    plane, name = cluster.plane, "frozen"
    cluster.pods.runs[name] = lambda _i, _a: PodOutcome(hang=True)
    _create(plane, workflow_run(name, {"loop": {"maxIterations": 3}}))
    eventually(lambda: len(_jobs(plane, name)) == 1, what="the first Job")
    before = _get(plane, name)
    patch = '[{"op": "replace", "path": "/spec/workflow/steps/0/loop/maxIterations", "value": 5}]'
    with pytest.raises(ControlPlaneError) as refused:
        plane.kubectl("patch", "agentrun", name, "-n", NAMESPACE, "--type=json", "-p", patch)
    print(refused.value)  # the exact wording docs/api.md#immutability quotes
    assert (
        f'The AgentRun "{name}" is invalid: spec.workflow: Forbidden: spec.workflow is immutable after '
        "creation (only spec.cancel and spec.approvals may change); create a new AgentRun with the "
        "changed spec instead. "
        "See docs/api.md#immutability"
    ) in str(refused.value)
    after = _get(plane, name)
    assert after["spec"] == before["spec"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"] == 1
    assert after["status"]["observedGeneration"] == 1
    # The allowed change: cancel (the generation moves, the operator acts on it).
    plane.kubectl(
        "patch", "agentrun", name, "-n", NAMESPACE, "--type=merge", "-p", '{"spec":{"cancel":"Immediate"}}'
    )
    run = _wait_finished(cluster, name)
    assert run["status"]["phase"] == "Cancelled"
    assert run["metadata"]["generation"] == run["status"]["observedGeneration"] == 2
    assert run["spec"]["workflow"]["steps"][0]["loop"]["maxIterations"] == 3
