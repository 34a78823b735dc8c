"""The Events a kubelet posts about a pod, as the kubelet posts them: core/v1, source `kubelet` on
this node, one Event per (pod, reason, message) whose count and last timestamp grow on each repeat
(the kubelet's event correlator). Only what the pod runner imitates posts one: a volume it cannot
mount (`FailedMount`, podrunner/volumes.py), retried as the kubelet retries it, the pod kept
`ContainerCreating` meanwhile (docs/local-dev.md#pod-runner-volumes).

Best effort, as the kubelet's: an Event that cannot be written is dropped, never retried.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from agentrun_devcluster.podrunner.api import Api, ApiError
from agentrun_devcluster.podrunner.status import now_rfc3339

log = logging.getLogger("agentrun.podrunner.events")

REPEAT_SECONDS = 10.0
"""A repeat updates the Event at most this often (the kubelet backs its own retries off to 2 min)."""


class PodEvents:
    """The Events of one pod (its worker posts them)."""

    def __init__(self, api: Api, pod: Mapping[str, Any], node: str) -> None:
        self.api = api
        self.pod = pod
        self.node = node
        self._posted: dict[tuple[str, str], tuple[str, int, float]] = {}  # -> (name, count, last write)

    def warning(self, reason: str, message: str) -> None:
        meta = self.pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        path = f"/api/v1/namespaces/{namespace}/events"
        now, stamp = time.monotonic(), now_rfc3339()
        known = self._posted.get((reason, message))
        try:
            if known is None:
                digest = hashlib.sha256(f"{meta.get('uid')}/{reason}/{message}".encode()).hexdigest()[:16]
                event = f"{name}.{digest}"
                self.api.request("POST", path, self._body(event, reason, message, stamp))
                self._posted[(reason, message)] = (event, 1, now)
            elif now - known[2] >= REPEAT_SECONDS:
                count = known[1] + 1
                patch = {"count": count, "lastTimestamp": stamp}
                self.api.request("PATCH", f"{path}/{known[0]}", patch, "application/merge-patch+json")
                self._posted[(reason, message)] = (known[0], count, now)
        except ApiError as exc:
            log.info("event %s on pod %s/%s not posted: %s", reason, namespace, name, exc)

    def _body(self, event: str, reason: str, message: str, stamp: str) -> dict[str, Any]:
        meta = self.pod.get("metadata") or {}
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event, "namespace": meta.get("namespace")},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message,
            "type": "Warning",
            "source": {"component": "kubelet", "host": self.node},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "reportingComponent": "kubelet",
            "reportingInstance": self.node,
        }
