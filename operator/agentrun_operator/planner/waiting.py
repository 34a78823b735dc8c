"""Where an iteration's pod waits for good, the step's message says why (docs/design.md#pod-waits).

A pod whose image is not on the node, cannot be pulled or is not a valid name, whose container
cannot be created (a missing Secret or ConfigMap key), that no node can take (`Unschedulable`), or
whose volume the node cannot attach or mount (`FailedAttachVolume`, `FailedMount`: Events on the
pod, which stays `ContainerCreating`) stays `Pending`: the Job stays active, and without this the
run would say only "running" until the step's timeout ended it. The shell records such a wait in
`ObservedPod.waiting` (and only such a wait, so an ordinary pod start re-plans nothing); the
planner puts it into the step's message, naming the container and the image (or the volume),
posts one Warning Event per distinct wait, and restores the message when the wait is over. The
timeout still ends the attempt (the Job's `activeDeadlineSeconds` counts from the Job's start, not
the pod's), and its failure message says what the pod was waiting for. Pure.
"""

from __future__ import annotations

from typing import Final

from agentrun_operator.planner.context import PlanContext, clip
from agentrun_operator.planner.observed import ObservedPod, PodWait
from agentrun_operator.planner.state import StepView

IMAGE_REASONS: Final = frozenset(
    {"ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName"}
)
"""A container's waiting reasons that say its image is not there and may never be."""

CREATE_REASONS: Final = frozenset({"CreateContainerConfigError", "CreateContainerError"})
"""A container's waiting reasons that say the node cannot create it as specified (retried forever)."""

CONTAINER_WAIT_REASONS: Final = IMAGE_REASONS | CREATE_REASONS

VOLUME_REASONS: Final = ("FailedAttachVolume", "FailedMount")
"""The reasons of the Events that say a pod's volume cannot be attached (the attach/detach controller:
e.g. a `ReadWriteOnce` claim still attached to another node) or mounted (the kubelet). Not in the
pod's status: the shell watches these Events (shell/volume_waits.py)."""

UNSCHEDULABLE: Final = "Unschedulable"
"""The reason of a pod's `PodScheduled=False` condition when no node fits it (taints, resources,
volumes the scheduler cannot place: an unbound claim, a volume node affinity conflict)."""

WAITING: Final = ": waiting, "
"""What separates the step's "running" message from the wait it adds."""

REASON_WAITING: Final = "IterationWaiting"


def running_message(where: str, attempt: int, tries: int, job: str) -> str:
    """The step's message while its attempt runs (`where`: "iteration i/N " or "")."""
    return f"{where}attempt {attempt}/{tries} running (Job {job})"


def headline(wait: PodWait, pod: str) -> str:
    """What waits and why, the same for every message of one wait (`ErrImagePull` and
    `ImagePullBackOff` alternate while the node retries, and the kubelet's text changes)."""
    if wait.reason in IMAGE_REASONS:
        image = wait.image or "(unknown)"
        if wait.reason == "ErrImageNeverPull":
            why = "is not on the node, and its pull policy is Never"
        elif wait.reason == "InvalidImageName":
            why = "is not a valid image name"
        else:
            why = "cannot be pulled"
        return f"container {wait.container} of pod {pod} cannot start: image {image} {why}"
    if wait.reason in CREATE_REASONS:
        return f"container {wait.container} of pod {pod} cannot be created"
    if wait.reason in VOLUME_REASONS:
        volume = f"volume {wait.volume}" if wait.volume else "a volume"
        verb = "attached" if wait.reason == "FailedAttachVolume" else "mounted"
        return f"pod {pod} cannot start: {volume} cannot be {verb}"
    return f"pod {pod} cannot be scheduled on any node"


def describe(wait: PodWait, pod: str) -> str:
    """The headline with the node's (or scheduler's) own reason and words."""
    detail = f"{wait.reason}: {clip(wait.message.strip(), 300)}" if wait.message.strip() else wait.reason
    return f"{headline(wait, pod)} ({detail})"


def waiting_pod(pods: tuple[ObservedPod, ...]) -> ObservedPod | None:
    """The first pod of the attempt that waits for good and is not being stopped."""
    return next((p for p in pods if p.waiting is not None and not p.terminal and not p.deleting), None)


def note_wait(ctx: PlanContext, step: StepView, base: str, pods: tuple[ObservedPod, ...]) -> None:
    """Put the attempt's wait (or its end) into the step's message; one Event per distinct wait.

    "Distinct" is by headline against the message as it stands (the persisted one): the same wait
    seen again, or its reason alternating, writes nothing new and posts no second Event."""
    st = step.st
    before = st.message or ""
    pod = waiting_pod(pods)
    if pod is None or pod.waiting is None:
        # Over only when a live pod no longer waits: a pod being deleted (at the deadline, the Job
        # controller deletes it) keeps the wait in the message, for the timeout's message to name.
        live = any(not p.terminal and not p.deleting for p in pods)
        if live and before.startswith(base + WAITING):
            st.message = base
        return
    head = headline(pod.waiting, pod.name)
    st.message = clip(f"{base}{WAITING}{describe(pod.waiting, pod.name)}")
    if head not in before:
        ctx.emit("Warning", REASON_WAITING, f"step {step.label}: {st.message}", step.where)


def waited_for(message: str | None) -> str | None:
    """What the step's message says its attempt was waiting for (None when it was not)."""
    if not message or WAITING not in message:
        return None
    return message.split(WAITING, 1)[1]
