"""Approval gates against the real control plane, with the operator as a process: the CLI's decisions
reach a waiting gate through `spec.approvals`, and an operator killed while a gate waits, or right as
a decision is applied, resumes without applying any decision twice. (The API server's append-only
rule itself: `INVALID_UPDATES` in tests/integration/test_crds_apiserver.py.)

The operator talks to the API server through `WatchProxy` (tests/integration/watch_proxy.py), which
forwards everything; the test uses it to hold the status write that applies a decision, and kills
the operator while that write is on its way."""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_operator.cli import build_parser
from agentrun_operator.ctl.main import run_ctl
from tests.integration.kubelet_driver import KubeletDriver, PodOutcome, ScriptedOutcomes
from tests.integration.watch_proxy import Call, WatchProxy
from tests.support import api
from tests.support.api import ready_namespace
from tests.support.claims import bound_claims
from tests.support.manifests import workflow_run
from tests.support.polling import eventually
from tests.support.processes import OperatorProcess

NAMESPACE = "gates"
GATE = {
    "name": "sign-off",
    "approval": {"message": "ok?", "inputs": [{"name": "verdict", "required": True}]},
}


@pytest.fixture(scope="module")
def outcomes() -> ScriptedOutcomes:
    return ScriptedOutcomes()


@pytest.fixture(scope="module")
def cluster(
    control_plane: ControlPlane, outcomes: ScriptedOutcomes, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ControlPlane, OperatorProcess, WatchProxy]]:
    plane = control_plane
    ready_namespace(plane, NAMESPACE)
    bound_claims(plane, NAMESPACE, ["ws"])
    driver = KubeletDriver(plane, NAMESPACE, outcomes.outcome).start()
    proxy = WatchProxy(plane, tmp_path_factory.mktemp("proxy")).start()
    operator = OperatorProcess(
        plane, tmp_path_factory.mktemp("operator"), kubeconfig=proxy.kubeconfig
    ).start()
    try:
        yield plane, operator, proxy
    finally:
        operator.stop()
        proxy.stop()
        driver.stop()


def _body_run(name: str) -> dict[str, Any]:
    """A loop body `develop` of `work` and the gate, until the verdict is final."""
    manifest = workflow_run(name, {})
    manifest["metadata"]["namespace"] = NAMESPACE
    manifest["spec"]["workflow"]["steps"] = [
        {
            "name": "develop",
            "loop": {
                "maxIterations": 4,
                "condition": {"type": "cel", "until": "iteration.last.control.outputs.verdict == 'final'"},
            },
            "steps": [{"name": "work"}, copy.deepcopy(GATE)],
        }
    ]
    return manifest


def _run_of(plane: ControlPlane, name: str) -> dict[str, Any]:
    return api.agentrun(plane, NAMESPACE, name)


def _waits(plane: ControlPlane, name: str, iteration: int) -> None:
    def waiting() -> bool:
        run = _run_of(plane, name)
        body = ((run.get("status") or {}).get("workflow") or {}).get("steps") or [{}]
        gate: dict[str, Any] = next((s for s in body[0].get("steps") or [] if s["name"] == "sign-off"), {})
        return (
            gate.get("phase") == "AwaitingApproval"
            and (gate.get("approval") or {}).get("iteration") == iteration
        )

    eventually(waiting, timeout=60, what=f"the gate to wait in iteration {iteration}")


def _cli(plane: ControlPlane, *argv: str) -> tuple[int, str]:
    """`agentrun approve|reject …` in this process (the same code the command runs)."""
    args = build_parser().parse_args([*argv, "-n", NAMESPACE, "--kubeconfig", str(plane.kubeconfig)])
    out, err = io.StringIO(), io.StringIO()
    code = run_ctl(args, out, err)
    return code, out.getvalue() + err.getvalue()


def _append(plane: ControlPlane, name: str, entry: dict[str, Any]) -> None:
    """A decision written by hand: a JSON patch appending to spec.approvals."""
    run = _run_of(plane, name)
    ops: list[dict[str, Any]] = (
        [{"op": "add", "path": "/spec/approvals/-", "value": entry}]
        if "approvals" in run["spec"]
        else [{"op": "add", "path": "/spec/approvals", "value": [entry]}]
    )
    plane.kubectl("patch", "agentrun", name, "-n", NAMESPACE, "--type", "json", "-p", json.dumps(ops))


def _finished(plane: ControlPlane, name: str, operator: OperatorProcess) -> dict[str, Any]:
    result: dict[str, Any] = {}

    def done() -> bool:
        result.update(_run_of(plane, name))
        return (result.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Cancelled")

    try:
        eventually(done, 90, f"agentrun {name} to finish")
    except AssertionError:
        print(json.dumps(result.get("status"), indent=1), operator.logs()[-5000:])
        raise
    return result


def _jobs(plane: ControlPlane, name: str) -> list[str]:
    return sorted(j["metadata"]["name"] for j in api.jobs_of_run(plane, NAMESPACE, name))


def _events(plane: ControlPlane, name: str) -> list[dict[str, Any]]:
    uid = _run_of(plane, name)["metadata"]["uid"]
    out = plane.kubectl(
        "get", "events", "-n", NAMESPACE, "--field-selector", f"involvedObject.uid={uid}", "-o", "json"
    )
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def test_decisions_from_the_cli_drive_a_gate_in_a_loop_body(
    cluster: tuple[ControlPlane, OperatorProcess, WatchProxy], outcomes: ScriptedOutcomes
) -> None:
    plane, operator, _ = cluster
    name = "gate-cli"
    outcomes.runs[name] = lambda _i, _a: PodOutcome()
    plane.kubectl("create", "-f", "-", input_text=json.dumps(_body_run(name)))
    _waits(plane, name, 1)
    code, text = _cli(plane, "approve", name, "--step", "develop/sign-off")
    assert code == 4 and "requires input 'verdict'" in text, text
    code, text = _cli(plane, "approve", name, "--step", "develop/sign-off", "--input", "verdict=more")
    assert code == 0 and "spec.approvals[0]" in text, text
    _waits(plane, name, 2)
    code, text = _cli(plane, "approve", name, "--step", "develop/sign-off", "--iteration", "1")
    assert code == 4 and "waits in iteration 2, not 1" in text, text
    code, text = _cli(plane, "approve", name, "--step", "develop/sign-off", "--input", "verdict=final")
    assert code == 0, text
    run = _finished(plane, name, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert run["status"]["workflow"]["approvalsJudged"] == 2
    assert _jobs(plane, name) == [f"{name}-step-1i{k}-1-iter-1-attempt-1" for k in (1, 2)]  # no gate Job


def _judged(plane: ControlPlane, name: str) -> int:
    workflow = (_run_of(plane, name).get("status") or {}).get("workflow") or {}
    return int(workflow.get("approvalsJudged") or 0)


def _status_write(name: str, judged: int) -> Callable[[Call], bool]:
    """The operator's status write of run `name` that records `judged` decisions as judged: the
    write that applies a decision (docs/concepts.md#approval-gates: applying it and advancing the
    count are one status write)."""

    def matches(call: Call) -> bool:
        if call.method != "PUT" or not call.path.endswith(f"/agentruns/{name}/status"):
            return False
        workflow = ((call.json() or {}).get("status") or {}).get("workflow") or {}
        return bool(workflow.get("approvalsJudged") == judged)

    return matches


def test_operator_killed_while_a_gate_waits_and_as_a_decision_is_applied_applies_it_once(
    cluster: tuple[ControlPlane, OperatorProcess, WatchProxy], outcomes: ScriptedOutcomes
) -> None:
    plane, operator, proxy = cluster
    name = "gate-restart"
    outcomes.runs[name] = lambda _i, _a: PodOutcome()
    plane.kubectl("create", "-f", "-", input_text=json.dumps(_body_run(name)))
    _waits(plane, name, 1)
    # killed while the gate waits; the decision arrives while no operator runs
    operator.kill()
    _append(
        plane,
        name,
        {"step": "develop/sign-off", "iteration": 1, "decision": "Approved", "inputs": {"verdict": "more"}},
    )
    operator.start()
    _waits(plane, name, 2)
    # a decision, and the operator killed right as it is being applied: its status write applying the
    # decision is held on its way to the API server, the operator is killed while it waits for the
    # answer, and the write is dropped (the API server never gets it)
    applying = proxy.hold(_status_write(name, 2))
    _append(
        plane,
        name,
        {"step": "develop/sign-off", "iteration": 2, "decision": "Approved", "inputs": {"verdict": "more"}},
    )
    assert applying.arrived.wait(60), "the operator never wrote the status applying the decision"
    operator.kill()
    applying.release(forward=False)
    # Mid-apply: the Job of iteration 3 the decision starts was created (Jobs come before the status
    # that mentions them), the decision is not recorded.
    third = f"{name}-step-1i3-1-iter-1-attempt-1"
    created = {j["metadata"]["name"]: j["metadata"]["uid"] for j in api.jobs_of_run(plane, NAMESPACE, name)}
    assert third in created, created
    assert _judged(plane, name) == 1
    operator.start()
    _waits(plane, name, 3)
    # a second decision for iteration 2 (already decided), written by hand: refused, never applied
    _append(
        plane, name, {"step": "develop/sign-off", "iteration": 2, "decision": "Rejected", "reason": "late"}
    )
    code, text = _cli(plane, "approve", name, "--step", "develop/sign-off", "--input", "verdict=final")
    assert code == 0, text
    run = _finished(plane, name, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    develop = run["status"]["workflow"]["steps"][0]
    assert develop["loop"]["completedIterations"] == 3
    assert [r["steps"]["sign-off"] for r in develop["loop"]["iterations"]] == ["Succeeded"] * 3
    assert run["status"]["workflow"]["approvalsJudged"] == 4
    jobs = {j["metadata"]["name"]: j["metadata"]["uid"] for j in api.jobs_of_run(plane, NAMESPACE, name)}
    assert sorted(jobs) == [f"{name}-step-1i{k}-1-iter-1-attempt-1" for k in (1, 2, 3)]
    assert jobs[third] == created[third]  # the restarted operator adopted iteration 3's Job, made no other
    refused = [e for e in _events(plane, name) if "ApprovalRefused" in (e["reason"] + e["message"])]
    assert refused and "spec.approvals[2]" in json.dumps(refused), refused
    assert "spec.approvals[1]" not in json.dumps(refused), refused  # applied, so never judged again
