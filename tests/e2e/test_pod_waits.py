"""An iteration pod that waits for good says why (docs/design.md#pod-waits): a claim whose volume
the node cannot mount leaves the pod `ContainerCreating`, and only the node's `FailedMount` Event on
the pod says why (the pod runner posts it as the kubelet does, podrunner/events.py); the step's
message names the volume within seconds, one Warning Event says it, and the step's timeout still ends
the run. The real-node tier takes this module's test over with its own `local_default` (the kubelet);
the same for an image the node does not have, which only a real node can show
(tests/node/image_waits.py).
"""

from __future__ import annotations

import json
import time

from tests.e2e.conftest import LocalDefault, step_status
from tests.support.polling import eventually

GONE = "/nonexistent/agentrun-e2e-mount-wait"
"""A path no node has: a `hostPath` volume of `type: Directory` there cannot be set up."""


def _unmountable(namespace: str) -> str:
    """A PersistentVolume the node cannot mount, bound in advance to a claim, and a run on it."""
    pv = f"{namespace}-unmountable"
    return f"""
apiVersion: v1
kind: PersistentVolume
metadata:
  name: {pv}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  claimRef: {{namespace: {namespace}, name: unmountable}}
  hostPath: {{path: {GONE}, type: Directory}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: unmountable
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  volumeName: {pv}
  resources: {{requests: {{storage: 1Gi}}}}
---
apiVersion: agents.proompteng.ai/v1alpha1
kind: AgentRun
metadata:
  name: mount-wait
spec:
  runtime: {{type: workflow}}
  workload:
    image: busybox:1.36
    command: [sh, -c, "true"]
    volumes:
      - {{name: workspace, type: pvc, claimName: unmountable, mountPath: /workspace}}
  workflow:
    steps:
      - name: mount
        timeoutSeconds: 15
        retries: 0
        loop: {{maxIterations: 1}}
"""


def test_a_volume_the_node_cannot_mount_is_named_in_the_step_message_and_the_timeout_ends_the_run(
    local_default: LocalDefault,
) -> None:
    plane, namespace = local_default.plane, local_default.namespace
    pv = f"{namespace}-unmountable"
    plane.kubectl("delete", "pv", pv, "--ignore-not-found", "--wait=false")
    local_default.apply(_unmountable(namespace))
    try:
        started = time.monotonic()

        def waiting() -> str | None:
            steps = ((local_default.run("mount-wait").get("status") or {}).get("workflow") or {}).get("steps")
            message = str((steps or [{}])[0].get("message") or "")
            return message if ": waiting, " in message else None

        message = eventually(waiting, timeout=15, what="the step message to say why the pod waits", every=0.2)
        print(f"volume wait named {time.monotonic() - started:.1f} s after the run was applied")
        assert f"volume {pv} cannot be mounted (FailedMount: MountVolume.SetUp failed" in message, message
        assert f"{GONE} is not a directory" in message, message

        run = local_default.wait_for_end("mount-wait")
        assert run["status"]["phase"] == "Failed", run["status"]
        ended = step_status(run)["message"]
        assert "timed out after 15s (activeDeadlineSeconds); its pod never started: pod" in ended, ended
        assert f"volume {pv} cannot be mounted" in ended, ended

        events = json.loads(
            plane.kubectl(
                "get", "events", "-n", namespace, "--field-selector", "reason=IterationWaiting", "-o", "json"
            )
        )["items"]
        about = [e for e in events if e["involvedObject"]["name"] == "mount-wait"]
        assert len(about) == 1, [e["message"] for e in about]
        assert f"volume {pv} cannot be mounted" in about[0]["message"]
    finally:
        plane.kubectl(
            "delete", "agentrun", "mount-wait", "-n", namespace, "--ignore-not-found", "--wait=false"
        )
        plane.kubectl("delete", "pvc", "unmountable", "-n", namespace, "--ignore-not-found", "--wait=false")
        plane.kubectl("delete", "pv", pv, "--ignore-not-found", "--wait=false")
