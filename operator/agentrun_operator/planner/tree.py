"""The tree of steps: every step of a workflow with its field path, run path, depth and scope.

A step is a workload step, a group (`steps:`) or a switch; groups and switches hold child steps, so a
workflow is a tree. Validation and the planner both address a step by its position in that tree:

- the *field path* (`spec.workflow.steps[0].switch.cases[1].steps[0]`) names it in messages about
  the spec;
- the *run path* (`review/fix`) names it in status, Events and logs;
- the *scope* is what its CEL may read: `steps.X` names an earlier sibling of the step or of one of
  its ancestors, and `outputs.X` an output collected by a loop inside one of those earlier steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from agentrun_operator.api import AgentRun, WorkflowStep
from agentrun_operator.resolution import effective_steps


@dataclass(frozen=True)
class StepNode:
    """One step of the tree, where it sits, and what its expressions may refer to."""

    step: WorkflowStep
    field_path: str
    run_path: tuple[str, ...]
    depth: int  # top-level steps are at depth 1
    earlier_steps: tuple[str, ...]  # names `steps.X` may use
    earlier_outputs: tuple[str, ...]  # names `outputs.X` may use
    parent: StepNode | None = None

    @property
    def path(self) -> str:
        """The run path as people read it: `review/fix`."""
        return "/".join(self.run_path)


def outputs_in(step: WorkflowStep) -> list[str]:
    """Output names collected by loops in `step` or below it, in document order."""
    names = [step.loop.output.name] if step.loop is not None and step.loop.output is not None else []
    for _, child in step.children():
        names += outputs_in(child)
    return names


def _walk_list(
    steps: list[tuple[str, WorkflowStep]],
    depth: int,
    prefix: tuple[str, ...],
    parent: StepNode | None,
    outer_steps: tuple[str, ...],
    outer_outputs: tuple[str, ...],
) -> Iterator[StepNode]:
    earlier: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    previous_list = ""
    for field_path, step in steps:
        this_list = field_path.rsplit("[", 1)[0]
        if this_list != previous_list:  # a switch's cases are separate lists: no scope between them
            earlier, outputs, previous_list = (), (), this_list
        node = StepNode(
            step,
            field_path,
            (*prefix, step.name),
            depth,
            (*outer_steps, *earlier),
            (*outer_outputs, *outputs),
            parent,
        )
        yield node
        yield from walk_children(node)
        earlier = (*earlier, step.name)
        outputs = (*outputs, *outputs_in(step))


def walk_children(node: StepNode) -> Iterator[StepNode]:
    """Every step below `node`, depth first in document order."""
    children = [(f"{node.field_path}.{rel}", child) for rel, child in node.step.children()]
    yield from _walk_list(
        children, node.depth + 1, node.run_path, node, node.earlier_steps, node.earlier_outputs
    )


def walk(run: AgentRun) -> Iterator[StepNode]:
    """Every step of the run, depth first in document order (the implicit step of a job run too)."""
    implicit = run.spec.workflow is None
    top = [
        ("spec" if implicit else f"spec.workflow.steps[{i}]", step)
        for i, step in enumerate(effective_steps(run))
    ]
    yield from _walk_list(top, 1, (), None, (), ())
