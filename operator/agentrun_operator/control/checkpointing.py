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

Best-of-N (loop.candidates): the iteration's N pods, one per index of an Indexed Job, share the
volume. Each does the above for the volume's root under the store's lock (the first records the
start, the others find it theirs), then copies the start into its own work tree
(`checkpoint.candidate_tree`, which its `main` mounts as the volume), and after `main` records that
tree as ``<id>c<index>`` (`record_candidate`), from which the operator restores the winner.
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
    candidate: CandidateArgs | None = None
    candidate_problem: str = ""
    """Why the candidate arguments cannot be used (`parse_candidate`'s refusal): `main` must not start."""


@dataclass(frozen=True)
class CandidateArgs:
    """loop.candidates: this pod is candidate `index` of its iteration (`parse_candidate`)."""

    index: int
    dir: str
    """Its work tree, `checkpoint.candidate_tree` of the root: what its `main` sees as the volume."""
    checkpoint_id: str
    """Its end state is recorded under this id: ``<the iteration's id>c<index>``."""


class CheckpointRefusal(Exception):
    """`main` must not start: the message (one line, ending with `CHECKPOINT_ANCHOR`) says why."""


def _refusal(what: str, exc: BaseException) -> CheckpointRefusal:
    return CheckpointRefusal(f"checkpoint: {what}: {exc}; see {CHECKPOINT_ANCHOR}")


def parse_candidate(
    root: str, checkpoint_id: str, index: str | None, directory: str | None, candidate_id: str | None
) -> CandidateArgs | None:
    """The candidate arguments as the Job builder wrote them (all three or none); None without.
    Raises `CheckpointRefusal` when they do not name this iteration's candidate tree and id: the
    work tree is emptied before `main`, so a path the reporter did not expect is never touched."""
    given = [x for x in (index, directory, candidate_id) if x is not None]
    if not given:
        return None
    if len(given) != 3:
        raise CheckpointRefusal(
            "checkpoint: --candidate-index, --candidate-dir and --candidate-checkpoint come together, "
            f"but only {len(given)} of them were given; see {CHECKPOINT_ANCHOR}"
        )
    assert index is not None and directory is not None and candidate_id is not None
    if not (index.isascii() and index.isdigit()):
        raise CheckpointRefusal(
            f"checkpoint: --candidate-index {index[:50]!r} is not a whole number of 0 or more "
            f"(the pod's job-completion-index); see {CHECKPOINT_ANCHOR}"
        )
    number = int(index)
    tree = store.candidate_tree(root, checkpoint_id, number)
    if os.path.normpath(directory) != os.path.normpath(tree):
        raise CheckpointRefusal(
            f"checkpoint: --candidate-dir {directory[:300]!r} is not candidate {number}'s work tree "
            f"{tree!r}; see {CHECKPOINT_ANCHOR}"
        )
    if candidate_id != f"{checkpoint_id}c{number}" or not store.valid_id(candidate_id):
        raise CheckpointRefusal(
            f"checkpoint: --candidate-checkpoint {candidate_id[:210]!r} is not "
            f"{checkpoint_id + 'c' + str(number)!r} (or not a valid id); see {CHECKPOINT_ANCHOR}"
        )
    return CandidateArgs(number, tree, candidate_id)


def prepare_workspace(args: CheckpointArgs) -> dict[str, Any]:
    """Restore and record as the arguments say; the facts the envelope carries (`checkpoint`).
    A candidate pod does so under the store's lock, then copies the iteration's start into its
    work tree (facts["candidate"] = {"index": N}). Raises `CheckpointRefusal` when `main` must not
    start."""
    if args.candidate_problem:
        raise CheckpointRefusal(args.candidate_problem)
    if args.candidate is None:
        return _prepare_root(args)
    try:
        with store.locked(args.root):
            facts = _prepare_root(args)
            _copy_start(args, args.candidate)
    except OSError as exc:  # the lock itself, or the store's directories for it
        raise _refusal("cannot lock the checkpoint store", exc) from None
    return facts | {"candidate": {"index": args.candidate.index}}


def _copy_start(args: CheckpointArgs, candidate: CandidateArgs) -> None:
    """Candidate's work tree, emptied, then the iteration's start restored into it: each candidate
    starts from exactly the same state, whatever an earlier attempt left in its tree."""
    relative = os.path.relpath(candidate.dir, args.root)
    try:
        store.fresh_tree(args.root, relative)
    except (store.CheckpointError, OSError) as exc:
        raise _refusal(f"cannot empty candidate {candidate.index}'s work tree {candidate.dir}", exc) from None
    try:
        store.restore(args.root, args.checkpoint_id, args.exclude, tree=candidate.dir)
        _COPY_CACHES[candidate.dir] = store.tree_cache(args.root, args.checkpoint_id, candidate.dir)
    except store.CheckpointError as exc:
        raise _refusal(f"cannot copy the iteration's start to candidate {candidate.index}", exc) from None


_COPY_CACHES: dict[str, store.StatCache] = {}
"""Per candidate work tree, what its copy held right after the copy (`store.tree_cache`): the
reporter that copied it records its end after `main` in the same process, reading only what `main`
changed. A restarted reporter has none and reads the whole copy (the same checkpoint results)."""


MAX_CANDIDATE_ERROR: Final = 400
"""A candidate's recording error is cut to this (the facts go into the termination message)."""


def record_candidate(args: CheckpointArgs, facts: dict[str, Any], main_ended: bool = True) -> dict[str, Any]:
    """After `main`: `facts` with candidate's end state recorded from its work tree, under the store's
    lock: facts["candidate"] gains id, files, bytes, addedBytes and ms, or an `error` (one line,
    ending with `CHECKPOINT_ANCHOR`); never raises. A restarted reporter finds it done when the facts
    say so. Without `main_ended` (the pod was stopped while `main` may still run) nothing is
    recorded."""
    candidate = args.candidate
    if candidate is None:
        return facts
    done: dict[str, Any] = dict(facts.get("candidate") or {})
    done["index"] = candidate.index
    if "id" in done:
        return facts
    done.pop("error", None)
    if not main_ended:
        done["error"] = (
            f"checkpoint: candidate {candidate.index}'s end was not recorded: the pod was stopped before "
            f"main ended; see {CHECKPOINT_ANCHOR}"
        )
        return facts | {"candidate": done}
    try:
        # Recorded anew even when a checkpoint of this id is there: an earlier attempt's candidate of
        # the same index left it, and this attempt's copy is what this candidate made (a restarted
        # reporter whose facts were kept returned above; one whose were not records the same copy).
        with store.locked(args.root):
            made = store.record(
                args.root,
                candidate.checkpoint_id,
                args.exclude,
                owner=args.owner,
                tree=candidate.dir,
                cache=_COPY_CACHES.get(candidate.dir),
            )
        done |= {
            "id": made.id,
            "files": made.files,
            "bytes": made.bytes,
            "addedBytes": made.added_bytes,
            "ms": round(made.seconds * 1000),
        }
    except (store.CheckpointError, OSError) as exc:
        why = " ".join(str(exc).split())[:MAX_CANDIDATE_ERROR]
        done["error"] = (
            f"checkpoint: cannot record candidate {candidate.index}'s end as "
            f"{candidate.checkpoint_id!r}: {why}; see {CHECKPOINT_ANCHOR}"
        )
    return facts | {"candidate": done}


def _prepare_root(args: CheckpointArgs) -> dict[str, Any]:
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
    return _ours_id(args.root, args.checkpoint_id, args.owner)


def _ours_id(root: str, checkpoint_id: str, owner: str) -> bool:
    try:
        return store.exists(root, checkpoint_id) and store.owner(root, checkpoint_id) == owner
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
    return _described_id(args.root, args.checkpoint_id)


def _described_id(root: str, checkpoint_id: str) -> dict[str, Any]:
    for info in store.list_checkpoints(root):
        if info.id == checkpoint_id:
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
