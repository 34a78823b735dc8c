"""The loop proposal's test matrix (docs/design.md#test-matrix) against the real control plane, with
the operator as a process.

The Job controller creates the pods; `KubeletDriver` plays the kubelet (binds them, reports their
end and the reporter's termination message). Each test names the outcomes per (iteration, attempt).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_operator import naming
from agentrun_operator.api import API_VERSION
from tests.integration.kubelet_driver import KubeletDriver, PodOutcome, ScriptedOutcomes
from tests.integration.watch_proxy import Call, WatchProxy
from tests.support import api
from tests.support.api import ready_namespace
from tests.support.claims import bound_claims
from tests.support.manifests import workflow_run
from tests.support.polling import eventually
from tests.support.processes import OperatorProcess

NAMESPACE = "loops"
HISTORY_LIMIT = 3
REFERENCE = Path(__file__).resolve().parent.parent / "fixtures" / "reference"


@pytest.fixture(scope="module")
def outcomes() -> ScriptedOutcomes:
    return ScriptedOutcomes()


@pytest.fixture(scope="module")
def proxy(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WatchProxy]:
    """Between the operator and the API server (tests/integration/watch_proxy.py): it forwards every
    request; a test holds one of the operator's writes with it to kill the operator at that point."""
    proxy = WatchProxy(control_plane, tmp_path_factory.mktemp("proxy")).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def cluster(
    control_plane: ControlPlane,
    outcomes: ScriptedOutcomes,
    proxy: WatchProxy,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Any]:
    plane = control_plane
    ready_namespace(plane, NAMESPACE)
    bound_claims(plane, NAMESPACE, ["ws", "codex-workspace"])  # workflow_run's, the reference manifests'
    driver = KubeletDriver(plane, NAMESPACE, outcomes.outcome).start()
    operator = OperatorProcess(
        plane,
        tmp_path_factory.mktemp("operator"),
        env={"AGENTS_CONTROLLER_WORKFLOW_LOOP_STATUS_HISTORY_LIMIT": str(HISTORY_LIMIT)},
        kubeconfig=proxy.kubeconfig,
    ).start()
    try:
        yield plane, operator, driver
    finally:
        operator.stop()
        driver.stop()


def _get(plane: ControlPlane, kind: str, name: str) -> dict[str, Any]:
    assert kind == "agentrun", kind
    return api.agentrun(plane, NAMESPACE, name)


def _jobs(plane: ControlPlane, run: str) -> list[dict[str, Any]]:
    return api.jobs_of_run(plane, NAMESPACE, run)


def _job_succeeded(plane: ControlPlane, run: str, job: str) -> bool:
    """The Job controller counted the Job's pod as succeeded (what a restarted operator then reads)."""
    return any(
        j["metadata"]["name"] == job and (j.get("status") or {}).get("succeeded", 0) >= 1
        for j in _jobs(plane, run)
    )


def _pods_of(plane: ControlPlane, job: str) -> list[dict[str, Any]]:
    """The Job's pods that exist and have not reached a final phase."""
    pods = api.items(plane, "/api/v1", NAMESPACE, "pods", f"job-name={job}")
    return [p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]


def _create(plane: ControlPlane, manifest: dict[str, Any]) -> None:
    manifest = copy.deepcopy(manifest)
    manifest["metadata"]["namespace"] = NAMESPACE
    plane.kubectl("create", "-f", "-", input_text=json.dumps(manifest))


def _wait_finished(
    plane: ControlPlane, name: str, operator: OperatorProcess, timeout: float = 90
) -> dict[str, Any]:
    return api.finished_run(plane, NAMESPACE, name, operator.logs, timeout)


def _loop_run(name: str, loop: dict[str, Any], **step: Any) -> dict[str, Any]:
    return workflow_run(name, {"loop": loop, **step})


def _conditional(
    on_missing: str = "stop", on_invalid: str = "fail", max_iterations: int = 8
) -> dict[str, Any]:
    return {
        "maxIterations": max_iterations,
        "condition": {
            "type": "cel",
            "expression": "iteration.last.control.continue == true",
            "source": {"type": "file", "onMissing": on_missing, "onInvalid": on_invalid},
        },
    }


def _step_status(run: dict[str, Any]) -> dict[str, Any]:
    return dict(run["status"]["workflow"]["steps"][0])


def test_fixed_loop_runs_to_max(cluster: Any, outcomes: ScriptedOutcomes) -> None:
    plane, operator, _ = cluster
    _create(plane, _loop_run("fixed", {"maxIterations": 2}))
    run = _wait_finished(plane, "fixed", operator)
    assert run["status"]["phase"] == "Succeeded"
    loop = _step_status(run)["loop"]
    assert loop["stopReason"] == "LoopMaxIterationsReached"
    assert loop["completedIterations"] == 2
    assert sorted(j["metadata"]["name"] for j in _jobs(plane, "fixed")) == [
        "fixed-step-1-iter-1-attempt-1",
        "fixed-step-1-iter-2-attempt-1",
    ]


def test_kopf_delivers_a_run_and_writes_nothing_to_it(cluster: Any, outcomes: ScriptedOutcomes) -> None:
    """kopf's one resource handler is an event handler (shell/handlers.py): the run is delivered and
    reconciled to its end, and kopf leaves nothing of its own on it -- a deletion handler, a daemon
    or a timer would leave kopf's finalizer (a run then waits for the operator to be deleted), a
    handler that failed or retried its progress (annotations, `status.kopf`)."""
    plane, operator, _ = cluster
    _create(plane, _loop_run("kopf-free", {"maxIterations": 1}))
    run = _wait_finished(plane, "kopf-free", operator)
    assert run["status"]["phase"] == "Succeeded"
    meta = run["metadata"]
    assert meta.get("finalizers", []) == []
    assert [k for k in meta.get("annotations") or {} if "kopf" in k] == []
    assert "kopf" not in run["status"]  # nor its progress (status.kopf)


def test_reference_conditional_example_stops_on_false(cluster: Any, outcomes: ScriptedOutcomes) -> None:
    plane, operator, _ = cluster
    manifest = yaml.safe_load((REFERENCE / "agentrun-workflow-loop-conditional.yaml").read_text())
    name = manifest["metadata"]["name"]
    manifest["metadata"] = {"name": name}
    # The reference references an Agent and an ImplementationSpec: give it both (and a provider).
    for kind, obj_name, spec in (
        ("AgentProvider", "codex", {"image": "busybox:1.36", "command": ["sh", "-c", "true"]}),
        ("Agent", manifest["spec"]["agentRef"]["name"], {"providerRef": {"name": "codex"}}),
    ):
        _create(
            plane,
            {
                "apiVersion": API_VERSION,
                "kind": kind,
                "metadata": {"name": obj_name},
                "spec": spec,
            },
        )
    for step in manifest["spec"]["workflow"]["steps"]:
        ref = step.get("implementationSpecRef")
        if ref:
            _create(
                plane,
                {
                    "apiVersion": API_VERSION,
                    "kind": "ImplementationSpec",
                    "metadata": {"name": ref["name"]},
                    "spec": {"text": "Implement the thing.", "summary": "thing"},
                },
            )
    outcomes.runs[name] = lambda i, _a: PodOutcome(control={"continue": i < 2, "iteration": i})
    _create(plane, manifest)
    run = _wait_finished(plane, name, operator)
    status = run["status"]
    assert status["phase"] == "Succeeded", status
    loop = _step_status(run)["loop"]
    assert loop["stopReason"] == "LoopConditionFalse"
    assert loop["completedIterations"] == 2 and loop["currentIteration"] == 2
    assert loop["lastControl"] == {"continue": False, "iteration": 2}
    assert [it["index"] for it in loop["iterations"]] == [1, 2]
    assert all(it["phase"] == "Succeeded" and it["jobRef"]["name"] for it in loop["iterations"])
    assert len(_jobs(plane, name)) == 2
    described = plane.kubectl("describe", "agentrun", name, "-n", NAMESPACE)
    for reason in (
        "LoopStarted",
        "IterationStarted",
        "IterationSucceeded",
        "ConditionEvaluated",
        "LoopCompleted",
    ):
        assert reason in described, described


def test_each_iterations_condition_decision_is_an_event_of_its_own(
    cluster: Any, outcomes: ScriptedOutcomes
) -> None:
    """docs/concepts.md#events: a `ConditionEvaluated` Event per decision, with its reason and the
    iteration in its message, so iteration 1's decision is still there after iteration 3's."""
    plane, operator, _ = cluster
    name = "decisions"
    outcomes.runs[name] = lambda i, _a: PodOutcome(control={"continue": i < 3, "iteration": i})
    _create(plane, _loop_run(name, _conditional()))
    run = _wait_finished(plane, name, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    selector = f"involvedObject.name={name},reason=ConditionEvaluated"

    def all_three() -> list[dict[str, Any]] | None:
        path = f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector={quote(selector)}"
        found = list(api.get_json(plane, path)["items"])
        return found if len(found) >= 3 else None

    # Events are written beside the work queue (docs/operator.md#events): the last decision's may
    # land after the status that finished the run.
    events = eventually(all_three, what="the 3 decisions' Events")
    messages = sorted(e["message"] for e in events)
    assert len(messages) == 3, messages
    for index, message in enumerate(messages, 1):
        assert message.startswith(f"step implement: iteration {index}: "), messages
    assert all(e["type"] == "Normal" and e.get("count", 1) == 1 for e in events), events


@pytest.mark.parametrize(("policy", "phase"), [("stop", "Succeeded"), ("fail", "Failed")])
def test_missing_control_file_follows_on_missing(
    cluster: Any, outcomes: ScriptedOutcomes, policy: str, phase: str
) -> None:
    plane, operator, _ = cluster
    name = f"missing-{policy}"
    outcomes.runs[name] = lambda _i, _a: PodOutcome(control=None)
    _create(plane, _loop_run(name, _conditional(on_missing=policy)))
    run = _wait_finished(plane, name, operator)
    assert run["status"]["phase"] == phase
    loop = _step_status(run)["loop"]
    assert loop["completedIterations"] == 1
    assert loop["stopReason"] == ("LoopConditionFalse" if policy == "stop" else "LoopConditionError")
    assert len(_jobs(plane, name)) == 1


def test_invalid_control_payload_fails_deterministically(cluster: Any, outcomes: ScriptedOutcomes) -> None:
    """The same invalid control file fails two runs the same way, on the first iteration, without a
    retry. The envelope is what the reporter's own parser makes of the file's bytes (the driver does
    not write it), and the expected position comes from Python's JSON decoder, not from the envelope.
    (tests/e2e/test_control_file.py runs the same row through the real reporter process.)"""
    plane, operator, _ = cluster
    payload = b'{"continue": true,, "n": 1}'
    try:
        json.loads(payload)
        raise AssertionError("the payload must be invalid JSON")
    except json.JSONDecodeError as exc:
        position = f"line {exc.lineno} column {exc.colno}"
    messages = []
    for name in ("invalid-json-a", "invalid-json-b"):
        outcomes.runs[name] = lambda _i, _a: PodOutcome(control_bytes=payload)
        _create(plane, _loop_run(name, _conditional(on_invalid="fail"), retries=2))
        run = _wait_finished(plane, name, operator)
        assert run["status"]["phase"] == "Failed", run["status"]
        step = _step_status(run)
        assert step["loop"]["stopReason"] == "LoopConditionError"
        assert step["loop"]["completedIterations"] == 1
        assert [(it["index"], it["attempts"]) for it in step["loop"]["iterations"]] == [(1, 1)]
        assert len(_jobs(plane, name)) == 1  # an invalid payload is not an attempt failure: no retry
        assert "invalid JSON" in step["message"] and position in step["message"], step["message"]
        assert "onInvalid: fail" in step["message"]
        messages.append(step["message"].replace(name, "RUN"))
    assert messages[0] == messages[1]


def test_timeout_with_retries_remaining_retries(cluster: Any, outcomes: ScriptedOutcomes) -> None:
    plane, operator, _driver = cluster
    name = "timeout-retry"
    outcomes.runs[name] = lambda _i, a: PodOutcome(hang=(a == 1))
    # A timeout far beyond any scheduling delay, so the second attempt never races its deadline;
    # the first attempt's deadline is then cut to 1 s on its Job (the field is mutable), which the
    # job controller enforces as it would have at 120 s: no wall-clock margin in the test.
    _create(
        plane,
        _loop_run(name, {"maxIterations": 1}, timeoutSeconds=120, retries=1, retryBackoffSeconds=1),
    )
    first_name = f"{name}-step-1-iter-1-attempt-1"
    eventually(lambda: first_name in {j["metadata"]["name"] for j in _jobs(plane, name)}, what="attempt 1")
    plane.kubectl(
        "patch",
        "job",
        first_name,
        "-n",
        NAMESPACE,
        "--type=merge",
        "-p",
        '{"spec":{"activeDeadlineSeconds":1}}',
    )
    run = _wait_finished(plane, name, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    jobs = {j["metadata"]["name"]: j for j in _jobs(plane, name)}
    assert set(jobs) == {first_name, f"{name}-step-1-iter-1-attempt-2"}
    first = jobs[first_name]
    assert jobs[f"{name}-step-1-iter-1-attempt-2"]["spec"]["activeDeadlineSeconds"] == 120
    assert any(c["reason"] == "DeadlineExceeded" for c in first["status"].get("conditions", []))
    assert _step_status(run)["loop"]["iterations"][0]["attempts"] == 2


def test_a_timeout_is_recorded_at_once_but_the_retry_waits_for_the_pod(
    cluster: Any, outcomes: ScriptedOutcomes
) -> None:
    """docs/design.md#job-lifecycle, with the real Job controller: at the deadline it sets
    `FailureTarget` and deletes the pod, which takes 4 s to stop (a main ignoring SIGTERM); the
    timeout is recorded while that pod still runs, and the retry's Job is created only after it."""
    plane, operator, _driver = cluster
    name = "timeout-settling"
    outcomes.runs[name] = lambda _i, a: PodOutcome(hang=(a == 1), stop_seconds=4.0 if a == 1 else 0.0)
    _create(
        plane,
        _loop_run(name, {"maxIterations": 1}, timeoutSeconds=120, retries=1, retryBackoffSeconds=0),
    )
    first_name = f"{name}-step-1-iter-1-attempt-1"
    second_name = f"{name}-step-1-iter-1-attempt-2"
    eventually(lambda: first_name in {j["metadata"]["name"] for j in _jobs(plane, name)}, what="attempt 1")
    eventually(lambda: _pods_of(plane, first_name), what="attempt 1's pod")
    deadline = '{"spec":{"activeDeadlineSeconds":1}}'
    plane.kubectl("patch", "job", first_name, "-n", NAMESPACE, "--type=merge", "-p", deadline)
    started = time.monotonic()
    recorded_while_running = False
    while True:  # jobs first, then pods: a pod seen after a Job existed was alive alongside it
        jobs = {j["metadata"]["name"] for j in _jobs(plane, name)}
        step = _step_status(_get(plane, "agentrun", name))
        pods = _pods_of(plane, first_name)
        assert not (second_name in jobs and pods), "attempt 2's Job exists beside attempt 1's live pod"
        if step.get("phase") == "Retrying" and pods:
            assert "timed out after 120s (activeDeadlineSeconds)" in step["message"], step
            recorded_while_running = True
        if second_name in jobs:
            break
        assert time.monotonic() - started < 90, "attempt 2 never started"
        time.sleep(0.05)
    assert recorded_while_running, "the timeout was not recorded while the pod was stopping"
    run = _wait_finished(plane, name, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]


def test_a_reporter_that_ends_before_main_starts_fails_the_attempt_without_a_timeout(
    cluster: Any, outcomes: ScriptedOutcomes
) -> None:
    """No timeout set: the pod whose reporter died before it was ready (its `main` held at the shut
    gate, Running for good) fails its attempt through the real watch and decode, the retry runs, and
    a run out of retries ends Failed, never Running (docs/troubleshooting.md#reporter-ended-before-main)."""
    plane, operator, _ = cluster
    retried, failed = "reporter-lost-retried", "reporter-lost-failed"
    outcomes.runs[retried] = lambda _i, a: PodOutcome(reporter_dies="boom" if a == 1 else None)
    outcomes.runs[failed] = lambda _i, _a: PodOutcome(reporter_dies="MemoryError")
    _create(plane, _loop_run(retried, {"maxIterations": 1}, retries=1, retryBackoffSeconds=0))
    _create(plane, _loop_run(failed, {"maxIterations": 2}))
    run = _wait_finished(plane, retried, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert _step_status(run)["loop"]["iterations"][0]["attempts"] == 2
    run = _wait_finished(plane, failed, operator)
    assert run["status"]["phase"] == "Failed", run["status"]
    step = _step_status(run)
    assert step["loop"]["stopReason"] == "LoopIterationFailed"
    failure = step["lastFailure"]
    assert failure["reason"] == "ReporterEndedBeforeMain", failure
    assert "exit code 1, Error): MemoryError" in failure["message"], failure
    assert {j["metadata"]["name"] for j in _jobs(plane, failed)} <= {f"{failed}-step-1-iter-1-attempt-1"}


def test_timeout_with_retries_exhausted_fails_the_loop(cluster: Any, outcomes: ScriptedOutcomes) -> None:
    plane, operator, _ = cluster
    name = "timeout-exhausted"
    outcomes.runs[name] = lambda _i, _a: PodOutcome(hang=True)
    _create(plane, _loop_run(name, {"maxIterations": 3}, timeoutSeconds=1, retries=1, retryBackoffSeconds=1))
    run = _wait_finished(plane, name, operator)
    assert run["status"]["phase"] == "Failed"
    assert _step_status(run)["loop"]["stopReason"] == "LoopIterationFailed"
    assert len(_jobs(plane, name)) == 2


def test_a_failing_attempts_usage_exhausts_the_loop_budget(cluster: Any, outcomes: ScriptedOutcomes) -> None:
    """Every attempt reports its control file, failed ones too (the envelope is the reporter's
    termination message): the usage of a failing attempt is counted, so its retry never starts once
    it spent the loop's budget (docs/concepts.md#usage-and-budgets)."""
    plane, operator, _ = cluster
    name = "failed-usage"
    usage = {"inputTokens": 120, "outputTokens": 30, "costUSD": 0.5}
    outcomes.runs[name] = lambda _i, _a: PodOutcome(exit_code=1, control={"usage": usage})
    loop = {"maxIterations": 3, "budget": {"maxTokens": 100}}
    _create(plane, _loop_run(name, loop, retries=2, retryBackoffSeconds=1))
    run = _wait_finished(plane, name, operator)
    assert run["status"]["phase"] == "Failed", run["status"]
    step = _step_status(run)
    assert step["reason"] == "LoopBudgetExhausted", step
    assert step["loop"]["stopReason"] == "LoopBudgetExhausted"
    assert "budget exhausted (150 tokens of maxTokens 100)" in step["message"]
    assert step["usage"] == usage
    assert step["loop"]["iterations"][0]["usage"] == usage
    assert run["status"]["workflow"]["usage"] == usage
    assert [j["metadata"]["name"] for j in _jobs(plane, name)] == [f"{name}-step-1-iter-1-attempt-1"]


def test_a_for_each_over_an_output_nothing_was_collected_into_runs_zero_iterations(
    cluster: Any, outcomes: ScriptedOutcomes
) -> None:
    """A collecting loop that runs zero times leaves its output as `[]`, and a later forEach over it
    succeeds with zero iterations (docs/concepts.md#collected-outputs)."""
    plane, operator, _ = cluster
    name = "zero-outputs"
    manifest = workflow_run(name, {"loop": {"maxIterations": 3, "items": "[]", "output": {"name": "tasks"}}})
    manifest["spec"]["workflow"]["steps"].append(
        {"name": "work", "loop": {"maxIterations": 5, "items": "outputs.tasks"}}
    )
    _create(plane, manifest)
    run = _wait_finished(plane, name, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert run["status"]["workflow"]["outputs"] == {"tasks": []}
    work = run["status"]["workflow"]["steps"][1]
    assert work["phase"] == "Succeeded" and work["loop"]["completedIterations"] == 0, work
    assert _jobs(plane, name) == []


def test_required_pvc_misconfigured_is_invalid_before_any_job(
    cluster: Any, outcomes: ScriptedOutcomes
) -> None:
    plane, operator, _ = cluster
    name = "pvc-misconfigured"
    manifest = _loop_run(name, {"maxIterations": 2, "state": {"required": True, "volumeNames": ["scratch"]}})
    manifest["spec"]["workload"]["volumes"].append(
        {"name": "scratch", "type": "emptyDir", "mountPath": "/scratch"}
    )
    _create(plane, manifest)
    run = _wait_finished(plane, name, operator)
    assert run["status"]["phase"] == "Failed"
    conditions = {c["type"]: c for c in run["status"]["conditions"]}
    assert conditions["InvalidSpec"]["status"] == "True"
    assert "state.volumeNames" in run["status"]["message"]
    assert _jobs(plane, name) == []


def test_immediate_cancel_stops_the_running_iteration(cluster: Any, outcomes: ScriptedOutcomes) -> None:
    plane, operator, _ = cluster
    name = "cancel-now"
    outcomes.runs[name] = lambda _i, _a: PodOutcome(hang=True)
    _create(plane, _loop_run(name, {"maxIterations": 5}))
    eventually(lambda: len(_jobs(plane, name)) == 1, what="the first Job")
    plane.kubectl(
        "patch", "agentrun", name, "-n", NAMESPACE, "--type=merge", "-p", '{"spec":{"cancel":"Immediate"}}'
    )
    run = _wait_finished(plane, name, operator)
    assert run["status"]["phase"] == "Cancelled"
    step = _step_status(run)
    assert step["loop"]["stopReason"] == "LoopCancelled"
    assert step["loop"]["iterations"][-1]["phase"] == "Cancelled"
    eventually(lambda: _jobs(plane, name) == [], what="the cancelled Job to be deleted")


def test_operator_restart_mid_loop_resumes_without_duplicates(
    cluster: Any, outcomes: ScriptedOutcomes
) -> None:
    plane, operator, _ = cluster
    name = "restart"
    outcomes.runs[name] = lambda _i, _a: PodOutcome(run_seconds=1.0)
    _create(plane, _loop_run(name, {"maxIterations": 3}))

    def on_iteration_2() -> bool:
        return any(j["metadata"]["labels"][naming.LABEL_ITERATION] == "2" for j in _jobs(plane, name))

    eventually(on_iteration_2, what="iteration 2 to start")
    operator.kill()
    iteration_2 = f"{name}-step-1-iter-2-attempt-1"
    eventually(lambda: _job_succeeded(plane, name, iteration_2), what="iteration 2 to end with no operator")
    operator.start()
    run = _wait_finished(plane, name, operator)
    assert run["status"]["phase"] == "Succeeded"
    names = sorted(j["metadata"]["name"] for j in _jobs(plane, name))
    assert names == [f"{name}-step-1-iter-{k}-attempt-1" for k in (1, 2, 3)]
    assert _step_status(run)["loop"]["completedIterations"] == 3


def _wait_in(call: Call) -> dict[str, Any] | None:
    """The loop status a status write of the first step records while it waits for its next
    iteration (`nextIterationAt`), else None."""
    steps = (((call.json() or {}).get("status") or {}).get("workflow") or {}).get("steps") or [{}]
    loop: dict[str, Any] = steps[0].get("loop") or {}
    return loop if loop.get("nextIterationAt") else None


def test_operator_restart_during_the_interval_keeps_the_schedule(
    cluster: Any, outcomes: ScriptedOutcomes, proxy: WatchProxy
) -> None:
    """loop.intervalSeconds: the wait lives in status (nextIterationAt), not in the operator's memory.
    An operator SIGKILLed during the wait and started again neither starts iteration 2 early nor
    forgets it: iteration 2's Job is created at the due time, by the restarted operator.

    The kill lands in the wait by construction, not by the clock: the operator's status write that
    records the wait is held on its way to the API server and the operator is killed while it waits
    for the answer (it never learnt the write landed, never got to iteration 2); the write is then
    let through, so the wait the restarted operator finds in status is the one the killed one planned."""
    plane, operator, _ = cluster
    name = "interval-restart"
    interval = 8
    outcomes.runs[name] = lambda _i, _a: PodOutcome()
    recording = proxy.hold(
        lambda call: (
            call.method == "PUT"
            and call.path.endswith(f"/agentruns/{name}/status")
            and _wait_in(call) is not None
        )
    )
    _create(plane, _loop_run(name, {"maxIterations": 2, "intervalSeconds": interval}))
    assert recording.arrived.wait(90), "the operator never wrote the status recording the wait"
    operator.kill()  # SIGKILL with the write in flight: nothing of the schedule survives in memory
    recording.release()  # the write lands after the operator died
    assert recording.call is not None
    planned = _wait_in(recording.call)
    assert planned is not None
    waiting: dict[str, Any] = {}

    def the_wait_is_recorded() -> bool:
        steps = ((_get(plane, "agentrun", name).get("status") or {}).get("workflow") or {}).get("steps")
        waiting.update((steps[0].get("loop") or {}) if steps else {})
        return bool(waiting.get("nextIterationAt"))

    eventually(the_wait_is_recorded, what="the held write recording the wait to land")
    assert waiting["nextIterationAt"] == planned["nextIterationAt"], (waiting, planned)
    due = datetime.fromisoformat(str(waiting["nextIterationAt"]).replace("Z", "+00:00"))
    ended = datetime.fromisoformat(str(waiting["iterations"][0]["finishedAt"]).replace("Z", "+00:00"))
    assert due == ended + timedelta(seconds=interval)
    assert [j["metadata"]["name"] for j in _jobs(plane, name)] == [f"{name}-step-1-iter-1-attempt-1"]
    assert _pods_of(plane, f"{name}-step-1-iter-1-attempt-1") == []  # no pod runs during the wait
    operator.start()
    run = _wait_finished(plane, name, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    loop = _step_status(run)["loop"]
    assert loop["completedIterations"] == 2 and "nextIterationAt" not in loop
    second = next(j for j in _jobs(plane, name) if j["metadata"]["name"].endswith("-iter-2-attempt-1"))
    created = datetime.fromisoformat(second["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    started = datetime.fromisoformat(str(loop["iterations"][1]["startedAt"]).replace("Z", "+00:00"))
    # creationTimestamp has whole seconds: the Job was created within the second the wait ended, or later
    assert created >= due.replace(microsecond=0) and started >= due


def test_history_is_pruned_with_counters_kept(cluster: Any, outcomes: ScriptedOutcomes) -> None:
    plane, operator, _ = cluster
    name = "pruned"
    _create(plane, _loop_run(name, {"maxIterations": 5}))
    run = _wait_finished(plane, name, operator)
    loop = _step_status(run)["loop"]
    assert loop["completedIterations"] == 5
    assert loop["retainedIterations"] == HISTORY_LIMIT == len(loop["iterations"])
    assert loop["prunedIterations"] == 5 - HISTORY_LIMIT
    assert [it["index"] for it in loop["iterations"]] == [3, 4, 5]


def test_idempotent_resubmission_starts_nothing(cluster: Any, outcomes: ScriptedOutcomes) -> None:
    plane, operator, _ = cluster
    first = _loop_run("idem-first", {"maxIterations": 1})
    first["spec"]["idempotencyKey"] = "ticket-42"
    _create(plane, first)
    _wait_finished(plane, "idem-first", operator)
    second = _loop_run("idem-second", {"maxIterations": 1})
    second["spec"]["idempotencyKey"] = "ticket-42"
    _create(plane, second)
    run = _wait_finished(plane, "idem-second", operator)
    assert run["status"]["phase"] == "Failed"
    conditions = {c["type"]: c for c in run["status"]["conditions"]}
    assert conditions["Duplicate"]["status"] == "True"
    assert conditions["Duplicate"]["reason"] == "IdempotencyKeyCompleted"
    assert _jobs(plane, "idem-second") == []


def test_recreated_run_never_adopts_the_jobs_of_its_namesake(
    cluster: Any, outcomes: ScriptedOutcomes
) -> None:
    """Jobs left by a deleted AgentRun of the same name are not this run's: deleted, not adopted."""
    plane, operator, _ = cluster
    name = "namesake"
    _create(plane, _loop_run(name, {"maxIterations": 1}))
    first = _wait_finished(plane, name, operator)
    # Orphan the Jobs, as when the garbage collector has not caught up yet.
    plane.kubectl("delete", "agentrun", name, "-n", NAMESPACE, "--cascade=orphan", "--wait=true")
    assert len(_jobs(plane, name)) == 1
    _create(plane, _loop_run(name, {"maxIterations": 1}))
    second = _wait_finished(plane, name, operator, timeout=120)
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    assert second["status"]["phase"] == "Succeeded", second["status"]
    jobs = _jobs(plane, name)
    assert [j["metadata"]["ownerReferences"][0]["uid"] for j in jobs] == [second["metadata"]["uid"]]


def _nested_run(name: str, depth: int, max_depth: int) -> dict[str, Any]:
    """A chain of groups `implement/d2/…/d<depth>` whose innermost step is a workload step."""
    step: dict[str, Any] = {"name": f"d{depth}"}
    for level in range(depth - 1, 1, -1):
        step = {"name": f"d{level}", "steps": [step]}
    manifest = workflow_run(name, {"steps": [step]} if depth > 1 else {})
    manifest["spec"]["workflow"]["maxNestingDepth"] = max_depth
    return manifest


def test_nesting_past_the_limit_is_rejected_before_any_job(cluster: Any, outcomes: ScriptedOutcomes) -> None:
    """The apiserver stores nested child steps; the operator refuses one step past the limit by path."""
    plane, operator, _ = cluster
    _create(plane, _nested_run("nesting-past", 4, 3))
    run = _wait_finished(plane, "nesting-past", operator)
    assert run["status"]["phase"] == "Failed" and run["status"]["reason"] == "NestingTooDeep"
    assert "'implement/d2/d3/d4'" in run["status"]["message"]
    assert {c["type"]: c["status"] for c in run["status"]["conditions"]}["InvalidSpec"] == "True"
    assert _jobs(plane, "nesting-past") == []


def test_nesting_at_the_limit_runs(cluster: Any, outcomes: ScriptedOutcomes) -> None:
    """At the limit the depth is fine: the innermost step runs, named by its address."""
    plane, operator, _ = cluster
    _create(plane, _nested_run("nesting-at", 3, 3))
    run = _wait_finished(plane, "nesting-at", operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    jobs = _jobs(plane, "nesting-at")
    assert [j["metadata"]["name"] for j in jobs] == ["nesting-at-step-1i1-1i1-1-iter-1-attempt-1"]
    assert jobs[0]["metadata"]["labels"][naming.LABEL_STEP_PATH] == "1i1-1i1-1"
    d3 = run["status"]["workflow"]["steps"][0]["steps"][0]["steps"][0]
    assert d3["name"] == "d3" and d3["phase"] == "Succeeded"


def _body_run(name: str, max_iterations: int = 3) -> dict[str, Any]:
    """implement -> test -> review, until review approves."""
    manifest = workflow_run(name, {})
    manifest["spec"]["workflow"]["steps"] = [
        {
            "name": "develop",
            "loop": {
                "maxIterations": max_iterations,
                "condition": {"type": "cel", "until": "iteration.steps.review.control.approved == true"},
            },
            "steps": [{"name": "implement"}, {"name": "test"}, {"name": "review"}],
        }
    ]
    return manifest


def _review_approves_in(iteration: int, run_seconds: float = 0.0) -> Any:
    def outcome(labels: dict[str, str]) -> PodOutcome:
        path = labels.get(naming.LABEL_STEP_PATH, "")
        body_iteration = int(path.split("-")[0].split("i")[1]) if path else 0
        approved = labels[naming.LABEL_STEP] == "review" and body_iteration == iteration
        return PodOutcome(control={"approved": approved}, run_seconds=run_seconds)

    return outcome


def test_a_loop_body_repeats_its_children_until_review_approves(
    cluster: Any, outcomes: ScriptedOutcomes
) -> None:
    plane, operator, _ = cluster
    name = "body"
    outcomes.by_labels[name] = _review_approves_in(2)
    _create(plane, _body_run(name))
    run = _wait_finished(plane, name, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    develop = _step_status(run)
    assert develop["loop"]["completedIterations"] == 2
    assert develop["loop"]["stopReason"] == "LoopConditionFalse"
    children = {"implement": "Succeeded", "test": "Succeeded", "review": "Succeeded"}
    assert [it["steps"] for it in develop["loop"]["iterations"]] == [children, children]
    names = sorted(j["metadata"]["name"] for j in _jobs(plane, name))
    assert names == sorted(f"{name}-step-1i{k}-{c}-iter-1-attempt-1" for k in (1, 2) for c in (1, 2, 3))


def test_a_switch_runs_the_matching_case(cluster: Any, outcomes: ScriptedOutcomes) -> None:
    plane, operator, _ = cluster
    name = "switch"
    outcomes.by_labels[name] = lambda labels: PodOutcome(control={"kind": "bug"})
    manifest = workflow_run(name, {})
    manifest["spec"]["workflow"]["steps"].append(
        {
            "name": "route",
            "switch": {
                "expression": "steps.implement.control.kind",
                "cases": [
                    {"value": "feature", "steps": [{"name": "build"}]},
                    {"value": "bug", "steps": [{"name": "fix"}]},
                ],
                "default": {"steps": [{"name": "ask"}]},
            },
        }
    )
    _create(plane, manifest)
    run = _wait_finished(plane, name, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    route = run["status"]["workflow"]["steps"][1]
    assert route["case"] == "cases[1]" and [c["name"] for c in route["steps"]] == ["fix"]
    names = sorted(j["metadata"]["name"] for j in _jobs(plane, name))
    assert names == [f"{name}-step-1-iter-1-attempt-1", f"{name}-step-2c2-1-iter-1-attempt-1"]


def test_operator_sigkilled_mid_body_resumes_without_repeating_a_child(
    cluster: Any, outcomes: ScriptedOutcomes
) -> None:
    plane, operator, _ = cluster
    name = "body-restart"
    outcomes.by_labels[name] = _review_approves_in(2, run_seconds=1.0)
    _create(plane, _body_run(name))

    def on_test_of_iteration_1() -> bool:
        return any(j["metadata"]["name"] == f"{name}-step-1i1-2-iter-1-attempt-1" for j in _jobs(plane, name))

    eventually(on_test_of_iteration_1, what="the body's second child to start")
    operator.kill()  # SIGKILL, mid-body
    child = f"{name}-step-1i1-2-iter-1-attempt-1"
    eventually(lambda: _job_succeeded(plane, name, child), what="the child to end with no operator")
    operator.start()
    run = _wait_finished(plane, name, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    names = sorted(j["metadata"]["name"] for j in _jobs(plane, name))
    assert names == sorted(f"{name}-step-1i{k}-{c}-iter-1-attempt-1" for k in (1, 2) for c in (1, 2, 3))
    assert _step_status(run)["loop"]["completedIterations"] == 2
