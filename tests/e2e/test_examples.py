"""Every example in examples/ runs for real and reaches the outcome examples/README.md promises,
including the files its iterations leave on the PVC (state continuity across iterations)."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
from datetime import datetime, timedelta
from itertools import pairwise

from tests.e2e.conftest import LocalDefault, step_status
from tests.support.metrics import Samples, delta, value
from tests.support.polling import eventually
from tests.support.processes import processes_with


def iterations(run: dict[str, object]) -> list[dict[str, object]]:
    loop = step_status(run).get("loop") or {}
    result: list[dict[str, object]] = loop.get("iterations") or []
    return result


def succeeded_metrics(local_default: LocalDefault, before: Samples) -> Samples:
    """The metrics once the run that just succeeded is counted (its last facts, counted together)."""
    return local_default.metrics_after(
        before, "agentrun_run_phase_transitions_total", phase="Succeeded", reason="Completed"
    )


def test_fixed_loop(local_default: LocalDefault) -> None:
    local_default.apply_example("fixed-loop.yaml")
    run = local_default.wait_for_end("fixed-loop")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    loop = step_status(run)["loop"]
    assert loop["stopReason"] == "LoopMaxIterationsReached"
    assert loop["completedIterations"] == 3
    lines = (local_default.claim_dir("fixed-loop-workspace") / "log.txt").read_text().splitlines()
    assert [line.split(" at ")[0] for line in lines] == [f"iteration {k} of 3" for k in (1, 2, 3)]


def test_conditional_loop(local_default: LocalDefault) -> None:
    local_default.apply_example("conditional-loop.yaml")
    run = local_default.wait_for_end("conditional-loop")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    loop = step_status(run)["loop"]
    assert loop["stopReason"] == "LoopConditionFalse"
    assert loop["completedIterations"] == 3
    assert loop["lastControl"] == {"continue": False, "outputs": {"iteration": 3, "notes": 3}}
    root = local_default.claim_dir("conditional-loop-workspace")
    assert len((root / "notes" / "progress.log").read_text().splitlines()) == 3
    assert json.loads((root / ".agentrun" / "loop-control.json").read_text())["continue"] is False
    # one Job claim per iteration, each naming the pod that ran it (docs/concepts.md#exactly-once)
    claims = sorted((root / ".agentrun-claims").iterdir())
    assert len(claims) == 3 and all(len(c.read_text()) == 36 for c in claims), claims
    # each iteration saw the notes of the ones before it, and got the previous control object
    assert (root / "notes" / "iteration-1.txt").read_text().startswith("iteration 1: found 0 earlier notes")
    third = (root / "notes" / "iteration-3.txt").read_text()
    assert third.startswith("iteration 3: found 2 earlier notes")
    assert '"iteration":2' in third


def test_retries_with_a_command_that_fails_once(local_default: LocalDefault) -> None:
    local_default.apply_example("retries.yaml")
    run = local_default.wait_for_end("retries")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert [(it["index"], it["phase"], it["attempts"]) for it in iterations(run)] == [
        (1, "Succeeded", 2),
        (2, "Succeeded", 1),
    ]
    root = local_default.claim_dir("retries-workspace")
    assert (root / "attempts.log").read_text().splitlines() == [
        "iteration 1 attempt 1",
        "iteration 1 attempt 2",
        "iteration 2 attempt 1",
    ]
    assert (root / "flaky-marker").exists()


def test_timeout_kills_the_sleeping_process_and_the_retry_succeeds(local_default: LocalDefault) -> None:
    sleep = local_default.own_sleep("7777")

    def roomier(text: str) -> str:
        # The deadline counts from the Job's start, the pod's start included: on a loaded machine
        # (CI, with the real-node tier beside it) 10 s could end attempt 1 before its sleep ever ran,
        # and the test would not see what it is about. 30 s leaves the start room; the kill is the same.
        return local_default.own_sleeps(text).replace("timeoutSeconds: 10", "timeoutSeconds: 30")

    local_default.apply_example("timeout.yaml", edit=roomier)
    eventually(lambda: processes_with("sleep", sleep), what="attempt 1's sleep to run", timeout=120)
    run = local_default.wait_for_end("timeout")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert [(it["phase"], it["attempts"]) for it in iterations(run)] == [("Succeeded", 2)]
    assert not processes_with("sleep", sleep), "the timed-out attempt's process is still running"
    lines = (local_default.claim_dir("timeout-workspace") / "attempts.log").read_text().splitlines()
    assert lines == ["attempt 1 sleeping", "attempt 2 done"]


def test_timeout_without_retries_fails_the_iteration(local_default: LocalDefault) -> None:
    def no_retry(text: str) -> str:
        return (
            text.replace("name: timeout\n", "name: timeout-no-retry\n")
            .replace("retries: 1", "retries: 0")
            .replace("timeout-workspace", "timeout-no-retry-workspace")
            .replace("sleep 7777", f"sleep {sleep}")
        )

    sleep = local_default.own_sleep("7779")
    local_default.apply_example("timeout.yaml", edit=no_retry)
    eventually(lambda: processes_with("sleep", sleep), what="the attempt's sleep to run", timeout=120)
    run = local_default.wait_for_end("timeout-no-retry")
    assert run["status"]["phase"] == "Failed", run["status"]
    step = step_status(run)
    assert step["loop"]["stopReason"] == "LoopIterationFailed"
    assert [(it["phase"], it["attempts"]) for it in iterations(run)] == [("Failed", 1)]
    eventually(lambda: not processes_with("sleep", sleep), timeout=60, what="the sleep to be killed")
    lines = (local_default.claim_dir("timeout-no-retry-workspace") / "attempts.log").read_text().splitlines()
    assert lines == ["attempt 1 sleeping"]


def test_immediate_cancel(local_default: LocalDefault) -> None:
    sleep = local_default.own_sleep("7778")
    local_default.apply_example("cancel-immediate.yaml", edit=local_default.own_sleeps)
    eventually(lambda: processes_with("sleep", sleep), what="iteration 1's sleep to run", timeout=120)
    local_default.patch_run("cancel-immediate", {"spec": {"cancel": "Immediate"}})
    run = local_default.wait_for_end("cancel-immediate")
    assert run["status"]["phase"] == "Cancelled", run["status"]
    step = step_status(run)
    assert step["loop"]["stopReason"] == "LoopCancelled"
    assert [it["phase"] for it in iterations(run)] == ["Cancelled"]
    eventually(lambda: not processes_with("sleep", sleep), timeout=60, what="the sleep to be killed")
    started = (local_default.claim_dir("cancel-immediate-workspace") / "started.log").read_text()
    assert len(started.splitlines()) == 1


def test_agent_provider_and_implementation_spec(local_default: LocalDefault) -> None:
    local_default.apply_example("agent-trio.yaml")
    run = local_default.wait_for_end("agent-trio")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert step_status(run)["loop"]["completedIterations"] == 2
    root = local_default.claim_dir("agent-trio-workspace")
    assert (root / "task.md").read_text() == (
        "Write a haiku about iterating on the same workspace.\nKeep each line short.\n\n"
    )
    assert json.loads((root / "criteria.json").read_text()) == ["three lines"]  # AGENTRUN_ACCEPTANCE_CRITERIA
    lines = (root / "agent.log").read_text().splitlines()
    assert [line.split(":")[0] for line in lines] == ["shell-agent iteration 1", "shell-agent iteration 2"]
    assert all("write a haiku about loops" in line for line in lines)


def test_git_loop_commits_once_per_iteration_through_a_version_control_provider(
    local_default: LocalDefault,
) -> None:
    local_default.apply_example("git-loop.yaml")
    run = local_default.wait_for_end("git-loop")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    forge, work = run["status"]["workflow"]["steps"]
    assert forge["phase"] == "Succeeded"
    records = work["loop"]["iterations"]
    commits = [r.get("commit") for r in records]
    assert len(commits) == 3 and len(set(commits)) == 3, records
    assert all(isinstance(c, str) and len(c) == 40 for c in commits), commits
    vcs = run["status"]["vcs"]
    assert vcs == {
        "provider": "local-forge",
        "repository": "demo/app.git",
        "baseBranch": "main",
        "headBranch": "agentrun/git-loop",
        "mode": "read-write",
        "commit": commits[-1],
    }
    bare = local_default.claim_dir("git-loop-forge") / "demo" / "app.git"

    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", "--git-dir", str(bare), *args], check=True, capture_output=True, text=True
        )
        return out.stdout.strip()

    assert git("rev-parse", "agentrun/git-loop") == commits[-1]
    assert git("log", "--format=%H", "-n", "3", "agentrun/git-loop").splitlines() == commits[::-1]
    assert git("log", "--format=%an <%ae>", "-n", "1", "agentrun/git-loop") == (
        "AgentRun Example <agentrun@example.invalid>"
    )
    assert git("show", "agentrun/git-loop:progress.md").splitlines() == [
        f"iteration {k} of 3" for k in (1, 2, 3)
    ]


def test_runner_contract_provider(local_default: LocalDefault) -> None:
    local_default.apply_example("runner-contract.yaml")
    run = local_default.wait_for_end("runner-contract")
    assert run["status"]["phase"] == "Succeeded", step_status(run).get("message")
    assert step_status(run)["loop"]["completedIterations"] == 2
    root = local_default.claim_dir("runner-contract-workspace")
    seen = root / "seen"
    assert (seen / "env.txt").read_text().splitlines() == [
        "AGENT_PROVIDER=shell-runner",
        f"RUN_NAMESPACE={local_default.namespace}",
        "AGENT_DEPTH=2",
        "TOPIC=loops",
        "MISSING=",
        "API_TOKEN=s3cret-token",
        "EXTRA_SETTING=from-spec-secrets",
        "args: runner-contract loops",
    ]
    assert (seen / "task.md").read_text() == "Summarise what the loop learned."
    spec = json.loads((seen / "run.json").read_text())
    assert spec["provider"] == "shell-runner"
    assert spec["agentRun"]["name"] == "runner-contract" and spec["agentRun"]["uid"] == run["metadata"]["uid"]
    assert spec["implementation"]["text"] == "Summarise what the loop learned."
    assert spec["parameters"] == {"topic": "loops"}
    assert spec["artifacts"] == [
        {"name": "report", "path": "/workspace/out/report.md", "url": "https://artifacts.example/report.md"},
        {"name": "runner-log", "path": "/tmp/agent/runner.log"},
    ]
    runner = json.loads((seen / "agent-runner.json").read_text())
    assert runner["provider"] == "shell-runner" and runner["adapter"] == {"mode": "demo"}
    report = (root / "out" / "report.md").read_bytes()
    assert report == b"report of iteration 2 for loops\n"
    assert run["status"]["artifacts"] == [
        {
            "name": "report",
            "path": "/workspace/out/report.md",
            "url": "https://artifacts.example/report.md",
            "size": len(report),
            "digest": "sha256:" + hashlib.sha256(report).hexdigest(),
            "step": "run",
            "iteration": 2,
        },
        {
            "name": "runner-log",
            "path": "/tmp/agent/runner.log",
            "size": len(b"runner log of iteration 2\n"),
            "digest": "sha256:" + hashlib.sha256(b"runner log of iteration 2\n").hexdigest(),
            "step": "run",
            "iteration": 2,
        },
    ]


def test_original_manifests_run_unchanged(local_default: LocalDefault) -> None:
    local_default.apply_example("original-manifests.yaml")
    run = local_default.wait_for_end("original-manifests")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert step_status(run)["attempt"] == 2  # defaults.retryLimit: 1, retried at once
    report = (local_default.claim_dir("original-manifests-workspace") / "report.txt").read_text()
    assert report.splitlines() == [
        "system prompt: You are a careful engineer.",
        "goal: Make the failing test pass.",
        "token: example-token",
        "repo: example/repo base: main",
        "task: Fix issue 7",
        "attempt: 2",
    ]
    template = local_default.run("original-manifests-template")["status"]
    assert (template["phase"], template["reason"]) == ("Pending", "Template"), template
    assert "workflow" not in template or not template["workflow"].get("steps")


def test_plan_step_outputs_drive_a_for_each(local_default: LocalDefault) -> None:
    local_default.apply_example("plan-for-each.yaml")
    run = local_default.wait_for_end("plan-for-each")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    workflow = run["status"]["workflow"]
    assert workflow["outputs"] == {"tasks": ["parser", "lexer", "printer"]}
    plan, work = workflow["steps"]
    assert plan["loop"]["stopReason"] == "LoopConditionFalse" and plan["loop"]["completedIterations"] == 3
    assert work["loop"]["items"] == ["parser", "lexer", "printer"]
    assert work["loop"]["completedIterations"] == 3
    root = local_default.claim_dir("plan-for-each-workspace")
    plan_log = (root / "plan.log").read_text().splitlines()
    assert plan_log == [
        "iteration 1 planned parser (collected so far: {})",
        'iteration 2 planned lexer (collected so far: {"tasks":["parser"]})',
        'iteration 3 planned printer (collected so far: {"tasks":["parser","lexer"]})',
    ]
    for index, task in enumerate(["parser", "lexer", "printer"]):
        done = (root / "done" / f"{task}.txt").read_text()
        assert done.startswith(f"worked on {task} (item {index} of ")
        assert '"tasks":["parser","lexer","printer"]' in done


def test_token_budget_stops_a_loop(local_default: LocalDefault) -> None:
    before = local_default.metrics()
    local_default.apply_example("token-budget.yaml")
    run = local_default.wait_for_end("token-budget")
    after = local_default.metrics_after(before, "agentrun_loop_stops_total", reason="LoopBudgetExhausted")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    step = step_status(run)
    assert step["loop"]["stopReason"] == "LoopBudgetExhausted"
    assert step["loop"]["completedIterations"] == 3
    assert step["usage"] == {"inputTokens": 900, "outputTokens": 300, "costUSD": 0.03}
    assert run["status"]["workflow"]["usage"] == step["usage"]
    assert [it["usage"]["inputTokens"] for it in iterations(run)] == [300, 300, 300]
    # the same usage in the metrics (docs/operator.md#metrics): 3 x 400 tokens, 3 x 0.01 USD
    assert delta(before, after, "agentrun_tokens_total") == 1200
    assert abs(delta(before, after, "agentrun_cost_usd_total") - 0.03) < 1e-9
    lines = (local_default.claim_dir("token-budget-workspace") / "spend.log").read_text().splitlines()
    assert lines == [f"iteration {k} spent 400 tokens" for k in (1, 2, 3)]


def test_until_stops_when_its_condition_is_true(local_default: LocalDefault) -> None:
    local_default.apply_example("until-loop.yaml")
    run = local_default.wait_for_end("until-loop")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    loop = step_status(run)["loop"]
    assert loop["stopReason"] == "LoopConditionFalse"
    assert loop["completedIterations"] == 3 and loop["maxIterations"] == 10
    assert loop["lastControl"] == {"outputs": {"remaining_tasks": 0, "finished": "docs"}}
    root = local_default.claim_dir("until-loop-workspace")
    assert (root / "done.txt").read_text().splitlines() == [
        "iteration 1 finished parser",
        "iteration 2 finished lexer",
        "iteration 3 finished docs",
    ]
    assert (root / "todo.txt").read_text() == ""


def test_polling_loop_waits_its_interval_between_checks(local_default: LocalDefault) -> None:
    local_default.apply_example("polling-loop.yaml")
    run = local_default.wait_for_end("polling-loop")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    loop = step_status(run)["loop"]
    assert loop["stopReason"] == "LoopConditionFalse"
    assert loop["completedIterations"] == 3 and "nextIterationAt" not in loop
    assert loop["lastControl"] == {"outputs": {"ready": True, "version": "v1.4.0"}}
    records = iterations(run)
    assert [r["phase"] for r in records] == ["Succeeded"] * 3

    def moment(value: object) -> datetime:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))

    # No Job (so no pod) of the run between a check's end and the next one's start: at least the
    # interval, whatever the machine's load (a lower bound; a slow machine only adds to it).
    gaps = [moment(b["startedAt"]) - moment(a["finishedAt"]) for a, b in pairwise(records)]
    assert all(gap >= timedelta(seconds=2) for gap in gaps), gaps
    root = local_default.claim_dir("polling-loop-workspace")
    assert (root / "checks.log").read_text().splitlines() == [
        "check 1: not yet",
        "check 2: not yet",
        "check 3: found v1.4.0",
    ]


def test_for_each_over_a_run_parameter(local_default: LocalDefault) -> None:
    local_default.apply_example("for-each-parameters.yaml")
    run = local_default.wait_for_end("for-each-parameters")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    loop = step_status(run)["loop"]
    assert loop["items"] == ["api", "web", "worker"]
    assert (loop["itemCount"], loop["maxIterations"], loop["completedIterations"]) == (3, 3, 3)
    assert loop["stopReason"] == "LoopMaxIterationsReached"
    root = local_default.claim_dir("for-each-parameters-workspace")
    assert (root / "checked.log").read_text().splitlines() == ["0 api", "1 web", "2 worker"]
    for index, repo in enumerate(["api", "web", "worker"]):
        assert (root / "repos" / f"{repo}.txt").read_text() == (
            f"checked {repo} (item {index}, iteration {index + 1} of 3)\n"
        )


def test_for_each_over_an_earlier_steps_control_outputs(local_default: LocalDefault) -> None:
    local_default.apply_example("for-each-step-outputs.yaml")
    run = local_default.wait_for_end("for-each-step-outputs")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    plan, work = run["status"]["workflow"]["steps"]
    assert plan["phase"] == "Succeeded" and "loop" not in plan
    assert plan["control"] == {"outputs": {"tasks": ["lint", "test", "package"]}}
    assert work["loop"]["items"] == ["lint", "test", "package"]
    assert work["loop"]["completedIterations"] == 3
    assert work["loop"]["stopReason"] == "LoopMaxIterationsReached"
    root = local_default.claim_dir("for-each-step-outputs-workspace")
    assert (root / "plan.txt").read_text() == "planned: lint test package\n"
    assert (root / "work.log").read_text().splitlines() == [
        'task 0: "lint"',
        'task 1: "test"',
        'task 2: "package"',
    ]


def test_when_skips_one_step_and_runs_another(local_default: LocalDefault) -> None:
    before = local_default.metrics()
    local_default.apply_example("when.yaml")
    run = local_default.wait_for_end("when")
    after = succeeded_metrics(local_default, before)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    check, fix, publish = run["status"]["workflow"]["steps"]
    assert (check["phase"], fix["phase"], publish["phase"]) == ("Succeeded", "Skipped", "Succeeded")
    assert fix["reason"] == "WhenFalse"
    assert fix["message"] == "skipped: when `steps.check.control.outputs.failures > 0` is false"
    assert "jobRef" not in fix
    messages = [e["message"] for e in local_default.events("when")]
    assert any("step fix: skipped: when" in m for m in messages), messages
    root = local_default.claim_dir("when-workspace")
    assert (root / "check.log").read_text() == "checked: 0 failures\n"
    assert (root / "published.txt").read_text() == "published after checked: 0 failures\n"
    assert not (root / "fixed.txt").exists()
    steps = {"construct": "workload", "loop": "false"}
    assert delta(before, after, "agentrun_steps_total", **steps, phase="Skipped") == 1
    assert delta(before, after, "agentrun_steps_total", **steps, phase="Succeeded") == 2


def test_graceful_cancel_lets_the_running_iteration_finish(local_default: LocalDefault) -> None:
    local_default.apply_example("cancel-graceful.yaml")
    progress = local_default.claim_dir("cancel-graceful-workspace") / "progress.log"
    eventually(
        lambda: progress.exists() and "iteration 1 started" in progress.read_text(),
        what="iteration 1 to start",
        timeout=120,
    )
    local_default.patch_run("cancel-graceful", {"spec": {"cancel": "Graceful"}})
    run = local_default.wait_for_end("cancel-graceful")
    assert run["status"]["phase"] == "Cancelled", run["status"]
    step = step_status(run)
    assert step["phase"] == "Cancelled"
    assert step["loop"]["stopReason"] == "LoopCancelled"
    recorded = iterations(run)
    # the iteration that was running when the cancel came finished and is recorded; none started after
    assert recorded and all(it["phase"] == "Succeeded" for it in recorded), recorded
    assert step["loop"]["completedIterations"] == len(recorded) < 10
    lines = progress.read_text().splitlines()
    assert lines == [
        f"iteration {k} {what}" for k in range(1, len(recorded) + 1) for what in ("started", "finished")
    ]


# ----------------------------------------------------------------------------------- control flow


def created_jobs(local_default: LocalDefault, name: str) -> list[str]:
    return [line["job"] for line in local_default.decision_lines(name) if line["decision"] == "create-job"]


def test_review_loop_repeats_its_body_until_the_review_approves(local_default: LocalDefault) -> None:
    before = local_default.metrics()
    local_default.apply_example("review-loop.yaml")
    run = local_default.wait_for_end("review-loop")
    after = succeeded_metrics(local_default, before)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    develop = step_status(run)
    loop = develop["loop"]
    assert loop["stopReason"] == "LoopConditionFalse"
    assert loop["completedIterations"] == 3
    assert loop["lastControl"] == {"approved": True, "changes": 3}
    children = {"implement": "Succeeded", "test": "Succeeded", "review": "Succeeded"}
    assert [(it["index"], it["phase"], it["steps"]) for it in loop["iterations"]] == [
        (k, "Succeeded", children) for k in (1, 2, 3)
    ]
    assert [(c["name"], c["phase"]) for c in develop["steps"]] == list(children.items())
    # Job decisions name the child's path, with the body's iteration (docs/operator.md#logs)
    lines = local_default.decision_lines("review-loop")
    assert [
        (line["step"], line["path"], line["iteration"]) for line in lines if line["decision"] == "create-job"
    ] == [
        (f"develop/{child}", f"develop/iteration {k}/{child}", 1)
        for k in (1, 2, 3)
        for child in ("implement", "test", "review")
    ]
    assert len(set(created_jobs(local_default, "review-loop"))) == 9  # 3 children x 3 iterations
    # the timeline through the real CLI: plain text when piped, a bar per iteration and per child
    timeline = local_default.cli("status", "review-loop", "--timeline")
    assert timeline.returncode == 0 and "\x1b[" not in timeline.stdout, timeline.stderr
    print(timeline.stdout)
    rows = [line.split("|") for line in timeline.stdout.splitlines() if "|" in line]
    drawn = {row[0].strip(): row[1] for row in rows}
    assert [*drawn] == ["develop", "#1", "#2", "#3", "implement (#3)", "test (#3)", "review (#3)"], drawn
    assert all(len(bar) == 60 and set(bar) <= {"=", " ", "."} for bar in drawn.values()), drawn
    starts = [len(drawn[k]) - len(drawn[k].lstrip()) for k in ("#1", "#2", "#3")]
    assert starts == sorted(starts) and starts[0] < starts[2], drawn
    paths = {f"develop/iteration {k}/{child}" for k in (1, 2, 3) for child in ("implement", "test", "review")}

    def ttl_paths() -> bool:  # the last Job's TTL is set by the reconcile after the run's end
        lines = local_default.decision_lines("review-loop")
        return {line["path"] for line in lines if line["decision"] == "set-job-ttl"} == paths

    eventually(ttl_paths, timeout=30, what="every Job's TTL decision, naming its path")
    # Events (and their log lines) name the path the same way
    succeeded = [line["msg"] for line in lines if line["decision"] == "IterationSucceeded"]
    assert any(m.startswith("step develop/iteration 2/test: succeeded (Job ") for m in succeeded), succeeded
    assert "step develop: iteration 3/5 succeeded: all 3 steps finished" in succeeded
    # metrics: 9 child steps and 1 loop body ended; 9 attempts and 3 passes
    assert (
        delta(before, after, "agentrun_steps_total", construct="workload", loop="false", phase="Succeeded")
        == 9
    )
    assert (
        delta(before, after, "agentrun_steps_total", construct="group", loop="true", phase="Succeeded") == 1
    )
    assert delta(before, after, "agentrun_iterations_total", result="Succeeded") == 12
    assert delta(before, after, "agentrun_loop_stops_total", reason="LoopConditionFalse") == 1
    assert value(after, "agentrun_nesting_depth_reached") >= 2
    root = local_default.claim_dir("review-loop-workspace")
    assert (root / "feature.txt").read_text().splitlines() == ["change 1", "change 2", "change 3"]
    assert (root / "tests.log").read_text().splitlines() == [
        f"iteration {k}: {k} changes pass" for k in (1, 2, 3)
    ]
    assert (root / "journal.log").read_text().splitlines() == [
        f"iteration {k} {child}" for k in (1, 2, 3) for child in ("implement", "test", "review")
    ]


def test_switch_takes_the_case_of_the_triage_result(local_default: LocalDefault) -> None:
    before = local_default.metrics()
    local_default.apply_example("switch-triage.yaml")
    run = local_default.wait_for_end("switch-triage")
    after = succeeded_metrics(local_default, before)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    triage, route = run["status"]["workflow"]["steps"]
    assert triage["control"] == {"outputs": {"kind": "bug"}}
    assert (route["phase"], route["case"]) == ("Succeeded", "cases[0]")
    assert [(c["name"], c["phase"]) for c in route["steps"]] == [
        ("reproduce", "Succeeded"),
        ("fix", "Succeeded"),
    ]
    root = local_default.claim_dir("switch-triage-workspace")
    assert (root / "triage.txt").read_text() == "bug\n"
    assert (root / "route.log").read_text().splitlines() == ["reproduce bug", "fix bug"]
    assert delta(before, after, "agentrun_switch_cases_total", case="cases[0]") == 1
    assert (
        delta(before, after, "agentrun_steps_total", construct="switch", loop="false", phase="Succeeded") == 1
    )
    lines = local_default.decision_lines("switch-triage")
    taken = [(line["step"], line["msg"]) for line in lines if line["decision"] == "SwitchCaseTaken"]
    assert taken == [("route", 'step route: took cases[0] (the expression gave "bug")')]
    created = [(line["step"], line["path"]) for line in lines if line["decision"] == "create-job"]
    assert created == [
        ("triage", "triage"),
        ("route/reproduce", "route/reproduce"),
        ("route/fix", "route/fix"),
    ]


def test_switch_takes_its_default_when_no_case_matches(local_default: LocalDefault) -> None:
    def question(text: str) -> str:
        return text.replace("switch-triage", "switch-default").replace(
            "crash when saving", "how do I export?"
        )

    before = local_default.metrics()
    local_default.apply_example("switch-triage.yaml", edit=question)
    run = local_default.wait_for_end("switch-default")
    after = succeeded_metrics(local_default, before)
    assert delta(before, after, "agentrun_switch_cases_total", case="default") == 1
    assert run["status"]["phase"] == "Succeeded", run["status"]
    triage, route = run["status"]["workflow"]["steps"]
    assert triage["control"] == {"outputs": {"kind": "question"}}
    assert (route["phase"], route["case"]) == ("Succeeded", "default")
    assert [(c["name"], c["phase"]) for c in route["steps"]] == [("ask-human", "Succeeded")]
    root = local_default.claim_dir("switch-default-workspace")
    assert (root / "route.log").read_text().splitlines() == ["ask-human question"]


def test_nested_loop_refines_each_module_until_its_check_passes(local_default: LocalDefault) -> None:
    before = local_default.metrics()
    local_default.apply_example("nested-loop.yaml")
    run = local_default.wait_for_end("nested-loop")
    after = succeeded_metrics(local_default, before)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    plan, modules = run["status"]["workflow"]["steps"]
    assert plan["phase"] == "Succeeded"
    loop = modules["loop"]
    assert [item["name"] for item in loop["items"]] == ["lexer", "parser", "printer"]
    assert (loop["completedIterations"], loop["stopReason"]) == (3, "LoopMaxIterationsReached")
    assert [it["steps"] for it in loop["iterations"]] == [
        {"checkout": "Succeeded", "refine": "Succeeded"}
    ] * 3
    refine = modules["steps"][1]  # the last pass's: the printer needed 3 refinements
    assert (refine["loop"]["completedIterations"], refine["loop"]["stopReason"]) == (3, "LoopConditionFalse")
    root = local_default.claim_dir("nested-loop-workspace")
    for index, (module, rounds) in enumerate((("lexer", 1), ("parser", 2), ("printer", 3))):
        # checkout and every refinement got the body's item: the module
        lines = (root / "modules" / f"{module}.txt").read_text().splitlines()
        assert lines == [
            f"checked out {module} (module {index})",
            *(f"refinement {k}" for k in range(1, rounds + 1)),
        ]
    assert (root / "refine.log").read_text().splitlines() == [
        "lexer refinement 1: passed=true",
        "parser refinement 1: passed=false",
        "parser refinement 2: passed=true",
        "printer refinement 1: passed=false",
        "printer refinement 2: passed=false",
        "printer refinement 3: passed=true",
    ]
    # 1 plan + per module 1 checkout and 1, 2, 3 refinements: every Job its own (path-based names)
    assert len(set(created_jobs(local_default, "nested-loop"))) == 1 + 3 + 6
    created = [
        (line["path"], line["iteration"])
        for line in local_default.decision_lines("nested-loop")
        if line["decision"] == "create-job" and line["step"] == "modules/refine"
    ]
    assert created == [(f"modules/iteration {m}/refine", k) for m in (1, 2, 3) for k in range(1, m + 1)]
    # 3 inner loops stopped by their condition, 1 outer forEach by its count; the inner loops at depth 2
    assert delta(before, after, "agentrun_loop_stops_total", reason="LoopConditionFalse") == 3
    assert (
        delta(before, after, "agentrun_steps_total", construct="workload", loop="true", phase="Succeeded")
        == 3
    )
    assert value(after, "agentrun_nesting_depth_reached") >= 2


def test_graceful_cancel_of_a_running_body_keeps_its_partial_outputs(local_default: LocalDefault) -> None:
    local_default.apply_example("cancel-body.yaml")
    progress = local_default.claim_dir("cancel-body-workspace") / "progress.log"
    eventually(
        lambda: progress.exists() and "iteration 2 implement started" in progress.read_text(),
        what="iteration 2's implement to start",
        timeout=180,
    )
    local_default.patch_run("cancel-body", {"spec": {"cancel": "Graceful"}})
    run = local_default.wait_for_end("cancel-body")
    assert run["status"]["phase"] == "Cancelled", run["status"]
    develop = step_status(run)
    assert (develop["phase"], develop["loop"]["stopReason"]) == ("Cancelled", "LoopCancelled")
    completed = develop["loop"]["completedIterations"]
    assert completed >= 1
    # what the completed iterations collected stays in status
    assert run["status"]["workflow"]["outputs"] == {
        "changes": [f"change-{k}" for k in range(1, completed + 1)]
    }
    records = develop["loop"]["iterations"]
    both = {"implement": "Succeeded", "test": "Succeeded"}
    assert [(it["phase"], it["steps"]) for it in records[:completed]] == [("Succeeded", both)] * completed
    lines = progress.read_text().splitlines()
    full = [
        f"iteration {k} {c} {w}"
        for k in range(1, completed + 1)
        for c in ("implement", "test")
        for w in ("started", "finished")
    ]
    assert lines[: len(full)] == full
    partial = lines[len(full) :]
    # the cancel came while the next pass's implement ran: it finished, and test never started
    nxt = completed + 1
    assert partial == [f"iteration {nxt} implement started", f"iteration {nxt} implement finished"], lines
    assert records[-1]["index"] == nxt and records[-1]["phase"] == "Cancelled", records
    # the interrupted pass's children: implement recorded, test never started
    assert [(c["name"], c["phase"]) for c in develop["steps"]] == [
        ("implement", "Succeeded"),
        ("test", "Pending"),
    ]
    work = local_default.claim_dir("cancel-body-workspace") / "work"
    assert (work / f"implement-{nxt}.txt").read_text() == f"implement of change {nxt}\n"
    assert not (work / f"test-{nxt}.txt").exists()


def test_stalled_loop_stops_with_loop_stalled(local_default: LocalDefault) -> None:
    before = local_default.metrics()
    local_default.apply_example("stalled-loop.yaml")
    run = local_default.wait_for_end("stalled-loop")
    local_default.metrics_after(before, "agentrun_loop_stops_total", reason="LoopStalled")
    assert run["status"]["phase"] == "Failed" and run["status"]["reason"] == "LoopStalled", run["status"]
    step = step_status(run)
    assert step["reason"] == "LoopStalled" and step["loop"]["stopReason"] == "LoopStalled"
    assert step["loop"]["completedIterations"] == 3 and step["loop"]["progress"] == [2, 2, 2]
    assert "no progress in the last 3 iterations" in step["message"]
    lines = (local_default.claim_dir("stalled-loop-workspace") / "work.log").read_text().splitlines()
    assert lines == [
        "iteration 1 finished lexer",
        "iteration 2 could not finish flaky-docs",
        "iteration 3 could not finish flaky-docs",
    ]
    events = local_default.events("stalled-loop")
    assert any(e["reason"] == "LoopStalled" or "LoopStalled:" in e["message"] for e in events), events


def test_retry_feedback_tells_the_retry_why_the_attempt_before_failed(local_default: LocalDefault) -> None:
    local_default.apply_example("retry-feedback.yaml")
    run = local_default.wait_for_end("retry-feedback")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    step = step_status(run)
    assert step["attempt"] == 2 and step["lastFailure"]["reason"] == "Error"
    root = local_default.claim_dir("retry-feedback-workspace")
    assert json.loads((root / "previous-1.json").read_text()) == {"attempt": None, "iteration": None}
    told = json.loads((root / "previous-2.json").read_text())
    assert told["iteration"] is None
    attempt = told["attempt"]
    assert (attempt["attempt"], attempt["reason"], attempt["exitCode"]) == (1, "Error", 3), attempt
    assert attempt["message"].endswith("patch rejected: hunk 2 of parser.c does not apply"), attempt
    result = (root / "result.txt").read_text()
    assert result == "attempt 2: rebased first, because attempt 1's patch was rejected\n"


def _gate_waits(local_default: LocalDefault, name: str, iteration: int) -> dict[str, object]:
    def waiting() -> dict[str, object] | None:
        run = local_default.run(name)
        conditions = {c["type"]: c for c in run.get("status", {}).get("conditions", [])}
        cond = conditions.get("AwaitingApproval")
        label = f"step develop/iteration {iteration}/sign-off: awaiting approval"
        return run if cond and cond["status"] == "True" and label in cond["message"] else None

    return eventually(waiting, timeout=120, what=f"the sign-off gate to wait in iteration {iteration}")


def test_approval_loop_is_decided_from_the_cli(local_default: LocalDefault) -> None:
    before = local_default.metrics()
    local_default.apply_example("approval-loop.yaml")
    _gate_waits(local_default, "approval-loop", 1)
    status = local_default.cli("status", "approval-loop")
    assert "Approval:" in status.stdout and "Review change.log" in status.stdout, status.stdout
    # bad input is refused by the CLI, naming the flag, and nothing is written
    refused = local_default.cli("reject", "approval-loop", "--step", "develop/sign-off")
    assert refused.returncode == 4 and "--reason" in refused.stderr, refused.stderr
    refused = local_default.cli(
        "approve", "approval-loop", "--step", "develop/sign-off", "--input", "colour=red"
    )
    assert refused.returncode == 4 and "input 'colour' is not declared" in refused.stderr, refused.stderr
    refused = local_default.cli("approve", "approval-loop", "--step", "develop/implement")
    assert refused.returncode == 4 and "not an approval gate" in refused.stderr, refused.stderr
    assert "approvals" not in local_default.run("approval-loop")["spec"]
    approved = local_default.cli(
        "approve",
        "approval-loop",
        "--step",
        "develop/sign-off",
        "--input",
        "verdict=revise",
        "--input",
        "note=add tests",
    )
    assert approved.returncode == 0, approved.stderr
    assert "recorded as spec.approvals[0]" in approved.stdout
    _gate_waits(local_default, "approval-loop", 2)
    # The approve command that status (and the condition, and the Event) suggests is one the gate
    # accepts: its required input is a flag, VALUE to fill in.
    status = local_default.cli("status", "approval-loop")
    suggested = re.search(r"approve with `agentrun (approve [^`]*)`", status.stdout)
    assert suggested is not None, status.stdout
    assert "--input verdict=VALUE" in suggested.group(1), suggested.group(1)
    assert "(required: verdict: revise (another iteration) or final)" in status.stdout, status.stdout
    command = shlex.split(suggested.group(1).replace("verdict=VALUE", "verdict=final"))
    final = local_default.cli(*command)
    assert final.returncode == 0, final.stderr
    run = local_default.wait_for_end("approval-loop")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    develop = step_status(run)
    assert develop["loop"]["stopReason"] == "LoopConditionFalse"
    assert develop["loop"]["completedIterations"] == 2
    assert develop["loop"]["lastControl"] == {
        "decision": "Approved",
        "outputs": {"note": "", "verdict": "final"},
    }
    assert run["status"]["workflow"]["approvalsJudged"] == 2
    conditions = {c["type"]: c for c in run["status"]["conditions"]}
    assert conditions["AwaitingApproval"]["status"] == "False"
    lines = (local_default.claim_dir("approval-loop-workspace") / "change.log").read_text().splitlines()
    assert lines == ["iteration 1: first draft", "iteration 2: revised: add tests"]
    after = local_default.metrics_after(before, "agentrun_approval_waits_total")
    assert delta(before, after, "agentrun_approval_waits_total") == 2
    finished = local_default.cli(
        "approve", "approval-loop", "--step", "develop/sign-off", "--input", "verdict=x"
    )
    assert finished.returncode == 4 and "already finished" in finished.stderr


def test_checkpoint_undo_gives_the_retry_its_iterations_start(local_default: LocalDefault) -> None:
    local_default.apply_example("checkpoint-undo.yaml")
    run = local_default.wait_for_end("checkpoint-undo")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    loop = step_status(run)["loop"]
    assert loop["stopReason"] == "LoopMaxIterationsReached" and loop["completedIterations"] == 3
    records = {r["index"]: r for r in iterations(run)}
    assert [(k, r["phase"], r["attempts"]) for k, r in records.items()] == [
        (1, "Succeeded", 1),
        (2, "Succeeded", 2),
        (3, "Succeeded", 1),
    ]
    assert [records[k]["checkpoint"]["id"] for k in (1, 2, 3)] == [
        f"checkpoint-undo_1_{k}" for k in (1, 2, 3)
    ]
    assert records[2]["checkpoint"]["restored"] == "checkpoint-undo_1_2"
    root = local_default.claim_dir("checkpoint-undo-workspace")
    assert (root / "draft.txt").read_text().splitlines() == ["section 1", "section 2", "section 3"]
    assert (root / "outline.txt").exists() and not (root / "scratch.txt").exists()
    # logs/ is excluded: every attempt's line survived the restore, and both attempts of iteration 2
    # saw the same draft
    assert (root / "logs" / "attempts.log").read_text().splitlines() == [
        "iteration 1 attempt 1 saw: ",
        "iteration 2 attempt 1 saw: section 1 ",
        "iteration 2 attempt 2 saw: section 1 ",
        "iteration 3 attempt 1 saw: section 1 section 2 ",
    ]
    listed = local_default.cli("checkpoints", "checkpoint-undo")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("write", str(k), f"checkpoint-undo_1_{k}") for k in (1, 2, 3)
    ]


def test_best_of_n_keeps_each_iterations_highest_score(local_default: LocalDefault) -> None:
    local_default.apply_example("best-of-n.yaml")
    run = local_default.wait_for_end("best-of-n")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    step = step_status(run)
    assert step["loop"]["stopReason"] == "LoopMaxIterationsReached"
    assert [r["candidates"]["winner"] for r in iterations(run)] == [2, 0, 1]
    assert all(r["candidates"]["promoted"] for r in iterations(run))
    assert step["usage"]["inputTokens"] == 900
    root = local_default.claim_dir("best-of-n-workspace")
    assert (root / "answer.txt").read_text().splitlines() == [
        "iteration 1 by candidate 2",
        "iteration 2 by candidate 0",
        "iteration 3 by candidate 1",
    ]
    copies = root / ".agentrun" / "candidates"
    assert not copies.exists() or not any(copies.iterdir())
    logs = local_default.cli("logs", "best-of-n", "--step", "draft", "--iteration", "1")
    assert logs.returncode == 0, logs.stderr
    assert [f"candidate {i} · pod" in logs.stdout for i in range(3)] == [True, True, True], logs.stdout
    assert '"promoted":"best-of-n_1_1c2"' in logs.stdout  # the promotion pod's own line


def test_warm_loop_runs_every_iteration_in_one_pod(local_default: LocalDefault) -> None:
    local_default.apply_example("warm-loop.yaml")
    run = local_default.wait_for_end("warm-loop")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    step = step_status(run)
    assert step["loop"]["stopReason"] == "LoopConditionFalse"
    records = iterations(run)
    assert [r.get("warm", False) for r in records] == [False, True, True, True, True]
    (pod,) = {r["pod"] for r in records}
    assert len({r["jobRef"]["name"] for r in records}) == 1
    root = local_default.claim_dir("warm-loop-workspace")
    assert (root / "build.log").read_text().splitlines() == [
        f"iteration {k} in {pod}, its run {k}" for k in range(1, 6)
    ]
    # No Event per hand-over (docs/operator.md#events): the 4 hand-overs are one held series, a part
    # of the run's final Event when the run ends within its first minute, else posted once with its
    # count (a loaded machine may take longer).
    end = eventually(
        lambda: next((e for e in local_default.events("warm-loop") if e["reason"] == "RunSucceeded"), None),
        what="the run's final Event",
    )
    events = local_default.events("warm-loop")
    reasons = sorted(e["reason"] for e in events)
    if reasons == ["LoopStarted", "RunSucceeded"]:
        assert "; IterationStarted (x4 over " in end["message"], end["message"]
    else:
        assert reasons == ["IterationStarted", "LoopStarted", "RunSucceeded"], events
        series = next(e for e in events if e["reason"] == "IterationStarted")
        assert series["count"] == 4 and "iteration 5/10 attempt 1/1 started" in series["message"], series
