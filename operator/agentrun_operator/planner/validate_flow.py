"""Validation of control flow before the first Job: nesting depth, collected output names, and every
CEL expression of the tree (it compiles; `steps.X` and `outputs.X` name something produced earlier).

The rules a single object can decide (exactly one of workload / group / switch, cases, budgets) sit
in the models and the CRD; these need the whole tree. See docs/concepts.md#control-flow.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from agentrun_operator.api import AgentRun
from agentrun_operator.api.agentrun import DEFAULT_NESTING_DEPTH
from agentrun_operator.celeval import CANDIDATES_ROOT, CelCompileError, compile_expression
from agentrun_operator.planner.tree import StepNode, walk
from agentrun_operator.problem import Problem, concepts
from agentrun_operator.resolution import condition_cel

REASON_NESTING_TOO_DEEP: Final = "NestingTooDeep"


def max_nesting_depth(run: AgentRun) -> int:
    workflow = run.spec.workflow
    depth = workflow.max_nesting_depth if workflow is not None else None
    return depth if depth is not None else DEFAULT_NESTING_DEPTH


def nesting_problems(run: AgentRun, nodes: list[StepNode]) -> Iterator[Problem]:
    """One problem per step deeper than `spec.workflow.maxNestingDepth` whose parent is within it."""
    limit = max_nesting_depth(run)
    for node in nodes:
        if node.depth == limit + 1:
            yield Problem(
                node.field_path,
                node.path,
                f"NestingTooDeep: step {node.path!r} is at nesting depth {node.depth}, past "
                f"spec.workflow.maxNestingDepth {limit}",
                "flatten the groups or switches above it, or raise spec.workflow.maxNestingDepth "
                "(at most 10)",
                concepts("nesting"),
                reason=REASON_NESTING_TOO_DEEP,
            )


def output_problems(nodes: list[StepNode]) -> Iterator[Problem]:
    """An output name is collected by one loop only: `outputs.N` must mean one list."""
    first: dict[str, StepNode] = {}
    for node in nodes:
        loop = node.step.loop
        if loop is None or loop.output is None:
            continue
        name = loop.output.name
        if name in first:
            yield Problem(
                f"{node.field_path}.loop.output.name",
                name,
                f"output {name!r} is already collected by step {first[name].path!r}",
                "give each loop.output its own name",
                concepts("collected-outputs"),
            )
        else:
            first[name] = node


NO_ROOTS: frozenset[str] = frozenset()


def _expressions(node: StepNode) -> Iterator[tuple[str, str, frozenset[str]]]:
    step, path = node.step, node.field_path
    if step.when is not None:
        yield f"{path}.when", step.when, NO_ROOTS
    if step.switch is not None:
        yield f"{path}.switch.expression", step.switch.expression, NO_ROOTS
    loop = step.loop
    if loop is None:
        return
    if loop.items is not None:
        yield f"{path}.loop.items", loop.items, NO_ROOTS
    if loop.condition is not None:
        field_name, expression = condition_cel(loop.condition)
        yield f"{path}.loop.condition.{field_name}", expression, NO_ROOTS
    if loop.output is not None:
        yield f"{path}.loop.output.expression", loop.output.expression, NO_ROOTS
    if loop.stall is not None:
        yield f"{path}.loop.stall.progress", loop.stall.progress, NO_ROOTS
    if loop.candidates is not None:
        yield f"{path}.loop.candidates.select", loop.candidates.select, frozenset({CANDIDATES_ROOT})


def cel_problems(nodes: list[StepNode]) -> Iterator[Problem]:
    """Every expression compiles, and reads only steps and outputs produced before its step."""
    all_names = {n.step.name for n in nodes}
    all_outputs = {n.step.loop.output.name for n in nodes if n.step.loop and n.step.loop.output}
    for node in nodes:
        for path, expression, roots in _expressions(node):
            try:
                compiled = compile_expression(expression, roots)
            except CelCompileError as exc:
                yield Problem(
                    path,
                    expression,
                    str(exc),
                    "correct the expression; it may read iteration, step, run, steps.<earlier step> and "
                    "outputs.<earlier output>"
                    + (", and candidates (each {index, control})" if CANDIDATES_ROOT in roots else ""),
                    concepts("cel-expressions"),
                )
                continue
            for name in sorted(compiled.referenced_steps - set(node.earlier_steps)):
                where = (
                    "itself"
                    if name == node.step.name
                    else "a later step or one holding this one"
                    if name in all_names
                    else None
                )
                what = f"step {name!r} is {where}" if where else f"there is no step named {name!r}"
                yield Problem(
                    path,
                    expression,
                    f"the expression reads steps.{name}, but {what}; only earlier steps "
                    f"({', '.join(node.earlier_steps) or 'none'}) are in the context",
                    "refer only to steps listed before this one (or before a group that holds it), or "
                    "reorder the steps",
                    concepts("cel-expressions"),
                )
            yield from _iteration_steps_problems(node, path, expression, compiled.referenced_iteration_steps)
            for name in sorted(compiled.referenced_outputs - set(node.earlier_outputs)):
                what = (
                    f"output {name!r} is collected by this step or a later one"
                    if name in all_outputs
                    else f"no loop collects an output named {name!r}"
                )
                yield Problem(
                    path,
                    expression,
                    f"the expression reads outputs.{name}, but {what}; only outputs of earlier steps "
                    f"({', '.join(node.earlier_outputs) or 'none'}) are in the context",
                    "collect the output (loop.output.name) in a step listed before this one, or reorder "
                    "the steps",
                    concepts("collected-outputs"),
                )


def flow_problems(run: AgentRun) -> list[Problem]:
    nodes = list(walk(run))
    return [
        *nesting_problems(run, nodes),
        *output_problems(nodes),
        *cel_problems(nodes),
    ]


_BODY_FIELDS: Final = (
    ".loop.condition.expression",
    ".loop.condition.until",
    ".loop.output.expression",
    ".loop.stall.progress",
)


def _iteration_steps_problems(
    node: StepNode, path: str, expression: str, names: frozenset[str]
) -> Iterator[Problem]:
    """`iteration.steps.X` exists only in the condition and output of a loop body, and X must be one
    of the body's children (docs/cel.md#iteration-steps)."""
    body = node.step.steps is not None and node.step.loop is not None and path.endswith(_BODY_FIELDS)
    children = [c.name for c in node.step.steps or []] if body else []
    for name in sorted(names - set(children)):
        if body:
            why = (
                f"the loop body {node.path!r} has no child named {name!r}; its children are "
                f"{', '.join(children)}"
            )
            fix = "name one of the body's children, or reorder the steps"
        else:
            why = (
                "iteration.steps is only filled in the loop.condition, loop.output and loop.stall of a loop "
                "body (a group with loop), and this expression is not one"
            )
            fix = (
                "read an earlier step as steps.<name> instead, or move the expression to the loop "
                "body's condition"
            )
        yield Problem(
            path,
            expression,
            f"the expression reads iteration.steps.{name}, but {why}",
            fix,
            "docs/cel.md#iteration-steps",
        )
