"""CEL for loop conditions, `until`, `when` and `loop.items`, on cel-python (``celpy``); pure.

The planner compiles each distinct expression once per process (``compile_expression`` is cached),
builds a context from plain Python values (``build_context``) and evaluates with ``evaluate_bool`` or
``evaluate_list``. Every failure is one of two exceptions with a message meant for the AgentRun's
status: ``CelCompileError`` (the spec is wrong: ``InvalidSpec``) and ``CelEvaluationError`` (this
evaluation failed: the ``onInvalid`` policy applies).

Two deliberate additions to celpy's behaviour, both from the CEL specification:

- numbers compare by value across types (``1 == 1.0``, ``1 < 1.5``): JSON does not distinguish
  ``0`` from ``0.0``, and a control file written by another tool must not flip a condition into an
  error;
- a reference to a variable outside the documented context (``iteraton.index``) is a compile error,
  so a typo is rejected before the first Job instead of failing the loop after an iteration.

Regular expressions (``matches``) run on RE2 inside celpy, so control payloads cannot cause
catastrophic backtracking.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import math
import operator
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import celpy
import lark
from celpy import celtypes
from celpy.celparser import CELParseError, tree_dump
from celpy.evaluation import CELEvalError

#: The root variables every evaluation context has (see ``build_context`` and docs/cel.md).
CONTEXT_ROOTS: Final = frozenset({"iteration", "step", "run", "steps", "outputs"})
#: Identifiers CEL itself resolves: type names (``type(x) == int``) and the protobuf package.
_BUILTIN_IDENTS: Final = frozenset(
    {"bool", "bytes", "double", "int", "uint", "string", "list", "map", "null_type", "type", "google"}
)
#: Macros whose first argument declares a variable (``list.all(x, x > 0)``).
_BINDING_MACROS: Final = frozenset({"all", "exists", "exists_one", "map", "filter"})
#: Keep error messages short enough for a status field and an Event.
_MAX_MESSAGE_CHARS: Final = 400
_COMPILE_CACHE_SIZE: Final = 1024

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


class CelError(Exception):
    """Base class of the errors this module raises."""


class CelCompileError(CelError):
    """The expression does not parse, or refers to a variable the context does not have."""

    def __init__(self, expression: str, reason: str, line: int | None = None, column: int | None = None):
        self.expression = expression
        self.reason = reason
        self.line = line
        self.column = column
        where = ""
        if column is not None:
            where = f" at column {column}" if line in (None, 1) else f" at line {line}, column {column}"
        super().__init__(f"invalid CEL expression {_quote(expression)}: {reason}{where}")


class CelEvaluationError(CelError):
    """Evaluating a compiled expression failed, or gave a value of the wrong type."""

    def __init__(self, expression: str, reason: str):
        self.expression = expression
        self.reason = reason
        super().__init__(f"CEL expression {_quote(expression)} failed: {reason}")


def _quote(expression: str, limit: int = 200) -> str:
    text = expression if len(expression) <= limit else expression[: limit - 1] + "…"
    return "`" + text.replace("\n", " ") + "`"


def _short(message: str) -> str:
    return message if len(message) <= _MAX_MESSAGE_CHARS else message[: _MAX_MESSAGE_CHARS - 1] + "…"


# ------------------------------------------------------------------------------------- compiling


@dataclass(frozen=True, eq=False)
class CompiledExpression:
    """A parsed, ready-to-run expression. Immutable and safe to share between evaluations."""

    expression: str
    #: Names X used as ``steps.X`` (or ``steps["X"]``): validation checks each is an earlier step.
    referenced_steps: frozenset[str]
    _runner: Any  # a celpy Runner; untyped upstream
    #: Names X used as ``outputs.X`` (or ``outputs["X"]``): validation checks each is collected earlier.
    referenced_outputs: frozenset[str] = frozenset()
    referenced_iteration_steps: frozenset[str] = frozenset()
    """Names X used as ``iteration.steps.X`` (children of a loop body)."""

    def __repr__(self) -> str:
        return f"CompiledExpression({self.expression!r})"


def _numeric(value: Any) -> bool:
    return isinstance(value, celtypes.IntType | celtypes.UintType | celtypes.DoubleType)


def _plain_number(value: Any) -> int | float:
    return float(value) if isinstance(value, celtypes.DoubleType) else int(value)


def _mixed_numeric(
    compare: Callable[[Any, Any], bool], fallback: Callable[[Any, Any], Any]
) -> Callable[[Any, Any], Any]:
    """A relation that compares int, uint and double by value (celpy 0.5 raises "no such overload")."""

    def relation(left: Any, right: Any) -> Any:
        if _numeric(left) and _numeric(right) and type(left) is not type(right):
            return celtypes.BoolType(compare(_plain_number(left), _plain_number(right)))
        return fallback(left, right)

    return relation


def _no_overload(name: str, *args: Any) -> CELEvalError:
    types = ", ".join(cel_type_name(a) for a in args)
    return CELEvalError(f"no such overload: {name}({types})", TypeError, None)


_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ASCII_UPPER: Final = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _split(text: Any, separator: Any) -> Any:
    """``'a,b'.split(',')`` (cel-go strings extension): turns a parameter into forEach items."""
    if not isinstance(text, str) or not isinstance(separator, str):
        return _no_overload("split", text, separator)
    parts = list(text) if separator == "" else text.split(separator)
    return celtypes.ListType([celtypes.StringType(part) for part in parts])


def _join(items: Any, separator: Any = "") -> Any:
    if not isinstance(items, list) or not isinstance(separator, str):
        return _no_overload("join", items, separator)
    if not all(isinstance(item, str) for item in items):
        return CELEvalError("join: every list element must be a string", TypeError, None)
    return celtypes.StringType(separator.join(items))


def _string_method(name: str, method: Callable[[str], str]) -> Callable[[Any], Any]:
    def apply(text: Any) -> Any:
        return celtypes.StringType(method(text)) if isinstance(text, str) else _no_overload(name, text)

    return apply


def _replace(text: Any, old: Any, new: Any) -> Any:
    if not all(isinstance(v, str) for v in (text, old, new)):
        return _no_overload("replace", text, old, new)
    return celtypes.StringType(text.replace(old, new))


#: celpy's standard functions, plus the cel-go strings-extension subset that loops need.
_FUNCTIONS: Final[dict[str, Any]] = {
    "split": _split,
    "join": _join,
    "trim": _string_method("trim", str.strip),
    "lowerAscii": _string_method("lowerAscii", lambda t: t.translate(_ASCII_LOWER)),
    "upperAscii": _string_method("upperAscii", lambda t: t.translate(_ASCII_UPPER)),
    "replace": _replace,
    "_==_": _mixed_numeric(operator.eq, celpy.evaluation.bool_eq),
    "_!=_": _mixed_numeric(operator.ne, celpy.evaluation.bool_ne),
    "_<_": _mixed_numeric(operator.lt, celpy.evaluation.bool_lt),
    "_<=_": _mixed_numeric(operator.le, celpy.evaluation.bool_le),
    "_>_": _mixed_numeric(operator.gt, celpy.evaluation.bool_gt),
    "_>=_": _mixed_numeric(operator.ge, celpy.evaluation.bool_ge),
}
_lock = threading.Lock()  # celpy's parser keeps the text being parsed on a shared object
_environment: Any = None


def _env() -> Any:
    global _environment
    if _environment is None:
        _environment = celpy.Environment()  # note: celpy raises the recursion limit to 2500 here
    return _environment


def _parse_reason(exc: Exception) -> str:
    """Turn lark's exception (chained under celpy's CELParseError) into a short reason."""
    cause = exc.__context__
    if isinstance(cause, lark.exceptions.UnexpectedToken):
        if cause.token.type == "$END":
            return "unexpected end of expression"
        return f"unexpected {str(cause.token)!r}"
    if isinstance(cause, lark.exceptions.UnexpectedCharacters):
        return f"unexpected character {cause.char!r}"
    first = str(exc).strip().splitlines()
    return f"syntax error ({first[0]})" if first else "syntax error"


def _children(tree: lark.Tree[Any]) -> list[Any]:
    return list(tree.children)


def _ident_name(node: Any) -> str | None:
    """``steps`` for a ``member -> primary -> ident`` chain, else None."""
    while isinstance(node, lark.Tree) and node.data in ("member", "primary") and len(node.children) == 1:
        node = node.children[0]
    if isinstance(node, lark.Tree) and node.data == "ident" and node.children:
        return str(node.children[0])
    return None


_STRING_KEY = re.compile(r"""^(?:"([A-Za-z0-9_.-]*)"|'([A-Za-z0-9_.-]*)')$""")


def _literal_string(node: Any) -> str | None:
    """The value of an index expression that is a plain string literal (``steps["build"]``)."""
    while isinstance(node, lark.Tree) and len(node.children) == 1 and node.data != "literal":
        node = node.children[0]
    if isinstance(node, lark.Tree) and node.data == "literal" and node.children:
        match = _STRING_KEY.match(str(node.children[0]))
        if match:
            return match.group(1) if match.group(1) is not None else match.group(2)
    return None


def _is_iteration_steps(node: Any) -> bool:
    """Whether ``node`` is the ``iteration.steps`` member chain."""
    while isinstance(node, lark.Tree) and node.data == "member" and len(node.children) == 1:
        node = node.children[0]
    if not (isinstance(node, lark.Tree) and node.data == "member_dot" and len(node.children) == 2):
        return False
    return _ident_name(node.children[0]) == "iteration" and str(node.children[1]) == "steps"


@dataclass
class _Analysis:
    steps: set[str]
    outputs: set[str]
    roots: list[tuple[str, int | None, int | None]]  # (name, line, column) of free identifiers
    bound: set[str]
    iteration_steps: set[str]


def _analyse(ast: lark.Tree[Any]) -> _Analysis:
    """Walk the AST once: ``steps.X`` references, root identifiers, macro-bound variables."""
    result = _Analysis(steps=set(), outputs=set(), roots=[], bound=set(), iteration_steps=set())
    tables = {"steps": result.steps, "outputs": result.outputs}
    for node in ast.iter_subtrees():
        kids = _children(node)
        root = (
            _ident_name(kids[0]) if node.data in ("member_dot", "member_index") and len(kids) == 2 else None
        )
        if node.data in ("member_dot", "member_index") and len(kids) == 2 and _is_iteration_steps(kids[0]):
            key = str(kids[1]) if node.data == "member_dot" else _literal_string(kids[1])
            if key is not None:
                result.iteration_steps.add(key)
        if root in tables and node.data == "member_dot":
            tables[root].add(str(kids[1]))
        elif root in tables:
            key = _literal_string(kids[1])
            if key is not None:
                tables[root].add(key)
        elif node.data == "member_dot_arg" and len(kids) == 3 and str(kids[1]) in _BINDING_MACROS:
            exprlist = kids[2]
            if isinstance(exprlist, lark.Tree) and exprlist.children:
                var = _ident_name(_unwrap(exprlist.children[0]))
                if var is not None:
                    result.bound.add(var)
        elif node.data in ("ident", "dot_ident") and kids:
            token = kids[0]
            result.roots.append((str(token), getattr(token, "line", None), getattr(token, "column", None)))
    return result


def _unwrap(node: Any) -> Any:
    """Descend through single-child wrapper nodes (expr -> conditionalor -> ... -> member)."""
    while isinstance(node, lark.Tree) and len(node.children) == 1 and node.data != "ident":
        node = node.children[0]
    return node


@functools.lru_cache(maxsize=_COMPILE_CACHE_SIZE)
def _compile_cached(
    expression: str, extra_roots: frozenset[str] = frozenset()
) -> CompiledExpression | CelCompileError:
    """Compile once per process; a failure is cached too, so a bad spec costs one parse."""
    if not expression.strip():
        return CelCompileError(expression, "expression is empty")
    try:
        with _lock:
            environment = _env()
            ast = environment.compile(expression)
            runner = environment.program(ast, functions=_FUNCTIONS)
    except CELParseError as exc:
        return CelCompileError(expression, _parse_reason(exc), exc.line, exc.column)
    except RecursionError:
        return CelCompileError(expression, "expression is nested too deeply")
    except Exception as exc:  # celpy may raise other internal errors on odd input
        return CelCompileError(expression, _short(f"{type(exc).__name__}: {exc}"))
    analysis = _analyse(ast)
    known = CONTEXT_ROOTS | extra_roots | _BUILTIN_IDENTS | analysis.bound
    for name, line, column in analysis.roots:
        if name not in known:
            roots = ", ".join(sorted(CONTEXT_ROOTS | extra_roots))
            return CelCompileError(
                expression, f"undeclared reference to {name!r} (the context has {roots})", line, column
            )
    return CompiledExpression(
        expression,
        frozenset(analysis.steps),
        runner,
        frozenset(analysis.outputs),
        frozenset(analysis.iteration_steps),
    )


CANDIDATES_ROOT: Final = "candidates"
"""The variable only `loop.candidates.select` has (planner/candidates.py)."""


def compile_expression(expression: str, extra_roots: frozenset[str] = frozenset()) -> CompiledExpression:
    """Parse and check ``expression``; the result is cached per distinct text.

    ``extra_roots`` are variables the expression's own field adds to the context (``candidates``).
    Raises ``CelCompileError`` naming the expression, the problem and its position.
    """
    result = _compile_cached(expression, extra_roots)
    if isinstance(result, CelCompileError):
        # a fresh instance: re-raising the cached one would grow its traceback on every call
        raise CelCompileError(result.expression, result.reason, result.line, result.column)
    return result


def referenced_steps(expression: str | CompiledExpression) -> set[str]:
    """Names X used as ``steps.X``/``steps["X"]``; text inside string literals is never counted."""
    compiled = expression if isinstance(expression, CompiledExpression) else compile_expression(expression)
    return set(compiled.referenced_steps)


# ------------------------------------------------------------------------------------ the context


@dataclass(frozen=True)
class EarlierStep:
    """What an expression may read about an earlier step as ``steps.<name>``."""

    phase: str
    completed_iterations: int = 0
    control: Mapping[str, Any] | None = None  # its last control object; {} when it had none


_CEL_VALUE_TYPES: Final = (
    celtypes.BoolType,
    celtypes.IntType,
    celtypes.UintType,
    celtypes.DoubleType,
    celtypes.StringType,
    celtypes.BytesType,
    celtypes.ListType,
    celtypes.MapType,
    celtypes.TimestampType,
    celtypes.DurationType,
)


def to_cel(value: Any) -> Any:
    """Convert a JSON-like Python value to CEL; CEL values pass through unchanged.

    Integers outside int64 (legal in JSON) become doubles rather than an overflow error.
    """
    if value is None or isinstance(value, _CEL_VALUE_TYPES):
        return value
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        if _INT64_MIN <= value <= _INT64_MAX:
            # IntType(value) re-creates a range-checking wrapper on every call (~25 us); the range
            # is checked right here, so build the int subclass directly.
            return int.__new__(celtypes.IntType, value)
        try:
            return celtypes.DoubleType(float(value))
        except OverflowError:
            return celtypes.DoubleType(math.copysign(math.inf, value))
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, Mapping):
        return celtypes.MapType({celtypes.StringType(str(k)): to_cel(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return celtypes.ListType([to_cel(item) for item in value])
    raise TypeError(f"cannot use a {type(value).__name__} in a CEL context")


def build_context(
    *,
    run_name: str,
    run_namespace: str,
    step_name: str,
    run_parameters: Mapping[str, str] | None = None,
    iteration_index: int = 0,
    max_iterations: int = 0,
    last_phase: str = "",
    last_control: Mapping[str, Any] | None = None,
    item: Any = None,
    steps: Mapping[str, EarlierStep] | None = None,
    outputs: Mapping[str, list[Any]] | None = None,
    iteration_steps: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The documented CEL context (docs/cel.md), converted to CEL values.

    ``iteration_index`` is the 1-based index of the iteration that just completed (0 before any, as
    for ``when`` and ``loop.items``); ``last_control`` is ``{}`` when unavailable; ``item`` is the
    forEach item (``null`` outside forEach); ``steps`` holds earlier steps only.
    """
    earlier = {
        name: {
            "phase": s.phase,
            "completedIterations": s.completed_iterations,
            "control": dict(s.control or {}),
        }
        for name, s in (steps or {}).items()
    }
    return {
        "iteration": to_cel(
            {
                "index": iteration_index,
                "maxIterations": max_iterations,
                "last": {"phase": last_phase, "control": dict(last_control or {})},
                "item": item,
                "steps": {k: dict(v) for k, v in (iteration_steps or {}).items()},
            }
        ),
        "step": to_cel({"name": step_name}),
        "run": to_cel(
            {"name": run_name, "namespace": run_namespace, "parameters": dict(run_parameters or {})}
        ),
        "steps": to_cel(earlier),
        "outputs": to_cel({k: list(v) for k, v in (outputs or {}).items()}),
    }


# ------------------------------------------------------------------------------------- evaluating

_TYPE_NAMES: Final = {
    "BoolType": "bool",
    "IntType": "int",
    "UintType": "uint",
    "DoubleType": "double",
    "StringType": "string",
    "BytesType": "bytes",
    "ListType": "list",
    "MapType": "map",
    "MessageType": "map",
    "TimestampType": "timestamp",
    "DurationType": "duration",
    "TypeType": "type",
    "NoneType": "null",
}
_OPERATORS: Final = {
    "relation_lt": "<",
    "relation_le": "<=",
    "relation_gt": ">",
    "relation_ge": ">=",
    "relation_eq": "==",
    "relation_ne": "!=",
    "relation_in": "in",
    "addition_add": "+",
    "addition_sub": "-",
    "multiplication_mul": "*",
    "multiplication_div": "/",
    "multiplication_mod": "%",
    "unary_not": "!",
    "unary_neg": "-",
}
_CLASS_RE: Final = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>")
_TOKEN_RE: Final = re.compile(r"Token\('RULE', '(\w+)'\)")


def cel_type_name(value: Any) -> str:
    """The CEL name of a value's type (``int``, ``map``, ``null``...)."""
    if isinstance(value, type):
        return "type"
    for cls in type(value).__mro__:
        if cls.__name__ in _TYPE_NAMES:
            return _TYPE_NAMES[cls.__name__]
    return type(value).__name__


def _eval_reason(exc: BaseException) -> str:
    """A readable reason from celpy's error (which can embed a dump of the whole activation)."""
    if isinstance(exc, RecursionError):
        return "evaluation nested too deeply"
    message = str(exc.args[0]) if exc.args else type(exc).__name__
    message = message.split(" (in activation", 1)[0]
    message = _TOKEN_RE.sub(lambda m: _OPERATORS.get(m.group(1), m.group(1)), message)
    message = _CLASS_RE.sub(lambda m: _TYPE_NAMES.get(m.group(1), m.group(1)), message)
    message = message.replace("found no matching overload", "no matching overload")
    hint = ""
    if message.startswith("no such member in mapping: "):
        message = "no such key " + message.removeprefix("no such member in mapping: ")
        hint = "; use has(...) to test for an optional field"
    tree = getattr(exc, "tree", None)
    if tree is not None:
        with contextlib.suppress(Exception):  # the source excerpt is a nicety
            message += f" in `{' '.join(tree_dump(tree).split())}`"
    if not isinstance(exc, CELEvalError) and not message.startswith(type(exc).__name__):
        message = f"{type(exc).__name__}: {message}"
    return _short(message + hint)


def _evaluate(compiled: CompiledExpression, context: Mapping[str, Any]) -> Any:
    try:
        activation = {name: to_cel(value) for name, value in context.items()}
        return compiled._runner.evaluate(activation)
    except Exception as exc:  # CELEvalError, CELUnsupportedError, TypeError from to_cel, celpy bugs
        raise CelEvaluationError(compiled.expression, _eval_reason(exc)) from exc


def evaluate_bool(compiled: CompiledExpression, context: Mapping[str, Any]) -> bool:
    """Evaluate a condition (``expression``, ``until``, ``when``); it must give a bool."""
    value = _evaluate(compiled, context)
    if not isinstance(value, celtypes.BoolType):
        raise CelEvaluationError(
            compiled.expression, f"expression returned {cel_type_name(value)}, expected bool"
        )
    return bool(value)


def from_cel(value: Any, where: str = "result") -> Any:
    """A JSON-native Python value (str/int/float/bool/None/list/dict) from a CEL value.

    Bytes become base64, timestamps RFC 3339 text and durations like ``"1.5s"``, as in protobuf
    JSON; map keys become strings. Non-finite doubles and type values have no JSON form: TypeError.
    """
    if value is None:
        return None
    if isinstance(value, celtypes.BoolType | bool):
        return bool(value)
    if isinstance(value, celtypes.DoubleType | float):
        if not math.isfinite(value):
            raise TypeError(f"{where} is {float(value)}, which JSON cannot represent")
        return float(value)
    if isinstance(value, type):
        raise TypeError(f"{where} is a type, not a JSON value")
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, celtypes.TimestampType):
        return str(value)
    if isinstance(value, celtypes.DurationType):
        return f"{value.total_seconds():g}s"
    if isinstance(value, Mapping):
        return {_json_key(k): from_cel(v, f"{where}[{_json_key(k)!r}]") for k, v in value.items()}
    if isinstance(value, Iterable):
        return [from_cel(item, f"{where}[{i}]") for i, item in enumerate(value)]
    raise TypeError(f"{where} is a {cel_type_name(value)}, not a JSON value")


def _json_key(key: Any) -> str:
    if isinstance(key, celtypes.BoolType | bool):
        return "true" if key else "false"
    return str(key)


def evaluate_list(compiled: CompiledExpression, context: Mapping[str, Any]) -> list[Any]:
    """Evaluate ``loop.items``; it must give a list, returned as JSON-native Python values."""
    value = _evaluate(compiled, context)
    if not isinstance(value, celtypes.ListType | list):
        raise CelEvaluationError(
            compiled.expression, f"expression returned {cel_type_name(value)}, expected list"
        )
    try:
        return [from_cel(item, f"item {i}") for i, item in enumerate(value)]
    except TypeError as exc:
        raise CelEvaluationError(compiled.expression, str(exc)) from exc


def evaluate_json(compiled: CompiledExpression, context: Mapping[str, Any]) -> Any:
    """Evaluate ``loop.output.expression`` or ``switch.expression``: any JSON value."""
    value = _evaluate(compiled, context)
    try:
        return from_cel(value)
    except TypeError as exc:
        raise CelEvaluationError(compiled.expression, str(exc)) from exc
