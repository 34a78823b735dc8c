"""The reporter's part in loop.checkpoint: which volume is checkpointed, what is left out, and the
arguments that tell the reporter what to restore and record before `main`
(docs/concepts.md#checkpoints). Pure."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from agentrun_operator.api import StepLoop, WorkloadVolume
from agentrun_operator.control.claim import CLAIMS_DIR
from agentrun_operator.naming import CANDIDATES_DIR

CHECKPOINT_FACTS_NAME: Final = "checkpoint.json"
CHECKPOINT_SECURITY_CONTEXT: Final[dict[str, Any]] = {
    "runAsUser": 0,
    "runAsGroup": 0,
    "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID"]},
}
"""The reporter restores files `main` wrote as whatever user it runs as, with their owners and
modes: it needs root's file capabilities and no others (docs/concepts.md#checkpoints)."""


@dataclass(frozen=True)
class CheckpointPlan:
    """What the planner decided about an attempt's checkpoint (planner/checkpoints.py)."""

    checkpoint_id: str
    prefix: str
    keep: int
    owner: str
    restore_own: bool = False
    expected: bool = False
    restore_from: str | None = None
    exclude: tuple[str, ...] = ()
    """The user's `loop.checkpoint.exclude`."""
    candidates: int = 0
    """loop.candidates.count: the attempt is an Indexed Job of that many candidates (0: none)."""


def checkpoint_volume(
    loop: StepLoop | None, volumes: Iterable[WorkloadVolume], holder: WorkloadVolume | None
) -> WorkloadVolume | None:
    """The volume a loop's checkpoints are of: the first read-write PVC of `loop.state.volumeNames`,
    else the control file's volume when it is a read-write PVC, else the first read-write PVC; None
    when there is none (validation refuses such a loop, planner/validate.py)."""
    writable = [v for v in volumes if v.type == "pvc" and not v.read_only]
    named = list(loop.state.volume_names or []) if loop is not None and loop.state is not None else []
    for name in named:
        for volume in writable:
            if volume.name == name:
                return volume
    if holder is not None and holder in writable:
        return holder
    return writable[0] if writable else None


def _relative(path: str, root: str) -> str | None:
    """`path` relative to `root`, when it lies strictly inside it."""
    root = root.rstrip("/") or "/"
    if root == "/":
        rel = path.lstrip("/")
    elif path.startswith(root + "/"):
        rel = path[len(root) + 1 :]
    else:
        return None
    rel = posixpath.normpath(rel)
    return rel if rel not in ("", ".") and not rel.startswith("..") else None


def excluded_paths(
    plan: CheckpointPlan, volume: WorkloadVolume, control_path: str, claims_here: bool
) -> list[str]:
    """What is neither recorded nor restored: the control file's directory (or the file itself when it
    sits at the volume's root), the Job claims when they are on this volume (a restore must never undo
    the claim that lets this pod run), and the user's list."""
    out: list[str] = []
    control = _relative(control_path, volume.mount_path)
    if control is not None:
        directory = posixpath.dirname(control)
        out.append(directory or control)
    if claims_here:
        out.append(CLAIMS_DIR)
    if plan.candidates and CANDIDATES_DIR not in out and not _covered(CANDIDATES_DIR, out):
        out.append(CANDIDATES_DIR)
    for entry in plan.exclude:
        if entry not in out:
            out.append(entry)
    return out


def _covered(path: str, excluded: list[str]) -> bool:
    """`path` lies under an excluded one (the default control directory `.agentrun` holds the
    candidates' copies already)."""
    return any(path == e or path.startswith(e.rstrip("/") + "/") for e in excluded)


def reporter_checkpoint_args(
    plan: CheckpointPlan, volume: WorkloadVolume, excluded: list[str], facts_file: str
) -> list[str]:
    """The reporter's `--checkpoint-…` arguments (control/reporter.py)."""
    args = [
        "--checkpoint-root",
        volume.mount_path,
        "--checkpoint-id",
        plan.checkpoint_id,
        "--checkpoint-prefix",
        plan.prefix,
        "--checkpoint-keep",
        str(plan.keep),
        "--checkpoint-owner",
        plan.owner,
        "--checkpoint-facts",
        facts_file,
    ]
    for entry in excluded:
        args += ["--checkpoint-exclude", entry]
    if plan.restore_own:
        args.append("--checkpoint-restore")
    if plan.expected:
        args.append("--checkpoint-expected")
    if plan.restore_from:
        args += ["--checkpoint-from", plan.restore_from]
    return args
