"""What the reporter does with the workspace's checkpoint before `main` starts (loop.checkpoint,
docs/concepts.md#checkpoints): restore the checkpoint a retry or a resumed run starts from, record
the iteration's start, prune what the loop no longer keeps. Standard library only, like the
reporter (control/checkpoint.py is the store).

The planner decides, the pod carries out: the iteration's checkpoint id is deterministic
(`naming.checkpoint_id`), so every attempt of an iteration names the same one. The first attempt
that finds none records it (no `main` has run in the iteration before that, so the volume is the
iteration's start); a later attempt finds it and, with `onFailedAttempt: Restore`, puts the
volume back to it. When the operator already saw an attempt record it (`expected`), a missing or
damaged checkpoint is an error, never a silent new recording of a dirty volume.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Final

from agentrun_operator.control import checkpoint as store

CHECKPOINT_EXIT: Final = 4
"""The reporter's exit code when the checkpoint failed before `main` (its termination message says why)."""
CHECKPOINT_ANCHOR: Final = "docs/troubleshooting.md#checkpoint-failed"
"""Every checkpoint refusal ends with this anchor: the operator knows the refusal by it, too."""
REFUSED: Final = "checkpoint"
"""The ready file's word for a pod whose checkpoint failed: the hook keeps `main`'s gate shut."""


@dataclass(frozen=True)
class CheckpointArgs:
    """The reporter's checkpoint arguments, as the Job builder wrote them."""

    root: str
    """The state volume's mountPath: what is recorded and restored."""
    checkpoint_id: str
    prefix: str
    """The loop's ids start with it: `keep` counts these (`naming.checkpoint_prefix`)."""
    keep: int
    exclude: tuple[str, ...] = ()
    restore_own: bool = False
    """onFailedAttempt: Restore: an attempt that finds its iteration's checkpoint restores it."""
    expected: bool = False
    """An earlier attempt reported this checkpoint: it must exist."""
    restore_from: str | None = None
    """A resumed run's first iteration: the source run's checkpoint to start from."""
    owner: str = ""
    """The run's uid: a checkpoint of the same id left by an earlier run of the same name is not ours."""


class CheckpointRefusal(Exception):
    """`main` must not start: the message (one line, ending with `CHECKPOINT_ANCHOR`) says why."""


def _refusal(what: str, exc: BaseException) -> CheckpointRefusal:
    return CheckpointRefusal(f"checkpoint: {what}: {exc}; see {CHECKPOINT_ANCHOR}")


def prepare_workspace(args: CheckpointArgs) -> dict[str, Any]:
    """Restore and record as the arguments say; the facts the envelope carries (`checkpoint`).
    Raises `CheckpointRefusal` when `main` must not start."""
    facts: dict[str, Any] = {"id": args.checkpoint_id}
    ours = _ours(args)
    if args.expected and not ours:
        raise _refusal("cannot restore the iteration's start", _why_not_ours(args))
    if ours:
        if args.restore_own:
            try:
                done = store.restore(args.root, args.checkpoint_id, args.exclude)
            except store.CheckpointError as exc:
                raise _refusal("cannot restore the iteration's start", exc) from None
            facts["restored"] = args.checkpoint_id
            facts["restoreMs"] = round(done.seconds * 1000)
        return facts | _described(args)
    if args.restore_from:
        try:
            done = store.restore(args.root, args.restore_from, args.exclude)
        except store.CheckpointError as exc:
            raise _refusal(f"cannot start from checkpoint {args.restore_from!r}", exc) from None
        facts["restored"] = args.restore_from
        facts["restoreMs"] = round(done.seconds * 1000)
    try:
        made = store.record(args.root, args.checkpoint_id, args.exclude, owner=args.owner)
    except store.CheckpointError as exc:
        raise _refusal("cannot record the iteration's start", exc) from None
    facts |= {"files": made.files, "bytes": made.bytes, "addedBytes": made.added_bytes}
    facts["ms"] = round(made.seconds * 1000)
    try:
        store.prune(args.root, args.prefix, max(args.keep, 1))
    except (
        store.CheckpointError,
        OSError,
        ValueError,
    ) as exc:  # the checkpoint is made: pruning can wait for the next one
        facts["pruneError"] = str(exc)[:200]
    return facts


def _ours(args: CheckpointArgs) -> bool:
    """This run's checkpoint of the iteration is in the store. One of the same id left by an earlier
    run of the same name, or one whose manifest is damaged, is not: it is recorded anew (with
    `expected`, the refusal says it is gone)."""
    try:
        return (
            store.exists(args.root, args.checkpoint_id)
            and store.owner(args.root, args.checkpoint_id) == args.owner
        )
    except store.CheckpointError:
        return False


def _why_not_ours(args: CheckpointArgs) -> Exception:
    """Why a checkpoint an earlier attempt recorded cannot be used now: the store's own words."""
    where = os.path.join(args.root, store.STORE_DIR)
    try:
        found = store.owner(args.root, args.checkpoint_id)
    except store.CheckpointError as exc:
        return exc
    return store.CheckpointMissing(
        f"checkpoint {args.checkpoint_id!r} in {where} was recorded by another run "
        f"(uid {found or 'unknown'}), "
        f"not this one ({args.owner}): the store was replaced"
    )


def _described(args: CheckpointArgs) -> dict[str, Any]:
    """Files and bytes of an existing checkpoint, for the status (an attempt after the first)."""
    for info in store.list_checkpoints(args.root):
        if info.id == args.checkpoint_id:
            return {"files": info.files, "bytes": info.bytes}
    return {}


def save_facts(path: str, facts: dict[str, Any]) -> None:
    """Keep the facts in the pod's meta volume until the report (a restarted reporter reuses them)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(facts, handle, separators=(",", ":"))
    os.replace(tmp, path)


def load_facts(path: str) -> dict[str, Any] | None:
    """The facts `save_facts` kept, or None."""
    try:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def elapsed_ms(since: float) -> int:
    return round((time.monotonic() - since) * 1000)
