"""Warm iterations (`loop.warm`) end to end: a loop's iterations run in one pod, told by the operator
through the pod's supervisor, and every iteration is recorded as a cold one; a failed attempt, a
timeout, a cancel and an operator restart behave as for cold iterations. docs/concepts.md#warm-iterations.

Each iteration's script appends one line to `/workspace/log` with its iteration, attempt, the pod
it ran in and a counter kept in the container's own /tmp (it starts again in a new container), so
the tests see which iterations shared a container and that none ran twice."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

from agentrun_operator import naming
from tests.e2e.conftest import LocalDefault, step_status
from tests.support.manifests import claim_yaml
from tests.support.polling import eventually

RUN = """
apiVersion: agents.proompteng.ai/v1alpha1
kind: AgentRun
metadata:
  name: {name}
spec:
  runtime:
    type: workflow
  workload:
    image: busybox:1.36
    command: [sh, -c]
    args:
      - |
{script}
    volumes:
      - name: workspace
        type: pvc
        claimName: {name}-workspace
        mountPath: /workspace
  workflow:
    steps:
      - name: work
{step_fields}        loop:
          maxIterations: {max_iterations}
          condition:
            expression: "iteration.last.control.continue == true"
          warm:
            idleSeconds: {idle}
"""

# One line per iteration: iteration, attempt, the pod (its hostname) and the container's own count.
# `/workspace/hold-N-A` makes attempt A of iteration N wait until the test removes it (or for good).
LOOP = """set -e
cd /workspace
n=$(cat /tmp/count 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > /tmp/count
echo "$AGENTRUN_ITERATION $AGENTRUN_ATTEMPT $(hostname) $n $AGENTRUN_PREVIOUS_CONTROL" >> log
touch "started-$AGENTRUN_ITERATION-$AGENTRUN_ATTEMPT"
echo "said by iteration $AGENTRUN_ITERATION"
while [ -e "hold-$AGENTRUN_ITERATION-$AGENTRUN_ATTEMPT" ]; do sleep 0.05; done
{fail}
mkdir -p .agentrun
if [ "$AGENTRUN_ITERATION" -lt {last} ]; then more=true; else more=false; fi
echo "{{\\"continue\\": $more, \\"n\\": $AGENTRUN_ITERATION}}" > "$AGENTRUN_LOOP_CONTROL_PATH"
touch "done-$AGENTRUN_ITERATION-$AGENTRUN_ATTEMPT"
"""


def warm_run(
    name: str,
    *,
    last: int = 5,
    fail: str = "",
    retries: int | None = None,
    timeout_seconds: int | None = None,
    idle: int = 120,
) -> str:
    script = LOOP.format(last=last, fail=fail)
    body = "\n".join("        " + line for line in script.strip().splitlines())
    fields = f"        retries: {retries}\n        retryBackoffSeconds: 0\n" if retries is not None else ""
    if timeout_seconds is not None:
        fields += f"        timeoutSeconds: {timeout_seconds}\n"
    return claim_yaml(f"{name}-workspace") + RUN.format(
        name=name, script=body, step_fields=fields, max_iterations=last + 2, idle=idle
    )


def log_lines(local_default: LocalDefault, name: str) -> list[list[str]]:
    text = (Path(local_default.claim_dir(f"{name}-workspace")) / "log").read_text()
    return [line.split(" ", 4) for line in text.splitlines()]


def jobs_of(local_default: LocalDefault, name: str) -> list[str]:
    """Every Job the operator created for the run (its decision log: a finished warm loop's Job is
    deleted with the loop's end)."""
    lines = local_default.decision_lines(name)
    return sorted({line["job"] for line in lines if line.get("decision") == "create-job"})


def hold(local_default: LocalDefault, name: str, iteration: int, attempt: int = 1) -> Path:
    """Attempt `attempt` of iteration `iteration` waits while this file exists."""
    root = Path(local_default.claim_dir(f"{name}-workspace"))
    path = root / f"hold-{iteration}-{attempt}"
    path.touch()
    return path


def test_a_warm_loop_runs_its_iterations_in_one_pod_and_records_each(local_default: LocalDefault) -> None:
    name = "warm-five"
    local_default.apply(warm_run(name, last=5))
    run = local_default.wait_for_end(name)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    step = step_status(run)
    records = step["loop"]["iterations"]
    assert [r["index"] for r in records] == [1, 2, 3, 4, 5]
    assert all(r["phase"] == "Succeeded" and r["attempts"] == 1 for r in records)
    assert [r.get("warm", False) for r in records] == [False, True, True, True, True]
    pods = {r["pod"] for r in records}
    assert len(pods) == 1
    assert {r["jobRef"]["name"] for r in records} == {naming.job_name(name, 1, 1, 1)}
    assert step["loop"]["stopReason"] == "LoopConditionFalse"
    lines = log_lines(local_default, name)
    assert [(line[0], line[1], line[3]) for line in lines] == [(str(i), "1", str(i)) for i in range(1, 6)]
    assert len({line[2] for line in lines}) == 1  # one container: its /tmp counted 1..5
    assert json.loads(lines[2][4]) == {"continue": True, "n": 2}  # the previous iteration's control
    assert jobs_of(local_default, name) == [naming.job_name(name, 1, 1, 1)]
    # docs/operations.md#logs: an iteration's log is its part of the one pod's log
    shown = local_default.cli("logs", name, "--step", "work", "--iteration", "3")
    assert shown.returncode == 0 and shown.stdout == "said by iteration 3\n", shown


def test_a_failed_warm_attempt_is_retried_in_a_new_pod(local_default: LocalDefault) -> None:
    name = "warm-retry"
    fail = 'if [ "$AGENTRUN_ITERATION" = 3 ] && [ "$AGENTRUN_ATTEMPT" = 1 ]; then exit 7; fi'
    local_default.apply(warm_run(name, last=4, fail=fail, retries=1))
    run = local_default.wait_for_end(name)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    records = {r["index"]: r for r in step_status(run)["loop"]["iterations"]}
    assert records[3]["attempts"] == 2 and not records[3].get("warm")
    assert records[4]["warm"] is True and records[4]["pod"] == records[3]["pod"] != records[2]["pod"]
    lines = log_lines(local_default, name)
    assert [(line[0], line[1]) for line in lines] == [
        ("1", "1"),
        ("2", "1"),
        ("3", "1"),
        ("3", "2"),
        ("4", "1"),
    ]
    assert [line[3] for line in lines] == ["1", "2", "3", "1", "2"]  # the retry's container is new
    assert jobs_of(local_default, name) == sorted(
        [naming.job_name(name, 1, 1, 1), naming.job_name(name, 1, 3, 2)]
    )
    failure = next(e for e in local_default.events(name) if "exited with code 7" in e.get("message", ""))
    assert "in warm pod" in failure["message"]


def test_an_immediate_cancel_stops_a_warm_iteration(local_default: LocalDefault) -> None:
    name = "warm-cancel-now"
    local_default.apply(warm_run(name, last=5))
    held = hold(local_default, name, 2)
    eventually(lambda: (held.parent / "started-2-1").exists(), timeout=120, what="iteration 2 to start")
    local_default.cli("cancel", name)
    run = local_default.wait_for_end(name)
    assert run["status"]["phase"] == "Cancelled", run["status"]
    records = step_status(run)["loop"]["iterations"]
    assert [r["phase"] for r in records] == ["Succeeded", "Cancelled"]

    def pods_gone() -> bool:
        out = local_default.plane.kubectl(
            "get", "pods", "-n", local_default.namespace, "-l", f"{naming.LABEL_RUN}={name}", "-o", "name"
        )
        return not out.strip()

    eventually(pods_gone, timeout=60, what="the warm pod to be gone")
    assert [line[0] for line in log_lines(local_default, name)] == ["1", "2"]


def test_a_graceful_cancel_lets_the_warm_iteration_finish_and_starts_no_other(
    local_default: LocalDefault,
) -> None:
    name = "warm-cancel-graceful"
    local_default.apply(warm_run(name, last=5))
    held = hold(local_default, name, 2)
    eventually(lambda: (held.parent / "started-2-1").exists(), timeout=120, what="iteration 2 to start")
    local_default.cli("cancel", name, "--graceful")
    eventually(
        lambda: local_default.run(name)["spec"].get("cancel") == "Graceful", timeout=30, what="the cancel"
    )
    held.unlink()
    run = local_default.wait_for_end(name)
    assert run["status"]["phase"] == "Cancelled", run["status"]
    records = step_status(run)["loop"]["iterations"]
    assert [(r["index"], r["phase"]) for r in records] == [(1, "Succeeded"), (2, "Succeeded")]
    assert [line[0] for line in log_lines(local_default, name)] == ["1", "2"]


def test_a_warm_iteration_past_its_timeout_fails_and_its_retry_is_a_new_pod(
    local_default: LocalDefault,
) -> None:
    name = "warm-timeout"
    local_default.apply(warm_run(name, last=3, retries=1, timeout_seconds=20))
    held = hold(local_default, name, 2)
    run = local_default.wait_for_end(name, timeout=300)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    records = {r["index"]: r for r in step_status(run)["loop"]["iterations"]}
    assert records[2]["attempts"] == 2
    messages = " ".join(e.get("message", "") for e in local_default.events(name))
    assert "timed out after 20s (a warm iteration: its pod was deleted)" in messages
    assert held.exists()  # attempt 1 never got past its hold: it was stopped at the timeout
    assert not (held.parent / "done-2-1").exists()
    lines = log_lines(local_default, name)
    assert [(line[0], line[1]) for line in lines][:3] == [("1", "1"), ("2", "1"), ("2", "2")]


def test_an_operator_restart_during_a_warm_iteration_loses_and_repeats_nothing(
    local_default: LocalDefault,
) -> None:
    name = "warm-restart"
    local_default.apply(warm_run(name, last=4))
    held = hold(local_default, name, 2)
    eventually(lambda: (held.parent / "started-2-1").exists(), timeout=120, what="iteration 2 to start")
    local_default.operator.kill()
    held.unlink()  # iteration 2 ends while no operator listens: the pod keeps its result
    eventually(lambda: (held.parent / "done-2-1").exists(), timeout=60, what="iteration 2 to end")
    local_default.operator.start()
    local_default.ended.clear()  # a new operator process counts from zero: only runs ended from now
    run = local_default.wait_for_end(name)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    records = step_status(run)["loop"]["iterations"]
    assert [(r["index"], r["attempts"], r.get("warm", False)) for r in records] == [
        (1, 1, False),
        (2, 1, True),
        (3, 1, True),
        (4, 1, True),
    ]
    assert [(line[0], line[1]) for line in log_lines(local_default, name)] == [
        ("1", "1"),
        ("2", "1"),
        ("3", "1"),
        ("4", "1"),
    ]


def test_the_supervisor_refuses_a_request_without_the_runs_key(local_default: LocalDefault) -> None:
    name = "warm-refuses"
    local_default.apply(warm_run(name, last=3))
    held = hold(local_default, name, 1)
    eventually(lambda: (held.parent / "started-1-1").exists(), timeout=120, what="iteration 1 to start")
    out = local_default.plane.kubectl(
        "get", "pods", "-n", local_default.namespace, "-l", f"{naming.LABEL_RUN}={name}", "-o", "json"
    )
    (pod,) = json.loads(out)["items"]
    ip = pod["status"]["podIP"]
    for headers in ({}, {"Authorization": 'AgentRun-HMAC nonce="00", signature="00"'}):
        connection = http.client.HTTPConnection(ip, 8471, timeout=30)
        connection.request("POST", "/v1/start", body=b'{"id": "9-1", "env": {}}', headers=headers)
        answer = connection.getresponse()
        assert answer.status == 401, (answer.status, answer.read())
        connection.close()
    held.unlink()
    run = local_default.wait_for_end(name)
    assert run["status"]["phase"] == "Succeeded"
    assert [line[0] for line in log_lines(local_default, name)] == ["1", "2", "3"]


def _warm_approval_loop(text: str) -> str:
    """examples/approval-loop.yaml with a warm loop body, named apart, each pass noting its pod and
    what its container remembers (a file in its own /tmp)."""
    text = text.replace("name: approval-loop-workspace", "name: warm-approval-workspace")
    text = text.replace("claimName: approval-loop-workspace", "claimName: warm-approval-workspace")
    text = text.replace("name: approval-loop\n", "name: warm-approval\n")
    text = text.replace(
        "            until: \"iteration.last.control.outputs.verdict == 'final'\"\n",
        "            until: \"iteration.last.control.outputs.verdict == 'final'\"\n"
        "          warm:\n"
        "            idleSeconds: 300\n",
    )
    marker = "                  cd /workspace\n"
    assert marker in text and "warm:" in text
    return text.replace(
        marker,
        marker
        + "                  "
        + 'echo "$(hostname) $(cat /tmp/seen 2>/dev/null || echo new)" >> pods.log; echo kept > /tmp/seen\n',
    )


def test_a_warm_loop_body_keeps_its_pod_across_the_approval_gate(local_default: LocalDefault) -> None:
    """docs/concepts.md#warm-iterations (loop bodies): `implement` of pass 2 runs in pass 1's pod,
    which waited idle while the gate waited for a person."""
    from tests.e2e.test_examples import _gate_waits

    name = "warm-approval"
    local_default.apply_example("approval-loop.yaml", _warm_approval_loop)
    _gate_waits(local_default, name, 1)
    approved = local_default.cli(
        "approve",
        name,
        "--step",
        "develop/sign-off",
        "--input",
        "verdict=revise",
        "--input",
        "note=add tests",
    )
    assert approved.returncode == 0, approved.stderr
    _gate_waits(local_default, name, 2)
    implement = step_status(local_default.run(name))["steps"][0]
    assert implement["warm"] is True and implement["phase"] == "Succeeded", implement
    final = local_default.cli("approve", name, "--step", "develop/sign-off", "--input", "verdict=final")
    assert final.returncode == 0, final.stderr
    run = local_default.wait_for_end(name)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    root = Path(local_default.claim_dir(f"{name}-workspace"))
    assert (root / "change.log").read_text().splitlines() == [
        "iteration 1: first draft",
        "iteration 2: revised: add tests",
    ]
    first, second = (line.split(" ") for line in (root / "pods.log").read_text().splitlines())
    assert first[1] == "new" and second == [first[0], "kept"]  # one container: it remembers pass 1
    assert len(jobs_of(local_default, name)) == 1
