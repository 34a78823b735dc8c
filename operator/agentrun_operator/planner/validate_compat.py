"""Validation of what the original controller's surface adds to a run's pods, before any Job:
the runner contract's input files and output artifacts (docs/api.md#runner-contract,
docs/api.md#output-artifacts) and version control (docs/api.md#version-control).

Checked for every workload step against its effective workload, with the referenced objects the
shell observed; each problem once, however many steps share it.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator

from agentrun_operator.api import AgentRun
from agentrun_operator.jobs.builder import META_MOUNT, volume_holding
from agentrun_operator.jobs.pod_compat import implementation_document, provider_contract, run_vcs
from agentrun_operator.jobs.runner_contract import (
    RunnerContract,
    RunnerInputs,
    file_collision,
    input_files,
    reserved_paths,
    template_context,
)
from agentrun_operator.planner.problem import Problem
from agentrun_operator.planner.problem import api as _api
from agentrun_operator.planner.resolution import References, effective_parameters, effective_workload
from agentrun_operator.planner.tree import StepNode, walk

_WHERE = "spec.agentRef.name"
"""Problems in the provider are reported on the run's field that leads to it (as a missing provider is)."""


def compat_problems(run: AgentRun, refs: References) -> list[Problem]:
    """Every problem of the run's runner contract, artifacts and version control, each once."""
    problems: list[Problem] = []
    contract = provider_contract(refs)
    for view in walk(run):
        if view.step.kind != "workload":
            continue
        found = list(_vcs_problems(run, view, refs))
        if contract is not None:
            found += _contract_problems(run, view, refs, contract)
        problems += [p for p in found if p not in problems]
    return problems


def _vcs_problems(run: AgentRun, view: StepNode, refs: References) -> Iterator[Problem]:
    yield from run_vcs(run, view.step, refs).problems


def _contract_problems(
    run: AgentRun, view: StepNode, refs: References, contract: RunnerContract
) -> Iterator[Problem]:
    workload = effective_workload(run.spec.workload, view.step.workload)
    volumes = list(workload.volumes or [])
    mounts = [v.mount_path for v in volumes] + [META_MOUNT]
    provider = f"AgentProvider {refs.provider_name!r}"
    inputs = RunnerInputs(
        run_name=str(run.metadata.get("name", "")),
        run_uid=str(run.metadata.get("uid", "")),
        namespace=str(run.metadata.get("namespace", "")),
        provider_name=refs.provider_name,
        agent_name=refs.agent_name,
        agent_config={},
        agent_env=[],
        implementation=implementation_document(run, view.step, refs),
        parameters=effective_parameters(run, view.step),
    )
    rendered = input_files(contract, template_context(inputs))
    seen: dict[str, int] = {}
    for index, (path, _) in enumerate(rendered):
        field = f"{provider} inputFiles[{index}].path"
        if not path.startswith("/"):
            yield Problem(
                _WHERE,
                path,
                f"{field} is relative: an input file is mounted at its path, which must be absolute",
                f"make the path absolute in {provider} (e.g. /workspace/{path.lstrip('./')})",
                _api("runner-contract"),
            )
            continue
        norm = posixpath.normpath(path)
        collision = file_collision(norm, mounts)
        if collision is not None or norm in reserved_paths() or norm in seen:
            what = (
                f"the mount path {collision!r} of a volume"
                if collision is not None
                else "a file the runner contract mounts itself"
                if norm in reserved_paths()
                else f"inputFiles[{seen[norm]}]"
            )
            yield Problem(
                _WHERE,
                path,
                f"{field} collides with {what} in the pod of step {view.path!r}",
                f"give the input file a path of its own in {provider} (a file inside a volume is fine; "
                "the volume's own mount path, a directory above a mount, run.json and agent-runner.json "
                "are not)",
                _api("runner-contract"),
            )
        seen.setdefault(norm, index)
    for index, artifact in enumerate(contract.output_artifacts):
        file_path = artifact.file_path
        if file_path is not None and volume_holding(file_path, volumes) is None:
            known = ", ".join(f"{v.name}: {v.mount_path}" for v in volumes) or "none"
            yield Problem(
                _WHERE,
                artifact.path,
                f"{provider} outputArtifacts[{index}] ({artifact.name!r}) is at {file_path}, on no volume of "
                f"step {view.path!r} (volumes: {known}), so nothing could report it after the pod ends",
                "mount a volume (e.g. a pvc or emptyDir) at a directory holding the artifact, "
                "or change its path",
                _api("output-artifacts"),
            )
