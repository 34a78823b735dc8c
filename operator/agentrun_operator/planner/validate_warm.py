"""Validation of `loop.warm` (docs/concepts.md#warm-iterations): what a warm pod needs to run the
loop's iterations one after the other. Each rule names the field, the value and the fix."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Final

from agentrun_operator.api import AgentRun
from agentrun_operator.jobs.warm_pod import PER_ITERATION_ENV
from agentrun_operator.planner.tree import StepNode
from agentrun_operator.problem import Problem
from agentrun_operator.problem import concepts as _concepts
from agentrun_operator.resolution import effective_workload

_REFERENCE: Final = re.compile(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
"""`$(VAR)` in a container's command or args, which the kubelet expands once, as the container starts
(`$$(VAR)` is the escaped, literal form)."""


def warm_problems(run: AgentRun, view: StepNode) -> Iterator[Problem]:
    """A warm loop is a top-level looping workload step whose command is known (`main` runs it again
    and again in a shell loop) and does not use a per-iteration variable the kubelet would expand
    only once."""
    loop = view.step.loop
    if loop is None or not loop.warm_enabled:
        return
    field = f"{view.field_path}.loop.warm"
    if view.step.steps is not None or view.step.switch is not None or view.parent is not None:
        yield Problem(
            field,
            {"enabled": True},
            "loop.warm is supported on a top-level looping workload step, not on a loop body (steps:), a "
            "switch, or a step inside a group or loop body: its one pod runs the step's own command",
            "move loop.warm to a looping workload step at the top level of spec.workflow.steps, or remove it",
            _concepts("warm-iterations"),
        )
        return
    workload = effective_workload(run.spec.workload, view.step.workload)
    where = f"{view.field_path}.workload" if view.step.workload is not None else "spec.workload"
    if not workload.command:
        yield Problem(
            f"{where}.command",
            None,
            "loop.warm needs the workload's command: the warm pod runs it once per iteration from a "
            "shell loop, and the image's own entrypoint is not known to the operator",
            f"set {where}.command (e.g. [sh, -c] with the script in args, or the entrypoint of the "
            "image), or remove loop.warm",
            _concepts("warm-iterations"),
        )
        return
    for name, values in (("command", workload.command), ("args", workload.args or [])):
        for index, value in enumerate(values):
            used = sorted({m for m in _REFERENCE.findall(value) if m in PER_ITERATION_ENV})
            if used:
                yield Problem(
                    f"{where}.{name}[{index}]",
                    value,
                    f"$({used[0]}) is expanded by the kubelet once, when the warm pod starts, so every "
                    "iteration in it would see the first iteration's value",
                    f"read ${used[0]} from the environment in the command (e.g. sh -c '... "
                    f"${used[0]} ...'), or remove loop.warm",
                    _concepts("warm-iterations"),
                )
