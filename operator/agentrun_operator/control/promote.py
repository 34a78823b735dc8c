"""`agentrun reporter promote`: put a loop's winning candidate into the workspace (loop.candidates,
docs/concepts.md#candidates). The promotion pod restores the winner's end checkpoint over the
checkpointed volume, then removes the iteration's candidate copies. Standard library only, like the
reporter; idempotent, so a promotion run twice leaves the same workspace."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence

from agentrun_operator.control import checkpoint as store
from agentrun_operator.control.checkpointing import CHECKPOINT_ANCHOR


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentrun reporter promote", description=__doc__)
    parser.add_argument("--root", required=True, help="the checkpointed volume's mountPath")
    parser.add_argument("--checkpoint", required=True, help="the winner's end checkpoint")
    parser.add_argument("--owner", default="", help="the run's uid: the checkpoint must be this run's")
    parser.add_argument("--exclude", action="append", default=[], metavar="PATH", help="not restored")
    parser.add_argument("--copies", metavar="DIR", help="the iteration's candidate copies, removed after")
    parser.add_argument(
        "--base", metavar="ID", help="the iteration's start checkpoint: the workspace is still as it recorded"
    )
    return parser


def promote(
    root: str,
    checkpoint_id: str,
    owner: str,
    exclude: Sequence[str],
    copies: str | None,
    base: str | None = None,
) -> dict[str, object]:
    """Restore `checkpoint_id` over `root` (refusing one another run recorded), then remove `copies`.
    Raises `store.CheckpointError` when the workspace could not be restored."""
    found = store.owner(root, checkpoint_id)
    if owner and found != owner:
        raise store.CheckpointMissing(
            f"checkpoint {checkpoint_id!r} was recorded by another run (uid {found or 'unknown'}), not this "
            f"one ({owner})"
        )
    done = store.restore(root, checkpoint_id, tuple(exclude), base=base)
    if copies:
        shutil.rmtree(copies, ignore_errors=True)
    return {"promoted": checkpoint_id, "restoreMs": round(done.seconds * 1000)}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        facts = promote(args.root, args.checkpoint, args.owner, args.exclude, args.copies, args.base)
    except (store.CheckpointError, OSError) as exc:
        print(
            f"checkpoint: cannot promote candidate checkpoint {args.checkpoint!r}: {exc}; "
            f"see {CHECKPOINT_ANCHOR}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    print(json.dumps(facts, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
