"""Operating runs against the real control plane: conditions that `kubectl wait` reads, the claims a
run mounts (missing: InvalidSpec before any Job; unbound: the run waits and says so), and the
`agentrun status | watch | cancel` commands with their errors."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_operator import naming
from tests.integration.kubelet_driver import KubeletDriver, PodOutcome
from tests.support import api
from tests.support.api import ready_namespace
from tests.support.claims import bound_claim
from tests.support.manifests import workflow_run
from tests.support.polling import eventually
from tests.support.processes import OperatorProcess

NAMESPACE = "operate"
TERMINAL = ("Succeeded", "Failed", "Cancelled")
REFERENCE_GRACE_SECONDS = 6


@dataclass
class Env:
    plane: ControlPlane
    operator: OperatorProcess
    hang: set[str]

    def create(self, manifest: dict[str, Any]) -> None:
        manifest["metadata"]["namespace"] = NAMESPACE
        self.plane.kubectl("create", "-f", "-", input_text=json.dumps(manifest))

    def get(self, name: str) -> dict[str, Any]:
        return api.agentrun(self.plane, NAMESPACE, name)

    def jobs(self, run: str) -> list[dict[str, Any]]:
        return api.jobs_of_run(self.plane, NAMESPACE, run)

    def wait_finished(self, name: str, timeout: float = 90) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        def done() -> bool:
            seen.clear()
            seen.update(self.get(name))
            return (seen.get("status") or {}).get("phase") in TERMINAL

        try:
            eventually(done, timeout, f"agentrun {name} to finish")
        except AssertionError:
            print(json.dumps(seen.get("status"), indent=1))
            print(self.operator.logs()[-4000:])
            raise
        return seen

    def cli(self, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        """`agentrun ARGS` as a user runs it (its own process, stdout not a terminal)."""
        return subprocess.run(
            [sys.executable, "-m", "agentrun_operator.cli", *args],
            env={
                "KUBECONFIG": str(kubeconfig or self.plane.kubeconfig),
                "PATH": "/usr/bin:/bin",
                "HOME": "/nonexistent",
            },
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    plane = control_plane
    ready_namespace(plane, NAMESPACE)
    bound_claim(plane, NAMESPACE, "ws")
    hang: set[str] = set()

    def outcome(pod: dict[str, Any]) -> PodOutcome:
        labels = pod["metadata"].get("labels") or {}
        if labels.get(naming.LABEL_RUN) in hang:
            return PodOutcome(run_seconds=3.0)
        return PodOutcome()

    driver = KubeletDriver(plane, NAMESPACE, outcome).start()
    operator = OperatorProcess(
        plane,
        tmp_path_factory.mktemp("operate-operator"),
        env={
            "AGENTS_CONTROLLER_NAMESPACES": NAMESPACE,
            # A short reference grace: the missing claim fails sooner (the 30 s default is the planner's
            # unit test); long enough that the run is seen waiting first.
            "AGENTS_CONTROLLER_REFERENCE_GRACE_SECONDS": str(REFERENCE_GRACE_SECONDS),
        },
    ).start()
    try:
        yield Env(plane, operator, hang)
    finally:
        plane.kubectl("delete", "agentruns", "--all", "-n", NAMESPACE, "--wait=false", check=False)
        operator.stop()
        driver.stop()


def condition(run: dict[str, Any], type_: str) -> dict[str, Any]:
    found = [c for c in (run.get("status") or {}).get("conditions") or [] if c["type"] == type_]
    assert len(found) == 1, (type_, run.get("status"))
    return dict(found[0])


# ----------------------------------------------------------------------------------- conditions


def test_kubectl_wait_for_condition_succeeded(env: Env) -> None:
    env.create(workflow_run("wait-me", {"loop": {"maxIterations": 2}}))
    proc = env.plane.kubectl(
        "wait", "--for=condition=Succeeded", "ar/wait-me", "-n", NAMESPACE, "--timeout=120s", check=False
    )
    assert "condition met" in proc, proc
    run = env.get("wait-me")
    assert run["status"]["phase"] == "Succeeded"
    generation = run["metadata"]["generation"]
    for type_, status in (
        ("Ready", "True"),
        ("Succeeded", "True"),
        ("Reconciling", "False"),
        ("Stalled", "False"),
    ):
        cond = condition(run, type_)
        assert cond["status"] == status, cond
        assert cond["reason"] == "Completed"
        assert cond["observedGeneration"] == generation
        assert cond["lastTransitionTime"]
    assert run["status"]["observedGeneration"] == generation


# ----------------------------------------------------------------------------------- claims


def test_a_missing_claim_fails_invalid_spec_naming_it_before_any_job(env: Env) -> None:
    manifest = workflow_run("no-claim", {"loop": {"maxIterations": 2}})
    manifest["spec"]["workload"]["volumes"][0]["claimName"] = "never-created"
    env.create(manifest)
    # First it waits (people apply a directory in any order), then it fails.

    def waiting_run() -> dict[str, Any] | None:
        run = env.get("no-claim")
        return run if (run.get("status") or {}).get("reason") == "WaitingForReferences" else None

    waiting: dict[str, Any] = eventually(waiting_run, 30, "the run to wait for its claim")
    assert condition(waiting, "Ready")["reason"] == "WaitingForReferences"
    assert (
        f"InvalidSpec if still missing {REFERENCE_GRACE_SECONDS}s after creation"
        in waiting["status"]["message"]
    )
    run = env.wait_finished("no-claim", timeout=120)
    status = run["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec")
    assert "PersistentVolumeClaim 'never-created' does not exist" in status["message"]
    assert "spec.workload.volumes[0].claimName" in status["message"]
    assert condition(run, "InvalidSpec")["status"] == "True"
    assert condition(run, "Stalled")["status"] == "True"
    assert env.jobs("no-claim") == []
    assert "startedAt" not in status


def test_an_unbound_claim_waits_with_a_condition_then_the_run_starts(env: Env) -> None:
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "unbound", "namespace": NAMESPACE},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": "static-operate-unbound",  # no such volume yet: the binder waits
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    env.plane.kubectl("apply", "-f", "-", input_text=json.dumps(claim))
    manifest = workflow_run("waits-for-binding", {"loop": {"maxIterations": 1}})
    manifest["spec"]["workload"]["volumes"][0]["claimName"] = "unbound"
    env.create(manifest)

    def waiting() -> bool:
        status = env.get("waits-for-binding").get("status") or {}
        return status.get("reason") == "PersistentVolumeClaimPending"

    eventually(waiting, 30, "the run to wait for its claim")
    run = env.get("waits-for-binding")
    assert run["status"]["phase"] == "Pending"
    assert "PersistentVolumeClaim unbound (phase Pending) to be bound" in run["status"]["message"]
    ready = condition(run, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PersistentVolumeClaimPending")
    assert condition(run, "Reconciling")["status"] == "True"
    assert env.jobs("waits-for-binding") == []
    # It keeps waiting past the grace period of missing references: the claim exists.
    # Now give the claim its volume; the binder binds them and the run starts and finishes.
    bound_claim(env.plane, NAMESPACE, "unbound")
    run = env.wait_finished("waits-for-binding", timeout=90)
    assert run["status"]["phase"] == "Succeeded", run["status"]


# ----------------------------------------------------------------------------------- the CLI


def test_status_prints_the_table_and_objects(env: Env) -> None:
    env.wait_finished("wait-me")
    table = env.cli("status", "wait-me", "-n", NAMESPACE)
    assert table.returncode == 0, table.stderr
    assert "Phase:       Succeeded (Completed)" in table.stdout
    assert "implement  Succeeded  2/2" in table.stdout
    assert "\x1b" not in table.stdout  # not a terminal: no control codes
    as_json = env.cli("status", "wait-me", "-n", NAMESPACE, "-o", "json")
    assert json.loads(as_json.stdout)["metadata"]["name"] == "wait-me"
    as_yaml = env.cli("status", "wait-me", "-n", NAMESPACE, "-o", "yaml")
    assert yaml.safe_load(as_yaml.stdout)["status"]["phase"] == "Succeeded"


def test_the_context_namespace_is_the_default(env: Env, tmp_path: Path) -> None:
    doc = yaml.safe_load(env.plane.kubeconfig.read_text())
    doc["contexts"][0]["context"]["namespace"] = NAMESPACE
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump(doc))
    proc = env.cli("status", "wait-me", kubeconfig=config)
    assert proc.returncode == 0, proc.stderr
    assert f"(namespace {NAMESPACE})" in proc.stdout
    other = env.cli("status", "wait-me", "--context", "nope", kubeconfig=config)
    assert other.returncode == 4 and "context 'nope' is not in kubeconfig" in other.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("status", "nobody", "-n", NAMESPACE), 'AgentRun "nobody" not found in namespace "operate"'),
        (
            ("status", "wait-me", "-n", "default"),
            f'AgentRun "wait-me" not found in namespace "default"; it exists in namespace {NAMESPACE} '
            f"(use -n {NAMESPACE})",
        ),
        (("watch", "nobody", "-n", NAMESPACE), 'AgentRun "nobody" not found'),
        (("cancel", "nobody", "-n", NAMESPACE, "--graceful"), 'AgentRun "nobody" not found'),
    ],
)
def test_not_found_is_one_line(env: Env, args: tuple[str, ...], expected: str) -> None:
    env.wait_finished("wait-me")
    proc = env.cli(*args)
    assert proc.returncode == 4
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert expected in proc.stderr


def test_forbidden_is_one_line(env: Env, tmp_path: Path) -> None:
    env.plane.kubectl("create", "serviceaccount", "nobody", "-n", NAMESPACE, check=False)
    token = env.plane.kubectl("create", "token", "nobody", "-n", NAMESPACE).strip()
    doc = yaml.safe_load(env.plane.kubeconfig.read_text())
    doc["users"] = [{"name": "nobody", "user": {"token": token}}]
    doc["contexts"][0]["context"]["user"] = "nobody"
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump(doc))
    proc = env.cli("status", "wait-me", "-n", NAMESPACE, kubeconfig=config)
    assert proc.returncode == 4
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("agentrun status: forbidden: ")
    assert "system:serviceaccount:operate:nobody" in proc.stderr


def test_cancel_of_a_finished_run_changes_nothing(env: Env) -> None:
    before = env.wait_finished("wait-me")
    proc = env.cli("cancel", "wait-me", "-n", NAMESPACE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "AgentRun wait-me already finished (Succeeded); nothing changed\n"
    after = env.get("wait-me")
    assert "cancel" not in after["spec"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]


def test_watch_of_a_finished_run_exits_with_its_phase(env: Env) -> None:
    env.wait_finished("wait-me")
    env.wait_finished("no-claim", timeout=120)
    ok = env.cli("watch", "wait-me", "-n", NAMESPACE)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[-1].split(" ", 1)[1].startswith("run Succeeded (Completed)")
    failed = env.cli("watch", "no-claim", "-n", NAMESPACE)
    assert failed.returncode == 1, failed.stderr


def test_cancel_then_watch_exits_2(env: Env) -> None:
    env.hang.add("cancel-me")
    env.create(workflow_run("cancel-me", {"loop": {"maxIterations": 20}}))
    eventually(lambda: bool(env.jobs("cancel-me")), 60, "the first Job")
    proc = env.cli("cancel", "cancel-me", "-n", NAMESPACE, "--graceful")
    assert proc.returncode == 0, proc.stderr
    assert "cancel requested (Graceful)" in proc.stdout
    assert env.get("cancel-me")["spec"]["cancel"] == "Graceful"
    again = env.cli("cancel", "cancel-me", "-n", NAMESPACE, "--graceful")
    assert "already" in again.stdout
    watched = env.cli("watch", "cancel-me", "-n", NAMESPACE, "--timeout", "120")
    assert watched.returncode == 2, watched.stdout + watched.stderr
    assert "run Cancelled (Cancelled)" in watched.stdout


def test_watch_times_out_with_exit_3(env: Env) -> None:
    env.hang.add("slow")
    env.create(workflow_run("slow", {"loop": {"maxIterations": 20}}))
    proc = env.cli("watch", "slow", "-n", NAMESPACE, "--timeout", "2")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "gave up after" in proc.stderr and "(--timeout 2)" in proc.stderr
    env.plane.kubectl(
        "patch", "ar/slow", "-n", NAMESPACE, "--type", "merge", "-p", '{"spec":{"cancel":"Immediate"}}'
    )


def test_kubectl_finds_the_plugin(env: Env) -> None:
    """`kubectl agentrun …` runs the `kubectl-agentrun` the package installs (found on PATH)."""
    env.wait_finished("wait-me")
    plugin_dir = Path(sys.executable).parent
    assert (plugin_dir / "kubectl-agentrun").exists()
    proc = subprocess.run(
        [str(env.plane.bin_dir / "kubectl"), "agentrun", "status", "wait-me", "-n", NAMESPACE],
        env={
            "KUBECONFIG": str(env.plane.kubeconfig),
            "PATH": f"{plugin_dir}:/usr/bin:/bin",
            "HOME": "/nonexistent",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Phase:       Succeeded (Completed)" in proc.stdout
