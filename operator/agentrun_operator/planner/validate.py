"""Validation of an AgentRun before its first Job (docs/concepts.md#validation;
why these rules: docs/design.md#validation-rules).

Two entry points share every rule:

- `validate_run` — the operator's check of a parsed run against this installation (feature flag,
  iteration cap) and the referenced objects the shell observed;
- `validate_manifest` — the offline check behind `agentrun validate FILE…`: parse errors become
  problems too, and references are skipped (there is no cluster to look them up in).

Every `Problem` names the field path, the bad value, what is wrong, how to fix it and a docs anchor,
so a status message, an Event and a CLI line are each enough to act on without reading code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel, ValidationError

from agentrun_operator.api import AgentRun, WorkloadVolume, error_path
from agentrun_operator.api.base import DOCS_API
from agentrun_operator.api.errors import at_rule_field
from agentrun_operator.api.resources import (
    Agent,
    AgentProvider,
    AgentProviderSpec,
    AgentSpec,
    ImplementationSpec,
    ImplementationSpecSpec,
)
from agentrun_operator.api.vcs import VersionControlProvider
from agentrun_operator.config import OperatorConfig
from agentrun_operator.jobs.builder import RESERVED_VOLUME_PREFIX, volume_holding
from agentrun_operator.jobs.checkpoint_args import checkpoint_volume
from agentrun_operator.planner import compat
from agentrun_operator.planner.envelope import metadata_problems
from agentrun_operator.planner.observed import Observed
from agentrun_operator.planner.tree import StepNode, walk
from agentrun_operator.planner.validate_compat import compat_problems
from agentrun_operator.planner.validate_flow import flow_problems
from agentrun_operator.planner.validate_warm import warm_problems
from agentrun_operator.problem import REASON_INVALID_SPEC as REASON_INVALID_SPEC
from agentrun_operator.problem import Problem as Problem
from agentrun_operator.problem import api as _api
from agentrun_operator.problem import concepts as _concepts
from agentrun_operator.problem import format_value as format_value
from agentrun_operator.resolution import (
    References,
    control_path,
    effective_workload,
    implementation_spec_refs,
)

REASON_LOOPS_DISABLED: Final = "WorkflowLoopsDisabled"

_SEE_DOCS: Final = re.compile(r"\s*See (docs/[\w./-]+#[\w-]+)\s*$")


# ----------------------------------------------------------------------------------- steps


def _step_views(run: AgentRun) -> list[StepNode]:
    """Every step of the tree (nested ones too), each with its field path."""
    return list(walk(run))


def _effective_volumes(run: AgentRun, view: StepNode) -> tuple[list[WorkloadVolume], str]:
    """The step's effective volumes and the field path they come from (step's list, else the run's)."""
    if view.step.workload is not None and view.step.workload.volumes is not None:
        return list(view.step.workload.volumes), f"{view.field_path}.workload.volumes"
    workload = effective_workload(run.spec.workload, None)
    return list(workload.volumes or []), "spec.workload.volumes"


# ----------------------------------------------------------------------------------- rules


def _runtime_problems(run: AgentRun, config: OperatorConfig, check_flag: bool) -> Iterator[Problem]:
    spec = run.spec
    workflow = spec.workflow
    if spec.runtime.type == "job" and workflow is not None and len(workflow.steps) > 1:
        yield Problem(
            "spec.workflow.steps",
            [s.name for s in workflow.steps],
            f"runtime.type job runs a single Job, but the workflow has {len(workflow.steps)} steps",
            "set spec.runtime.type: workflow, or keep one step",
            _concepts("runtime-job"),
        )
    for view in _step_views(run):
        if view.step.loop is None:
            continue
        if check_flag and not config.loops_enabled:
            yield Problem(
                f"{view.field_path}.loop",
                {"maxIterations": view.step.loop.max_iterations},
                "workflow loops are disabled on this operator (feature flag off)",
                "remove the loop, or ask the operator's admin to switch loops on "
                "(AGENTS_CONTROLLER_WORKFLOW_LOOPS_ENABLED=true, set from the Helm chart's values)",
                _concepts("feature-flag"),
                reason=REASON_LOOPS_DISABLED,
            )


def _loop_problems(run: AgentRun, view: StepNode, config: OperatorConfig) -> Iterator[Problem]:
    loop = view.step.loop
    if loop is None:
        return
    if loop.max_iterations > config.loop_max_iterations:
        yield Problem(
            f"{view.field_path}.loop.maxIterations",
            loop.max_iterations,
            f"loop.maxIterations exceeds this operator's cap of {config.loop_max_iterations}",
            f"set maxIterations to at most {config.loop_max_iterations}, or ask the operator's admin "
            "to raise AGENTS_CONTROLLER_WORKFLOW_LOOP_MAX_ITERATIONS",
            _concepts("iteration-cap"),
        )
    stall = loop.stall
    if stall is not None and loop.items is None and stall.window > loop.max_iterations:
        yield Problem(
            f"{view.field_path}.loop.stall.window",
            stall.window,
            f"loop.stall.window is larger than loop.maxIterations ({loop.max_iterations}), so the loop "
            "ends before a stall could ever be seen",
            f"set window to at most {loop.max_iterations} (2 or 3 is usual), or remove loop.stall",
            _concepts("stall-detection"),
        )
    yield from _state_problems(run, view)
    yield from _checkpoint_problems(run, view)
    yield from candidates_problems(run, view)


def _checkpoint_problems(run: AgentRun, view: StepNode) -> Iterator[Problem]:
    """loop.checkpoint needs a read-write PVC to keep the checkpoints on, and a looping workload step
    (each attempt's pod records and restores; a loop body's children are several pods)."""
    loop = view.step.loop
    if loop is None or loop.checkpoint is None or not loop.checkpoint.enabled:
        return
    path = f"{view.field_path}.loop.checkpoint.mode"
    if view.step.steps is not None or view.step.switch is not None:
        yield Problem(
            path,
            loop.checkpoint.mode,
            "loop.checkpoint is supported on a looping workload step, not on a loop body (steps:) or a "
            "switch: each attempt's own pod records and restores the volume",
            "move loop.checkpoint to the looping workload step whose retries should start clean, or "
            "remove it",
            _concepts("checkpoints"),
        )
        return
    volumes, volumes_path = _effective_volumes(run, view)
    if not any(v.type == "pvc" and not v.read_only for v in volumes):
        yield Problem(
            path,
            loop.checkpoint.mode,
            "loop.checkpoint needs a read-write pvc volume (a ReadWriteOnce or ReadWriteMany claim) to keep "
            f"the checkpoints on, and {volumes_path} has none",
            f"add a volume of type pvc (claimName, not readOnly) to {volumes_path} and list it in "
            "loop.state.volumeNames, or set mode: None",
            _concepts("checkpoints"),
        )
        return
    named = list(loop.state.volume_names or []) if loop.state is not None else []
    by_name = {v.name: v for v in volumes}
    if named and not any(
        by_name.get(n) is not None and by_name[n].type == "pvc" and not by_name[n].read_only for n in named
    ):
        yield Problem(
            f"{view.field_path}.loop.state.volumeNames",
            named,
            "loop.checkpoint records the loop's state volume, and none of loop.state.volumeNames is a "
            "read-write pvc volume",
            "list the read-write pvc volume that holds the workspace first in loop.state.volumeNames",
            _concepts("checkpoints"),
        )


def candidates_problems(run: AgentRun, view: StepNode) -> Iterator[Problem]:
    """loop.candidates: each candidate's `main` works on a copy of the checkpointed volume, so the
    control file it writes must be on that volume (or on none, the pod's own)."""
    loop = view.step.loop
    if loop is None or loop.candidates is None:
        return
    if view.step.steps is not None or view.step.switch is not None or view.parent is not None:
        yield Problem(
            f"{view.field_path}.loop.candidates",
            loop.candidates.count,
            "loop.candidates is supported on a top-level looping workload step, not on a loop body "
            "(steps:), a switch, or a step inside a group or loop body: each candidate is a pod of the "
            "step's own, and its winner becomes the workspace the run's next step sees",
            "move the step with loop.candidates to the top level of spec.workflow.steps, or remove "
            "loop.candidates",
            _concepts("candidates"),
        )
        return
    volumes, _ = _effective_volumes(run, view)
    path = control_path(view.step)
    holder = volume_holding(path, volumes)
    volume = checkpoint_volume(loop, volumes, holder)
    if holder is not None and holder.type == "pvc" and volume is not None and holder.name != volume.name:
        yield Problem(
            f"{view.field_path}.loop.candidates",
            path,
            f"the control file {path} is on volume {holder.name!r}, which the candidates share, not on "
            f"the checkpointed volume {volume.name!r} that each candidate gets its own copy of",
            f"put the control file under {volume.mount_path} (loop.condition.source.path), or list "
            f"{holder.name} first in loop.state.volumeNames",
            _concepts("candidates"),
        )


def _resume_problems(run: AgentRun) -> Iterator[Problem]:
    """spec.resumeFrom restores the source's checkpoint in a looping step with loop.checkpoint."""
    resume = run.spec.resume_from
    if resume is None:
        return
    steps = run.spec.workflow.steps if run.spec.workflow is not None else []
    checkpointed = [
        s.name
        for s in steps
        if s.loop is not None and s.loop.checkpoint is not None and s.loop.checkpoint.enabled
    ]
    if resume.step is not None and resume.step not in checkpointed:
        yield Problem(
            "spec.resumeFrom.step",
            resume.step,
            "resumeFrom.step must name a top-level looping step with loop.checkpoint "
            f"(this run has: {', '.join(checkpointed) or 'none'})",
            "name the looping step the source run's checkpoints belong to, or leave step out",
            _concepts("resume"),
        )
    elif not checkpointed:
        yield Problem(
            "spec.resumeFrom",
            resume.model_dump(by_alias=True, exclude_none=True),
            "resumeFrom starts a looping step from a checkpoint, and no top-level step has loop.checkpoint "
            "with mode: Files",
            "keep the source run's loop.checkpoint in this run's spec (agentrun resume copies it)",
            _concepts("resume"),
        )


def _state_problems(run: AgentRun, view: StepNode) -> Iterator[Problem]:
    loop = view.step.loop
    if loop is None or loop.state is None:
        return
    state = loop.state
    path = f"{view.field_path}.loop.state"
    names = list(state.volume_names or [])
    volumes, volumes_path = _effective_volumes(run, view)
    by_name = {v.name: v for v in volumes}
    for i, name in enumerate(names):
        if name not in by_name:
            known = sorted(by_name) or "none"
            yield Problem(
                f"{path}.volumeNames[{i}]",
                name,
                f"volume {name!r} is not among the step's effective workload volumes "
                f"({volumes_path}: {known})",
                f"add a volume named {name!r} to {volumes_path} (a step's volumes replace the run's), "
                "or list an existing one",
                _concepts("loop-state"),
            )
    if not state.required:
        return
    listed = [by_name[n] for n in names if n in by_name]
    pvcs = [v for v in listed if v.type == "pvc"]
    if listed and not pvcs:
        yield Problem(
            f"{path}.volumeNames",
            names,
            "loop.state.required is true but none of the listed volumes is of type pvc "
            f"({', '.join(f'{v.name}: {v.type}' for v in listed)}); emptyDir and secret volumes do not "
            "survive from one iteration's pod to the next",
            "list a volume of type pvc (with claimName) that holds the state",
            _concepts("loop-state"),
        )
    for volume in pvcs:
        if volume.read_only:
            yield Problem(
                f"{volumes_path}[{volumes.index(volume)}].readOnly",
                True,
                f"state volume {volume.name!r} is mounted read-only, so iterations cannot change the state",
                "remove readOnly: true from the state volume",
                _concepts("loop-state"),
            )


def _volume_problems(run: AgentRun, observed: Observed | None) -> Iterator[Problem]:
    """Every volume list in the spec (run's and each step's), checked once per list."""
    lists: list[tuple[str, list[WorkloadVolume]]] = []
    if run.spec.workload is not None and run.spec.workload.volumes is not None:
        lists.append(("spec.workload.volumes", list(run.spec.workload.volumes)))
    for view in _step_views(run):
        if view.step.workload is not None and view.step.workload.volumes is not None:
            lists.append((f"{view.field_path}.workload.volumes", list(view.step.workload.volumes)))
    for list_path, volumes in lists:
        yield from _volume_list_problems(list_path, volumes, observed)


def _volume_list_problems(
    list_path: str, volumes: list[WorkloadVolume], observed: Observed | None
) -> Iterator[Problem]:
    mount_paths: dict[str, str] = {}
    for i, volume in enumerate(volumes):
        path = f"{list_path}[{i}]"
        if volume.name.startswith(RESERVED_VOLUME_PREFIX):
            yield Problem(
                f"{path}.name",
                volume.name,
                f"volume names starting with {RESERVED_VOLUME_PREFIX!r} are reserved for the operator's own "
                "volumes in the iteration pod",
                "rename the volume",
                _concepts("iteration-pod"),
            )
        normalized = volume.mount_path.rstrip("/") or "/"
        if normalized in mount_paths:
            yield Problem(
                f"{path}.mountPath",
                volume.mount_path,
                f"volumes {mount_paths[normalized]!r} and {volume.name!r} are mounted at the same path",
                "give each volume its own mountPath",
                _api("workload-volumes"),
            )
        mount_paths.setdefault(normalized, volume.name)
        if (
            observed is not None
            and observed.pvc_names is not None
            and volume.type == "pvc"
            and volume.claim_name
            and volume.claim_name not in observed.pvc_names
        ):
            yield Problem(
                f"{path}.claimName",
                volume.claim_name,
                f"PersistentVolumeClaim {volume.claim_name!r} does not exist in the namespace "
                "(the iteration pod could never start)",
                f"create the PersistentVolumeClaim {volume.claim_name!r}, or name an existing one",
                _concepts("references"),
                missing=f"PersistentVolumeClaim/{volume.claim_name}",
            )


# ----------------------------------------------------------------------------------- references


@dataclass(frozen=True)
class ReferenceResolution:
    """The parsed referenced objects, and a problem for each one that is missing or malformed."""

    refs: References
    problems: tuple[Problem, ...]


def _lookup(
    table: Mapping[str, dict[str, Any] | None],
    name: str,
    kind: str,
    model: type[BaseModel],
    path: str,
) -> tuple[Any, Problem | None]:
    """Parse the observed spec of `kind/name`; an absent key counts as not found (the shell looks
    up every referenced name, so absence means it found nothing)."""
    raw = table.get(name)
    if raw is None:
        return None, Problem(
            path,
            name,
            f"{kind} {name!r} does not exist in the run's namespace",
            f"create {kind} {name!r} (kubectl apply it), or correct the name",
            _concepts("references"),
            missing=f"{kind}/{name}",
        )
    try:
        return model.model_validate(raw), None
    except ValidationError as err:
        first = err.errors()[0]
        where = error_path(tuple(first["loc"])) or "spec"
        return None, Problem(
            path,
            name,
            f"{kind} {name!r} has an invalid spec ({where}: {first['msg']})",
            f"fix {kind} {name!r} (agentrun validate can check it)",
            _concepts("references"),
        )


def resolve_references(run: AgentRun, observed: Observed) -> ReferenceResolution:
    """Look up the Agent (and its AgentProvider) and every ImplementationSpec the run names."""
    problems: list[Problem] = []
    agent: AgentSpec | None = None
    provider: AgentProviderSpec | None = None
    if run.spec.agent_ref is not None:
        agent, problem = _lookup(
            observed.agents, run.spec.agent_ref.name, "Agent", AgentSpec, "spec.agentRef.name"
        )
        problems += [problem] if problem else []
        if agent is not None and agent.provider_ref is not None:
            provider, problem = _lookup(
                observed.providers,
                agent.provider_ref.name,
                "AgentProvider",
                AgentProviderSpec,
                "spec.agentRef.name",
            )
            if problem is not None:
                problems.append(_via_agent(problem, run.spec.agent_ref.name))
    impl_specs: dict[str, ImplementationSpecSpec] = {}
    for path, name in _implementation_refs(run):
        if name in impl_specs:
            continue
        spec, problem = _lookup(
            observed.implementation_specs, name, "ImplementationSpec", ImplementationSpecSpec, path
        )
        if spec is not None:
            impl_specs[name] = spec
        elif problem is not None and not any(
            p.missing == problem.missing and p.path == path for p in problems
        ):
            problems.append(problem)
    refs = References(
        agent,
        provider,
        impl_specs,
        agent_name=run.spec.agent_ref.name if run.spec.agent_ref is not None else "",
        provider_name=agent.provider_ref.name if agent is not None and agent.provider_ref is not None else "",
        vcs_providers=observed.vcs_providers,
        secret_keys=observed.secret_keys,
    )
    return ReferenceResolution(refs, tuple(problems))


def _via_agent(problem: Problem, agent_name: str) -> Problem:
    """Say that the provider is missing *through* the Agent, since the run does not name it."""
    return Problem(
        problem.path,
        problem.value,
        f"Agent {agent_name!r} uses providerRef {problem.value!r}, but {problem.message}",
        problem.fix,
        problem.docs,
        problem.reason,
        problem.missing,
    )


def _implementation_refs(run: AgentRun) -> Iterator[tuple[str, str]]:
    return implementation_spec_refs(run)


# ----------------------------------------------------------------------------------- entry points


def _spec_problems(
    run: AgentRun, observed: Observed | None, config: OperatorConfig, check_flag: bool
) -> list[Problem]:
    problems: list[Problem] = list(_runtime_problems(run, config, check_flag))
    for view in _step_views(run):
        problems.extend(_loop_problems(run, view, config))
        problems.extend(warm_problems(run, view))
    problems.extend(_resume_problems(run))
    problems.extend(_volume_problems(run, observed))
    problems.extend(flow_problems(run))
    problems.extend(compat.static_problems(run))
    return problems


def validate_run(run: AgentRun, observed: Observed, config: OperatorConfig) -> list[Problem]:
    """All problems of `run` on this installation; empty when it may start.

    Includes the feature flag, the iteration cap, every CEL expression, volumes, and the referenced
    Agent/AgentProvider/ImplementationSpec objects and PVCs the shell observed (problems with
    `missing` set; the planner gives those a grace period before calling the run invalid).
    """
    problems = _spec_problems(run, observed, config, check_flag=True)
    resolution = resolve_references(run, observed)
    problems.extend(resolution.problems)
    if not resolution.problems:
        problems.extend(compat.reference_problems(run, resolution.refs, observed))
    problems.extend(compat_problems(run, resolution.refs))
    return problems


def validate_static(run: AgentRun, config: OperatorConfig, *, check_flag: bool = True) -> list[Problem]:
    """The rules that need no cluster: everything but referenced objects."""
    return _spec_problems(run, None, config, check_flag)


_KIND_MODELS: Final[dict[str, type[BaseModel]]] = {
    "AgentRun": AgentRun,
    "Agent": Agent,
    "AgentProvider": AgentProvider,
    "ImplementationSpec": ImplementationSpec,
    "VersionControlProvider": VersionControlProvider,
}


def validate_manifest(obj: dict[str, Any], config: OperatorConfig) -> list[Problem]:
    """Offline validation of one manifest of any of our kinds (AgentRun, Agent, AgentProvider,
    ImplementationSpec, VersionControlProvider). The envelope first (planner/envelope.py: metadata
    as the API server checks it), then the kind's model: parse errors become problems with their
    field path; references are skipped.
    """
    kind = obj.get("kind")
    model = _KIND_MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        return [
            Problem(
                "kind",
                kind,
                f"unknown kind {kind!r} for {obj.get('apiVersion')}",
                f"use one of {', '.join(_KIND_MODELS)}",
                DOCS_API,
            )
        ]
    problems = metadata_problems(obj)
    if not isinstance(obj.get("metadata"), Mapping):  # said once above, not again by the model
        obj = {**obj, "metadata": {}}
    try:
        # Strict, from JSON, as the API server reads a manifest: `maxIterations: true` or `"3"` is
        # refused there, where lax parsing would take them as 1 and 3.
        parsed = model.model_validate_json(json.dumps(obj, default=str), strict=True)
    except ValidationError as err:
        docs = _api(f"fields-{str(kind).lower()}")
        return [*problems, *(_problem_from_error(item, docs) for item in err.errors())]
    if isinstance(parsed, AgentRun):
        return [*problems, *validate_static(parsed, config)]
    if isinstance(parsed, AgentProvider):
        return [*problems, *compat.provider_problems(parsed.spec)]
    return problems


def _problem_from_error(item: Any, docs: str) -> Problem:
    """A pydantic error item as a Problem; our rule messages carry `…; fix. See docs/…#anchor`."""
    loc = tuple(p for p in item["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    path = error_path(loc) or "(root)"
    text = str(item["msg"]).removeprefix("Value error, ")
    match = _SEE_DOCS.search(text)
    if match:
        docs = match.group(1)
        text = text[: match.start()]
    if item["type"] == "extra_forbidden":
        return _unknown_field(path, item.get("input"), docs)
    if item["type"] == "missing":
        field = path.rsplit(".", 1)[-1]
        return Problem(path, None, "required field is missing", f"add {field}", docs)
    path, field_path = at_rule_field(path, str(item["msg"]).removeprefix("Value error, "))
    value = item.get("input")
    if field_path is not None:
        value = _value_at(value, field_path)
    message, _, fix = text.rstrip(".").partition("; ")
    return Problem(path, value, message, fix or "correct the value", docs)


_STEP_FIELD: Final = re.compile(r"(?:^|\.)steps\[\d+\]$")
_LOOP_FIELD_ANCHORS: Final = {
    "intervalSeconds": "loop-intervalseconds",
    "maxIterations": "loop-maxiterations",
}


def _unknown_field(path: str, value: Any, docs: str) -> Problem:
    """An unknown field; a field of `loop` written on the step itself (`intervalSeconds` next to
    `loop` rather than in it) is told where it belongs, since the spelling is right."""
    parent, _, name = path.rpartition(".")
    if name in _LOOP_FIELD_ANCHORS and _STEP_FIELD.search(parent):
        return Problem(
            path,
            value,
            f"{name} is a field of the step's loop, not of the step",
            f"move it into the step's loop, as {parent}.loop.{name} (a step without loop runs once)",
            _api(_LOOP_FIELD_ANCHORS[name]),
        )
    return Problem(path, value, "unknown field", "check the spelling against the API", docs)


def _value_at(obj: Any, field_path: str) -> Any:
    """The value at a relative field path (`.runtime.type`) of a manifest fragment; None if absent."""
    for key in field_path.lstrip(".").split("."):
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj
