"""Deterministic names and labels (docs/design.md#restart-safety): the same input gives the same Job."""

from __future__ import annotations

import hashlib

from agentrun_operator.api.base import GROUP as GROUP  # labels and annotations are prefixed with it

LABEL_RUN = f"{GROUP}/agent-run"
LABEL_STEP = f"{GROUP}/step"
LABEL_STEP_INDEX = f"{GROUP}/step-index"
LABEL_ITERATION = f"{GROUP}/iteration"
LABEL_ATTEMPT = f"{GROUP}/attempt"
LABEL_STEP_PATH = f"{GROUP}/step-path"  # only on Jobs of nested steps: the address, e.g. `2i3-1`
LABEL_STEP_ITERATION = f"{GROUP}/step-iteration"
"""Only on Jobs of a loop body's child without a loop of its own: the iteration of the child itself
(always 1, as in its Job name), while `LABEL_ITERATION` carries the body's iteration (the
AGENTRUN_ITERATION its pod sees), so `-l agents.proompteng.ai/iteration=3` finds body iteration 3."""
ANNOTATION_STEP = f"{GROUP}/step"
"""Only on Jobs (and pods) of nested steps: the step's path as Events and logs name it, with the
iteration of every looping ancestor (`develop/iteration 2/review`)."""
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "agentrun-operator"

MAX_NAME = 63
_HASH_LEN = 8


def step_address(ancestors: tuple[str, ...], step_index: int) -> str:
    """Where a step sits in the tree, with the iteration (or case) of every ancestor: `2i3-1`.

    Each ancestor is a segment `<index>i<iteration>` (a group; iteration 1 without a loop) or
    `<index>c<case>` (a switch: case 1.., 0 for the default), then the step's own 1-based index. A
    top-level step's address is its index alone. Label-safe (`[0-9a-z-]`).
    """
    return "-".join((*ancestors, str(step_index)))


def tree_path(path: str) -> str:
    """The path without the ancestors' iterations: `develop/iteration 2/review` -> `develop/review`.

    Step names are DNS labels (no spaces), so an `iteration N` segment is never a step's name."""
    return "/".join(part for part in path.split("/") if not part.startswith("iteration "))


def job_name(
    run_name: str, step_index: int, iteration: int, attempt: int, ancestors: tuple[str, ...] = ()
) -> str:
    """`<run>-step-<address>-iter-<k>-attempt-<a>`; cut to 63 characters with a hash suffix when too long.

    `step_index` and `iteration` are 1-based, as in the loop proposal's `run-step-1-iter-2-attempt-1`
    (docs/design.md#origin); a top-level step's address is its index, so its names are unchanged. A
    nested step's address carries its ancestors' iterations (`step_address`), so every iteration of
    a loop body gets Jobs of its own. When the name is too long the run name is cut first; when the
    suffix alone is too long, the address is replaced by a hash of the whole name.
    """
    suffix = f"-step-{step_address(ancestors, step_index)}-iter-{iteration}-attempt-{attempt}"
    full = f"{run_name}{suffix}"
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:_HASH_LEN]
    keep = MAX_NAME - len(suffix) - _HASH_LEN - 1
    if keep >= 1:
        return f"{run_name[:keep].rstrip('-.')}-{digest}{suffix}"
    tail = f"-{digest}-iter-{iteration}-attempt-{attempt}"
    head = f"{run_name}-step-{step_address(ancestors, step_index)}"[: MAX_NAME - len(tail)]
    return f"{head.rstrip('-.')}{tail}"


PROMOTION_SUFFIX = "-promote"


def promotion_job_name(attempt_job: str) -> str:
    """The Job that puts the winning candidate's files into the workspace after the candidates' Job
    `attempt_job` (docs/concepts.md#candidates): `<attempt job>-promote`, cut with a hash when too long."""
    full = f"{attempt_job}{PROMOTION_SUFFIX}"
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:_HASH_LEN]
    head = attempt_job[: MAX_NAME - len(PROMOTION_SUFFIX) - _HASH_LEN - 1].rstrip("-.")
    return f"{head}-{digest}{PROMOTION_SUFFIX}"


def is_promotion_job(name: str) -> bool:
    """A promotion Job (`promotion_job_name`): an iteration Job's name ends with `-attempt-<n>`."""
    return name.endswith(PROMOTION_SUFFIX)


def candidate_checkpoint_id(start_checkpoint: str, index: int | str) -> str:
    """The end state of candidate `index` of the iteration whose start is `start_checkpoint`:
    `<start>c<index>` (an iteration's candidates are kept and pruned with it)."""
    return f"{start_checkpoint}c{index}"


WARM_SECRET_SUFFIX = "-warm"
LABEL_WARM = f"{GROUP}/warm"
"""On a warm loop's pods (`"true"`): the chart's NetworkPolicy selects them
(docs/operations.md#warm-network-policy)."""
WARM_KEY_VOLUME = "agentrun-warm-key"
"""The warm pod's volume of the run's warm key (jobs/warm_pod.py)."""
ANNOTATION_WARM_TEMPLATE = f"{GROUP}/warm-template"
"""On a warm loop's Job: the digest of its pod template without what changes per iteration
(jobs/warm_pod.py): the next iteration runs in its pod only when its own Job would be the same."""


def warm_secret_name(run_name: str) -> str:
    """The Secret holding a run's warm key (docs/design.md#warm-pod): `<run>-warm`, cut with a hash
    when the run's name is too long for it."""
    full = f"{run_name}{WARM_SECRET_SUFFIX}"
    if len(full) <= 253:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:_HASH_LEN]
    head = run_name[: 253 - len(WARM_SECRET_SUFFIX) - _HASH_LEN - 1].rstrip("-.")
    return f"{head}-{digest}{WARM_SECRET_SUFFIX}"


CANDIDATES_DIR = ".agentrun/candidates"
"""Where, under the checkpointed volume's root, each candidate's copy of the workspace lives
(`<dir>/<start checkpoint>/<index>`); never recorded in a checkpoint."""


def job_iteration(labels: dict[str, str]) -> str | None:
    """The iteration of the Job's own step (what its name and the planner count), from its labels:
    `LABEL_STEP_ITERATION` where the Job has it, else `LABEL_ITERATION` (every Job of an operator
    before it, and every Job whose step is the loop)."""
    return labels.get(LABEL_STEP_ITERATION, labels.get(LABEL_ITERATION))


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


CHECKPOINT_ID_MAX = 200


def checkpoint_prefix(run_name: str, address: str) -> str:
    """The ids of one loop's checkpoints start with `<run>_<address>_` (`_` is in no run name or
    address, so one loop's prefix never matches another's); a long run name is cut with a hash."""
    head = run_name
    if len(head) + len(address) + 16 > CHECKPOINT_ID_MAX:
        digest = hashlib.sha256(run_name.encode()).hexdigest()[:_HASH_LEN]
        head = f"{run_name[: CHECKPOINT_ID_MAX - len(address) - 32].rstrip('-.')}-{digest}"
    return f"{head}_{address}_"


def checkpoint_id(run_name: str, address: str, iteration: int) -> str:
    """The checkpoint of an iteration's start: `<run>_<address>_<iteration>` (docs/concepts.md#checkpoints).
    Deterministic, so every attempt of the iteration, and a run resumed from it, names the same one."""
    return f"{checkpoint_prefix(run_name, address)}{iteration}"
