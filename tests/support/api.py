"""Reads from the API server for tests that poll: one HTTPS GET each (a `kubectl get` costs a process
start and ~80 ms of CPU, which a loop polling every 0.1 s takes from the system under test)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_operator import naming
from tests.support.polling import eventually

RUNS = f"/apis/{naming.GROUP}/v1alpha1"


def get_json(plane: ControlPlane, path: str) -> dict[str, Any]:
    """The object or list at `path`; fails naming the path and the answer unless it is 200."""
    code, body = plane.api_get(path, timeout=30.0)
    assert code == 200, f"GET {path}: {code} {body[:300]!r}"
    result: dict[str, Any] = json.loads(body)
    return result


def agentrun(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    return get_json(plane, f"{RUNS}/namespaces/{namespace}/agentruns/{name}")


FINAL_PHASES = ("Succeeded", "Failed", "Cancelled")


def finished_run(
    plane: ControlPlane, namespace: str, name: str, logs: Callable[[], str], timeout: float
) -> dict[str, Any]:
    """The run once its phase is final. When it is not within `timeout`, its last status and the tail
    of the operator's log (`logs`) are printed before the failure, to say why."""
    seen: dict[str, Any] = {}

    def done() -> bool:
        seen.update(agentrun(plane, namespace, name))
        return (seen.get("status") or {}).get("phase") in FINAL_PHASES

    try:
        eventually(done, timeout, f"agentrun {name} to finish")
    except AssertionError:
        print(json.dumps(seen.get("status"), indent=1))
        print(logs()[-6000:])
        raise
    return seen


def items(
    plane: ControlPlane, group_version: str, namespace: str, plural: str, selector: str
) -> list[dict[str, Any]]:
    """The objects of `plural` in `namespace` matching the label `selector` (`/api/v1` or `/apis/G/V`)."""
    path = f"{group_version}/namespaces/{namespace}/{plural}?labelSelector={quote(selector)}"
    found: list[dict[str, Any]] = get_json(plane, path)["items"]
    return found


def jobs_of_run(plane: ControlPlane, namespace: str, run: str) -> list[dict[str, Any]]:
    """The Jobs the operator made for the run `run`."""
    return items(plane, "/apis/batch/v1", namespace, "jobs", f"{naming.LABEL_RUN}={run}")


def kubectl_in(
    plane: ControlPlane, namespace: str, *args: str, manifest: Any = None
) -> subprocess.CompletedProcess[str]:
    """`kubectl -n namespace args…` with `manifest` (JSON) on stdin, its exit code and both streams
    kept for the test to read (a refusal is an answer, not an error)."""
    return subprocess.run(
        [str(plane.bin_dir / "kubectl"), f"--kubeconfig={plane.kubeconfig}", "-n", namespace, *args],
        input=None if manifest is None else json.dumps(manifest),
        capture_output=True,
        text=True,
        check=False,
    )


def ready_namespace(plane: ControlPlane, namespace: str) -> None:
    """The namespace, made if missing, once its default ServiceAccount exists (the Job controller's
    pods need it)."""
    from tests.support.polling import eventually

    if not plane.kubectl("get", "ns", namespace, "--ignore-not-found", "-o", "name").strip():
        plane.kubectl("create", "namespace", namespace)
    eventually(lambda: plane.api_get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")[0] == 200)
