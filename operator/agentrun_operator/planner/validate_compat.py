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
from agentrun_operator.jobs.builder import volume_holding
from agentrun_operator.jobs.pod_compat import implementation_document, provider_contract, run_vcs
from agentrun_operator.jobs.reporter_container import META_MOUNT
from agentrun_operator.jobs.runner_contract import (
    RunnerContract,
    RunnerInputs,
    file_collision,
    input_files,
    reserved_paths,
    template_context,
)
from agentrun_operator.planner.tree import StepNode, walk
from agentrun_operator.problem import Problem
from agentrun_operator.problem import api as _api
from agentrun_operator.resolution import References, effective_parameters, effective_workload

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
    for index, (path, _) in enumerate(rendered):
        # Relative paths, duplicates and the step's volume mounts: planner/compat.py (unrendered).
        norm = posixpath.normpath(path)
        if not path.startswith("/"):
            continue
        clash = "a file the runner contract mounts itself" if norm in reserved_paths() else None
        if file_collision(norm, [META_MOUNT]) is not None or norm.startswith(META_MOUNT + "/"):
            clash = f"the operator's own mount {META_MOUNT!r}"
        if clash is not None:
            yield Problem(
                _WHERE,
                path,
                f"{provider} inputFiles[{index}].path collides with {clash} in the pod of step {view.path!r}",
                f"give the input file a path of its own in {provider} (not /workspace/run.json, "
                f"/workspace/agent-runner.json or under {META_MOUNT})",
                _api("runner-contract"),
            )
    for index, artifact in enumerate(contract.output_artifacts):
        file_path = artifact.file_path
        if file_path is None or volume_holding(file_path, volumes) is not None:
            continue
        directory = posixpath.dirname(file_path)
        if (
            directory == "/"
            or file_collision(directory, [META_MOUNT])
            or directory.startswith(META_MOUNT + "/")
        ):
            yield Problem(
                _WHERE,
                artifact.path,
                f"{provider} outputArtifacts[{index}] ({artifact.name!r}) is at {file_path}, on no volume of "
                f"step {view.path!r}, and the operator cannot give its directory {directory!r} one "
                "(it mounts an emptyDir at an artifact's directory otherwise), so nothing could report it",
                "put the artifact in a directory of its own (e.g. /workspace/out/), or mount a volume there",
                _api("output-artifacts"),
            )
