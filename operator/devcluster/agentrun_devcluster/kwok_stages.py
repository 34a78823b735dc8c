"""The KWOK Stages that play an iteration pod's life on a simulated node (docs/local-dev.md#kwok).

KWOK runs no container: these Stages write what a kubelet would. A pod bound to a fake node starts
Running at once, with a pod IP from the plane's loopback range (`kwok.POD_CIDR`); a pod of an
AgentRun (the run label the operator puts on every iteration pod) then ends Succeeded with every
container terminated, and the `reporter` container's termination message is the control envelope the
real reporter would write (agentrun_operator/control/envelope.py) — for the control payload the run
declares in its workload's env `AGENTRUN_SIM_CONTROL` (a JSON object; unset: a `missing` envelope, as
for an iteration that wrote no control file). A run that sets `AGENTRUN_SIM_HANG=true` plays a
container that never ends. A warm loop's pod (`naming.LABEL_WARM`) only starts: its supervisor, which
the operator calls at its pod IP, is simulated outside the cluster (tests/bench/warm_sim.py), and that
simulator ends the pod as a kubelet would. A pod being deleted is gone at once (the kubelet's
confirmation). Pods of anything else only start and keep running (the unrelated load).

So the operator under test is the released one: it reads the envelope from the pod status exactly
as on a real node; nothing in the product knows it is simulated. Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from agentrun_operator.jobs.reporter_container import REPORTER_CONTAINER, WORKLOAD_CONTAINERS
from agentrun_operator.naming import LABEL_RUN, LABEL_WARM

CONTROL_ENV: Final = "AGENTRUN_SIM_CONTROL"
"""The workload env a benchmark sets to the JSON control payload each iteration reports."""
HANG_ENV: Final = "AGENTRUN_SIM_HANG"
"""The workload env that makes the simulated `main` never end (`true`)."""
NODE_ANNOTATION: Final = "kwok.x-k8s.io/node"
NODE_ANNOTATION_VALUE: Final = "fake"
NODE_CAPACITY: Final = {"cpu": "1000", "memory": "4Ti", "pods": "2000"}
"""One fake node's capacity: enough for thousands of small pods; the node count spreads them."""

_WORKLOADS: Final = " ".join(f'"{n}"' for n in sorted(WORKLOAD_CONTAINERS))


def expression(key: str, operator: str, *values: str) -> str:
    """One entry of a Stage's `selector.matchExpressions` (`key` is KWOK's jq-like path)."""
    row = f"    - key: '{key}'\n      operator: '{operator}'\n"
    if values:
        row += "      values: [" + ", ".join(f"'{v}'" for v in values) + "]\n"
    return row


def live_pods_in(phase: str) -> tuple[str, str]:
    """The selector of pods in `phase` that are not being deleted (the gone Stage takes those)."""
    return expression(".metadata.deletionTimestamp", "DoesNotExist"), expression(".status.phase", "In", phase)


def owned_by(kind: str) -> str:
    """The selector of pods an object of `kind` owns (KWOK's own recipe for Jobs, Workflows...)."""
    return expression(".metadata.ownerReferences.[].kind", "In", kind)


def stage(name: str, kind: str, match: tuple[str, ...], then: str) -> str:
    """A Stage: objects of `kind` (v1) that every `match` expression selects move to `then` (the
    indented body of its `next`)."""
    head = (
        "apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata:\n"
        f"  name: {name}\nspec:\n  resourceRef:\n    apiGroup: v1\n    kind: {kind}\n"
        "  selector:\n    matchExpressions:\n"
    )
    return head + "".join(match) + "  next:\n" + then


_NODE_READY: Final = """    statusTemplate: |
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

_POD_RUNNING: Final = """    statusTemplate: |
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

# Pod completion, for every owner kind: `%(setup)s` computes a termination message once per pod,
# `%(message)s` writes it into one container's terminated state (both empty: no message).
_POD_COMPLETED: Final = """    statusTemplate: |
      {{ $now := Now }}
%(setup)s      conditions:
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
%(message)s      {{ end }}
      phase: Succeeded
"""

_MESSAGE: Final = """            {{ if eq .name "%(container)s" }}
            message: {{ %(value)s | Quote }}
            {{ end }}
"""


@dataclass(frozen=True)
class TerminationMessage:
    """What one container's terminated state says: `setup` (template lines, run once per pod) leaves
    it in the template variable `value`."""

    container: str
    setup: str
    value: str


def pod_completed_stage(name: str, owner: tuple[str, ...], message: TerminationMessage | None = None) -> str:
    """The Stage that ends a Running pod `owner` selects: Succeeded, every container terminated with
    exit code 0 and reason Completed, and `message` (if any) as its container's termination message.
    One template for every owner kind: an AgentRun's iteration pods here, Argo's in its benchmark."""
    fill = {"setup": "", "message": ""}
    if message is not None:
        fill = {
            "setup": message.setup,
            "message": _MESSAGE % {"container": message.container, "value": message.value},
        }
    return stage(name, "Pod", (*live_pods_in("Running"), *owner), _POD_COMPLETED % fill)


# The envelope is built as a string and quoted once: the control payload goes in verbatim (it is the
# run's own JSON), the path is the one the reporter was told (its `--path` argument).
_ENVELOPE: Final = """      {{ $control := "" }}
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
"""  # noqa: E501 (KWOK's template language, one expression a line)

_WORKLOAD_SELECTOR: Final = '.spec.containers.[] | select( .name == "main" or .name == "agent-runner" )'


def stages_yaml() -> str:
    """Every Stage, as one multi-document YAML file for `kwok --config`."""
    capacity = "{" + ", ".join(f"{k}: {v!r}" for k, v in NODE_CAPACITY.items()) + "}"
    node_ready = stage(
        "agentrun-node-ready",
        "Node",
        (expression('.status.conditions.[] | select( .type == "Ready" ) | .status', "NotIn", "True"),),
        _NODE_READY % {"capacity": capacity},
    )
    running = stage("agentrun-pod-running", "Pod", live_pods_in("Pending"), _POD_RUNNING)
    envelope = _ENVELOPE % {
        "control_env": CONTROL_ENV,
        "workloads": _WORKLOADS,
        "reporter": REPORTER_CONTAINER,
    }
    iteration_ended = pod_completed_stage(
        "agentrun-iteration-ended",
        (
            expression(f'.metadata.labels["{LABEL_RUN}"]', "Exists"),
            # A warm pod runs iteration after iteration: the simulated supervisor ends it.
            expression(f'.metadata.labels["{LABEL_WARM}"]', "NotIn", "true"),
            expression(
                f'{_WORKLOAD_SELECTOR} | .env.[]? | select( .name == "{HANG_ENV}" ) | .value', "NotIn", "true"
            ),
        ),
        TerminationMessage(REPORTER_CONTAINER, envelope, "$envelope"),
    )
    gone = stage(
        "agentrun-pod-gone",
        "Pod",
        (expression(".metadata.deletionTimestamp", "Exists"),),
        "    delete: true\n",
    )
    return "---\n".join([node_ready, running, iteration_ended, gone])
