"""Field paths as users see them: a pydantic error location as `spec.workflow.steps[0].name`.

Dependency-free, so the in-pod reporter's envelope code and the API models share one rendering.
"""

from __future__ import annotations


def error_path(loc: tuple[int | str, ...]) -> str:
    """Render a pydantic error location as a Kubernetes field path: `spec.workflow.steps[0].name`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out:
            out += f".{part}"
        else:
            out = str(part)
    return out
