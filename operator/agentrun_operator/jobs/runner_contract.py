"""The original controller's runner contract, beside our image/command/args provider form
(docs/api.md#runner-contract). Pure: the Job builder calls `runner_pod` and merges what it returns.

A provider uses the contract when it sets no `command` and either no `image` or any of `binary`,
`argsTemplate`, `envTemplate`, `inputFiles`, `secretEnv`, `outputArtifacts`, `adapter`, `workload`.
Then `main` runs `binary` (default `/usr/local/bin/agent-runner`) with the rendered `argsTemplate` as
its args and the rendered `envTemplate` as provider-level env; `secretEnv` becomes
env from Secrets; and the pod gets `AGENT_RUN_SPEC=/workspace/run.json`,
`AGENT_RUNNER_SPEC_PATH=/workspace/agent-runner.json` and `AGENT_PROVIDER=<provider name>`.

`run.json`, `agent-runner.json` and every input file come from one ConfigMap the operator creates
before the Job (`runner_config_map`): its name carries a hash of its data, so every iteration of a
step that renders the same files shares it, a re-created one is adopted unchanged, and one of an
earlier run of the same name (another uid in run.json) is never taken for this run's. Each file is
mounted alone (`subPath`) at its path, on top of whatever volume holds that directory.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from agentrun_operator import naming
from agentrun_operator.jobs.template import render

DEFAULT_BINARY: Final = "/usr/local/bin/agent-runner"
RUN_SPEC_PATH: Final = "/workspace/run.json"
RUNNER_SPEC_PATH: Final = "/workspace/agent-runner.json"
RUNNER_STATUS_PATH: Final = "/workspace/.agent/status.json"
RUNNER_LOG_PATH: Final = "/workspace/.agent/runner.log"
RUNNER_VOLUME: Final = "agentrun-runner"
ARTIFACT_ROOT: Final = "/workspace"
"""A relative artifact path is taken relative to this directory (the original's workspace)."""
MAX_CONFIG_MAP_NAME: Final = 253

_CONTRACT_FIELDS: Final = (
    "binary",
    "argsTemplate",
    "envTemplate",
    "inputFiles",
    "secretEnv",
    "outputArtifacts",
    "adapter",
    "workload",
)


@dataclass(frozen=True)
class SecretEnv:
    """One `secretEnv` entry: the variable `name` from key `key` of Secret `secret_name`."""

    name: str
    secret_name: str
    key: str
    optional: bool | None = None

    def env(self) -> dict[str, Any]:
        ref: dict[str, Any] = {"name": self.secret_name, "key": self.key}
        if self.optional is not None:
            ref["optional"] = self.optional
        return {"name": self.name, "valueFrom": {"secretKeyRef": ref}}


@dataclass(frozen=True)
class OutputArtifact:
    """One `outputArtifacts` entry, as the provider declares it."""

    name: str
    path: str | None = None
    key: str | None = None
    url: str | None = None

    @property
    def file_path(self) -> str | None:
        """Where the file is in the pod: `path`, a relative one under /workspace."""
        if not self.path:
            return None
        return posixpath.normpath(posixpath.join(ARTIFACT_ROOT, self.path))

    def to_dict(self) -> dict[str, str]:
        return {
            k: v
            for k, v in (("name", self.name), ("path", self.path), ("key", self.key), ("url", self.url))
            if v
        }


@dataclass(frozen=True)
class RunnerContract:
    """The runner-contract part of an AgentProvider's spec (a view of its manifest form)."""

    binary: str = DEFAULT_BINARY
    args_template: tuple[str, ...] = ()
    env_template: tuple[tuple[str, str], ...] = ()
    input_files: tuple[tuple[str, str], ...] = ()
    secret_env: tuple[SecretEnv, ...] = ()
    output_artifacts: tuple[OutputArtifact, ...] = ()
    adapter: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, spec: Mapping[str, Any] | None) -> RunnerContract | None:
        """The contract of a provider spec in manifest form (camelCase), or None for our own form."""
        if spec is None or spec.get("command") is not None:
            return None
        if not any(spec.get(key) is not None for key in _CONTRACT_FIELDS) and spec.get("image"):
            return None
        return cls(
            binary=str(spec.get("binary") or DEFAULT_BINARY),
            args_template=tuple(str(a) for a in spec.get("argsTemplate") or ()),
            env_template=tuple((str(k), str(v)) for k, v in (spec.get("envTemplate") or {}).items()),
            input_files=tuple(
                (str(f.get("path") or ""), str(f.get("content") or "")) for f in spec.get("inputFiles") or ()
            ),
            secret_env=tuple(
                SecretEnv(str(s["name"]), str(s["secretName"]), str(s["key"]), s.get("optional"))
                for s in spec.get("secretEnv") or ()
            ),
            output_artifacts=tuple(
                OutputArtifact(str(a["name"]), a.get("path"), a.get("key"), a.get("url"))
                for a in spec.get("outputArtifacts") or ()
            ),
            adapter=dict(spec.get("adapter") or {}),
        )


# ----------------------------------------------------------------------------------- context


@dataclass(frozen=True)
class RunnerInputs:
    """What the contract's templates and documents are made from, resolved by the builder."""

    run_name: str
    run_uid: str
    namespace: str
    provider_name: str
    agent_name: str
    agent_config: Mapping[str, Any]
    agent_env: Sequence[Mapping[str, Any]]
    implementation: Mapping[str, Any]
    parameters: Mapping[str, str]
    memory: Mapping[str, Any] | None = None
    vcs: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    """More keys of run.json (e.g. `goal`, `systemPrompt`, the contract's mapped keys)."""


def template_context(inputs: RunnerInputs) -> dict[str, Any]:
    """The context `{{ dotted.path }}` is looked up in."""
    return {
        "agentRun": {"name": inputs.run_name, "uid": inputs.run_uid, "namespace": inputs.namespace},
        "agent": {
            "name": inputs.agent_name,
            "config": dict(inputs.agent_config),
            "env": list(inputs.agent_env),
        },
        "implementation": dict(inputs.implementation),
        "parameters": dict(inputs.parameters),
        "inputs": dict(inputs.parameters),
        "memory": dict(inputs.memory or {}),
        "vcs": dict(inputs.vcs or {}),
    }


def run_document(inputs: RunnerInputs, contract: RunnerContract) -> dict[str, Any]:
    """`/workspace/run.json`: the run's resolved spec."""
    doc: dict[str, Any] = {
        "provider": inputs.provider_name,
        "agentRun": {"name": inputs.run_name, "uid": inputs.run_uid, "namespace": inputs.namespace},
        "implementation": dict(inputs.implementation),
        "parameters": dict(inputs.parameters),
        "memory": dict(inputs.memory) if inputs.memory is not None else None,
        "artifacts": [a.to_dict() for a in contract.output_artifacts],
    }
    if inputs.vcs:
        doc["vcs"] = dict(inputs.vcs)
    for key, value in inputs.extra.items():
        doc.setdefault(key, value)
    return doc


def runner_document(inputs: RunnerInputs, contract: RunnerContract) -> dict[str, Any]:
    """`/workspace/agent-runner.json`: the provider and adapter configuration for the runner."""
    return {
        "provider": inputs.provider_name,
        "inputs": dict(inputs.parameters),
        "payloads": {"eventFilePath": RUN_SPEC_PATH, "eventBodyPath": RUN_SPEC_PATH},
        "artifacts": {"statusPath": RUNNER_STATUS_PATH, "logPath": RUNNER_LOG_PATH},
        "adapter": dict(contract.adapter),
    }


# ----------------------------------------------------------------------------------- input files


def input_files(contract: RunnerContract, context: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(path, content) of each input file, both rendered; one with an empty path or content is
    left out, as the original does."""
    files = [(render(path, context), render(content, context)) for path, content in contract.input_files]
    return [(path, content) for path, content in files if path and content]


def reserved_paths() -> tuple[str, ...]:
    """Files the contract itself mounts: no input file may take their place."""
    return (RUN_SPEC_PATH, RUNNER_SPEC_PATH)


def file_collision(path: str, mount_paths: Sequence[str]) -> str | None:
    """The mount path a file at `path` collides with: the same path, or a mount below it (the file
    would have to be that mount's directory). A file *inside* a mount is fine: it is mounted on top."""
    norm = posixpath.normpath(path)
    for mount in mount_paths:
        root = posixpath.normpath(mount)
        if norm == root or root.startswith(norm.rstrip("/") + "/"):
            return mount
    return None


# ----------------------------------------------------------------------------------- the pod


@dataclass(frozen=True)
class RunnerPod:
    """What the contract adds to the iteration pod."""

    command: list[str]
    args: list[str]
    injected_env: list[dict[str, Any]]
    """AGENT_RUN_SPEC, AGENT_RUNNER_SPEC_PATH, AGENT_PROVIDER: set by the operator, never overridden."""
    provider_env: list[dict[str, Any]]
    """The rendered envTemplate and secretEnv: the provider's layer (an Agent or workload overrides)."""
    config_map: dict[str, Any]
    volume: dict[str, Any]
    mounts: list[dict[str, Any]]


def config_map_name(run_name: str, data: Mapping[str, str]) -> str:
    """`<run>-runner-<hash of the data>`, at most 253 characters."""
    digest = hashlib.sha256(json.dumps(dict(data), sort_keys=True).encode()).hexdigest()[:10]
    suffix = f"-runner-{digest}"
    return f"{run_name[: MAX_CONFIG_MAP_NAME - len(suffix)].rstrip('-.')}{suffix}"


def _key(index: int) -> str:
    return f"input-{index}"


def runner_pod(
    inputs: RunnerInputs,
    contract: RunnerContract,
    owner: Mapping[str, Any],
    labels: Mapping[str, str],
) -> RunnerPod:
    """The command, env, ConfigMap and mounts of `main` under the contract."""
    context = template_context(inputs)
    data: dict[str, str] = {
        "run.json": json.dumps(run_document(inputs, contract), indent=2, sort_keys=True, ensure_ascii=False),
        "agent-runner.json": json.dumps(
            runner_document(inputs, contract), indent=2, sort_keys=True, ensure_ascii=False
        ),
    }
    mounts = [("run.json", RUN_SPEC_PATH), ("agent-runner.json", RUNNER_SPEC_PATH)]
    for index, (path, content) in enumerate(input_files(contract, context)):
        data[_key(index)] = content
        mounts.append((_key(index), path))
    name = config_map_name(inputs.run_name, data)
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": inputs.namespace,
            "labels": {naming.LABEL_RUN: naming.label_value(inputs.run_name), **labels},
            "ownerReferences": [dict(owner)],
        },
        "data": data,
    }
    provider_env = [{"name": k, "value": render(v, context)} for k, v in contract.env_template]
    provider_env += [s.env() for s in contract.secret_env]
    return RunnerPod(
        command=[contract.binary],
        args=[render(a, context) for a in contract.args_template],
        injected_env=[
            {"name": "AGENT_RUN_SPEC", "value": RUN_SPEC_PATH},
            {"name": "AGENT_RUNNER_SPEC_PATH", "value": RUNNER_SPEC_PATH},
            {"name": "AGENT_PROVIDER", "value": inputs.provider_name},
        ],
        provider_env=provider_env,
        config_map=config_map,
        volume={"name": RUNNER_VOLUME, "configMap": {"name": name}},
        mounts=[
            {"name": RUNNER_VOLUME, "mountPath": path, "subPath": key, "readOnly": True}
            for key, path in mounts
        ],
    )


def template_fields(contract: RunnerContract) -> Iterator[tuple[str, str]]:
    """(field path under the provider's spec, template) of every template of the contract."""
    for i, arg in enumerate(contract.args_template):
        yield f"argsTemplate[{i}]", arg
    for key, value in contract.env_template:
        yield f"envTemplate.{key}", value
    for i, (path, content) in enumerate(contract.input_files):
        yield f"inputFiles[{i}].path", path
        yield f"inputFiles[{i}].content", content
