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


def _warm_loop_of(view: StepNode) -> StepNode | None:
    """The view whose loop is the step's nearest (its own, else a loop body's around it)."""
    node: StepNode | None = view
    while node is not None:
        if node.step.loop is not None:
            return node
        node = node.parent
    return None


def warm_problems(run: AgentRun, view: StepNode) -> Iterator[Problem]:
    """`loop.warm` sits on a top-level loop (a workload step, or a loop body whose workload steps it
    covers); each workload step it covers has a known command (`main` runs it again and again from a
    shell loop) that uses no per-iteration variable the kubelet would expand only once."""
    loop = view.step.loop
    if loop is not None and loop.warm_enabled and (view.parent is not None or view.step.kind == "switch"):
        yield Problem(
            f"{view.field_path}.loop.warm",
            {"enabled": True},
            "loop.warm is supported on a top-level loop (a looping workload step or loop body), not on "
            "a loop inside a group or loop body: one warm pod serves one loop",
            "move loop.warm to the top-level loop around this step, or remove it",
            _concepts("warm-iterations"),
        )
        return
    owner = _warm_loop_of(view)
    if view.step.kind != "workload" or owner is None or owner.parent is not None:
        return
    owner_loop = owner.step.loop
    if owner_loop is None or not owner_loop.warm_enabled:
        return
    yield from _command_problems(run, view)


def _command_problems(run: AgentRun, view: StepNode) -> Iterator[Problem]:
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
