"""Pure builders that turn one planned iteration attempt into a batch/v1 Job manifest
(docs/design.md#iteration-pod).

Nothing here talks to Kubernetes: the planner calls `build_iteration_job` and hands the dict to the
shell inside a `CreateJob` action. Because the output depends only on the inputs, the same planned
attempt always yields the same manifest (and the same deterministic name), which is what makes a
re-created Job adoptable after an operator restart.

Pod layout (why it looks like this):

- `reporter` — a native sidecar (init container with `restartPolicy: Always`) of the operator image.
  It is declared *first* so it is running (and has blocked SIGTERM, see `control/reporter.py`) before
  anything else; it reads the control file once the main container has ended and writes the control
  envelope to its termination message, where the operator reads it. Before that, first thing, it
  claims the Job for its pod on the control file's volume (a duplicate pod of the Job never runs
  `main`, docs/concepts.md#exactly-once) and records what the control file looked like before `main`
  ran, so a file left by an earlier iteration is reported `stale` instead of being mistaken for this
  iteration's answer. Its postStart hook waits until it has (the kubelet starts `main` only once
  the hook has completed) and fails in a duplicate pod. A hook rather than a regular init container
  saves a container start, about a second a pod on a real node (docs/design.md#fingerprint-hook).
- `main` — the agent (or user) container; named `agent-runner`, the original controller's name, in a
  run without loops (`workload_container_name`, docs/migration.md#runner-pod).

The reporter mounts the volume that holds the control path at the same mount path as `main` (the
operator never mounts the PVC itself). The Job's claim (`.agentrun-claims/`, the only thing the
reporter writes on a volume) is taken on a PVC (`claim_volume`): the control file's when `main`
writes it, else `main`'s first read-write PVC, else its first PVC (read-only: the claim fails and the run says
so); a pod without a PVC shares no state and takes none. The reporter mounts that volume as `main`
does. When the control path lies on no volume an `emptyDir` is added. A pod with a PVC gets
`fsGroup` (`pod_security_context`), so the kubelet makes a root-owned volume writable for the
helper's uid (docs/design.md#claim-storage).
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from agentrun_operator import naming
from agentrun_operator.api import (
    API_VERSION,
    AgentRun,
    EnvVar,
    LoopWarm,
    WorkflowStep,
    Workload,
    WorkloadVolume,
)
from agentrun_operator.config import OperatorConfig
from agentrun_operator.control.claim import CLAIMS_DIR
from agentrun_operator.jobs import system_prompt
from agentrun_operator.jobs.candidates import add_candidates, candidates_job_spec
from agentrun_operator.jobs.checkpoint_args import (
    CHECKPOINT_FACTS_NAME,
    CHECKPOINT_SECURITY_CONTEXT,
    CheckpointPlan,
    checkpoint_volume,
    excluded_paths,
    reporter_checkpoint_args,
)
from agentrun_operator.jobs.pod_compat import PodParts, extend_pod
from agentrun_operator.jobs.reporter_container import (
    MAIN_CONTAINER,
    META_MOUNT,
    META_VOLUME,
    ORIGINAL_CONTAINER,
    READY_HOOK_POLLS_CHECKPOINT,
    gate_mount,
    knock_mount,
    ready_lifecycle,
    reporter_container,
)
from agentrun_operator.jobs.warm_pod import add_warm, iteration_id, template_digest
from agentrun_operator.resolution import (
    References,
    control_path,
    effective_parameters,
    effective_steps,
    effective_workload,
    step_grace_seconds,
    step_timeout_seconds,
)

DEFAULT_CONTAINER_ANNOTATION: Final = "kubectl.kubernetes.io/default-container"
CONTROL_FALLBACK_VOLUME: Final = "agentrun-control"
RESERVED_VOLUME_PREFIX: Final = "agentrun-"
ANNOTATION_RUN_NAME: Final = f"{naming.GROUP}/agent-run-name"
_ENV_NAME_UNSAFE: Final = re.compile(r"[^A-Za-z0-9]")


@dataclass(frozen=True)
class PlannedAttempt:
    """One attempt of one iteration of one step, as the planner decided to start it.

    `step_index` and `iteration` are 1-based (as in Job names); `item_index` is 0-based and set only
    for forEach iterations.
    """

    step_index: int
    iteration: int
    attempt: int
    max_iterations: int = 1
    previous_control: dict[str, Any] | None = None
    item: Any = None
    item_index: int | None = None
    outputs: dict[str, list[Any]] | None = None
    """Collected outputs so far; None when the run collects none (then no AGENTRUN_OUTPUTS)."""
    previous: dict[str, Any] | None = None
    """AGENTRUN_PREVIOUS: what the previous attempt and iteration did (planner/feedback.py)."""
    ancestors: tuple[str, ...] = ()
    """For a nested step: its ancestors' segments (`naming.step_address`); `step_index` is then its
    index among its siblings. Empty for a top-level step."""
    step: WorkflowStep | None = None
    """The step's spec, for a nested step (a top-level one is found by `step_index`)."""
    control_path: str | None = None
    """Where the pod leaves its control file, when not the step's own (a loop body's source path)."""
    env_iteration: int | None = None
    """AGENTRUN_ITERATION when it is not `iteration` (a child of a loop body without a loop of its
    own gets the body's iteration, and so does its `iteration` label; its Job name keeps iteration 1,
    and the body's iteration is in the name's step address, `2i3-1`)."""
    path: str | None = None
    prefer_node: str | None = None
    """The node the run's newest stopped pod ran on (`planner/placement.py`): a pod with a PVC prefers
    it, where the volume is attached (docs/design.md#next-pod-placement)."""
    """For a nested step: its path as Events and logs name it (`develop/iteration 2/review`), kept in
    the Job's `naming.ANNOTATION_STEP` annotation so every decision about the Job can name it."""

    checkpoint: CheckpointPlan | None = None
    """loop.checkpoint: what the reporter restores and records before `main` (planner/checkpoints.py)."""

    warm: LoopWarm | None = None
    """loop.warm of the step's loop, or of the loop body around it: the pod runs its iterations one
    after the other when told (jobs/warm_pod.py, planner/warm.py)."""
    warm_ttl_seconds: int | None = None
    """A warm Job's `ttlSecondsAfterFinished` at creation (planner/podgc.py `warm_creation_ttl`)."""

    @property
    def top_index(self) -> int:
        """The 1-based index of the top-level step this attempt belongs to."""
        if not self.ancestors:
            return self.step_index
        return int(self.ancestors[0].split("i")[0].split("c")[0])


@dataclass(frozen=True)
class ResolvedContainer:
    """The image/command/args/env of `main`, and which layer supplied the image (for messages)."""

    image: str
    command: list[str] | None
    args: list[str] | None
    env: list[dict[str, Any]]
    source: str


# ----------------------------------------------------------------------------------- container


def _merge_env(layers: Iterable[Iterable[EnvVar] | None]) -> list[dict[str, Any]]:
    """Later layers override earlier ones by name; the first position of a name is kept."""
    merged: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for var in layer or ():
            merged[var.name] = var.to_dict()
    return list(merged.values())


def resolve_container(
    run: AgentRun, step: WorkflowStep, refs: References, config: OperatorConfig
) -> ResolvedContainer:
    """Container resolution: step workload → run workload → Agent's provider → default.

    See docs/concepts.md#iteration-pod.

    A workload image brings its own command/args (the provider's would belong to another image); when
    the image comes from the provider, a workload's command/args still override the provider's.
    Environment is layered provider < Agent < workload, whatever supplied the image.
    """
    workload = effective_workload(run.spec.workload, step.workload)
    env = _merge_env(
        [
            refs.provider.env if refs.provider else None,
            refs.agent.env if refs.agent else None,
            workload.env,
        ]
    )
    step_image = step.workload.image if step.workload is not None else None
    if workload.image is not None:
        source = "step workload" if step_image is not None else "run workload"
        return ResolvedContainer(workload.image, workload.command, workload.args, env, source)
    if refs.provider is not None:
        command = workload.command if workload.command is not None else refs.provider.command
        args = workload.args if workload.args is not None else refs.provider.args
        provider_workload = refs.provider.workload
        image = refs.provider.image or (provider_workload.image if provider_workload else None)
        return ResolvedContainer(image or config.runner_image, command, args, env, "agent provider")
    return ResolvedContainer(config.runner_image, workload.command, workload.args, env, "operator default")


@dataclass(frozen=True)
class Task:
    """What the pod is asked to do: the text, its summary and the ImplementationSpec's criteria."""

    text: str | None = None
    summary: str | None = None
    acceptance_criteria: tuple[str, ...] = ()


def resolve_implementation(run: AgentRun, step: WorkflowStep, refs: References) -> Task:
    """The task: the step's inline/ref, else the run's inline/ref, else none.

    All three parts come from the same source: a step's inline task never carries the run's
    ImplementationSpec's criteria along (only its own `acceptanceCriteria`).
    """
    for inline, ref in (
        (step.implementation, step.implementation_spec_ref),
        (run.spec.implementation, run.spec.implementation_spec_ref),
    ):
        if inline is not None:
            task = inline.inline
            return Task(task.text, task.summary, tuple(task.acceptance_criteria or ()))
        if ref is not None:
            spec = refs.implementation_specs.get(ref.name)
            if spec is None:
                return Task()
            return Task(spec.text, spec.summary, tuple(spec.acceptance_criteria or ()))
    return Task()


# ----------------------------------------------------------------------------------- env


def param_env_name(name: str) -> str:
    """`AGENTRUN_PARAM_<NAME>`: upper-cased, every non-alphanumeric character replaced by `_`."""
    return "AGENTRUN_PARAM_" + _ENV_NAME_UNSAFE.sub("_", name).upper()


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def agentrun_env(
    run: AgentRun,
    step: WorkflowStep,
    attempt: PlannedAttempt,
    refs: References,
) -> list[dict[str, Any]]:
    """The operator-injected environment of `main` (listed first, so `$(VAR)` can refer to it).

    Parameter names that collide after sanitising (`a-b`, `a_b`) keep the first in sorted order; the
    full map is always in `AGENTRUN_PARAMETERS`.
    """
    meta = run.metadata
    parameters = effective_parameters(run, step)
    env: dict[str, str] = {
        "AGENTRUN_NAME": str(meta.get("name", "")),
        "AGENTRUN_NAMESPACE": str(meta.get("namespace", "")),
        "AGENTRUN_STEP": step.name,
        "AGENTRUN_ITERATION": str(attempt.env_iteration or attempt.iteration),
        "AGENTRUN_MAX_ITERATIONS": str(attempt.max_iterations),
        "AGENTRUN_ATTEMPT": str(attempt.attempt),
        "AGENTRUN_LOOP_CONTROL_PATH": attempt.control_path or control_path(step),
        "AGENTRUN_PREVIOUS_CONTROL": _json(attempt.previous_control),
        "AGENTRUN_PREVIOUS": _json(attempt.previous or {"attempt": None, "iteration": None}),
        "AGENTRUN_ITEM": _json(attempt.item),
        "AGENTRUN_ITEM_INDEX": "" if attempt.item_index is None else str(attempt.item_index),
        "AGENTRUN_PARAMETERS": _json(parameters),
    }
    if attempt.outputs is not None:
        env["AGENTRUN_OUTPUTS"] = _json(attempt.outputs)
    for key in sorted(parameters):
        env.setdefault(param_env_name(key), parameters[key])
    task = resolve_implementation(run, step, refs)
    env["AGENTRUN_IMPLEMENTATION_TEXT"] = task.text or ""
    env["AGENTRUN_IMPLEMENTATION_SUMMARY"] = task.summary or ""
    env["AGENTRUN_ACCEPTANCE_CRITERIA"] = _json(list(task.acceptance_criteria))
    goal = run.spec.goal
    if goal is not None:  # docs/api.md#goal
        env["AGENTRUN_GOAL_OBJECTIVE"] = goal.objective
        if goal.token_budget is not None:
            env["AGENTRUN_GOAL_TOKEN_BUDGET"] = str(goal.token_budget)
    return [{"name": name, "value": value} for name, value in env.items()]


# ----------------------------------------------------------------------------------- volumes


def _pod_volume(volume: WorkloadVolume) -> dict[str, Any]:
    if volume.type == "pvc":
        claim: dict[str, Any] = {"claimName": volume.claim_name}
        if volume.read_only:
            claim["readOnly"] = True
        return {"name": volume.name, "persistentVolumeClaim": claim}
    if volume.type == "secret":
        return {"name": volume.name, "secret": {"secretName": volume.secret_name}}
    empty: dict[str, Any] = {}
    if volume.size_limit is not None:
        empty["sizeLimit"] = volume.size_limit
    if volume.medium:
        empty["medium"] = volume.medium
    return {"name": volume.name, "emptyDir": empty}


def _mount(name: str, path: str, read_only: bool) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": name, "mountPath": path}
    if read_only:
        mount["readOnly"] = True
    return mount


def _under(path: str, mount_path: str) -> bool:
    """True when `path` lies inside `mount_path` (component-wise: /work does not hold /workspace/x)."""
    root = mount_path.rstrip("/") or "/"
    return root == "/" or path == root or path.startswith(root + "/")


def volume_holding(path: str, volumes: Iterable[WorkloadVolume]) -> WorkloadVolume | None:
    """The volume whose mountPath is the longest prefix of `path` (the one the file is written to)."""
    best: WorkloadVolume | None = None
    for volume in volumes:
        if _under(path, volume.mount_path) and (
            best is None or len(volume.mount_path.rstrip("/")) > len(best.mount_path.rstrip("/"))
        ):
            best = volume
    return best


@dataclass(frozen=True)
class _PodVolumes:
    volumes: list[dict[str, Any]]
    main_mounts: list[dict[str, Any]]
    reporter_mounts: list[dict[str, Any]]
    claim_volume: WorkloadVolume | None
    """The PVC the reporter claims the Job on (`claim_volume`); None: the pod has no PVC."""

    @property
    def claim_dir(self) -> str | None:
        """`.agentrun-claims/` at the root of the claim volume's mount."""
        if self.claim_volume is None:
            return None
        return posixpath.join(self.claim_volume.mount_path, CLAIMS_DIR)


def claim_volume(volumes: Iterable[WorkloadVolume], holder: WorkloadVolume | None) -> WorkloadVolume | None:
    """The PVC the Job's claim is taken on (docs/concepts.md#exactly-once).

    The control file's volume when it is a PVC `main` writes (where claims always were); else the first
    PVC `main` mounts read-write (the shared state a duplicate pod would write too); else the first
    PVC at all, read-only, so the claim fails and the run says so. None without a PVC: an `emptyDir`
    is the pod's own, nothing is shared for a duplicate to write twice."""
    pvcs = [v for v in volumes if v.type == "pvc"]
    if holder is not None and holder.type == "pvc" and not holder.read_only:
        return holder
    writable = [v for v in pvcs if not v.read_only]
    return next(iter(writable or pvcs), None)


def _pod_volumes(workload: Workload, path: str) -> _PodVolumes:
    """Pod volumes, `main`'s mounts, and the reporter's mounts for the control path.

    The reporter sees the control file's volume, and the claim volume, as `main` does: it takes the
    Job's claim there before `main` starts and writes nothing else (control/claim.py); the report
    itself only reads."""
    user = list(workload.volumes or [])
    volumes = [_pod_volume(v) for v in user]
    main_mounts = [_mount(v.name, v.mount_path, bool(v.read_only)) for v in user]
    meta = _mount(META_VOLUME, META_MOUNT, False)
    holder = volume_holding(path, user)
    if holder is not None:
        reporter_mounts = [meta, _mount(holder.name, holder.mount_path, bool(holder.read_only))]
    else:
        directory = posixpath.dirname(path) or "/"
        volumes.append({"name": CONTROL_FALLBACK_VOLUME, "emptyDir": {}})
        main_mounts.append(_mount(CONTROL_FALLBACK_VOLUME, directory, False))
        reporter_mounts = [meta, _mount(CONTROL_FALLBACK_VOLUME, directory, True)]
    claim = claim_volume(user, holder)
    if claim is not None and claim is not holder:
        reporter_mounts.insert(1, _mount(claim.name, claim.mount_path, bool(claim.read_only)))
    volumes.append({"name": META_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}})
    return _PodVolumes(volumes, main_mounts, reporter_mounts, claim)


# ----------------------------------------------------------------------------------- containers


def has_loops(run: AgentRun) -> bool:
    """Whether any step of the run, at any depth, has a `loop` (forEach included)."""
    pending = list(effective_steps(run))
    while pending:
        step = pending.pop()
        if step.loop is not None:
            return True
        pending += [child for _, child in step.children()]
    return False


def workload_container_name(run: AgentRun) -> str:
    """The name of the workload's container in the run's pods: the original controller's
    `agent-runner` in a run without loops, so its users' tooling (`kubectl logs -c agent-runner`)
    keeps working; `main` in a run with loops, the loop proposal's layout
    (docs/migration.md#runner-pod). One name for every pod of a run."""
    return MAIN_CONTAINER if has_loops(run) else ORIGINAL_CONTAINER


def main_container(
    resolved: ResolvedContainer,
    injected_env: list[dict[str, Any]],
    workload: Workload,
    mounts: list[dict[str, Any]],
    name: str = MAIN_CONTAINER,
) -> dict[str, Any]:
    """The `main` container (named `name`). Injected `AGENTRUN_*` variables win over user variables
    of the same name."""
    injected_names = {e["name"] for e in injected_env}
    env = injected_env + [e for e in resolved.env if e["name"] not in injected_names]
    container: dict[str, Any] = {"name": name, "image": resolved.image}
    if resolved.command is not None:
        container["command"] = list(resolved.command)
    if resolved.args is not None:
        container["args"] = list(resolved.args)
    container["env"] = env
    # No termination message from `main`: the kubelet takes the tail of its log instead (at most 80
    # lines / 2 KiB), so a failed attempt's status says why (docs/troubleshooting.md#why-it-failed).
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    if workload.resources is not None:
        container["resources"] = workload.resources.to_dict()
    if mounts:
        container["volumeMounts"] = mounts
    return container


def secrets_env_from(run: AgentRun) -> dict[str, Any]:
    """`spec.secrets`: every Secret as `envFrom` of `main` (docs/api.md#secrets); empty without any."""
    if not run.spec.secrets:
        return {}
    return {"envFrom": [{"secretRef": {"name": name}} for name in run.spec.secrets]}


# ----------------------------------------------------------------------------------- the Job


def job_labels(run_name: str, step: WorkflowStep, attempt: PlannedAttempt) -> dict[str, str]:
    """Labels on the Job and its pod template; the shell finds a run's Jobs and pods by them."""
    labels = {
        naming.LABEL_RUN: naming.label_value(run_name),
        naming.LABEL_STEP: naming.label_value(step.name),
        naming.LABEL_STEP_INDEX: str(attempt.top_index),
        naming.LABEL_ITERATION: str(attempt.env_iteration or attempt.iteration),
        naming.LABEL_ATTEMPT: str(attempt.attempt),
        naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
    }
    if attempt.env_iteration is not None:  # a loop body's child: the label is the body's iteration
        labels[naming.LABEL_STEP_ITERATION] = str(attempt.iteration)
    if attempt.ancestors:
        labels[naming.LABEL_STEP_PATH] = naming.step_address(attempt.ancestors, attempt.step_index)
    return labels


def owner_reference(run: AgentRun) -> dict[str, Any]:
    """Controller owner reference: deleting the AgentRun garbage-collects its Jobs and pods."""
    return {
        "apiVersion": API_VERSION,
        "kind": "AgentRun",
        "name": str(run.metadata.get("name", "")),
        "uid": str(run.metadata.get("uid", "")),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def iteration_job_name(run: AgentRun, attempt: PlannedAttempt) -> str:
    """The deterministic Job name of a planned attempt (see `naming.job_name`)."""
    return naming.job_name(
        str(run.metadata.get("name", "")),
        attempt.step_index,
        attempt.iteration,
        attempt.attempt,
        attempt.ancestors,
    )


def _pod_spec(
    run: AgentRun,
    step: WorkflowStep,
    attempt: PlannedAttempt,
    refs: References,
    config: OperatorConfig,
    companions: list[dict[str, Any]],
) -> dict[str, Any]:
    workload = effective_workload(run.spec.workload, step.workload)
    path = attempt.control_path or control_path(step)
    volumes = _pod_volumes(workload, path)
    resolved = resolve_container(run, step, refs, config)
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        # The reporter, listed before `main`, sees `main`'s processes end through the shared
        # namespace (docs/design.md#reporter-first); and the pause container is PID 1, so `main` gets
        # the ordinary SIGTERM semantics even when it is `sh -c …` (a PID 1 ignores SIGTERM without
        # a handler, docs/design.md#grace-period).
        "shareProcessNamespace": True,
        "containers": [
            reporter_container(
                path,
                volumes.reporter_mounts,
                config,
                volumes.claim_dir,
                volumes.claim_volume.name if volumes.claim_volume is not None else "",
            ),
            main_container(
                resolved,
                agentrun_env(run, step, attempt, refs),
                workload,
                [*volumes.main_mounts, knock_mount(), gate_mount()],
                workload_container_name(run),
            )
            | secrets_env_from(run),
        ],
        "volumes": volumes.volumes,
    }
    # Kubernetes' default grace (30 s) unless the step or the installation asks; an immediate cancel
    # deletes the pods with a short one instead (docs/design.md#grace-period).
    grace = step_grace_seconds(step, config)
    if grace is not None:
        pod["terminationGracePeriodSeconds"] = grace
    security = pod_security_context(volumes.claim_volume, config)
    if security is not None:
        pod["securityContext"] = security
    if workload.service_account_name:
        pod["serviceAccountName"] = workload.service_account_name
    else:
        pod["automountServiceAccountToken"] = False
    if workload.node_selector:
        pod["nodeSelector"] = dict(workload.node_selector)
    if workload.tolerations:
        pod["tolerations"] = [t.to_dict() for t in workload.tolerations]
    affinity = same_node_affinity(attempt.prefer_node, volumes.claim_volume)
    if affinity is not None:
        pod["affinity"] = affinity
    if attempt.checkpoint is not None:
        containers = pod["containers"]
        _add_checkpoint(containers[0], containers[1], attempt.checkpoint, step, workload, path, volumes)
    parts = PodParts(
        pod,
        pod["containers"][1],
        pod["containers"][0],
        owner_reference(run),
        lambda path: volume_holding(path, workload.volumes or []),
    )
    companions += extend_pod(parts, run, step, workload, refs)
    return pod


def _add_checkpoint(
    reporter: dict[str, Any],
    main: dict[str, Any],
    plan: CheckpointPlan,
    step: WorkflowStep,
    workload: Workload,
    path: str,
    volumes: _PodVolumes,
) -> None:
    """The reporter restores and records the loop's checkpoint before `main` (docs/concepts.md#checkpoints):
    it mounts the checkpointed volume read-write where `main` does, and runs with the file
    capabilities a restore of `main`'s files needs. Nothing changes for a loop without checkpoints."""
    user = list(workload.volumes or [])
    volume = checkpoint_volume(step.loop, user, volume_holding(path, user))
    if volume is None:  # validation refuses such a loop before any Job; never a half-made pod
        return
    mounts = reporter["volumeMounts"]
    if not any(m["name"] == volume.name for m in mounts):
        mounts.append(_mount(volume.name, volume.mount_path, False))
    claims_here = volumes.claim_volume is not None and volumes.claim_volume.name == volume.name
    excluded = excluded_paths(plan, volume, path, claims_here)
    facts = posixpath.join(META_MOUNT, CHECKPOINT_FACTS_NAME)
    reporter["args"] = [*reporter["args"], *reporter_checkpoint_args(plan, volume, excluded, facts)]
    reporter["securityContext"] = dict(CHECKPOINT_SECURITY_CONTEXT)
    reporter["lifecycle"] = ready_lifecycle(READY_HOOK_POLLS_CHECKPOINT)
    if plan.candidates:
        add_candidates(reporter, main, plan, volume)


def same_node_affinity(node: str | None, claim: WorkloadVolume | None) -> dict[str, Any] | None:
    """A soft preference for `node` (by `metadata.name`: a node's hostname label may differ from its
    name) for a pod with a PVC; None without a node or a PVC (nothing attached to stay near)."""
    if node is None or claim is None:
        return None
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": term}]
        }
    }


def pod_security_context(claim: WorkloadVolume | None, config: OperatorConfig) -> dict[str, Any] | None:
    """`fsGroup` (`AGENTS_CONTROLLER_POD_FS_GROUP`) for a pod with a PVC, so the kubelet makes the volume
    group-writable (setgid) for the helper's uid and the Job's claim works on a root-owned `0755`
    volume; `OnRootMismatch` walks the volume only when its root is not set up yet
    (docs/design.md#claim-storage). None without a PVC, or with the setting 0."""
    if claim is None or config.pod_fs_group is None:
        return None
    return {"fsGroup": config.pod_fs_group, "fsGroupChangePolicy": "OnRootMismatch"}


def build_iteration_job(
    run: AgentRun,
    attempt: PlannedAttempt,
    refs: References,
    config: OperatorConfig,
) -> dict[str, Any]:
    """The Job manifest of one iteration attempt (`build_iteration_objects` without the objects to
    create before it)."""
    return build_iteration_objects(run, attempt, refs, config)[0]


def build_iteration_objects(
    run: AgentRun,
    attempt: PlannedAttempt,
    refs: References,
    config: OperatorConfig,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The Job manifest of one iteration attempt (docs/concepts.md#iteration-pod), and the objects to
    create before it (the runner contract's ConfigMap, `jobs/pod_compat.py`). Pure and deterministic.

    `backoffLimit: 0` because retries are the planner's (per iteration, with backoff and pod
    gating); `activeDeadlineSeconds` only when the attempt has a timeout; no TTL at creation: the
    planner sets it once the attempt's result is safely recorded in the run's status -- but for a
    warm Job, which ends only after its loop's results are recorded (`warm_ttl_seconds`).
    """
    step = attempt.step if attempt.step is not None else effective_steps(run)[attempt.step_index - 1]
    run_name = str(run.metadata.get("name", ""))
    labels = job_labels(run_name, step, attempt)
    companions: list[dict[str, Any]] = []
    annotations = {ANNOTATION_RUN_NAME: run_name}
    if attempt.path is not None:
        annotations[naming.ANNOTATION_STEP] = attempt.path
    # `kubectl logs POD` / `kubectl exec` mean the workload, not the reporter listed before it.
    pod_annotations = dict(annotations) | {DEFAULT_CONTAINER_ANNOTATION: workload_container_name(run)}
    pod = _pod_spec(run, step, attempt, refs, config, companions)
    system_prompt.add_to_pod(pod, pod_annotations, refs.agent)  # docs/api.md#system-prompt
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "completions": 1,
        "parallelism": 1,
        "template": {"metadata": {"labels": dict(labels), "annotations": pod_annotations}, "spec": pod},
    }
    if attempt.checkpoint is not None and attempt.checkpoint.candidates:
        candidates_job_spec(job_spec, attempt.checkpoint.candidates, iteration_job_name(run, attempt))
    timeout = step_timeout_seconds(step, refs)
    if timeout > 0:
        job_spec["activeDeadlineSeconds"] = timeout
    if attempt.warm is not None and attempt.warm.enabled:
        first = iteration_id(attempt.env_iteration or attempt.iteration, attempt.attempt)
        add_warm(job_spec, attempt.warm, run_name, config.warm_port, first)
        if attempt.warm_ttl_seconds is not None:
            job_spec["ttlSecondsAfterFinished"] = attempt.warm_ttl_seconds
        job = job_manifest(run, iteration_job_name(run, attempt), labels, annotations, job_spec)
        job["metadata"]["annotations"][naming.ANNOTATION_WARM_TEMPLATE] = template_digest(job)
        return job, companions
    return job_manifest(run, iteration_job_name(run, attempt), labels, annotations, job_spec), companions


def job_manifest(
    run: AgentRun, name: str, labels: dict[str, str], annotations: dict[str, str], spec: dict[str, Any]
) -> dict[str, Any]:
    """A Job of the run: its name, labels and annotations, owned by the run, in the run's namespace."""
    metadata: dict[str, Any] = {
        "name": name,
        "labels": labels,
        "annotations": annotations,
        "ownerReferences": [owner_reference(run)],
    }
    namespace = run.metadata.get("namespace")
    if namespace:
        metadata["namespace"] = str(namespace)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}
