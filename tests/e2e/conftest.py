"""The e2e tier: the real control plane, the operator as a process and the local pod runner as a
process, so every pod of every iteration runs real commands on real (bind-mounted) volumes.

The runner and the operator watch only the `e2e` namespace, so they never meet the integration
tests' fake kubelet (namespace `loops`). Claims are real PersistentVolumeClaims, bound by the
controller-manager to volumes the runner's local provisioner creates (directories under its state,
`<state>/pv/pvc-<claim uid>/`), which the tests read to check what the iterations left.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_devcluster.processes import free_port
from tests.support.claims import bound_claim_dir, create_claim
from tests.support.metrics import Samples, scrape, total, value
from tests.support.node import NodeHost
from tests.support.polling import eventually
from tests.support.processes import OperatorProcess, RunnerProcess

NAMESPACE = "e2e"
NODE = "agentrun-e2e"
EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
TERMINAL = ("Succeeded", "Failed", "Cancelled")


def runs_path(namespace: str) -> str:
    return f"/apis/agents.proompteng.ai/v1alpha1/namespaces/{namespace}/agentruns"


@dataclass
class LocalDefault:
    """What an e2e test works with."""

    plane: ControlPlane
    runner: RunnerProcess | NodeHost  # what runs the pods: the local pod runner, or the real node
    operator: OperatorProcess
    namespace: str = NAMESPACE
    metrics_port: int = 0  # the operator's --metrics-port
    ended: dict[str, str] = field(default_factory=dict)  # uid -> terminal phase, of runs waited for
    sleep_offset: int = 0
    """Added to the examples' marker sleeps (`sleep 7777`), which tests find among the host's
    processes: the pod runner's and the real node's tiers run at once on one host."""

    def own_sleep(self, seconds: str) -> str:
        """This fixture's version of an example's marker sleep, e.g. "7777" -> "7877"."""
        return str(int(seconds) + self.sleep_offset)

    def own_sleeps(self, text: str) -> str:
        """An example's text with its marker sleeps (`sleep 77xx`) made this fixture's own."""
        return re.sub(r"\bsleep (77\d\d)\b", lambda m: f"sleep {self.own_sleep(m.group(1))}", text)

    def metrics(self) -> Samples:
        """Everything the operator's `/metrics` serves right now."""
        return scrape(f"http://127.0.0.1:{self.metrics_port}/metrics")

    def metrics_after(self, before: Samples, name: str, **labels: str) -> Samples:
        """The metrics once the counter `name{labels}` moved past `before`.

        The operator counts a reconcile's facts right after posting its Events, so a run's final
        counts may lag its final status by a moment; they are counted together, in one go."""

        def moved() -> Samples | None:
            now = self.metrics()
            return now if value(now, name, **labels) > value(before, name, **labels) else None

        result: Samples = eventually(moved, timeout=30, what=f"{name}{labels} to move")
        return result

    def decision_lines(self, name: str) -> list[dict[str, Any]]:
        """The operator's JSON decision log lines about the run (docs/operator.md#logs)."""
        return self.operator.decision_lines(self.run(name)["metadata"]["uid"])

    @property
    def state_dir(self) -> Path:
        return self.runner.state_dir

    def claim_dir(self, claim: str) -> Path:
        """The directory of the volume bound to `claim` (waits for the binding)."""
        return bound_claim_dir(self.plane, self.state_dir, self.namespace, claim)

    def create_claim(self, claim: str, storage_class: str | None = None) -> None:
        """A 1Gi ReadWriteOnce claim, as a user creates one (the default StorageClass unless given)."""
        create_claim(self.plane, self.namespace, claim, storage_class)

    def apply(self, manifest: str) -> None:
        self.plane.kubectl("apply", "-n", self.namespace, "-f", "-", input_text=manifest)

    def apply_example(self, name: str, edit: Callable[[str], str] | None = None) -> str:
        text = (EXAMPLES / name).read_text()
        if edit is not None:
            text = edit(text)
        self.apply(text)
        return text

    def run(self, name: str) -> dict[str, Any]:
        code, body = self.plane.api_get(f"{runs_path(self.namespace)}/{name}")
        assert code == 200, (code, body[:300])
        result: dict[str, Any] = json.loads(body)
        return result

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`agentrun ARGS -n NAMESPACE` as a user runs it, against this cluster's API server."""
        return subprocess.run(
            [sys.executable, "-m", "agentrun_operator.cli", *args, "-n", self.namespace],
            env={**os.environ, "KUBECONFIG": str(self.plane.kubeconfig)},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def diagnosis(self) -> str:
        """What a failed test's report shows of the cluster (tests/conftest.py): every run's phase with
        its conditions' and steps' messages in full (an assertion's repr of a status is cut short),
        its recent Events, and the tails of the runner's and the operator's logs."""
        lines: list[str] = []
        code, body = self.plane.api_get(runs_path(self.namespace))
        items = json.loads(body).get("items", []) if code == 200 else []
        for run in items:
            status = run.get("status") or {}
            lines.append(f"AgentRun {run['metadata']['name']}: {status.get('phase')}")
            for condition in status.get("conditions") or []:
                lines.append(
                    f"  condition {condition.get('type')}={condition.get('status')}: "
                    f"{condition.get('reason')}: {condition.get('message')}"
                )
            for step in (status.get("workflow") or {}).get("steps") or []:
                lines.append(f"  step {step.get('name')}: {step.get('phase')}: {step.get('message')}")
                for record in ((step.get("loop") or {}).get("iterations") or [])[-3:]:
                    lines.append(f"    iteration {json.dumps(record, sort_keys=True)}")
            try:
                events = self.events(run["metadata"]["name"])[-8:]
            except Exception as exc:  # a diagnosis never hides the failure it describes
                lines.append(f"  (its Events could not be read: {exc})")
                events = []
            for event in events:
                lines.append(f"  event {event.get('type')} {event.get('reason')}: {event.get('message')}")
        return "\n".join(
            [
                *lines,
                f"--- runner log (tail) ---\n{self.runner.logs()[-4000:]}",
                f"--- operator log (tail) ---\n{self.operator.logs()[-4000:]}",
            ]
        )

    def wait_for_end(self, name: str, timeout: float = 240.0) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            obj = self.run(name)
            return obj if (obj.get("status") or {}).get("phase") in TERMINAL else None

        try:
            result: dict[str, Any] = eventually(
                ended, timeout=timeout, what=f"AgentRun {name} to end", every=0.2
            )
        except AssertionError:
            raise AssertionError(
                f"AgentRun {name} did not end: {json.dumps(self.run(name).get('status'), indent=1)}\n"
                f"--- runner log ---\n{self.runner.logs()[-3000:]}\n"
                f"--- operator log ---\n{self.operator.logs()[-3000:]}"
            ) from None
        self.ended[result["metadata"]["uid"]] = result["status"]["phase"]
        self._wait_until_ends_are_counted()
        return result

    def _wait_until_ends_are_counted(self) -> None:
        """Until the operator has counted the end of every run waited for so far.

        It counts a reconcile's facts after that reconcile's status write lands, so a run is seen
        ended a moment before its last iteration is counted; a later test's metrics baseline taken
        in that moment would see the count move under it (the operator lives for the whole tier)."""
        phases = list(self.ended.values())

        def counted() -> bool:
            now = self.metrics()
            name = "agentrun_run_phase_transitions_total"
            return all(total(now, name, phase=p) >= phases.count(p) for p in set(phases))

        eventually(counted, timeout=30, what="the operator to count the end of every run waited for")

    def events(self, name: str) -> list[dict[str, Any]]:
        """The Events posted on the run (aggregated: one may carry several `Reason: message` parts)."""
        uid = self.run(name)["metadata"]["uid"]
        selector = f"involvedObject.uid={uid}"
        out = self.plane.kubectl(
            "get", "events", "-n", self.namespace, "--field-selector", selector, "-o", "json"
        )
        result: list[dict[str, Any]] = json.loads(out)["items"]
        return result

    def patch_run(self, name: str, patch: dict[str, Any]) -> None:
        self.plane.kubectl(
            "patch", "agentrun", name, "-n", self.namespace, "--type", "merge", "-p", json.dumps(patch)
        )


def step_status(run: dict[str, Any], index: int = 0) -> dict[str, Any]:
    steps = ((run.get("status") or {}).get("workflow") or {}).get("steps") or []
    result: dict[str, Any] = steps[index]
    return result


@pytest.fixture(autouse=True)
def needs_bubblewrap() -> None:
    """The pod runner cannot mount volumes without bwrap (`make setup` installs it as root)."""
    from agentrun_devcluster.podrunner.sandbox import SandboxUnavailable, find_bwrap

    try:
        find_bwrap()
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))


def start_local_default(
    plane: ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
    namespace: str = NAMESPACE,
    node: str = NODE,
    operator_env: dict[str, str] | None = None,
    host: NodeHost | None = None,
    sleep_offset: int = 0,
    runner_env: dict[str, str] | None = None,
) -> Iterator[LocalDefault]:
    """A namespace, a pod runner (or `host`, the real node) and an operator watching only it; torn
    down at the end."""
    if not plane.kubectl("get", "ns", namespace, "--ignore-not-found", "-o", "name").strip():
        plane.kubectl("create", "namespace", namespace)
    eventually(
        lambda: plane.api_get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")[0] == 200,
        timeout=120,
        what=f"the {namespace} namespace's default ServiceAccount",
    )
    runner: RunnerProcess | NodeHost = (
        host
        or RunnerProcess(
            plane,
            tmp_path_factory.mktemp("runner-state"),
            node=node,
            namespaces=(namespace,),
            env=runner_env,
        ).start()
    )
    metrics_port = free_port()
    operator = OperatorProcess(
        plane,
        tmp_path_factory.mktemp(f"{namespace}-operator"),
        args=(f"--metrics-port={metrics_port}",),
        env={
            "AGENTS_CONTROLLER_NAMESPACES": namespace,
            "AGENTS_CONTROLLER_JOB_TTL_SECONDS": "600",
            # A run whose claim does not exist fails after 6 s, not the default 30 s (which the
            # planner's unit test proves); the examples create their claims before their runs.
            "AGENTS_CONTROLLER_REFERENCE_GRACE_SECONDS": "6",
            **(operator_env or {}),
        },
    )
    try:
        operator.start()
        yield LocalDefault(plane, runner, operator, namespace, metrics_port, sleep_offset=sleep_offset)
    finally:
        # Runs end here, so no later operator (the integration tier's is cluster-wide) picks them up.
        plane.kubectl("delete", "agentruns", "--all", "-n", namespace, "--wait=false", check=False)
        operator.stop()
        runner.stop()


@pytest.fixture(scope="package")  # torn down after the last e2e test, before the next tier
def local_default(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalDefault]:
    yield from start_local_default(control_plane, tmp_path_factory)
