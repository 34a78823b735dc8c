"""Live fuzz: mutated example manifests applied to the real API server with the operator running.

Each mutant is either refused at admission (the API server's message names a `spec` field) or ends
in a terminal phase (Succeeded, Failed, Cancelled) with a reason and a message; and the operator
never logs the same warning or error for one run more than `MAX_REPEATS` times (the hot loop of a
refused Job create, which retried every 1-2 s forever, is what this catches).

The control plane is the integration tier's; the operator runs as its own process, watching only
the `fuzz` namespace, and the integration tier's kubelet driver plays the kubelet (binds the pods,
reports them finished: main container exit 0 and a control file chosen per pod from the seed).
Size: `AGENTRUN_FUZZ_LIVE` mutants (default 20) from seed `AGENTRUN_FUZZ_SEED` (default 0).
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any, Final

import pytest

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_operator import naming
from tests.fuzz.mutate import Mutant, example_claims, mutant, support_objects
from tests.integration.kubelet_driver import KubeletDriver, PodOutcome
from tests.support.api import ready_namespace
from tests.support.claims import bound_claims
from tests.support.polling import eventually
from tests.support.processes import OperatorProcess

pytestmark = pytest.mark.integration  # needs the local control plane

NAMESPACE: Final = "fuzz"
COUNT: Final = int(os.environ.get("AGENTRUN_FUZZ_LIVE", "20"))
SEED: Final = int(os.environ.get("AGENTRUN_FUZZ_SEED", "0"))
MAX_REPEATS: Final = 3
TERMINAL: Final = ("Succeeded", "Failed", "Cancelled")
CONTROLS: Final[tuple[bytes | None, ...]] = (
    b'{"continue": true}',
    b'{"continue": false}',
    None,  # no file
    b'{"continue": tru',  # invalid JSON
)


def outcome_of(pod: dict[str, Any]) -> PodOutcome:
    """Main container exit 0 (no retries to wait out); the control file chosen from the pod's name."""
    rng = random.Random(f"{SEED}/{pod['metadata']['name']}")
    control = rng.choice(CONTROLS)
    return PodOutcome(control_bytes=control) if control is not None else PodOutcome()


@pytest.fixture(scope="module")
def fuzz_cluster(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ControlPlane, OperatorProcess]]:
    plane = control_plane
    ready_namespace(plane, NAMESPACE)
    support = support_objects()
    for obj in support:
        obj["metadata"]["namespace"] = NAMESPACE
    plane.kubectl(
        "apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": support})
    )
    bound_claims(plane, NAMESPACE, example_claims())  # bound, as the operator requires before a run starts
    driver = KubeletDriver(plane, NAMESPACE, outcome_of).start()
    operator = OperatorProcess(
        plane,
        tmp_path_factory.mktemp("fuzz-operator"),
        # A mutant naming a missing object fails after 6 s instead of the default 30 s.
        env={"AGENTS_CONTROLLER_NAMESPACES": NAMESPACE, "AGENTS_CONTROLLER_REFERENCE_GRACE_SECONDS": "6"},
    ).start()
    try:
        yield plane, operator
    finally:
        plane.kubectl("delete", "agentruns", "--all", "-n", NAMESPACE, "--wait=false", check=False)
        operator.stop()
        driver.stop()


def _create(plane: ControlPlane, case: Mutant) -> str | None:
    """None when admitted; else the API server's refusal."""
    manifest = dict(case.manifest)
    manifest["metadata"] = {**manifest["metadata"], "namespace": NAMESPACE}
    try:
        plane.kubectl("create", "-f", "-", input_text=json.dumps(manifest))
    except Exception as exc:
        return str(exc)
    return None


def _run(plane: ControlPlane, name: str) -> dict[str, Any]:
    code, body = plane.api_get(f"/apis/{naming.GROUP}/v1alpha1/namespaces/{NAMESPACE}/agentruns/{name}")
    assert code == 200, (name, code, body[:300])
    result: dict[str, Any] = json.loads(body)
    return result


def _repeated_failures(log: str) -> dict[tuple[str, str], int]:
    """(run, what failed) -> how often the operator logged it at warning level or above."""
    counts: Counter[tuple[str, str]] = Counter()
    for line in log.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or record.get("level") not in ("warning", "error", "critical"):
            continue
        run = str(record.get("run") or record.get("correlation_id") or "")
        if not run:
            continue
        what = " | ".join(str(record.get(k, "")) for k in ("msg", "error", "api_message", "refused"))
        counts[(run, what)] += 1
    return {key: n for key, n in counts.items() if n > MAX_REPEATS}


def test_every_mutant_is_refused_or_ends_with_a_clear_message(
    fuzz_cluster: tuple[ControlPlane, OperatorProcess],
) -> None:
    plane, operator = fuzz_cluster
    cases = [mutant(seed, name=f"fuzz-{seed}") for seed in range(SEED, SEED + COUNT)]
    refused: dict[str, str] = {}
    admitted: list[Mutant] = []
    for case in cases:
        answer = _create(plane, case)
        if answer is None:
            admitted.append(case)
        else:
            refused[case.describe()] = answer
    for what, answer in refused.items():
        # The API server names the field it refuses (e.g. spec.workflow.steps[0].name).
        assert "spec" in answer, f"{what}: a refusal that names no field: {answer}"

    unfinished: dict[str, Any] = {}

    def all_finished() -> bool:
        unfinished.clear()
        for case in admitted:
            status = _run(plane, case.manifest["metadata"]["name"]).get("status") or {}
            if status.get("phase") not in TERMINAL:
                unfinished[case.describe()] = status
        return not unfinished

    try:
        timeout = 180 + 5 * len(admitted)  # generous: one operator, 2 shared cores
        eventually(all_finished, timeout=timeout, what="every admitted mutant to reach a terminal phase")
    except AssertionError:
        detail = json.dumps(unfinished, indent=1, default=str)[:6000]
        log = operator.logs()[-4000:]
        raise AssertionError(f"runs not finished:\n{detail}\n--- operator log ---\n{log}") from None
    phases: Counter[str] = Counter()
    for case in admitted:
        status = _run(plane, case.manifest["metadata"]["name"])["status"]
        phases[status["phase"]] += 1
        assert status.get("reason") and status.get("message"), f"{case.describe()}: {status}"
    print(f"fuzz: {COUNT} mutants from seed {SEED}: {len(refused)} refused at admission, {dict(phases)}")
    repeated = _repeated_failures(operator.logs())
    assert not repeated, f"the operator logged the same failure for a run too often: {repeated}"
