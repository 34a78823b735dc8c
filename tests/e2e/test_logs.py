"""`agentrun logs` and `kubectl logs` on the local default, after the Job TTL (1 s here): a loop body
whose children succeed twice and fail in iteration 3 with the issue's own stderr. The failed attempt
keeps its pod (pod GC `OnPodSuccess`, the default) and its log is read through the API server, which
calls the pod runner's kubelet log endpoint; the succeeded attempts say they were collected; the
failed attempt's message carries its log's tail and the command; the body's iteration is a label."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrun_devcluster.controlplane import ControlPlane
from tests.e2e.conftest import LocalDefault, start_local_default
from tests.support.polling import eventually

NAMESPACE = "e2e-logs"
STDERR = "cannot create /workspace/.agentrun/missing/loop-control.json: Directory nonexistent"

MANIFEST = """\
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: logs-ws
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
---
apiVersion: agents.proompteng.ai/v1alpha1
kind: AgentRun
metadata:
  name: body-fails
spec:
  runtime:
    type: workflow
  workload:
    image: busybox:1.36
    command: [sh, -c]
    args:
      - |
        echo "iteration $AGENTRUN_ITERATION working"
        if [ "$AGENTRUN_ITERATION" = 3 ]; then
          echo '{}' > /workspace/.agentrun/missing/loop-control.json
          exit 2
        fi
    volumes:
      - name: workspace
        type: pvc
        claimName: logs-ws
        mountPath: /workspace
  workflow:
    steps:
      - name: dev
        loop:
          maxIterations: 3
        steps:
          - name: implement
          - name: review
"""


@pytest.fixture(scope="module")
def local_default(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalDefault]:
    """The local default with a Job TTL of 1 s: a succeeded attempt's pod is gone at once."""
    yield from start_local_default(
        control_plane,
        tmp_path_factory,
        namespace=NAMESPACE,
        node="agentrun-e2e-logs",
        operator_env={"AGENTS_CONTROLLER_JOB_TTL_SECONDS": "1"},
    )


def agentrun(env: LocalDefault, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentrun_operator.cli", *args, "-n", NAMESPACE],
        env={**os.environ, "KUBECONFIG": str(env.plane.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def kubectl(env: LocalDefault, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(Path(env.plane.bin_dir) / "kubectl"),
            f"--kubeconfig={env.plane.kubeconfig}",
            "-n",
            NAMESPACE,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_logs_of_a_failed_run_after_the_job_ttl(local_default: LocalDefault) -> None:
    local_default.apply(MANIFEST)
    run = local_default.wait_for_end("body-fails")
    assert run["status"]["phase"] == "Failed", run["status"]
    command = f"agentrun logs body-fails -n {NAMESPACE} --step dev/implement --iteration 3 --attempt 1"
    assert STDERR in run["status"]["message"] and command in run["status"]["message"], run["status"][
        "message"
    ]

    def collected() -> bool:
        jobs = kubectl(
            local_default, "get", "jobs", "-l", "agents.proompteng.ai/agent-run=body-fails", "-o", "name"
        )
        return jobs.stdout.split() == ["job.batch/body-fails-step-1i3-1-iter-1-attempt-1"]

    eventually(collected, timeout=120, what="the succeeded attempts' Jobs to be collected (TTL 1 s)")

    # The failed attempt's pod is found by the body's iteration, and kubectl reads its log.
    pods = kubectl(local_default, "get", "pods", "-l", "agents.proompteng.ai/iteration=3", "-o", "name")
    assert len(pods.stdout.split()) == 1, pods
    logs = kubectl(local_default, "logs", pods.stdout.split()[0])
    assert logs.returncode == 0 and STDERR in logs.stdout, logs

    latest = agentrun(local_default, "logs", "body-fails")
    assert latest.returncode == 0 and STDERR in latest.stdout, latest
    assert "iteration 3 working" in latest.stdout, latest

    every = agentrun(local_default, "logs", "body-fails", "--step", "dev")
    assert every.returncode == 1, every  # some pods are gone
    sections = every.stdout.split("==> ")[1:]
    assert len(sections) == 5, every.stdout  # implement and review twice, implement in iteration 3
    for section in sections[:4]:
        assert "Succeeded" in section.splitlines()[0] and "pod collected" in section, section
    assert "iteration 3" in sections[4].splitlines()[0] and STDERR in sections[4], sections[4]

    missing = agentrun(local_default, "logs", "body-fails", "--step", "dev/implement", "--iteration", "4")
    assert missing.returncode == 4 and missing.stderr.count("\n") == 1, missing
    assert "has no iteration 4" in missing.stderr, missing
    unknown = agentrun(local_default, "logs", "body-fails", "--step", "dev/nope")
    assert unknown.returncode == 4 and "--step: 'dev/nope' is not a step" in unknown.stderr, unknown
    absent = agentrun(local_default, "logs", "no-such-run")
    assert absent.returncode == 4 and 'AgentRun "no-such-run" not found' in absent.stderr, absent
