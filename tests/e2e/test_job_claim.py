"""The Job claim on real pods and real volumes (docs/concepts.md#exactly-once): taken on the run's PVC
even when the control path lies on no volume, on a volume provisioned root-owned 0755 and given to
the pod's fsGroup; and where it cannot be taken, said on the run (condition and Warning Event).

Only the `local_default` fixture's public methods are used, so the same tests run on any node that
fixture drives."""

from __future__ import annotations

import json
import os
import stat
from typing import Any

import yaml

from agentrun_operator.jobs.reporter_container import GATE_REFUSAL
from tests.e2e.conftest import LocalDefault, step_status
from tests.support.polling import eventually

FS_GROUP = 10001  # AGENTS_CONTROLLER_POD_FS_GROUP's default

OFF_VOLUME_LOOP = """\
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}-work
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
---
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
        set -eu
        {script}
    volumes:
      - name: work
        type: pvc
        claimName: {name}-work
        mountPath: /w
        readOnly: {read_only}
  workflow:
    steps:
      - name: loop
        loop:
          maxIterations: {iterations}
"""


def off_volume_loop(name: str, script: str, iterations: int = 3, read_only: bool = False) -> str:
    """A loop without condition whose control path (the default, /workspace/.agentrun/…) lies on no
    volume; its PVC is mounted at /w."""
    return OFF_VOLUME_LOOP.format(
        name=name, script=script, iterations=iterations, read_only="true" if read_only else "false"
    )


def test_a_loop_whose_control_path_lies_on_no_volume_claims_each_iteration_on_its_pvc(
    local_default: LocalDefault,
) -> None:
    local_default.apply(off_volume_loop("claim-off-volume", 'echo "run $AGENTRUN_ITERATION" >> /w/runs.log'))
    run = local_default.wait_for_end("claim-off-volume")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert step_status(run)["loop"]["completedIterations"] == 3
    root = local_default.claim_dir("claim-off-volume-work")
    assert (root / "runs.log").read_text().splitlines() == ["run 1", "run 2", "run 3"]
    # one Job claim per iteration on the PVC, each naming the pod that ran it
    claims = sorted((root / ".agentrun-claims").iterdir())
    assert len(claims) == 3 and all(len(c.read_text()) == 36 for c in claims), claims
    assert not any(c.type == "JobClaimUnavailable" for c in conditions(run))


def test_the_provisioned_volume_is_root_s_0755_and_the_pod_s_fs_group_opens_it(
    local_default: LocalDefault,
) -> None:
    """As a typical provisioner makes it, and as the kubelet gives it to a pod's fsGroup (group,
    g+rwx, setgid): the claim's helper (uid 10001, not root) writes there through the group."""
    local_default.apply(off_volume_loop("claim-owner", "id > /w/id-$AGENTRUN_ITERATION.txt", iterations=1))
    run = local_default.wait_for_end("claim-owner")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    root = local_default.claim_dir("claim-owner-work")
    info = os.stat(root)
    if os.geteuid() == 0:  # a provisioner that is not root cannot give the directory to root
        assert info.st_uid == 0
    assert info.st_gid == FS_GROUP
    assert stat.S_IMODE(info.st_mode) == 0o2775  # 0755 as provisioned, then g+rwx and setgid
    claims = root / ".agentrun-claims"
    assert claims.stat().st_gid == FS_GROUP and len(list(claims.iterdir())) == 1
    assert (root / "id-1.txt").stat().st_gid == FS_GROUP  # what main writes joins the group


def test_a_claim_that_cannot_be_taken_shows_on_the_run(local_default: LocalDefault) -> None:
    """Every PVC mounted read-only: no claim is possible, the run goes on and says so where users
    look -- a condition and a Warning Event naming the volume -- not only in a container log."""
    local_default.apply(off_volume_loop("claim-ro", "ls -a /w > /dev/null", iterations=2, read_only=True))
    run = local_default.wait_for_end("claim-ro")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    condition = next(c for c in conditions(run) if c.type == "JobClaimUnavailable")
    assert (condition.status, condition.reason) == ("True", "ClaimNotTaken")
    assert 'volume "work" (/w/.agentrun-claims)' in condition.message, condition.message
    assert "Read-only file system" in condition.message, condition.message
    events = local_default.events("claim-ro")  # aggregated: a reason may be one part of a message
    said = [
        e for e in events if e["reason"] == "JobClaimUnavailable" or "JobClaimUnavailable: " in e["message"]
    ]
    assert said and all(e["type"] == "Warning" for e in said), events
    assert any('volume "work"' in e["message"] for e in said), said
    assert not (local_default.claim_dir("claim-ro-work") / ".agentrun-claims").exists()


class _Condition:
    def __init__(self, raw: dict[str, str]) -> None:
        self.type = raw.get("type", "")
        self.status = raw.get("status", "")
        self.reason = raw.get("reason", "")
        self.message = raw.get("message", "")


def conditions(run: dict[str, object]) -> list[_Condition]:
    status = run.get("status") or {}
    assert isinstance(status, dict)
    return [_Condition(c) for c in status.get("conditions") or []]


def test_a_duplicate_pod_of_a_job_never_runs_main_it_waits_at_its_gate(local_default: LocalDefault) -> None:
    """A second pod of one Job (what the Job controller may create, Kubernetes' at-least-once Job
    semantics): made here from the Job's own pod template, naming the same Job uid, while the Job's
    pod runs. Its reporter finds the Job claimed by the other pod, its postStart hook fails with
    main's gate shut, and the kubelet will not mount the gate: main waits with
    `CreateContainerConfigError` and never runs (docs/design.md#reporter-first); the run is not
    disturbed."""

    script = 'touch "/w/ran-${MARK:-job}"; sleep 8'
    local_default.apply(off_volume_loop("claim-dup", script, iterations=1))
    jobs: list[dict[str, Any]] = []

    def job_pod_running() -> bool:
        found = json.loads(
            local_default.plane.kubectl(
                "get",
                "jobs",
                "-n",
                local_default.namespace,
                "-l",
                "agents.proompteng.ai/agent-run=claim-dup",
                "-o",
                "json",
            )
        )["items"]
        jobs[:] = found
        root = local_default.claim_dir("claim-dup-work")
        return bool(found) and (root / "ran-job").exists()

    eventually(job_pod_running, timeout=120, what="the Job's pod to run main")
    job = jobs[0]
    template = job["spec"]["template"]
    spec = template["spec"]
    for container in spec["containers"]:
        for env in container.get("env") or []:
            if env["name"] == "AGENTRUN_JOB_UID":  # the Job's uid, as the Job controller's label gives it
                env.pop("valueFrom")
                env["value"] = job["metadata"]["uid"]
        if container["name"] == "main":
            container["env"] = [*(container.get("env") or []), {"name": "MARK", "value": "dup"}]
    duplicate = {
        "apiVersion": "v1",
        "kind": "Pod",
        # not the Job's labels: the Job controller would adopt it and delete it as excess
        "metadata": {"name": "claim-dup-duplicate", "namespace": local_default.namespace},
        "spec": spec,
    }
    local_default.apply(yaml.safe_dump(duplicate))

    def held() -> dict[str, Any] | None:
        code, body = local_default.plane.api_get(
            f"/api/v1/namespaces/{local_default.namespace}/pods/claim-dup-duplicate"
        )
        assert code == 200, body[:300]
        statuses = {cs["name"]: cs for cs in json.loads(body)["status"].get("containerStatuses") or []}
        main = (statuses.get("main") or {}).get("state") or {}
        reporter = (statuses.get("reporter") or {}).get("state") or {}
        waiting = main.get("waiting") or {}
        if waiting.get("reason") == "CreateContainerConfigError" and "terminated" in reporter:
            return waiting
        return None

    waiting = eventually(held, timeout=120, what="the duplicate's main to wait at its gate")
    assert str(waiting.get("message", "")).startswith(GATE_REFUSAL), waiting
    run = local_default.wait_for_end("claim-dup")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert held() is not None  # still held once the run has ended
    root = local_default.claim_dir("claim-dup-work")
    assert (root / "ran-job").exists() and not (root / "ran-dup").exists()
    claims = list((root / ".agentrun-claims").iterdir())
    assert len(claims) == 1, claims  # the Job's one claim, held by the Job's own pod
    local_default.plane.kubectl(
        "delete", "pod", "claim-dup-duplicate", "-n", local_default.namespace, "--wait=false"
    )
