"""Shared building blocks of the API models: the base class, scalar types and error formatting.

Everything here is pure (pydantic only) so the planner, the CLI's offline `validate` and the CRD
generator can import it without kopf or a Kubernetes client.
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel

GROUP: Final = "agents.proompteng.ai"
VERSION: Final = "v1alpha1"
ApiVersion = Literal["agents.proompteng.ai/v1alpha1"]
"""The `apiVersion` of our kinds, as the type the models check (a Literal is spelt out, not built)."""
API_VERSION: Final[ApiVersion] = "agents.proompteng.ai/v1alpha1"
assert f"{GROUP}/{VERSION}" == API_VERSION, "API_VERSION must be GROUP/VERSION"
DOCS_API: Final = "docs/api.md"

# Limits shared by the models and the generated CRDs. Every list that a CEL rule iterates needs a
# maxItems, and every string it compares a maxLength, or the apiserver's static cost estimate
# refuses the CRD.
MAX_STEPS: Final = 50
MAX_VOLUMES: Final = 32
MAX_ENV: Final = 128
MAX_VOLUME_NAMES: Final = 32
MAX_PARAMETERS: Final = 100
MAX_ITERATIONS_SCHEMA: Final = 1000
MAX_LOOP_INTERVAL_SECONDS: Final = 86_400
"""loop.intervalSeconds' cap, one day: a loop polls (minutes, hours); a longer wait between iterations is a
schedule (a CronJob creating AgentRuns), and 1000 iterations a day apart would keep one run open for
years."""
MAX_COMMAND_ARGS: Final = 256
MAX_TOLERATIONS: Final = 64
MAX_ACCEPTANCE_CRITERIA: Final = 100
MAX_IMPLEMENTATION_TEXT: Final = 128 * 1024
MAX_CEL_LENGTH: Final = 4096
MAX_PATH_LENGTH: Final = 4096
MAX_NAME_LIST: Final = 256
"""Bound of the lists of names the original API left unbounded (secrets, labels, allow lists): a schema
needs one for the apiserver's CEL cost estimate, and no real manifest comes near it."""
DNS_LABEL_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_LABEL_MAX: Final = 63
NAME_MAX: Final = 253
QUANTITY_PATTERN: Final = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


class ApiModel(BaseModel):
    """Base of every spec model: camelCase on the wire, snake_case in Python, typos rejected.

    `extra="forbid"` makes offline validation catch misspelt fields, which the apiserver would
    otherwise silently prune.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=False,
    )

    def to_dict(self) -> dict[str, Any]:
        """The manifest form: camelCase keys, unset optionals left out."""
        return self.model_dump(by_alias=True, exclude_none=True)


class StatusModel(ApiModel):
    """Base of status models: unknown fields are ignored so an older operator can read a newer status."""

    model_config = ConfigDict(extra="ignore")


def _parse_timestamp(value: Any) -> Any:
    """Accept RFC 3339 strings (with `Z`) and datetimes; naive datetimes are taken as UTC."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)
    return value


@functools.lru_cache(maxsize=4096)
def format_timestamp(value: datetime) -> str:
    """RFC 3339 in UTC with a `Z`, seconds precision unless there are microseconds (metav1.Time style).

    Cached: a status's iteration history holds the same timestamps write after write, and formatting
    them was a visible share of every status write in the profile (docs/operator.md#performance)."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    # isoformat, not strftime: a status holds dozens of timestamps, serialized on every status write.
    return value.isoformat(timespec="microseconds" if value.microsecond else "seconds") + "Z"


Timestamp = Annotated[
    datetime,
    BeforeValidator(_parse_timestamp),
    PlainSerializer(format_timestamp, return_type=str),
]
"""A timezone-aware UTC datetime in Python, an RFC 3339 string on the wire (dumps stay JSON/YAML-safe)."""


def _check_quantity(value: int | str) -> int | str:
    """Reject strings the apiserver would reject, so offline validation agrees with admission."""
    if isinstance(value, str) and not _QUANTITY_RE.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity; use e.g. 500m, 2, 1Gi or 512Mi")
    return value


_QUANTITY_RE: Final = re.compile(QUANTITY_PATTERN)

Quantity = Annotated[
    int | str,
    AfterValidator(_check_quantity),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}),
]
"""A Kubernetes resource quantity (`500m`, `1Gi`, `2`): int or string, as the core API accepts."""
