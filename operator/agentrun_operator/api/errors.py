"""Turning pydantic validation errors into the lines users see (CLI output, InvalidSpec messages)."""

from __future__ import annotations

from typing import Final

from pydantic import ValidationError

from agentrun_operator.fieldpath import error_path as error_path  # re-exported by api

from .rules import ALL_STATIC_RULES

_FIELD_PATHS: Final[dict[str, str]] = {r.message: r.field_path for r in ALL_STATIC_RULES if r.field_path}


def at_rule_field(path: str, message: str) -> tuple[str, str | None]:
    """Move an object-level rule's error to the field the apiserver names (the rule's `fieldPath`).

    A model validator reports at the object (`spec.workload.volumes[0]`); the CRD rule with the same
    message names the field (`….claimName`). Returns the path and the field path appended, if any.
    """
    field_path = _FIELD_PATHS.get(message)
    if not field_path or path.endswith(field_path):
        return path, None
    return (f"{path}{field_path}" if path else field_path.lstrip(".")), field_path


def format_validation_error(err: ValidationError, prefix: str = "") -> list[str]:
    """One line per problem, `field.path: message`, for the CLI and for InvalidSpec status messages.

    pydantic prefixes messages of custom validators with "Value error, "; that noise is dropped
    because our messages already say what is wrong and how to fix it.
    """
    lines: list[str] = []
    for item in err.errors():
        loc = tuple(p for p in item["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        path = error_path(loc)
        if prefix:
            path = f"{prefix}.{path}" if path else prefix
        msg = str(item["msg"])
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
            path, _ = at_rule_field(path, msg)
        elif item["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling against docs/api.md"
        lines.append(f"{path}: {msg}" if path else msg)
    return lines
