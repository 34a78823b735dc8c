"""A pod's wait for good, read from its status as the informer decodes its watch event (the image
from the container's status, which the kubelet fills for a container it could not create)."""

from __future__ import annotations

import json
from typing import Any

from agentrun_operator.planner.observed import PodWait
from agentrun_operator.shell.codec import decode_json
from agentrun_operator.shell.observe import pod_from_k8s, pod_wait


def pod(status: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": "run-iter-1-abc", "labels": {"job-name": "run-iter-1"}},
        "spec": {"containers": [{"name": "main", "image": "busybox:does-not-exist"}]},
        "status": status,
    }


NEVER_PULL_STATUS = {
    "phase": "Pending",
    "initContainerStatuses": [
        {"name": "fingerprint", "image": "op:1", "state": {"terminated": {"exitCode": 0}}},
        {"name": "reporter", "image": "op:1", "state": {"running": {}}},
    ],
    "containerStatuses": [
        {
            "name": "main",
            "image": "busybox:does-not-exist",
            "state": {
                "waiting": {
                    "reason": "ErrImageNeverPull",
                    "message": (
                        'Container image "busybox:does-not-exist" is not present with pull policy of Never'
                    ),
                }
            },
        }
    ],
}


def test_a_missing_image_is_decoded_from_the_watch_event() -> None:
    event = json.dumps({"type": "MODIFIED", "object": pod(NEVER_PULL_STATUS)}, separators=(",", ":")).encode()
    decoded = decode_json(event)
    observed = pod_from_k8s(decoded["object"])
    assert observed is not None
    assert observed.waiting == PodWait(
        "ErrImageNeverPull",
        'Container image "busybox:does-not-exist" is not present with pull policy of Never',
        "main",
        "busybox:does-not-exist",
    )


def test_init_containers_come_first() -> None:
    status = {
        "initContainerStatuses": [
            {"name": "reporter", "image": "op:1", "state": {"waiting": {"reason": "ImagePullBackOff"}}}
        ],
        "containerStatuses": [
            {"name": "main", "image": "b:1", "state": {"waiting": {"reason": "PodInitializing"}}}
        ],
    }
    assert pod_wait(status) == PodWait("ImagePullBackOff", "", "reporter", "op:1")


def test_normal_waits_and_scheduled_pods_are_no_wait() -> None:
    for reason in ("ContainerCreating", "PodInitializing", None):
        status = {
            "containerStatuses": [{"name": "main", "image": "b:1", "state": {"waiting": {"reason": reason}}}],
            "conditions": [{"type": "PodScheduled", "status": "True"}],
        }
        assert pod_wait(status) is None
    assert pod_wait({}) is None
    gated = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}
    assert pod_wait(gated) is None


def test_an_unschedulable_pod_carries_the_schedulers_words() -> None:
    message = "0/1 nodes are available: 1 node(s) didn't find available persistent volumes to bind."
    status = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        ],
    }
    assert pod_wait(status) == PodWait("Unschedulable", message)


def test_containers_ended_needs_every_listed_container_terminated_main_among_them() -> None:
    from agentrun_operator.shell.observe import containers_ended

    def cs(name: str, state: str) -> dict[str, Any]:
        return {"name": name, "state": {state: {}}}

    ended = {
        "phase": "Running",
        "initContainerStatuses": [cs("fingerprint", "terminated"), cs("reporter", "terminated")],
        "containerStatuses": [cs("main", "terminated")],
    }
    assert containers_ended(ended)
    reporter_running = {
        **ended,
        "initContainerStatuses": [cs("fingerprint", "terminated"), cs("reporter", "running")],
    }
    assert not containers_ended(reporter_running)
    assert not containers_ended({"initContainerStatuses": [cs("fingerprint", "terminated")]})
    assert not containers_ended({})
    observed = pod_from_k8s(pod(ended))
    assert observed is not None and observed.containers_ended and observed.phase == "Running"


def test_a_main_held_at_its_shut_gate_is_no_wait_but_another_config_error_is() -> None:
    """A duplicate pod's `main` waits at its gate on purpose (docs/design.md#reporter-first): the
    kubelet's refusal to mount the gate's subPath is not a wait to report; a missing Secret key is."""
    gate = 'failed to prepare subPath for volumeMount "agentrun-meta" of container "main"'
    held = {
        "containerStatuses": [
            {"name": "reporter", "image": "op:1", "state": {"terminated": {"exitCode": 137}}},
            {
                "name": "main",
                "image": "b:1",
                "state": {"waiting": {"reason": "CreateContainerConfigError", "message": gate}},
            },
        ]
    }
    assert pod_wait(held) is None
    secret = "couldn't find key token in Secret team/gh"
    other = {
        "containerStatuses": [
            {
                "name": "main",
                "image": "b:1",
                "state": {"waiting": {"reason": "CreateContainerConfigError", "message": secret}},
            }
        ]
    }
    assert pod_wait(other) == PodWait("CreateContainerConfigError", secret, "main", "b:1")


def test_the_reporter_listed_before_main_reports_from_the_container_statuses() -> None:
    """The reporter is a regular container now; pods made before list it among the init containers."""
    envelope = '{"v":1,"status":"found"}'
    terminated = {"terminated": {"exitCode": 0, "message": envelope}}
    for key in ("containerStatuses", "initContainerStatuses"):
        status: dict[str, Any] = {"phase": "Running", key: [{"name": "reporter", "state": terminated}]}
        status.setdefault("containerStatuses", []).append(
            {"name": "main", "state": {"terminated": {"exitCode": 0, "finishedAt": "2026-11-27T10:00:00Z"}}}
        )
        observed = pod_from_k8s(pod(status))
        assert observed is not None and observed.reporter_message == envelope and observed.containers_ended


def test_a_reporter_that_refused_main_is_decoded_with_its_words_not_as_a_report() -> None:
    """Exit code 3 (control/reporter.py `BLIND_EXIT`): its termination message says why, and is no
    control envelope; any other end of the reporter is its report."""
    from agentrun_operator.control.reporter import BLIND_EXIT

    def status(code: int, message: str) -> dict[str, Any]:
        reporter = {"name": "reporter", "state": {"terminated": {"exitCode": code, "message": message}}}
        gate = {"reason": "CreateContainerConfigError", "message": "failed to prepare subPath"}
        return {
            "phase": "Running",
            "containerStatuses": [reporter, {"name": "main", "state": {"waiting": gate}}],
        }

    event = json.dumps({"type": "MODIFIED", "object": pod(status(BLIND_EXIT, "cannot see main"))}).encode()
    refused = pod_from_k8s(decode_json(event)["object"])
    assert refused is not None
    assert refused.reporter_refusal == "cannot see main" and refused.reporter_message is None
    unsaid = pod_from_k8s(pod(status(BLIND_EXIT, "")))
    assert unsaid is not None and "docs/troubleshooting.md#reporter-cannot-see-main" in str(
        unsaid.reporter_refusal
    )
    reported = pod_from_k8s(pod(status(0, '{"status":"missing"}')))
    assert reported is not None and reported.reporter_refusal is None
    assert reported.reporter_message == '{"status":"missing"}'


def test_a_reporter_that_ended_before_it_was_ready_is_lost_unless_its_pod_is_a_duplicate() -> None:
    """`main` held at its shut gate (the kubelet's `CreateContainerConfigError` for the gate) beside
    a reporter that ended: lost, with what it said; a duplicate's reporter ends so on purpose (its
    message is its `taken` claim report), and a reporter that refused (exit 3) is a refusal."""
    from agentrun_operator.control.claim import Claim, report_text
    from agentrun_operator.control.mainwatch import BLIND
    from agentrun_operator.control.reporter import BLIND_EXIT
    from agentrun_operator.jobs.reporter_container import GATE_REFUSAL

    def status(code: int, message: str, main: dict[str, Any]) -> dict[str, Any]:
        ended = {"exitCode": code, "reason": "Error", "message": message}
        reporter = {"name": "reporter", "state": {"terminated": ended}}
        return {"phase": "Running", "containerStatuses": [reporter, {"name": "main", "state": main}]}

    held = {"waiting": {"reason": "CreateContainerConfigError", "message": GATE_REFUSAL + ': "x"'}}
    event = json.dumps({"type": "MODIFIED", "object": pod(status(1, "Traceback: boom", held))}).encode()
    lost = pod_from_k8s(decode_json(event)["object"])
    assert lost is not None and lost.reporter_lost is not None
    assert "exit code 1, Error" in lost.reporter_lost and "Traceback: boom" in lost.reporter_lost
    duplicate = report_text(Claim("taken", "other-pod"), "ws", "/claims")
    assert pod_from_k8s(pod(status(1, duplicate, held))).reporter_lost is None  # type: ignore[union-attr]
    blind = pod_from_k8s(pod(status(BLIND_EXIT, "cannot see main", held)))
    assert blind is not None and blind.reporter_lost is None and blind.reporter_refusal
    # Killed after it wrote its refusal (its gate's hook gave up first): still the refusal.
    killed = pod_from_k8s(pod(status(137, BLIND.format(what="the reporter itself"), held)))
    assert killed is not None and killed.reporter_lost is None
    assert killed.reporter_refusal == BLIND.format(what="the reporter itself")
    running = {"running": {"startedAt": "2026-11-27T10:00:00Z"}}
    assert pod_from_k8s(pod(status(1, "boom", running))).reporter_lost is None  # type: ignore[union-attr]
    creating = {"waiting": {"reason": "ContainerCreating"}}
    assert pod_from_k8s(pod(status(1, "boom", creating))).reporter_lost is None  # type: ignore[union-attr]
