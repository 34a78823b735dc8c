"""The KWOK Stages as data: every document a Stage, and the one pod-completion Stage that serves
every owner kind (an AgentRun's iteration pods, with the reporter's envelope; Argo's, without)."""

from __future__ import annotations

import ipaddress
from typing import Any

import yaml

from agentrun_devcluster import kwok_stages
from agentrun_devcluster.kwok import POD_CIDR
from agentrun_devcluster.kwok_stages import TerminationMessage, owned_by, pod_completed_stage
from agentrun_devcluster.podrunner.addresses import POD_ADDRESSES
from agentrun_operator.jobs.reporter_container import REPORTER_CONTAINER
from agentrun_operator.naming import LABEL_RUN, LABEL_WARM


def _stages() -> dict[str, dict[str, Any]]:
    docs = [yaml.safe_load(doc) for doc in kwok_stages.stages_yaml().split("---\n")]
    assert all(d["apiVersion"] == "kwok.x-k8s.io/v1alpha1" and d["kind"] == "Stage" for d in docs)
    return {d["metadata"]["name"]: d for d in docs}


def _match(stage: dict[str, Any]) -> list[dict[str, Any]]:
    return list(stage["spec"]["selector"]["matchExpressions"])


def test_the_plane_has_its_four_stages() -> None:
    stages = _stages()
    assert set(stages) == {
        "agentrun-node-ready",
        "agentrun-pod-running",
        "agentrun-iteration-ended",
        "agentrun-pod-gone",
    }
    assert stages["agentrun-node-ready"]["spec"]["resourceRef"] == {"apiGroup": "v1", "kind": "Node"}
    assert stages["agentrun-pod-gone"]["spec"]["next"] == {"delete": True}


def test_running_and_ended_select_live_pods_by_phase() -> None:
    stages = _stages()
    live = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
    running, ended = _match(stages["agentrun-pod-running"]), _match(stages["agentrun-iteration-ended"])
    assert running == [live, {"key": ".status.phase", "operator": "In", "values": ["Pending"]}]
    assert ended[:2] == [live, {"key": ".status.phase", "operator": "In", "values": ["Running"]}]
    # Only an AgentRun's pods end, not a warm loop's (the simulated supervisor ends those), and not
    # those that play a container that never ends.
    assert ended[2] == {"key": f'.metadata.labels["{LABEL_RUN}"]', "operator": "Exists"}
    assert ended[3] == {"key": f'.metadata.labels["{LABEL_WARM}"]', "operator": "NotIn", "values": ["true"]}
    assert kwok_stages.HANG_ENV in ended[4]["key"] and ended[4]["values"] == ["true"]


def test_an_iteration_pod_ends_with_the_reporters_envelope_as_its_message() -> None:
    template = _stages()["agentrun-iteration-ended"]["spec"]["next"]["statusTemplate"]
    rows = [r.strip() for r in template.splitlines()]
    at = rows.index("message: {{ $envelope | Quote }}")  # in the reporter's terminated state only
    assert rows[at - 1] == f'{{{{ if eq .name "{REPORTER_CONTAINER}" }}}}'
    assert kwok_stages.CONTROL_ENV in template and '"status":"found"' in template
    assert "exitCode: 0" in template and "phase: Succeeded" in template


def test_one_completion_stage_serves_any_owner_with_or_without_a_message() -> None:
    plain = yaml.safe_load(pod_completed_stage("done", (owned_by("Workflow"),)))
    said = yaml.safe_load(
        pod_completed_stage(
            "said", (owned_by("Job"),), TerminationMessage("sidecar", '      {{ $m := "hi" }}\n', "$m")
        )
    )
    assert _match(plain)[2] == {
        "key": ".metadata.ownerReferences.[].kind",
        "operator": "In",
        "values": ["Workflow"],
    }
    assert _match(said)[2]["values"] == ["Job"]
    assert "message:" not in plain["spec"]["next"]["statusTemplate"]
    template = said["spec"]["next"]["statusTemplate"]
    assert '{{ $m := "hi" }}' in template and 'if eq .name "sidecar"' in template
    # Apart from the message, the two complete a pod the same way.
    strip = [
        r for r in template.splitlines() if "$m" not in r and "sidecar" not in r and "{{ end }}" not in r
    ]
    assert strip == [r for r in plain["spec"]["next"]["statusTemplate"].splitlines() if "{{ end }}" not in r]


def test_pod_ips_are_loopback_and_apart_from_the_pod_runners() -> None:
    """A connection to a simulated pod's IP (the operator calling a warm pod's supervisor) stays on
    `lo`, where the simulated supervisor listens (tests/bench/warm_sim.py); never 127.0.0.1 itself, nor
    the pod runner's range."""
    pods = ipaddress.ip_network(POD_CIDR)
    assert pods.subnet_of(ipaddress.ip_network("127.0.0.0/8"))
    assert not pods.overlaps(POD_ADDRESSES)
    assert ipaddress.ip_address("127.0.0.1") not in pods
