"""Helpers the integration tests share: polling for a condition, and a minimal workflow run."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def eventually(check: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    """Poll `check` until it holds; fail the test naming `what` when `timeout` runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def workflow_run(name: str, step: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """An AgentRun with one step `implement` (fields from `step`) on a `workspace` PVC."""
    return {
        "apiVersion": "agents.proompteng.ai/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "runtime": {"type": "workflow"},
            "workload": {
                "image": "busybox:1.36",
                "command": ["sh", "-c", "true"],
                "volumes": [
                    {"name": "workspace", "type": "pvc", "claimName": "ws", "mountPath": "/workspace"}
                ],
            },
            "workflow": {"steps": [{"name": "implement", **step}]},
            **spec,
        },
    }
