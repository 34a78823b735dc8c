"""What the shell observed about one AgentRun's world, reduced to what the planner needs.

The shell turns Kubernetes objects into these plain values; the planner never sees a Kubernetes
object, so every rule can be unit-tested with literals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

JobOutcome = Literal["Active", "Succeeded", "Failed", "DeadlineExceeded"]

RefusedWrite = Literal["Job", "Status"]

TRANSIENT_CLIENT_ERRORS: Final = frozenset({408, 409, 429})
"""4xx answers that say "not now" rather than "never": a timeout, a conflict (re-read and re-plan),
throttling. Every other 4xx to a create or update is a permanent refusal."""


def permanent_refusal(code: int) -> bool:
    """Whether an API answer to a create or update refuses that write for good.

    Sending the same object again gets the same answer (e.g. 422: a field the API server rejects), so
    the shell reports it to the planner as a `Refusal` instead of retrying; 5xx answers and the
    transient 4xx are retried with backoff.
    """
    return 400 <= code < 500 and code not in TRANSIENT_CLIENT_ERRORS


@dataclass(frozen=True)
class Refusal:
    """The API server refused a write the planner asked for, permanently (`permanent_refusal`).

    `what` is the kind of write: `Job` (the create of the Job named `name`) or `Status` (the update
    of the run's status). `message` is the API server's own message, field path included.
    """

    what: RefusedWrite
    name: str
    code: int
    message: str


@dataclass(frozen=True)
class PodWait:
    """What a pod that has not started waits for, when it may wait for good: a container the node
    cannot create (its image missing or not pullable, a missing Secret key), no node for the pod
    (`Unschedulable`), or a volume the node cannot attach or mount (`FailedAttachVolume`,
    `FailedMount`: Events on the pod, not its status). The normal waits (`ContainerCreating`,
    `PodInitializing`) are not recorded, so an ordinary start re-plans nothing (planner/waiting.py)."""

    reason: str  # the container's waiting reason, `Unschedulable`, or the volume Event's reason
    message: str = ""
    container: str | None = None
    image: str | None = None
    volume: str | None = None  # the volume a `FailedAttachVolume`/`FailedMount` Event names


@dataclass(frozen=True)
class ObservedPod:
    """A pod of an iteration Job. `terminal` means none of its containers can still touch the volume."""

    name: str
    job_name: str
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    deleting: bool = False
    # The reporter sidecar's termination message (the control envelope JSON), once it has ended.
    reporter_message: str | None = None
    # The fingerprint init container's termination message: how its Job claim went (control/claim.py).
    claim_message: str | None = None
    # Why the reporter refused to start `main`, when it did: it cannot see the pod's processes (no
    # shared PID namespace, control/mainwatch.py `blind_reason`); the attempt fails at once with it.
    reporter_refusal: str | None = None
    # Which refusal: ReporterCannotSeeMain, or CheckpointFailed (loop.checkpoint could not restore or
    # record the workspace before main, control/checkpointing.py).
    reporter_refusal_reason: str | None = None
    # The reporter ended before it was ready (it crashed, was OOM-killed, or its hook gave up), so
    # `main` is held at its shut gate for good: what it said (shell/observe.py `reporter_lost`).
    reporter_lost: str | None = None
    main_exit_code: int | None = None
    main_reason: str | None = None  # e.g. OOMKilled, Error, ContainerCannotRun
    main_message: str | None = None
    finished_at: datetime | None = None
    # The pod's own status.reason/message (e.g. Evicted, NodeLost, Shutdown), set by whoever failed it.
    reason: str | None = None
    message: str | None = None
    # Why it has not started, when that may last (`PodWait`); None for a pod on its normal way.
    waiting: PodWait | None = None
    # No container of it has started yet (Pending, none running or ended): the node may still be
    # attaching or mounting its volumes, so a volume Event can say why it waits (shell/volume_waits.py).
    creating: bool = False
    # Every container of the pod has terminated (`main` among them), whatever the phase says yet:
    # the kubelet writes the terminal phase only after tearing the sandbox and volumes down.
    containers_ended: bool = False
    # The node it was scheduled to (`spec.nodeName`): the next pod of the run prefers it, where the
    # run's volume is attached (planner/placement.py).
    node_name: str | None = None
    # Its Job's completion index (`batch.kubernetes.io/job-completion-index`): in a loop with
    # candidates, which candidate it is (planner/candidates.py); None for a pod of a one-pod Job.
    completion_index: int | None = None
    # A warm loop's pod (docs/design.md#warm-pod): its IP (`status.podIP`), where the operator calls
    # its supervisor; None for any other pod, or before it has one.
    warm_ip: str | None = None

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def stopped(self) -> bool:
        """No container of it runs, so none can touch a volume: terminal, or every container ended
        (docs/design.md#early-result)."""
        return self.terminal or self.containers_ended

    @property
    def reported(self) -> bool:
        """Its attempt's work is done and its report is in: every container ended, `main` with exit
        code 0, and the reporter's envelope in the status (docs/design.md#early-result)."""
        return self.containers_ended and self.main_exit_code == 0 and self.reporter_message is not None


@dataclass(frozen=True)
class ObservedJob:
    """An iteration attempt Job, found by its labels."""

    name: str
    uid: str
    step_index: int  # 1-based, from the step-index label
    iteration: int  # 1-based
    attempt: int  # 1-based
    outcome: JobOutcome
    deleting: bool = False
    started_at: datetime | None = None
    finished_at: datetime | None = None
    message: str | None = None  # the Job's Failed (or FailureTarget) condition message, when it failed
    ttl_seconds_after_finished: int | None = None
    # The Job controller has decided the outcome (`FailureTarget` / `SuccessCriteriaMet`, Kubernetes
    # >= 1.31) but not yet marked the Job `Failed` / `Complete`, which it does only once every pod
    # of the Job has terminated: its pods may still run (docs/design.md#job-lifecycle).
    settling: bool = False
    path: str = ""  # the step-path label of a nested step's Job (`2i3-1`); "" for a top-level step
    label: str = ""  # its step annotation, the path as logs name it (`develop/iteration 2/review`)
    completions: int = 1  # spec.completions: more than 1 for a loop's candidates (an Indexed Job)
    # A warm loop's Job: the digest of its pod template without what changes per iteration
    # (jobs/warm_pod.py); the next iteration runs in its pod only when its own Job has the same.
    warm_template: str | None = None

    @property
    def warm(self) -> bool:
        return self.warm_template is not None

    @property
    def finished(self) -> bool:
        """Its outcome is decided (the result may be recorded); its pods may still be stopping."""
        return self.outcome != "Active"

    @property
    def settled(self) -> bool:
        """Decided and marked `Complete`/`Failed`: the Job controller saw every pod of it terminate."""
        return self.finished and not self.settling


@dataclass(frozen=True)
class WarmResult:
    """The last iteration a warm pod's supervisor finished: its exit code and its control envelope
    (the text a cold reporter writes to its termination message)."""

    id: str
    exit_code: int
    envelope: str
    finished_at: datetime | None = None
    acked: bool = False


@dataclass(frozen=True)
class ObservedWarm:
    """What the operator last heard from a warm pod's supervisor (docs/design.md#warm-channel).

    `phase` is `running`, `idle` or `stopping`, None before the first answer. `error` is why the last
    request failed while that lasts (since `error_since`): the supervisor did not answer, answered
    garbage or without the run's signature."""

    pod: str
    phase: str | None = None
    running: str | None = None
    result: WarmResult | None = None
    error: str | None = None
    error_since: datetime | None = None


@dataclass(frozen=True)
class IdempotencyClaim:
    """The claim object for (namespace, agentRef, idempotencyKey), when one exists."""

    name: str
    holder_uid: str
    holder_name: str
    # The holder AgentRun as the shell found it: its phase, or gone (deleted, or replaced by a new
    # run of the same name). Whether that counts as finished is the planner's rule.
    holder_phase: str | None = None
    holder_gone: bool = False


@dataclass(frozen=True)
class Observed:
    """Everything observed for one reconcile of one AgentRun."""

    jobs: tuple[ObservedJob, ...] = ()
    pods: tuple[ObservedPod, ...] = ()
    claim: IdempotencyClaim | None = None
    claim_checked: bool = False  # the shell looked the claim up (so None means "no claim")
    # Referenced read-only objects by name (raw spec dicts; None when looked up and not found).
    agents: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    providers: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    implementation_specs: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    # VersionControlProviders by name (raw spec dicts; None when looked up and not found).
    vcs_providers: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    # The keys of the Secrets version control reads, by name (None: not found); None: not checked.
    secret_keys: dict[str, frozenset[str] | None] | None = None
    # PVC claim names that exist in the namespace (None: not checked).
    pvc_names: frozenset[str] | None = None
    # Of those, the claims not bound to a volume yet, with their phase (e.g. {"ws": "Pending"}).
    pvc_unbound: dict[str, str] = field(default_factory=dict)
    # Keys of the ConfigMaps and Secrets the run's Agent refers to (its systemPromptRef), by
    # `ConfigMap/name` or `Secret/name`; None when looked up and not found, absent when not checked.
    object_keys: dict[str, frozenset[str] | None] = field(default_factory=dict)
    # Writes of this reconcile the API server refused for good (the shell re-plans with them).
    refusals: tuple[Refusal, ...] = ()
    # What each warm pod's supervisor last said, by pod name (planner/warm.py).
    warm: dict[str, ObservedWarm] = field(default_factory=dict)

    def refusal(self, what: RefusedWrite, name: str) -> Refusal | None:
        return next((r for r in self.refusals if r.what == what and r.name == name), None)

    def pods_of(self, job_name: str) -> tuple[ObservedPod, ...]:
        return tuple(p for p in self.pods if p.job_name == job_name)

    def job(self, name: str) -> ObservedJob | None:
        return next((j for j in self.jobs if j.name == name), None)
