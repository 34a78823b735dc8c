"""`helm install` on the local default, as a user does it (docs/operations.md#install, #enable-loops,
#roll-back): the chart's Deployment gets a pod (the controller-manager runs the deployment and
replicaset controllers), the local pod runner runs the operator in it with in-cluster credentials of
the chart's ServiceAccount (a TokenRequest token, the CA, `KUBERNETES_SERVICE_HOST/PORT`) and the
image's entrypoint, and that operator runs the conditional example. Then the loop flag is rolled out:
`helm upgrade --set loops.enabled=false` rolls the Deployment, a new loop run fails
`InvalidSpec`/`WorkflowLoopsDisabled`, a run without loops still succeeds, a loop that was running
when the flag went off runs to its end; `helm rollback` brings loops back.

In process mode (this file) the operator pod runs the host's `agentrun` (the image is not pulled);
its own runner watches only the release's namespaces, so the e2e session's operator never meets it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_devcluster import processes
from agentrun_devcluster.controlplane import ControlPlane
from tests.e2e.conftest import EXAMPLES, TERMINAL, step_status
from tests.integration.helm import CHART, Helm
from tests.support import api
from tests.support.claims import bound_claim_dir, create_claim
from tests.support.manifests import workflow_run
from tests.support.node import NodeHost
from tests.support.polling import eventually
from tests.support.processes import RunnerProcess

RELEASE = "agentrun"
IMAGE = "ghcr.io/proompteng/agentrun-operator"
SELECTOR = "app.kubernetes.io/name=agentrun-operator"


@dataclass
class Release:
    plane: ControlPlane
    helm: Helm
    runner: RunnerProcess | NodeHost  # what runs the pods: the pod runner, or the real node
    # Each tier gets its own namespaces and node: the two releases never share a claim or a run.
    release_ns: str
    runs_ns: str
    node: str

    # -- helm ------------------------------------------------------------------------------------
    def helm_run(self, *args: str) -> str:
        return self.helm.run(*args, "--namespace", self.release_ns).stdout

    def revision(self) -> int:
        history = json.loads(self.helm_run("history", RELEASE, "--output", "json"))
        return max(int(entry["revision"]) for entry in history)

    # -- the operator's pods -----------------------------------------------------------------------
    def pods(self) -> list[dict[str, Any]]:
        return api.items(self.plane, "/api/v1", self.release_ns, "pods", SELECTOR)

    def running_pods(self, loops_enabled: str, count: int = 1) -> list[dict[str, Any]]:
        """The operator pods, `count` of them and no others, each Running, Ready, started, with the flag."""

        def serving(pod: dict[str, Any]) -> bool:
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
            conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
            return (
                env.get("AGENTS_CONTROLLER_WORKFLOW_LOOPS_ENABLED") == loops_enabled
                and pod["status"].get("phase") == "Running"
                and conditions.get("Ready") == "True"
                and "operator started" in self.operator_log(pod)
            )

        def ready() -> list[dict[str, Any]] | None:
            pods = self.pods()
            return pods if len(pods) == count and all(serving(p) for p in pods) else None

        try:
            pods: list[dict[str, Any]] = eventually(
                ready, timeout=180, what=f"{count} Running operator pod(s) with loops.enabled={loops_enabled}"
            )
        except AssertionError:
            raise AssertionError(self.diagnostics()) from None
        return pods

    def running_pod(self, loops_enabled: str) -> dict[str, Any]:
        return self.running_pods(loops_enabled)[0]

    def operator_log(self, pod: dict[str, Any]) -> str:
        return self.runner.container_log(self.release_ns, pod["metadata"]["name"], "operator")

    def diagnostics(self) -> str:
        pods = [(p["metadata"]["name"], p.get("status", {}).get("phase")) for p in self.pods()]
        deploy = self.plane.kubectl("get", "deploy,rs", "-n", self.release_ns, "-o", "wide", check=False)
        logs = "\n".join(f"{p['metadata']['name']}:\n{self.operator_log(p)[-2000:]}" for p in self.pods())
        return (
            f"pods: {pods}\n{deploy}\n--- operator ---\n{logs}\n--- runner ---\n{self.runner.logs()[-3000:]}"
        )

    # -- runs ------------------------------------------------------------------------------------
    def claim_dir(self, claim: str) -> Path:
        return bound_claim_dir(self.plane, self.runner.state_dir, self.runs_ns, claim)

    def apply_run(self, run: dict[str, Any]) -> None:
        """A run and the claims it mounts, as a user creates them."""
        for volume in run["spec"]["workload"]["volumes"]:
            create_claim(self.plane, self.runs_ns, volume["claimName"])
        self.apply(run)

    def apply(self, manifest: dict[str, Any] | str) -> None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        self.plane.kubectl("apply", "-n", self.runs_ns, "-f", "-", input_text=text)

    def run(self, name: str) -> dict[str, Any]:
        return api.agentrun(self.plane, self.runs_ns, name)

    def wait_for_end(self, name: str, timeout: float = 180.0) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            obj = self.run(name)
            return obj if (obj.get("status") or {}).get("phase") in TERMINAL else None

        try:
            result: dict[str, Any] = eventually(ended, timeout=timeout, what=f"AgentRun {name} to end")
        except AssertionError:
            status = json.dumps(self.run(name).get("status"), indent=1)
            raise AssertionError(f"{name} did not end: {status}\n{self.diagnostics()}") from None
        return result


@pytest.fixture(scope="module")
def release(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """The chart installed with loops on; the pod runner runs the host's `agentrun` in its pod (the
    node tier installs it again with the image on the real node, tests/node/conftest.py)."""
    plane = control_plane
    release_ns, runs_ns, node = "agentrun-helm", "helm-runs", "agentrun-helm"
    ensure_namespaces(plane, release_ns, runs_ns)
    runner = RunnerProcess(
        plane, tmp_path_factory.mktemp("helm-runner"), node=node, namespaces=(release_ns, runs_ns)
    ).start()
    helm = Helm(Path(plane.bin_dir) / "helm", tmp_path_factory.mktemp("helm-home"), plane.kubeconfig)
    # Pods share the host's network here: free ports for kopf's /healthz and the metrics, so nothing
    # else on the machine (another test's operator) collides with them.
    values = {
        "loops": {"enabled": True},
        "watchNamespaces": [runs_ns],
        "image": {"repository": IMAGE, "pullPolicy": "IfNotPresent"},
        "probes": {"port": processes.free_port()},
        "metrics": {"port": processes.free_port()},
        # No periodic resync to fall back on: kopf's watches alone must drive the runs.
        "resyncSeconds": 3600,
    }
    try:
        yield from installed(Release(plane, helm, runner, release_ns, runs_ns, node), values)
    finally:
        runner.stop()


def ensure_namespaces(plane: ControlPlane, *names: str) -> None:
    for ns in names:
        if not plane.kubectl("get", "ns", ns, "--ignore-not-found", "-o", "name").strip():
            plane.kubectl("create", "namespace", ns)


def installed(release: Release, values: dict[str, Any]) -> Iterator[Release]:
    """The chart installed with `values` for the release; its runs deleted and it uninstalled after."""
    values_file = release.helm.values_file(values)
    try:
        release.helm.run(
            "install",
            RELEASE,
            str(CHART),
            "--namespace",
            release.release_ns,
            "--values",
            str(values_file),
            "--wait=false",
        )
        yield release
    finally:
        release.plane.kubectl(
            "delete", "agentruns", "--all", "-n", release.runs_ns, "--wait=false", check=False
        )
        release.helm.run(
            "uninstall", RELEASE, "--namespace", release.release_ns, "--wait", "--timeout", "60s", check=False
        )


def test_install_runs_the_operator_as_a_pod_with_the_charts_credentials(release: Release) -> None:
    pod = release.running_pod("true")
    spec = pod["spec"]
    assert spec["serviceAccountName"] == f"{RELEASE}-agentrun-operator"  # the chart's, not `default`
    assert spec["nodeName"] == release.node
    container = spec["containers"][0]
    assert "command" not in container, "the chart relies on the image's entrypoint"
    # The ServiceAccount admission plugin added the projected token volume; the operator used it.
    mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in mounts
    log = release.operator_log(pod)
    started = next(json.loads(line) for line in log.splitlines() if "operator started" in line)
    assert started.get("loops_enabled") is True, started
    # kopf logs in at the address the pod's environment names (its watches and peering use their own
    # connection; the runs below, with no periodic resync, prove those watches work). A transient
    # 429 while a new API server's watch cache warms up is retried by kopf and is not a failure.
    eventually(
        lambda: "Initial authentication has finished" in release.operator_log(pod),
        timeout=120,
        what="kopf's login",
    )
    unreachable = [line for line in release.operator_log(pod).splitlines() if "ClientConnector" in line]
    assert not unreachable, unreachable[:3]
    deploy = json.loads(release.plane.kubectl("get", "deploy", "-n", release.release_ns, "-o", "json"))[
        "items"
    ][0]
    assert deploy["status"].get("availableReplicas") == 1, deploy["status"]


def test_the_installed_operator_runs_the_conditional_example(release: Release) -> None:
    release.running_pod("true")
    release.apply((EXAMPLES / "conditional-loop.yaml").read_text())
    run = release.wait_for_end("conditional-loop")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    loop = step_status(run)["loop"]
    assert (loop["stopReason"], loop["completedIterations"]) == ("LoopConditionFalse", 3)
    notes = release.claim_dir("conditional-loop-workspace") / "notes"
    assert len((notes / "progress.log").read_text().splitlines()) == 3


def _slow_loop(name: str, iterations: int, seconds: int) -> dict[str, Any]:
    step = {"loop": {"maxIterations": iterations}}
    run = workflow_run(name, step)
    run["spec"]["workload"]["command"] = [
        "sh",
        "-c",
        f"sleep {seconds}; echo $AGENTRUN_ITERATION >> /workspace/it",
    ]
    run["spec"]["workload"]["volumes"][0]["claimName"] = f"{name}-ws"
    return run


def _no_loop(name: str) -> dict[str, Any]:
    run = workflow_run(name, {})
    run["spec"]["workload"]["command"] = ["sh", "-c", "echo done > /workspace/out"]
    return run


def test_flag_rollout_and_rollback(release: Release) -> None:
    first = release.running_pod("true")
    installed_revision = release.revision()
    # A loop that is running when the flag goes off: it was admitted, so it runs to its end.
    release.apply_run(_slow_loop("admitted-loop", iterations=3, seconds=2))
    eventually(
        lambda: (release.run("admitted-loop").get("status") or {}).get("phase") == "Running",
        timeout=120,
        what="admitted-loop to run",
    )

    release.helm_run("upgrade", RELEASE, str(CHART), "--reuse-values", "--set", "loops.enabled=false")
    second = release.running_pod("false")
    assert second["metadata"]["name"] != first["metadata"]["name"], "the Deployment did not roll"
    assert release.revision() == installed_revision + 1

    release.apply_run(workflow_run("loop-after-off", {"loop": {"maxIterations": 2}}))
    refused = release.wait_for_end("loop-after-off")
    assert refused["status"]["phase"] == "Failed", refused["status"]
    assert refused["status"]["reason"] == "WorkflowLoopsDisabled", refused["status"]
    conditions = {c["type"]: c for c in refused["status"].get("conditions", [])}
    assert conditions["InvalidSpec"]["status"] == "True", conditions
    assert not release.plane.kubectl(
        "get",
        "jobs",
        "-n",
        release.runs_ns,
        "-l",
        "agents.proompteng.ai/agent-run=loop-after-off",
        "-o",
        "name",
    ).strip(), "a refused loop must start no Job"

    release.apply_run(_no_loop("plain-after-off"))
    plain = release.wait_for_end("plain-after-off")
    assert plain["status"]["phase"] == "Succeeded", plain["status"]

    admitted = release.wait_for_end("admitted-loop")
    assert admitted["status"]["phase"] == "Succeeded", admitted["status"]
    assert step_status(admitted)["loop"]["completedIterations"] == 3
    lines = (release.claim_dir("admitted-loop-ws") / "it").read_text().split()
    assert lines == ["1", "2", "3"], "each iteration exactly once across the rollout"

    release.helm_run("rollback", RELEASE, str(installed_revision))
    release.running_pod("true")
    release.apply_run(workflow_run("loop-after-rollback", {"loop": {"maxIterations": 2}}))
    back = release.wait_for_end("loop-after-rollback")
    assert back["status"]["phase"] == "Succeeded", back["status"]
    assert step_status(back)["loop"]["completedIterations"] == 2


def test_two_replicas_peer_and_the_standby_takes_over(release: Release) -> None:
    """replicas: 2 implies kopf peering; each pod serves its ports in its own network namespace, so the
    two replicas' /healthz and /metrics do not collide (docs/local-dev.md#network)."""
    release.helm_run("upgrade", RELEASE, str(CHART), "--reuse-values", "--set", "replicas=2")
    pods = release.running_pods("true", count=2)
    assert all("--peering" in p["spec"]["containers"][0]["args"] for p in pods)

    def serving(pod: dict[str, Any]) -> bool:
        """As kopf's peering last decided for the replica, by its own log (docs/operations.md#ha):
        it starts paused (peering is mandatory) and logs when kopf lets it serve or pauses it."""
        last = False
        for line in release.operator_log(pod).splitlines():
            if "serving: kopf's peering lets this replica serve" in line:
                last = True
            elif "standing by: a live peer has a priority as high" in line:
                last = False
        return last

    def roles() -> tuple[dict[str, Any], dict[str, Any]] | None:
        up = [p for p in pods if "operator started" in release.operator_log(p)]
        active = [p for p in up if serving(p)]
        paused = [p for p in up if not serving(p)]
        return (active[0], paused[0]) if len(paused) == 1 and len(active) == 1 else None

    try:
        active, standby = eventually(roles, timeout=120, what="one active and one paused replica")
    except AssertionError:
        raise AssertionError(release.diagnostics()) from None
    release.apply_run(workflow_run("ha-first", {"loop": {"maxIterations": 2}}))
    assert release.wait_for_end("ha-first")["status"]["phase"] == "Succeeded"

    release.plane.kubectl(
        "delete", "pod", active["metadata"]["name"], "-n", release.release_ns, "--wait=false"
    )
    eventually(
        lambda: serving(standby), timeout=120, what="the standby to serve when the active replica is gone"
    )
    release.apply_run(workflow_run("ha-second", {"loop": {"maxIterations": 2}}))
    second = release.wait_for_end("ha-second")
    assert second["status"]["phase"] == "Succeeded", second["status"]
    jobs = release.plane.kubectl("get", "jobs", "-n", release.runs_ns, "-o", "name").split()
    ha_jobs = [j for j in jobs if "/ha-" in j]
    assert len(ha_jobs) == len(set(ha_jobs)) == 4, ha_jobs


def test_values_of_the_wrong_type_are_refused_before_anything_changes(release: Release) -> None:
    before = release.revision()
    refused = release.helm.run(
        "upgrade",
        RELEASE,
        str(CHART),
        "--namespace",
        release.release_ns,
        "--reuse-values",
        "--set-json",
        'loops={"enabled": "yes"}',
        check=False,
    )
    assert refused.returncode != 0
    assert "loops" in refused.stderr and "enabled" in refused.stderr, refused.stderr
    assert release.revision() == before


def test_rendered_chart_names_the_image_entrypoint_nowhere(release: Release) -> None:
    """The Deployment gives `args` only: the image's ENTRYPOINT (`agentrun`) must supply the command,
    which is why the local pod runner knows the operator image's entrypoint."""
    rendered = release.helm.run("template", RELEASE, str(CHART)).stdout
    deploy = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container and container["args"][0] == "operator"
