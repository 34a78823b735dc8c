"""CEL over the documented context (docs/cel.md)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun_operator import celeval
from agentrun_operator.celeval import (
    CelCompileError,
    CelError,
    CelEvaluationError,
    CompiledExpression,
    EarlierStep,
    build_context,
    compile_expression,
    evaluate_bool,
    evaluate_list,
    referenced_steps,
)


def context(control: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "run_name": "codex-loop",
        "run_namespace": "agents",
        "step_name": "implement",
        "run_parameters": {"repo": "proompteng/lab", "tasks": "a,b,c"},
        "iteration_index": 2,
        "max_iterations": 8,
        "last_phase": "Succeeded",
        "last_control": control,
        "steps": {
            "plan": EarlierStep(
                phase="Succeeded",
                completed_iterations=1,
                control={"outputs": {"tasks": ["lint", "test"], "count": 2}},
            )
        },
    }
    args.update(overrides)
    return build_context(**args)


def holds(expression: str, ctx: dict[str, Any]) -> bool:
    return evaluate_bool(compile_expression(expression), ctx)


# ------------------------------------------------------------------------------- the reference


def test_reference_expression() -> None:
    expr = "iteration.last.control.continue == true"
    assert holds(expr, context({"continue": True, "outputs": {"summary": "x"}})) is True
    assert holds(expr, context({"continue": False})) is False


@pytest.mark.parametrize(
    ("expression", "control", "expected"),
    [
        ("iteration.last.control.outputs.remaining_tasks == 0", {"outputs": {"remaining_tasks": 0}}, True),
        ("iteration.last.control.outputs.remaining_tasks == 0", {"outputs": {"remaining_tasks": 3}}, False),
        # JSON does not tell 0 from 0.0: numbers compare by value across int and double
        ("iteration.last.control.outputs.remaining_tasks == 0", {"outputs": {"remaining_tasks": 0.0}}, True),
        ("iteration.last.control.outputs.remaining_tasks != 0", {"outputs": {"remaining_tasks": 0.0}}, False),
        ("iteration.last.control.ratio > 0.5", {"ratio": 1}, True),
        ("iteration.last.control.ratio <= 1 && 0.5 < iteration.last.control.ratio", {"ratio": 1.0}, True),
        ("iteration.last.control.n >= 2.0 && iteration.last.control.n < 3u", {"n": 2}, True),
        ("has(iteration.last.control.continue)", {"continue": False}, True),
        ("has(iteration.last.control.continue)", {}, False),
        ("!has(iteration.last.control.continue) || iteration.last.control.continue", {}, True),
        ("size(run.parameters) > 0", {}, True),
        ("iteration.index < iteration.maxIterations", {}, True),
        ("iteration.last.phase == 'Succeeded'", {}, True),
        ("step.name == 'implement' && run.name == 'codex-loop' && run.namespace == 'agents'", {}, True),
        ("run.parameters.repo.startsWith('proompteng/')", {}, True),
        ("steps.plan.phase == 'Succeeded' && steps.plan.completedIterations == 1", {}, True),
        ("size(steps.plan.control.outputs.tasks) == steps.plan.control.outputs.count", {}, True),
        ("iteration.item == null", {}, True),
        ("iteration.last.control.reason.matches('^needs ')", {"reason": "needs another pass"}, True),
        (
            "iteration.last.control.items.exists(i, i.done == false)",
            {"items": [{"done": True}, {"done": False}]},
            True,
        ),
        ("iteration.last.control.outputs.big > 1", {"outputs": {"big": 2**70}}, True),
    ],
)
def test_expressions_over_the_context(expression: str, control: dict[str, Any], expected: bool) -> None:
    assert holds(expression, context(control)) is expected


def test_unavailable_control_is_an_empty_map() -> None:
    ctx = context(None)
    assert holds("size(iteration.last.control) == 0", ctx)
    assert holds("!has(iteration.last.control.continue)", ctx)


def test_when_and_items_context_before_any_iteration() -> None:
    ctx = build_context(run_name="r", run_namespace="ns", step_name="s")
    assert holds("iteration.index == 0 && iteration.last.phase == '' && size(steps) == 0", ctx)
    assert holds("size(run.parameters) == 0 && iteration.item == null", ctx)


def test_item_is_available_as_json() -> None:
    ctx = context({}, item={"name": "lint", "weight": 2})
    assert holds("iteration.item.name == 'lint' && iteration.item.weight == 2", ctx)
    assert holds("iteration.item == 'x'", context({}, item="x"))


# --------------------------------------------------------------------------------- compiling


def test_compile_is_cached_per_expression() -> None:
    expr = "iteration.index >= 1 && true"
    first = compile_expression(expr)
    before = celeval._compile_cached.cache_info()
    assert compile_expression(expr) is first
    after = celeval._compile_cached.cache_info()
    assert after.hits == before.hits + 1 and after.misses == before.misses
    assert isinstance(first, CompiledExpression) and first.expression == expr


@pytest.mark.parametrize(
    ("expression", "reason", "where"),
    [
        ("iteration.index >", "unexpected end of expression", "at column"),
        ("iteration.index @ 2", "unexpected character '@'", "at column 17"),
        ("iteration.last.control.continue == true)", "unexpected ')'", "at column 40"),
        ("iteration.index ==\n  == 2", "unexpected '=='", "at line 2, column 3"),
        ("'unterminated", "unexpected character", "at column 1"),
        ("", "expression is empty", ""),
        ("   ", "expression is empty", ""),
        ("iteraton.index == 1", "undeclared reference to 'iteraton'", "at column 1"),
        ("iteration.index == 1 && runs.name == 'x'", "undeclared reference to 'runs'", "at column 25"),
    ],
)
def test_compile_errors_name_the_expression_and_the_position(
    expression: str, reason: str, where: str
) -> None:
    with pytest.raises(CelCompileError) as info:
        compile_expression(expression)
    message = str(info.value)
    assert message.startswith(f"invalid CEL expression `{expression.replace(chr(10), ' ')}`: ")
    assert reason in message and where in message, message
    assert info.value.expression == expression
    # failures are cached too and raise the same error again
    with pytest.raises(CelCompileError):
        compile_expression(expression)


@pytest.mark.parametrize(
    "expression",
    [
        "[1, 2].all(x, x > 0)",
        "[1, 2].map(n, n * 2)[1] == 4",
        "[1].exists_one(v, v == 1) && [2].filter(w, w > 1).size() == 1",
        "type(iteration.index) == int && type(run.name) == string",
        ".iteration.index >= 0",
    ],
)
def test_macro_variables_and_type_names_are_declared(expression: str) -> None:
    assert holds(expression, context({}))


# -------------------------------------------------------------------------------- evaluation


@pytest.mark.parametrize(
    ("expression", "control", "reason_part"),
    [
        ("iteration.last.control.continue == true", {}, "no such key 'continue'"),
        ("iteration.last.control.continue == true", {}, "use has(...)"),
        ("iteration.last.control.outputs.n == 1", {"outputs": "text"}, "does not support field selection"),
        (
            "iteration.last.control.n + 'x' == 'y'",
            {"n": 1},
            "no matching overload for + applied to '(int, string)'",
        ),
        ("iteration.last.control.n / 0 == 1", {"n": 1}, "divide by zero"),
        ("steps.build.phase == 'Succeeded'", {}, "no such key 'build'"),
        ("iteration.index", {}, "expression returned int, expected bool"),
        ("iteration.last.control.continue", {"continue": "yes"}, "expression returned string, expected bool"),
        ("iteration.last.control.continue", {"continue": None}, "expression returned null, expected bool"),
        ("iteration.last.control", {}, "expression returned map, expected bool"),
        ("iteration.last.control.xs", {"xs": [1]}, "expression returned list, expected bool"),
        ("iteration.last.control.x", {"x": 1.5}, "expression returned double, expected bool"),
    ],
)
def test_evaluation_errors_are_clear(expression: str, control: dict[str, Any], reason_part: str) -> None:
    with pytest.raises(CelEvaluationError) as info:
        holds(expression, context(control))
    assert reason_part in info.value.reason, info.value.reason
    assert str(info.value).startswith(f"CEL expression `{expression}` failed: ")
    assert "activation" not in str(info.value)  # celpy's dump of the whole context is not leaked
    assert len(str(info.value)) < 700


def test_evaluate_list_returns_json_native_values() -> None:
    ctx = context({"outputs": {"items": ["a", 1, 2.5, True, None, {"k": [1]}]}})
    items = evaluate_list(compile_expression("iteration.last.control.outputs.items"), ctx)
    assert items == ["a", 1, 2.5, True, None, {"k": [1]}]
    assert [type(i) for i in items] == [str, int, float, bool, type(None), dict]
    assert type(items[5]["k"][0]) is int
    assert json.loads(json.dumps(items)) == items


def test_evaluate_list_from_parameters_and_earlier_steps() -> None:
    ctx = context({})
    assert evaluate_list(compile_expression("steps.plan.control.outputs.tasks"), ctx) == ["lint", "test"]
    assert evaluate_list(compile_expression("[run.parameters.repo, 'x']"), ctx) == ["proompteng/lab", "x"]
    assert evaluate_list(compile_expression("[1, 2, 3].map(n, {'n': n})"), ctx) == [
        {"n": 1},
        {"n": 2},
        {"n": 3},
    ]
    assert evaluate_list(compile_expression("[]"), ctx) == []


def test_evaluate_list_converts_non_json_cel_values() -> None:
    expr = "[b'hi', timestamp('2026-02-28T05:00:00Z'), duration('90s'), 7u, {1: 'one'}]"
    items = evaluate_list(compile_expression(expr), context({}))
    assert items == ["aGk=", "2026-02-28T05:00:00Z", "90s", 7, {"1": "one"}]


@pytest.mark.parametrize(
    ("expression", "reason_part"),
    [
        ("run.parameters", "expression returned map, expected list"),
        ("'a,b'", "expression returned string, expected list"),
        ("iteration.item", "expression returned null, expected list"),
        ("[1.0 / 0.0]", "item 0 is inf"),
        ("[1, [int]]", "item 1[0] is a type"),
        ("iteration.last.control.missing", "no such key 'missing'"),
    ],
)
def test_evaluate_list_errors(expression: str, reason_part: str) -> None:
    with pytest.raises(CelEvaluationError) as info:
        evaluate_list(compile_expression(expression), context({}))
    assert reason_part in info.value.reason, info.value.reason


def test_plain_python_context_values_are_converted() -> None:
    compiled = compile_expression("iteration.last.control.continue == true && run.parameters.a == 'b'")
    ctx = {
        "iteration": {"last": {"control": {"continue": True}}},
        "run": {"parameters": {"a": "b"}},
        "step": {},
        "steps": {},
    }
    assert evaluate_bool(compiled, ctx) is True
    with pytest.raises(CelEvaluationError, match="cannot use a object"):
        evaluate_bool(compiled, {**ctx, "run": object()})


# ---------------------------------------------------------------------------------- steps.X


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("steps.plan.phase == 'Succeeded'", {"plan"}),
        ("steps.plan.control.outputs.n > 0 && steps.build.completedIterations == 2", {"plan", "build"}),
        ("steps['fetch-data'].phase == 'Succeeded'", {"fetch-data"}),
        ('has(steps.review.control.approved) && "steps.fake" != steps.real.phase', {"review", "real"}),
        ("'steps.a' == 'steps.b' && iteration.index > 0", set()),
        ("iteration.last.control.steps.x == 1", set()),
        ("size(steps) > 0", set()),
        ("[1].all(i, steps.inner.phase == 'x')", {"inner"}),
    ],
)
def test_referenced_steps(expression: str, expected: set[str]) -> None:
    assert referenced_steps(expression) == expected
    assert referenced_steps(compile_expression(expression)) == expected


def test_referenced_steps_of_a_bad_expression_raises() -> None:
    with pytest.raises(CelCompileError):
        referenced_steps("steps.a.phase ==")


# -------------------------------------------------------------------------------- properties

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=40,
)

EXPRESSIONS = [
    "iteration.last.control.continue == true",
    "iteration.last.control.outputs.remaining_tasks == 0",
    "has(iteration.last.control.continue) && iteration.last.control.continue",
    "size(iteration.last.control) > 1",
    "iteration.last.control.a.b.c > 2.5",
    "iteration.last.control.s.startsWith('x') || iteration.last.control.n * 2 > 10",
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(control=st.dictionaries(st.sampled_from(["continue", "outputs", "a", "s", "n", "x"]), json_values))
def test_any_control_gives_a_bool_or_a_cel_evaluation_error(control: dict[str, Any]) -> None:
    ctx = context(control)
    for expression in EXPRESSIONS:
        try:
            assert isinstance(holds(expression, ctx), bool)
        except CelEvaluationError as exc:
            assert exc.reason


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=80))
def test_any_text_compiles_or_gives_a_compile_error(text: str) -> None:
    try:
        compiled = compile_expression(text)
    except CelCompileError as exc:
        assert exc.reason
        return
    with contextlib.suppress(CelError):
        evaluate_bool(compiled, context({}))


# ------------------------------------------------------------------------ string extensions


def test_split_turns_a_parameter_into_foreach_items() -> None:
    ctx = context({}, run_parameters={"tasks": " lint, test ,build"})
    compiled = compile_expression("run.parameters.tasks.split(',').map(t, t.trim())")
    assert evaluate_list(compiled, ctx) == ["lint", "test", "build"]
    assert evaluate_list(compile_expression("'abc'.split('')"), ctx) == ["a", "b", "c"]


@pytest.mark.parametrize(
    "expression",
    [
        "['a', 'b'].join('-') == 'a-b' && ['a', 'b'].join() == 'ab'",
        "'AbC-é'.lowerAscii() == 'abc-é' && 'AbC'.upperAscii() == 'ABC'",
        "'a-b-c'.replace('-', '+') == 'a+b+c'",
        "'  x \\n'.trim() == 'x'",
    ],
)
def test_string_extensions(expression: str) -> None:
    assert holds(expression, context({}))


@pytest.mark.parametrize(
    ("expression", "reason_part"),
    [
        ("'a'.split(1) == []", "no such overload: split(string, int)"),
        ("[1].join(',') == ''", "every list element must be a string"),
        ("iteration.index.trim() == ''", "no such overload: trim(int)"),
    ],
)
def test_string_extension_errors(expression: str, reason_part: str) -> None:
    with pytest.raises(CelEvaluationError) as info:
        holds(expression, context({}))
    assert reason_part in info.value.reason


def test_hypothesis_runs_without_a_per_example_deadline() -> None:
    """The deadline is chosen in tests/conftest.py (no timed assertions), not Hypothesis' 200 ms."""
    from hypothesis import settings as current

    assert current.default is not None and current.default.deadline is None
