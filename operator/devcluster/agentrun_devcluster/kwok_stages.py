"""The KWOK Stages that play an iteration pod's life on a simulated node (docs/local-dev.md#kwok).

KWOK runs no container: these Stages write what a kubelet would. A pod bound to a fake node starts
Running at once; a pod of an AgentRun (the run label the operator puts on every iteration pod) then
ends Succeeded with every container terminated, and the `reporter` container's termination message
is the control envelope the real reporter would write (agentrun_operator/control/envelope.py) — for
the control payload the run declares in its workload's env `AGENTRUN_SIM_CONTROL` (a JSON object;
unset: a `missing` envelope, as for an iteration that wrote no control file). A run that sets
`AGENTRUN_SIM_HANG=true` plays a container that never ends. A pod being deleted is gone at once (the
kubelet's confirmation). Pods of anything else only start and keep running (the unrelated load).

So the operator under test is the released one: it reads the envelope from the pod status exactly
as on a real node; nothing in the product knows it is simulated. Pure data.
"""

from __future__ import annotations

from typing import Final

from agentrun_operator.jobs.reporter_container import REPORTER_CONTAINER, WORKLOAD_CONTAINERS
from agentrun_operator.naming import LABEL_RUN

CONTROL_ENV: Final = "AGENTRUN_SIM_CONTROL"
"""The workload env a benchmark sets to the JSON control payload each iteration reports."""
HANG_ENV: Final = "AGENTRUN_SIM_HANG"
"""The workload env that makes the simulated `main` never end (`true`)."""
NODE_ANNOTATION: Final = "kwok.x-k8s.io/node"
NODE_ANNOTATION_VALUE: Final = "fake"
NODE_CAPACITY: Final = {"cpu": "1000", "memory": "4Ti", "pods": "2000"}
"""One fake node's capacity: enough for thousands of small pods; the node count spreads them."""

_WORKLOADS: Final = " ".join(f'"{n}"' for n in sorted(WORKLOAD_CONTAINERS))

_NODE_READY: Final = """apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: agentrun-node-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values: ['True']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
      capacity: %(capacity)s
      allocatable: %(capacity)s
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        kubeletVersion: fake
      phase: Running
"""

_POD_RUNNING: Final = """apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: agentrun-pod-running
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: Initialized}
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: Ready}
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: ContainersReady}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        started: true
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      {{ with .spec.initContainers }}
      initContainerStatuses:
      {{ range . }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        state:
          terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }}, finishedAt: {{ $now | Quote }}}
      {{ end }}
      {{ end }}
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
      phase: Running
      startTime: {{ $now | Quote }}
"""  # noqa: E501 (KWOK's template language, one expression a line)

# The envelope is built as a string and quoted once: the control payload goes in verbatim (it is the
# run's own JSON), the path is the one the reporter was told (its `--path` argument).
_ITERATION_ENDED: Final = """apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: agentrun-iteration-ended
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.labels["%(run_label)s"]'
      operator: 'Exists'
    - key: '.spec.containers.[] | select( .name == "main" or .name == "agent-runner" ) | .env.[]? | select( .name == "%(hang_env)s" ) | .value'
      operator: 'NotIn'
      values: ['true']
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $control := "" }}
      {{ $path := "" }}
      {{ range .spec.containers }}
      {{ if has .name (list %(workloads)s) }}
      {{ range .env }}{{ if eq .name "%(control_env)s" }}{{ $control = .value }}{{ end }}{{ end }}
      {{ end }}
      {{ if eq .name "%(reporter)s" }}
      {{ $args := .args }}
      {{ range $i, $a := $args }}{{ if eq $a "--path" }}{{ $path = index $args (add1 $i) }}{{ end }}{{ end }}
      {{ end }}
      {{ end }}
      {{ $envelope := printf `{"v":1,"status":"missing","path":%%s,"size":null,"reason":null,"control":null}` ( $path | Quote ) }}
      {{ if $control }}
      {{ $envelope = printf `{"v":1,"status":"found","path":%%s,"size":%%d,"reason":null,"control":%%s}` ( $path | Quote ) ( len $control ) $control }}
      {{ end }}
      conditions:
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: Initialized}
      - {lastTransitionTime: {{ $now | Quote }}, status: "False", type: Ready, reason: PodCompleted}
      - {lastTransitionTime: {{ $now | Quote }}, status: "False", type: ContainersReady, reason: PodCompleted}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            reason: Completed
            startedAt: {{ $now | Quote }}
            finishedAt: {{ $now | Quote }}
            {{ if eq .name "%(reporter)s" }}
            message: {{ $envelope | Quote }}
            {{ end }}
      {{ end }}
      phase: Succeeded
"""  # noqa: E501 (KWOK's template language, one expression a line)

_POD_GONE: Final = """apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: agentrun-pod-gone
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
  next:
    delete: true
"""


def stages_yaml() -> str:
    """Every Stage, as one multi-document YAML file for `kwok --config`."""
    capacity = "{" + ", ".join(f"{k}: {v!r}" for k, v in NODE_CAPACITY.items()) + "}"
    ended = _ITERATION_ENDED % {
        "run_label": LABEL_RUN,
        "hang_env": HANG_ENV,
        "control_env": CONTROL_ENV,
        "workloads": _WORKLOADS,
        "reporter": REPORTER_CONTAINER,
    }
    docs = [_NODE_READY % {"capacity": capacity}, _POD_RUNNING, ended, _POD_GONE]
    return "---\n".join(docs)
