"""The control envelope: how an iteration's loop-control payload travels from its pod to the operator.

The operator never mounts the PVC (docs/design.md#iteration-pod). Instead the reporter sidecar reads
the control file when the main container has ended and writes a *control envelope* to its own
termination message, which the kubelet copies into the pod status, where the operator reads it back:

    {"v":1,"status":"found","path":"/workspace/.agentrun/loop-control.json","size":41,
     "reason":null,"control":{"continue":true}}

Kubernetes keeps at most 4096 bytes of a termination message (and keeps the *tail* of anything
longer, which would be garbage to us), so every envelope encoded here is guaranteed to fit: a payload
that would not fit becomes ``tooLarge``, and over-long reasons or paths are shortened.

Everything in this module is pure and total: parsing never raises, whatever the bytes, so no control
payload can crash the reporter or the operator. The same rules apply on both ends.

The envelope is a standard-library dataclass, and this module imports no pydantic until the
operator decodes a message (`decode_envelope`): the reporter builds and encodes envelopes inside
every iteration pod, between `main`'s end and the kubelet's next look, where pydantic's import
(about 150 ms of CPU) and its teardown were most of the reporter's time (docs/design.md#reporter-first).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal

from agentrun_operator.fieldpath import error_path

if TYPE_CHECKING:
    from pydantic import TypeAdapter, ValidationError

ENVELOPE_VERSION: Final = 1
#: Kubernetes' cap on one container's termination message (kubelet keeps the *last* 4096 bytes).
MAX_ENVELOPE_BYTES: Final = 4096
#: The reporter never reads more than this (+1, to detect "more") from the control file. A file this
#: large can never fit in an envelope once compacted; the cap only bounds the reporter's work.
MAX_CONTROL_FILE_BYTES: Final = 64 * 1024
#: Objects and arrays may nest this deep (the root object is level 1).
MAX_CONTROL_DEPTH: Final = 32
#: Reasons are for humans and land in the AgentRun status; keep them short.
MAX_REASON_CHARS: Final = 512

ControlStatus = Literal["found", "missing", "stale", "invalid", "tooLarge"]
EffectiveStatus = Literal["found", "missing", "invalid"]

_ELLIPSIS: Final = "…"


def _clean_text(value: str, limit: int | None = None) -> str:
    """Make a string safely UTF-8 encodable (argv and OS errors may carry lone surrogates) and short."""
    value = value.encode("utf-8", "replace").decode("utf-8")
    if limit is not None and len(value) > limit:
        value = value[: max(limit - 1, 0)] + _ELLIPSIS
    return value


@dataclass(frozen=True)
class ControlEnvelope:
    """What the reporter found at the control path, in the shape written to the termination message.

    ``control`` is set exactly when ``status`` is ``found``. ``size`` is the control file's size in
    bytes when the file exists (also for ``stale``, ``invalid`` and ``tooLarge``), else ``None``.
    Every envelope, built here or decoded, passes `__post_init__`: the path and reason cleaned, the
    rules above checked (a ValueError otherwise). `replace` makes a changed copy.
    """

    status: ControlStatus
    path: str
    size: int | None = None
    reason: str | None = None
    control: dict[str, Any] | None = None
    claim: dict[str, Any] | None = None
    """The Job claim's outcome (`control/claim.py` report) when it is news: unavailable, or taken by
    another pod. Rides along only when it fits beside everything else (it never shrinks the
    control's budget); older operators ignore it."""
    commit: str | None = None
    """The commit the pod's Git checkout is at, when the iteration moved it (docs/api.md#version-control)."""
    artifacts: list[dict[str, Any]] | None = None
    """The provider's output artifacts the pod left: name, path, size, digest
    (docs/api.md#output-artifacts)."""
    checkpoint: dict[str, Any] | None = None
    """loop.checkpoint: the checkpoint the pod recorded or restored before `main` (id, files, bytes,
    addedBytes, restored, ms; control/checkpointing.py); docs/concepts.md#checkpoints."""
    warm: dict[str, Any] | None = None
    """A warm pod's termination message: which iteration this envelope is of, and its command's exit
    code (`{"id", "exitCode"}`, control/warm.py); docs/design.md#warm-channel. Kept whatever else must
    give way (`attach_warm`): without it the envelope could not be told from another iteration's."""
    v: Literal[1] = ENVELOPE_VERSION

    __pydantic_config__: ClassVar[dict[str, Any]] = {"strict": True}
    """How `decode_envelope` checks a document: types exactly as JSON gives them (no "1" for 1)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", _clean_text(self.path))
        if self.reason is not None:
            object.__setattr__(self, "reason", _clean_text(self.reason, MAX_REASON_CHARS))
        if self.size is not None and self.size < 0:
            raise ValueError(f"size must be 0 or more, got {self.size}")
        if self.status == "found" and self.control is None:
            raise ValueError("a 'found' envelope must carry a control object")
        if self.status != "found" and self.control is not None:
            raise ValueError(f"a {self.status!r} envelope must not carry a control object")
        if self.warm is not None:
            _check_warm(self.warm)

    def replace(self, **changes: Any) -> ControlEnvelope:
        """A copy with `changes`, checked as a new envelope is."""
        return dataclasses.replace(self, **changes)


MAX_WARM_ID_CHARS: Final = 253


def _check_warm(warm: dict[str, Any]) -> None:
    iteration, code = warm.get("id"), warm.get("exitCode")
    if set(warm) != {"id", "exitCode"}:
        raise ValueError(f"warm must hold exactly id and exitCode, got {sorted(warm)}")
    if not isinstance(iteration, str) or not 0 < len(iteration) <= MAX_WARM_ID_CHARS:
        raise ValueError(f"warm.id must be a string of 1 to {MAX_WARM_ID_CHARS} characters")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
        raise ValueError("warm.exitCode must be an integer or null")


def effective_status(env: ControlEnvelope) -> EffectiveStatus:
    """The status the planner acts on: ``stale`` counts as ``missing``, ``tooLarge`` as ``invalid``.

    A control file left by an earlier iteration says nothing about this one, so it is as good as
    absent (``onMissing``); a payload too large to transport could not be evaluated (``onInvalid``).
    """
    if env.status == "stale":
        return "missing"
    if env.status == "tooLarge":
        return "invalid"
    return env.status


# --------------------------------------------------------------------------------------- encoding


def _dump(value: Any, *, ascii_only: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ascii_only, separators=(",", ":"), allow_nan=False)


def _as_doc(env: ControlEnvelope) -> dict[str, Any]:
    """The wire document, with a fixed key order (so sizes are predictable)."""
    doc: dict[str, Any] = {
        "v": env.v,
        "status": env.status,
        "path": env.path,
        "size": env.size,
        "reason": env.reason,
        "control": env.control,
    }
    if env.claim is not None:
        doc["claim"] = env.claim
    if env.commit is not None:
        doc["commit"] = env.commit
    if env.artifacts is not None:
        doc["artifacts"] = env.artifacts
    if env.checkpoint is not None:
        doc["checkpoint"] = env.checkpoint
    if env.warm is not None:
        doc["warm"] = env.warm
    return doc


def attach_warm(env: ControlEnvelope, warm: dict[str, Any]) -> ControlEnvelope:
    """`env` with `warm`, which always fits (a short id and a number): when the rest does not fit
    beside it, the claim gives way first, then the artifacts (from the end), the commit and the
    checkpoint's facts, and last the control itself (`tooLarge`, `fit_envelope`)."""
    env = env.replace(warm=warm)
    for dropped in ({}, {"claim": None}):
        env = env.replace(**dropped)
        if _fits(env):
            return env
    artifacts = list(env.artifacts or [])
    while artifacts:
        artifacts.pop()
        env = env.replace(artifacts=artifacts)
        if _fits(env):
            return env
    for dropped in ({"artifacts": None}, {"commit": None}, {"checkpoint": None}):
        env = env.replace(**dropped)
        if _fits(env):
            return env
    return fit_envelope(env)


def _fits(env: ControlEnvelope) -> bool:
    try:
        return len(_wire(env)) <= MAX_ENVELOPE_BYTES
    except (ValueError, TypeError, RecursionError):
        return False


def attach_checkpoint(env: ControlEnvelope, facts: dict[str, Any]) -> ControlEnvelope:
    """`env` with the checkpoint's facts when they fit in the termination message (they are small:
    an id and a few numbers); else with the id alone, else unchanged."""
    env = fit_envelope(env)
    for candidate in (facts, {"id": facts.get("id")}):
        try:
            attached = env.replace(checkpoint=candidate)
            if len(_wire(attached)) <= MAX_ENVELOPE_BYTES:
                return attached
        except (ValueError, TypeError):
            return env
    return env


def attach_extras(
    env: ControlEnvelope, commit: str | None, artifacts: list[dict[str, Any]] | None
) -> ControlEnvelope:
    """`env` with the commit and the artifacts, as many as fit in the termination message: artifacts
    are dropped from the end first, then the commit; the control envelope itself is never changed."""
    env = fit_envelope(env)
    kept = list(artifacts or [])
    while True:
        candidate = env.replace(commit=commit, artifacts=kept if artifacts is not None else None)
        try:
            if len(_wire(candidate)) <= MAX_ENVELOPE_BYTES:
                return candidate
        except (ValueError, TypeError):
            return env
        if kept:
            kept.pop()
        elif commit is not None:
            commit = None
        else:
            return env


def _wire(env: ControlEnvelope) -> bytes:
    """Compact UTF-8 JSON of the envelope. Raises for a control that is not JSON (NaN, surrogates...)."""
    return _dump(_as_doc(env)).encode("utf-8")


def max_control_bytes(
    path: str, size: int | None, reason: str | None = None, warm: dict[str, Any] | None = None
) -> int:
    """How many bytes of compact control JSON fit in a ``found`` envelope for this path and size
    (beside `warm`, in a warm pod's termination message)."""
    skeleton = ControlEnvelope(status="found", path=path, size=size, reason=reason, control={}, warm=warm)
    return max(MAX_ENVELOPE_BYTES - (len(_wire(skeleton)) - len(b"{}")), 0)


def _too_large(
    path: str, size: int | None, compact_bytes: int | None, warm: dict[str, Any] | None = None
) -> ControlEnvelope:
    budget = max_control_bytes(path, size, warm=warm)
    if compact_bytes is None:
        what = f"control file is {size} bytes"
        tail = f" (files over {MAX_CONTROL_FILE_BYTES} bytes are not even read)"
    else:
        what = f"control file is {size} bytes"
        if compact_bytes != size:
            what += f" ({compact_bytes} bytes as compact JSON)"
        tail = ""
    reason = f"{what}; at most {budget} bytes fit in the {MAX_ENVELOPE_BYTES}-byte termination message{tail}"
    return ControlEnvelope(status="tooLarge", path=path, size=size, reason=reason, warm=warm)


def _shrunk(text: str, keep: int) -> str:
    return text[: max(keep - 1, 0)] + _ELLIPSIS if len(text) > keep else text


def _fit_text_fields(env: ControlEnvelope) -> ControlEnvelope:
    """Shorten reason, then path, until a control-less envelope fits (rarely needed: huge paths)."""
    for field in ("reason", "path"):
        text = getattr(env, field)
        if text is None or len(_wire(env)) <= MAX_ENVELOPE_BYTES:
            continue
        lo, hi = 0, len(text)  # binary search the longest prefix that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(_wire(env.replace(**{field: _shrunk(text, mid)}))) <= MAX_ENVELOPE_BYTES:
                lo = mid
            else:
                hi = mid - 1
        env = env.replace(**{field: _shrunk(text, lo)})
    return env


def fit_envelope(env: ControlEnvelope) -> ControlEnvelope:
    """Return ``env`` or a replacement whose encoding is well-formed JSON of at most 4096 bytes.

    A ``found`` envelope that would not fit becomes ``tooLarge``; a control object that is not
    encodable JSON becomes ``invalid``; over-long reasons and paths are shortened. The claim is
    kept only when it fits beside the rest; `warm` always is (the control's room shrinks by it).
    """
    claim, env = env.claim, env.replace(claim=None)
    fitted = _fit_without_claim(env)
    if claim is None:
        return fitted
    with_claim = fitted.replace(claim=claim)
    try:
        return with_claim if len(_wire(with_claim)) <= MAX_ENVELOPE_BYTES else fitted
    except (ValueError, TypeError, RecursionError):
        return fitted


def _fit_without_claim(env: ControlEnvelope) -> ControlEnvelope:
    if env.control is not None:
        try:
            if len(_wire(env)) <= MAX_ENVELOPE_BYTES:
                return env
            compact = len(_dump(env.control).encode("utf-8"))
        except (ValueError, TypeError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
            env = ControlEnvelope(
                status="invalid", path=env.path, size=env.size, reason=_unencodable_reason(exc), warm=env.warm
            )
        else:
            env = _too_large(env.path, env.size, compact, env.warm)
    return _fit_text_fields(env)


def _unencodable_reason(exc: BaseException) -> str:
    if isinstance(exc, UnicodeError):
        return "control contains a string with an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)"
    if isinstance(exc, RecursionError):
        return f"nested deeper than {MAX_CONTROL_DEPTH} levels"
    return f"control is not encodable as JSON: {exc}"


def encode_envelope(env: ControlEnvelope) -> str:
    """The compact JSON text for the termination message; always at most 4096 bytes as UTF-8."""
    return _wire(fit_envelope(env)).decode("utf-8")


# --------------------------------------------------------------------------------------- parsing


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _loads(text: str) -> Any:
    """Strict JSON: no NaN/Infinity, no numbers that overflow to infinity."""
    return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)


def _json_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if value is None:
        return "null"
    return type(value).__name__


def _depth(value: Any) -> int:
    """Nesting depth of containers (iterative, so a hostile document cannot blow the stack)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_CONTROL_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest


def _object_problem(value: Any) -> str | None:
    """Why a parsed value is not an acceptable control object, or None when it is."""
    if not isinstance(value, dict):
        return f"root must be a JSON object, got {_json_kind(value)}"
    if _depth(value) > MAX_CONTROL_DEPTH:
        return f"nested deeper than {MAX_CONTROL_DEPTH} levels"
    return None


def _looks_truncated(exc: json.JSONDecodeError) -> bool:
    """The error is at the end of the text (or in a literal/string cut short by the end)."""
    rest = exc.doc[exc.pos :].rstrip()
    if not rest or exc.msg.startswith("Unterminated string"):
        return True
    return any(word.startswith(rest) for word in ("true", "false", "null"))


def _json_error_reason(exc: json.JSONDecodeError) -> str:
    if _looks_truncated(exc):
        return (
            f"invalid JSON: unexpected end of input at line {exc.lineno} column {exc.colno} "
            f"(truncated file?): {exc.msg}"
        )
    return f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"


def parse_control_payload(data: bytes, path: str, *, file_size: int | None = None) -> ControlEnvelope:
    """Apply the payload rules to the bytes of a control file; never raises.

    ``data`` may be only the first ``MAX_CONTROL_FILE_BYTES + 1`` bytes of the file, with
    ``file_size`` its real size (from ``fstat``); larger files are ``tooLarge`` without parsing.
    """
    size = max(len(data), file_size or 0)

    def invalid(reason: str) -> ControlEnvelope:
        return fit_envelope(ControlEnvelope(status="invalid", path=path, size=size, reason=reason))

    try:
        if size == 0:
            return invalid("empty file")
        if size > MAX_CONTROL_FILE_BYTES:
            return fit_envelope(_too_large(path, size, None))
        nul = data.find(b"\x00")
        if nul >= 0:
            return invalid(f"binary data (NUL byte at offset {nul}); the control file must be JSON text")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return invalid(f"not UTF-8 text: invalid byte 0x{data[exc.start]:02x} at offset {exc.start}")
        text = text.removeprefix("\ufeff")  # a UTF-8 byte order mark is harmless; some editors write it
        if not text.strip():
            return invalid("file contains only whitespace")
        try:
            value = _loads(text)
        except json.JSONDecodeError as exc:
            return invalid(_json_error_reason(exc))
        except RecursionError:  # thousands of levels: the root is still known from its first byte
            if text.lstrip().startswith("["):
                return invalid("root must be a JSON object, got array")
            return invalid(f"nested deeper than {MAX_CONTROL_DEPTH} levels")
        except ValueError as exc:  # NaN/Infinity, 1e999, integers with thousands of digits
            return invalid(f"invalid JSON: {exc}")
        problem = _object_problem(value)
        if problem is not None:
            return invalid(problem)
        return fit_envelope(ControlEnvelope(status="found", path=path, size=size, control=value))
    except Exception as exc:  # pragma: no cover - defensive: the contract is "never raises"
        return invalid(f"unexpected error while parsing: {type(exc).__name__}: {exc}")


# --------------------------------------------------------------------------------------- decoding


@functools.cache
def _wire_adapter() -> TypeAdapter[ControlEnvelope]:
    """pydantic's strict check of a message as an envelope (types as JSON gives them, then
    `__post_init__`). Imported on first use: only the operator decodes, never the reporter."""
    from pydantic import TypeAdapter

    return TypeAdapter(ControlEnvelope)


def _validation_reason(exc: ValidationError) -> str:
    first = exc.errors(include_url=False)[0]
    loc = error_path(tuple(first["loc"])) or "envelope"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{loc}: {first['msg']}{more}"


def decode_envelope(message: str | None, path: str = "") -> ControlEnvelope:
    """Read back the reporter's termination message; never raises.

    Anything that is not a well-formed envelope becomes ``invalid`` with a reason saying what was
    wrong: an absent message means the reporter never finished (killed, crashed, not started), so
    nothing is known about the control file, which must not silently count as "missing". ``path``
    (the configured control path) is used in such envelopes.
    """
    try:
        if message is None or not message.strip():
            return ControlEnvelope(
                status="invalid",
                path=path,
                reason="reporter left no termination message (it did not run to completion)",
            )
        try:
            doc = _loads(message)
        except RecursionError:
            return _foreign(path, "nested too deeply")
        except ValueError as exc:  # includes JSONDecodeError
            truncated = "; it may have been cut to its last 4096 bytes" if len(message) >= 4000 else ""
            return _foreign(path, f"not JSON ({exc}){truncated}")
        if not isinstance(doc, dict):
            return _foreign(path, f"a JSON {_json_kind(doc)}, not an object")
        if "v" in doc and doc["v"] != ENVELOPE_VERSION:
            return _foreign(path, f"unsupported envelope version {doc['v']!r} (this operator reads v1)")
        if isinstance(doc.get("path"), str) and doc["path"]:
            path = doc["path"]
        from pydantic import ValidationError

        try:  # the message again, not `doc`: strict mode takes an object for a dataclass only from JSON
            env = _wire_adapter().validate_json(message)
        except ValidationError as exc:
            return _foreign(path, _validation_reason(exc))
        if env.control is not None:
            problem = _object_problem(env.control)
            if problem is not None:
                return ControlEnvelope(status="invalid", path=env.path, size=env.size, reason=problem)
        return env
    except Exception as exc:  # pragma: no cover - defensive: the contract is "never raises"
        return _foreign(path, f"unexpected {type(exc).__name__}: {exc}")


def _foreign(path: str, detail: str) -> ControlEnvelope:
    return ControlEnvelope(
        status="invalid",
        path=_clean_text(path, 1024),
        reason=f"termination message is not a control envelope: {detail}",
    )
