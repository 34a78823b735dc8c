"""Operating real runs on the local default: `kubectl wait`, `agentrun watch` and `agentrun cancel
--graceful` against the examples, and a claim that does not exist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.conftest import NAMESPACE, LocalDefault, step_status
from tests.support.polling import eventually


def renamed(text: str, old: str, new: str) -> str:
    """An example under another name (its run and its claim), so it never meets an earlier copy."""
    return text.replace(f"name: {old}\n", f"name: {new}\n").replace(f"{old}-workspace", f"{new}-workspace")


def cli(env: LocalDefault, *args: str) -> subprocess.Popen[str]:
    """`agentrun ARGS` in its own process, as a user runs it (stdout is a pipe, not a terminal)."""
    return subprocess.Popen(
        [sys.executable, "-m", "agentrun_operator.cli", *args, "-n", NAMESPACE],
        env={**os.environ, "KUBECONFIG": str(env.plane.kubeconfig)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_watch_and_kubectl_wait_follow_the_conditional_example(local_default: LocalDefault) -> None:
    name = "conditional-watch"
    local_default.apply_example("conditional-loop.yaml", lambda t: renamed(t, "conditional-loop", name))
    watch = cli(local_default, "watch", name, "--timeout", "240")
    wait = subprocess.Popen(
        [
            str(Path(local_default.plane.bin_dir) / "kubectl"),
            f"--kubeconfig={local_default.plane.kubeconfig}",
            "wait",
            "--for=condition=Succeeded",
            f"ar/{name}",
            "-n",
            NAMESPACE,
            "--timeout=240s",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = watch.communicate(timeout=300)
    waited, wait_err = wait.communicate(timeout=300)
    assert watch.returncode == 0, out + err
    assert wait.returncode == 0 and "condition met" in waited, waited + wait_err
    lines = out.splitlines()
    for index in (1, 2, 3):
        assert any(f"step implement iteration {index}/8: Succeeded" in line for line in lines), out
    assert not any("iteration 4/8" in line for line in lines), out
    assert '"continue":false' in next(line for line in lines if "iteration 3/8: Succeeded" in line)
    assert "run Succeeded (Completed)" in lines[-1]
    assert "\x1b" not in out  # a pipe, not a terminal: no control codes
    run = local_default.run(name)
    conditions = {c["type"]: c for c in run["status"]["conditions"]}
    assert conditions["Succeeded"]["status"] == "True"
    assert conditions["Ready"]["status"] == "True"
    status = cli(local_default, "status", name)
    table, _ = status.communicate(timeout=60)
    assert status.returncode == 0
    assert 'last control: {"continue":false,"outputs":{"iteration":3,"notes":3}}' in table


def test_cancel_graceful_ends_the_loop_after_its_current_iteration(local_default: LocalDefault) -> None:
    name = "cancel-graceful-cli"
    # its own name: tests/e2e/test_examples.py runs the example as it is in the same namespace
    local_default.apply_example("cancel-graceful.yaml", edit=lambda t: renamed(t, "cancel-graceful", name))
    root = local_default.claim_dir(f"{name}-workspace")

    def second_iteration_running() -> bool:
        log = root / "progress.log"
        return log.exists() and "iteration 2 started" in log.read_text()

    eventually(second_iteration_running, timeout=120, what="iteration 2 to run")
    cancel = cli(local_default, "cancel", name, "--graceful")
    said, err = cancel.communicate(timeout=60)
    assert cancel.returncode == 0, err
    assert said.startswith(f"AgentRun {name} cancel requested (Graceful)")
    watch = cli(local_default, "watch", name, "--timeout", "120")
    out, err = watch.communicate(timeout=180)
    assert watch.returncode == 2, out + err
    run = local_default.run(name)
    assert run["status"]["phase"] == "Cancelled"
    step = step_status(run)
    assert step["phase"] == "Cancelled" and step["loop"]["stopReason"] == "LoopCancelled"
    records = step["loop"]["iterations"]
    # the iteration that ran when the cancel came finished and was recorded; none started after it
    assert [r["phase"] for r in records] == ["Succeeded"] * len(records), records
    assert len(records) in (2, 3)  # the cancel came during iteration 2 (3 if it had just started)
    lines = (root / "progress.log").read_text().splitlines()
    started = [line for line in lines if line.endswith("started")]
    finished = [line for line in lines if line.endswith("finished")]
    assert len(started) == len(finished) == len(records), lines
    again = cli(local_default, "cancel", name)
    said, _ = again.communicate(timeout=60)
    assert said == f"AgentRun {name} already finished (Cancelled); nothing changed\n"
    assert local_default.run(name)["spec"]["cancel"] == "Graceful"


def test_a_run_whose_claim_does_not_exist_fails_before_any_job(local_default: LocalDefault) -> None:
    text = (Path(__file__).resolve().parents[2] / "examples" / "fixed-loop.yaml").read_text()
    run_doc = text[text.index("apiVersion: agents.proompteng.ai") :]  # without its claim
    local_default.apply(
        renamed(run_doc, "fixed-loop", "no-claim").replace("no-claim-workspace", "absent-claim")
    )
    run = local_default.wait_for_end("no-claim", timeout=120)
    status = run["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec"), status
    assert "PersistentVolumeClaim 'absent-claim' does not exist" in status["message"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["InvalidSpec"] == "True"
    jobs = local_default.plane.kubectl(
        "get", "jobs", "-n", NAMESPACE, "-l", "agents.proompteng.ai/agent-run=no-claim", "-o", "json"
    )
    assert json.loads(jobs)["items"] == []


def test_a_run_whose_command_cannot_start_fails_with_the_runtimes_message(
    local_default: LocalDefault,
) -> None:
    """A typo in `command`: the runtime cannot start `main` (`StartError`). On a node runc finds it
    inside the container's init process, which the reporter sees come and go in the pod's PID
    namespace, so it reports and the pod fails within seconds; the pod runner leaves the same trace
    (podrunner/process.py `_fail_inside`). No timeout is set: before, the pod runner's reporter
    waited for `main` forever, and so did the run."""
    local_default.apply(
        """
apiVersion: agents.proompteng.ai/v1alpha1
kind: AgentRun
metadata:
  name: typo
spec:
  runtime:
    type: workflow
  workload:
    image: busybox:1.36
    command: ["/bin/no-such-agent"]
  workflow:
    steps:
      - name: work
        loop:
          maxIterations: 3
"""
    )
    run = local_default.wait_for_end("typo")
    assert run["status"]["phase"] == "Failed", run["status"]
    message = step_status(run)["message"]
    assert "StartError" in message, message  # the runtime's reason for main, and its words:
    assert '"/bin/no-such-agent"' in message and "no such file or directory" in message, message
