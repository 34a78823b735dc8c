"""JSON logs: one object per line; decision lines carry `correlation_id` (the run's uid), `run`,
`step`, `path`, `iteration`, `attempt` and `decision` as fields (docs/operator.md#observability)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}
NULLABLE_FIELDS = frozenset({"step", "path", "iteration", "attempt"})
"""Fields written even when empty (as null): a decision about the whole run names no step."""


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            # Only plain values: kopf attaches its whole settings object to every record.
            plain = isinstance(value, str | int | float | bool) or (value is None and key in NULLABLE_FIELDS)
            if plain and key not in _STANDARD and not key.startswith("_"):
                payload[key] = value
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, separators=(",", ":"))


def configure(fmt: str = "json", level: str = "INFO") -> None:
    # Neither format prints where a line was logged from; without this, every record walks the
    # stack to find it (the logging HOWTO's "Optimization": a visible share of the profile).
    logging._srcfile = None
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
