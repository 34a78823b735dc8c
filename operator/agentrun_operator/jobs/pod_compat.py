"""What the original controller's surface adds to an iteration pod (docs/api.md#runner-contract,
docs/api.md#version-control, docs/api.md#output-artifacts): the Job builder calls `extend_pod` on the
pod it built and gets back the objects to create before the Job (the runner contract's ConfigMap).

- version control (`jobs/vcs.py`): env, credential volumes; the reporter reads the commit the
  checkout is at before `main` and after it (`--checkout`), when a volume of the pod holds it;
- the runner contract (`jobs/runner_contract.py`), when the provider uses it;
- output artifacts: the reporter stats and hashes each declared file (`--artifact name=path`).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentrun_operator.api import AgentRun, WorkflowStep, Workload, WorkloadVolume
from agentrun_operator.jobs.runner_contract import RunnerContract, RunnerInputs, runner_pod
from agentrun_operator.jobs.vcs import VcsResolution, resolve_vcs
from agentrun_operator.resolution import References, effective_parameters


def _manifest(model: Any) -> dict[str, Any]:
    """A model in manifest form (camelCase), {} for None."""
    return model.to_dict() if model is not None else {}


def implementation_document(run: AgentRun, step: WorkflowStep, refs: References) -> dict[str, Any]:
    """The resolved implementation in manifest form: the step's inline/ref, else the run's (the same
    order as the task text, `builder.resolve_implementation`)."""
    for inline, ref in (
        (step.implementation, step.implementation_spec_ref),
        (run.spec.implementation, run.spec.implementation_spec_ref),
    ):
        if inline is not None:
            return _manifest(inline.inline)
        if ref is not None:
            return _manifest(refs.implementation_specs.get(ref.name))
    return {}


def run_vcs(run: AgentRun, step: WorkflowStep, refs: References) -> VcsResolution:
    """Version control for the step's pods (its parameters and implementation may differ)."""
    return resolve_vcs(
        run.spec.to_dict(),
        run.metadata,
        implementation_document(run, step, refs),
        _manifest(refs.agent) if refs.agent is not None else None,
        effective_parameters(run, step),
        refs.vcs_providers,
        refs.secret_keys,
    )


def provider_contract(refs: References) -> RunnerContract | None:
    return RunnerContract.of(_manifest(refs.provider)) if refs.provider is not None else None


def _names(env: list[dict[str, Any]]) -> set[str]:
    return {str(e["name"]) for e in env}


def _add_below(container: dict[str, Any], env: list[dict[str, Any]]) -> None:
    """Add `env` where the container does not set the name already (a lower layer)."""
    present = _names(container.setdefault("env", []))
    container["env"] += [e for e in env if e["name"] not in present]


def _add_over(container: dict[str, Any], env: list[dict[str, Any]]) -> None:
    """Add `env` in front, replacing the container's own of the same names (set by the operator)."""
    names = _names(env)
    container["env"] = list(env) + [e for e in container.get("env", []) if e["name"] not in names]


def _mount_for(container: dict[str, Any], volume: WorkloadVolume) -> None:
    """Mount a user volume into a helper container read-only, unless it is mounted there already."""
    mounts = container.setdefault("volumeMounts", [])
    if any(m["name"] == volume.name for m in mounts):
        return
    mounts.append({"name": volume.name, "mountPath": volume.mount_path, "readOnly": True})


@dataclass(frozen=True)
class PodParts:
    """The parts of the built pod `extend_pod` changes, and what it needs of the builder."""

    pod: dict[str, Any]
    main: dict[str, Any]
    reporter: dict[str, Any]
    owner: dict[str, Any]
    holder_of: Callable[[str], WorkloadVolume | None]
    """The user volume that holds a path in the pod (`builder.volume_holding`)."""


def extend_pod(
    parts: PodParts, run: AgentRun, step: WorkflowStep, workload: Workload, refs: References
) -> list[dict[str, Any]]:
    """Add what the run's version control, runner contract and artifacts need to the pod;
    return the objects to create before the Job (ordered, each created or adopted by name)."""
    pod, main, reporter = parts.pod, parts.main, parts.reporter
    volume_holding = parts.holder_of
    companions: list[dict[str, Any]] = []

    vcs = run_vcs(run, step, refs)
    if vcs.env:
        _add_below(main, list(vcs.env))
    if vcs.volumes:
        pod["volumes"] += list(vcs.volumes)
        main.setdefault("volumeMounts", []).extend(vcs.mounts)
    if vcs.checkout is not None:
        holder = volume_holding(vcs.checkout)
        if holder is not None:
            _mount_for(reporter, holder)
            reporter["args"] += ["--checkout", vcs.checkout]

    contract = provider_contract(refs)
    if contract is not None:
        agent = _manifest(refs.agent)
        inputs = RunnerInputs(
            run_name=str(run.metadata.get("name", "")),
            run_uid=str(run.metadata.get("uid", "")),
            namespace=str(run.metadata.get("namespace", "")),
            provider_name=refs.provider_name,
            agent_name=refs.agent_name,
            agent_config=agent.get("config") or {},
            agent_env=agent.get("env") or [],
            implementation=implementation_document(run, step, refs),
            parameters=effective_parameters(run, step),
            memory=None,
            vcs=vcs.context,
            extra=run_document_extras(run, refs),
        )
        labels: dict[str, str] = {}
        contract_pod = runner_pod(inputs, contract, parts.owner, labels)
        if workload.command is None:
            main["command"] = contract_pod.command
            if workload.args is None:
                main["args"] = contract_pod.args
        _add_over(main, contract_pod.injected_env)
        _add_below(main, contract_pod.provider_env)
        pod["volumes"].append(contract_pod.volume)
        main.setdefault("volumeMounts", []).extend(contract_pod.mounts)
        companions.append(contract_pod.config_map)
        _report_artifacts(parts, contract)
    return companions


ARTIFACTS_VOLUME = "agentrun-artifacts"


def _plain_mount_holding(path: str, mounts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The whole-volume mount of `main` (no subPath) whose mountPath is the longest prefix of `path`."""
    best: dict[str, Any] | None = None
    for mount in mounts:
        root = str(mount["mountPath"]).rstrip("/") or "/"
        inside = root == "/" or path == root or path.startswith(root + "/")
        if inside and not mount.get("subPath") and (best is None or len(root) > len(best["mountPath"])):
            best = mount
    return best


def _report_artifacts(parts: PodParts, contract: RunnerContract) -> None:
    """The reporter records each artifact (`--artifact name=path`) from the volume holding it, mounted
    read-only. An artifact on no volume of the pod gets one: an `emptyDir` at its directory in `main`
    and the reporter (as the original's providers write to /workspace without declaring a volume),
    one per outermost such directory (docs/api.md#output-artifacts)."""
    main, reporter = parts.main, parts.reporter
    paths = [(a.name, a.file_path) for a in contract.output_artifacts if a.file_path]
    homeless = sorted(
        {
            posixpath.dirname(p)
            for _, p in paths
            if _plain_mount_holding(p, main.get("volumeMounts", [])) is None
        }
    )
    outermost = [
        d for d in homeless if not any(o != d and (d + "/").startswith(o.rstrip("/") + "/") for o in homeless)
    ]
    for index, directory in enumerate(outermost):
        name = f"{ARTIFACTS_VOLUME}-{index}"
        parts.pod["volumes"].append({"name": name, "emptyDir": {}})
        main.setdefault("volumeMounts", []).append({"name": name, "mountPath": directory})
    for name, path in paths:
        holder = _plain_mount_holding(path, main.get("volumeMounts", []))
        if holder is None:  # pragma: no cover - every path has a home by now
            continue
        if not any(m["name"] == holder["name"] for m in reporter.setdefault("volumeMounts", [])):
            reporter["volumeMounts"].append(
                {"name": holder["name"], "mountPath": holder["mountPath"], "readOnly": True}
            )
        reporter["args"] += ["--artifact", f"{name}={path}"]


def run_document_extras(run: AgentRun, refs: References) -> Mapping[str, Any]:
    """Keys of run.json beyond the runner contract's own: the run's `goal`, and `memoryRef` (the
    run's, else its Agent's: passed on, not interpreted, docs/api.md#memoryref)."""
    spec = run.spec.to_dict()
    extras: dict[str, Any] = {key: spec[key] for key in ("goal", "memoryRef") if key in spec}
    agent_memory = _manifest(refs.agent).get("memoryRef")
    if "memoryRef" not in extras and agent_memory:
        extras["memoryRef"] = agent_memory
    return extras
