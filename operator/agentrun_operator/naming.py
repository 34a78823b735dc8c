"""Deterministic names and labels (docs/design.md#restart-safety): the same input gives the same Job."""

from __future__ import annotations

import hashlib

from agentrun_operator.api.base import GROUP as GROUP  # labels and annotations are prefixed with it

LABEL_RUN = f"{GROUP}/agent-run"
LABEL_STEP = f"{GROUP}/step"
LABEL_STEP_INDEX = f"{GROUP}/step-index"
LABEL_ITERATION = f"{GROUP}/iteration"
LABEL_ATTEMPT = f"{GROUP}/attempt"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "agentrun-operator"

MAX_NAME = 63
_HASH_LEN = 8


def job_name(run_name: str, step_index: int, iteration: int, attempt: int) -> str:
    """`<run>-step-<i>-iter-<k>-attempt-<a>`; cut to 63 characters with a hash suffix when too long.

    `step_index` and `iteration` are 1-based, as in the loop proposal's `run-step-1-iter-2-attempt-1`
    (docs/design.md#origin).
    """
    suffix = f"-step-{step_index}-iter-{iteration}-attempt-{attempt}"
    full = f"{run_name}{suffix}"
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:_HASH_LEN]
    keep = MAX_NAME - len(suffix) - _HASH_LEN - 1
    return f"{run_name[:keep].rstrip('-.')}-{digest}{suffix}"


def label_value(value: str) -> str:
    """A value that is always a valid label value (≤ 63 chars, alnum at both ends)."""
    if len(value) <= MAX_NAME:
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:_HASH_LEN]
    return f"{value[: MAX_NAME - _HASH_LEN - 1].rstrip('-_.')}-{digest}"


def idempotency_claim_name(namespace: str, agent_ref: str, key: str) -> str:
    """The name of the claim object that makes (namespace, agentRef, idempotencyKey) unique."""
    digest = hashlib.sha256(f"{namespace}\0{agent_ref}\0{key}".encode()).hexdigest()[:20]
    return f"agentrun-idem-{digest}"
