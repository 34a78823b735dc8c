"""The Agent's system prompt in the iteration pod: a file, its path in `AGENTRUN_SYSTEM_PROMPT_PATH`
(docs/api.md#system-prompt).

- `defaults.systemPromptRef` (a ConfigMap or Secret key) is a volume of that object with just the
  key, mounted read-only;
- `defaults.systemPrompt` (inline, ≤ 16 KiB) is a pod annotation projected into a file by the
  downward API, so no object has to be created for it.

Either way the file is `/var/run/agentrun/system-prompt/system-prompt.md`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from agentrun_operator.api.resources import AgentSpec
from agentrun_operator.jobs.reporter_container import WORKLOAD_CONTAINERS

DIRECTORY: Final = "/var/run/agentrun/system-prompt"
FILE_NAME: Final = "system-prompt.md"
PATH: Final = f"{DIRECTORY}/{FILE_NAME}"
ENV: Final = "AGENTRUN_SYSTEM_PROMPT_PATH"
VOLUME: Final = "agentrun-system-prompt"
ANNOTATION: Final = "agents.proompteng.ai/system-prompt"


@dataclass(frozen=True)
class SystemPromptPod:
    """What the pod gets for the system prompt."""

    volume: dict[str, Any]
    mount: dict[str, Any]
    env: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)


def system_prompt_pod(agent: AgentSpec | None) -> SystemPromptPod | None:
    """The volume, mount, env and pod annotations of the Agent's system prompt; None without one."""
    defaults = agent.defaults if agent is not None else None
    if defaults is None:
        return None
    mount = {"name": VOLUME, "mountPath": DIRECTORY, "readOnly": True}
    env = {ENV: PATH}
    ref = defaults.system_prompt_ref
    if ref is not None:
        items = [{"key": ref.key, "path": FILE_NAME}]
        if ref.kind == "Secret":
            volume = {"name": VOLUME, "secret": {"secretName": ref.name, "items": items}}
        else:
            volume = {"name": VOLUME, "configMap": {"name": ref.name, "items": items}}
        return SystemPromptPod(volume, mount, env)
    if defaults.system_prompt is not None:
        field_ref = {"fieldPath": f"metadata.annotations['{ANNOTATION}']"}
        volume = {"name": VOLUME, "downwardAPI": {"items": [{"path": FILE_NAME, "fieldRef": field_ref}]}}
        return SystemPromptPod(volume, mount, env, {ANNOTATION: defaults.system_prompt})
    return None


def add_to_pod(pod: dict[str, Any], annotations: dict[str, str], agent: AgentSpec | None) -> None:
    """Give the pod (spec) and its template's annotations the system prompt, if the Agent has one."""
    prompt = system_prompt_pod(agent)
    if prompt is None:
        return
    pod["volumes"] = [*pod.get("volumes", []), prompt.volume]
    main = next(c for c in pod["containers"] if c["name"] in WORKLOAD_CONTAINERS)  # after the reporter
    main["volumeMounts"] = [*main.get("volumeMounts", []), prompt.mount]
    main["env"] = [*main.get("env", []), *({"name": k, "value": v} for k, v in prompt.env.items())]
    annotations.update(prompt.annotations)
