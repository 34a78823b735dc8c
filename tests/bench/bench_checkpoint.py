"""Benchmark: what a checkpoint costs an iteration (control/checkpoint.py, loop.checkpoint mode Files).

Builds a workspace of `--files` files totalling `--megabytes` (random content, three levels of
directories) on the filesystem of `--dir` (default: under /var/tmp, which is on disk where /tmp may
be a tmpfs), records it once (the first, full record), then for each of `--iterations` iterations:

- changes `--changed` files (new random content of the same size), as an iteration's `main` would,
- records the iteration's checkpoint (what the reporter does before `main`): its time, the bytes it
  added to the store, the files it read,
- dirties the same files again and restores the checkpoint (what a retry with
  `onFailedAttempt: Restore` does): its time.

The baseline, mode None, is the same loop without checkpoints: the time of changing the files only.
With `--candidates N` (loop.candidates), after the loop: what one best-of-N iteration adds, per
candidate, done one after the other as the candidates' lock makes them: its copy (the start
checkpoint restored into an empty `.agentrun/candidates/<id>/<i>`), its end recorded after it changed
`--changed` files (with the stat cache the reporter takes right after the copy), and the winner's
promotion over the workspace.
It prints a table and, with `--json FILE`, writes the figures. The workspace was just written, so
reads come from the page cache (a fresh pod on a node that has not read the volume reads from the
disk: the first record is then slower). It asserts nothing about time.

    .venv/bin/python -m tests.bench.bench_checkpoint --files 10000 --megabytes 200 --changed 10 --iterations 5
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrun_operator.control import checkpoint

DEFAULT_BASE = "/var/tmp"
"""On disk on most systems; /tmp is often a tmpfs, which would flatter every figure."""


def filesystem_of(path: str) -> str:
    """The type of the filesystem `path` is on (the longest mount point of /proc/mounts above it)."""
    best, kind = "", "unknown"
    real = os.path.realpath(path)
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                above = len(fields) > 2 and (
                    real == fields[1] or real.startswith(fields[1].rstrip("/") + "/")
                )
                if above and len(fields[1]) >= len(best):
                    best, kind = fields[1], fields[2]
    except OSError:
        pass
    return kind


def build_workspace(root: Path, files: int, total_bytes: int, rng: random.Random) -> list[Path]:
    """`files` files of random sizes summing to `total_bytes`, spread over three directory levels."""
    weights = [rng.expovariate(1.0) for _ in range(files)]
    scale = total_bytes / sum(weights)
    sizes = [int(w * scale) for w in weights]
    sizes[0] += total_bytes - sum(sizes)
    fanout = max(2, round(files ** (1 / 3)))
    paths = []
    for i, size in enumerate(sizes):
        path = root / f"d{i % fanout:03}" / f"e{(i // fanout) % fanout:03}" / f"f{i:06}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
        paths.append(path)
    return paths


def change(paths: list[Path]) -> None:
    for path in paths:
        path.write_bytes(os.urandom(path.stat().st_size))


def percentile(values: list[float], p: float) -> float:
    """Nearest rank: the smallest value with at least p% of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(len(ordered) * p / 100) - 1))] if ordered else 0.0


def _candidates(
    root: Path, start: str, count: int, changed: int, rng: random.Random
) -> dict[str, Any] | None:
    """One best-of-N iteration from checkpoint `start`: each candidate's copy and end record, then the
    promotion of candidate 0 over the workspace (None without candidates)."""
    if count < 1:
        return None
    copy_ms: list[float] = []
    end_ms: list[float] = []
    end_added: list[int] = []
    for index in range(count):
        started = time.perf_counter()
        tree = checkpoint.fresh_tree(str(root), f"{checkpoint.CANDIDATES_DIR}/{start}/{index}")
        checkpoint.restore(str(root), start, tree=tree)
        cache = checkpoint.tree_cache(str(root), start, tree)  # as the reporter keeps it for the end
        copy_ms.append((time.perf_counter() - started) * 1000)
        files = sorted(p for p in Path(tree).rglob("*.bin"))
        change(rng.sample(files, min(changed, len(files))))
        started = time.perf_counter()
        made = checkpoint.record(str(root), f"{start}c{index}", tree=tree, cache=cache)
        end_ms.append((time.perf_counter() - started) * 1000)
        end_added.append(made.added_bytes)
    started = time.perf_counter()
    promoted = checkpoint.restore(str(root), f"{start}c0", base=start)
    promote_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    shutil.rmtree(root / checkpoint.CANDIDATES_DIR / start)
    remove_ms = (time.perf_counter() - started) * 1000
    return {
        "count": count,
        "copy_ms": _spread(copy_ms),
        "end_record_ms": _spread(end_ms),
        "end_added_bytes": {"p50": int(percentile([float(a) for a in end_added], 50)), "max": max(end_added)},
        "promote_ms": round(promote_ms, 1),
        "promote_written": promoted.written,
        "remove_copies_ms": round(remove_ms, 1),
    }


def run(
    files: int,
    megabytes: float,
    changed: int,
    iterations: int,
    base: str,
    seed: int,
    candidate_count: int = 0,
) -> dict[str, Any]:
    rng = random.Random(seed)
    top = Path(tempfile.mkdtemp(prefix="agentrun-bench-checkpoint-", dir=base))
    try:
        root = top / "ws"
        root.mkdir()
        paths = build_workspace(root, files, int(megabytes * 1024 * 1024), rng)
        started = time.perf_counter()
        first = checkpoint.record(str(root), "bench-0")
        first_ms = (time.perf_counter() - started) * 1000
        record_ms: list[float] = []
        added: list[int] = []
        hashed: list[int] = []
        restore_ms: list[float] = []
        baseline_ms: list[float] = []
        for iteration in range(1, iterations + 1):
            picked = rng.sample(paths, changed)
            started = time.perf_counter()
            change(picked)
            baseline_ms.append((time.perf_counter() - started) * 1000)  # mode None: nothing else
            started = time.perf_counter()
            made = checkpoint.record(str(root), f"bench-{iteration}")
            record_ms.append((time.perf_counter() - started) * 1000)
            added.append(made.added_bytes)
            hashed.append(made.hashed_files)
            change(picked)
            started = time.perf_counter()
            done = checkpoint.restore(str(root), f"bench-{iteration}")
            restore_ms.append((time.perf_counter() - started) * 1000)
            assert done.written == changed, done
        candidates = _candidates(root, f"bench-{iterations}", candidate_count, changed, rng)
        started = time.perf_counter()
        pruned = checkpoint.prune(str(root), "bench-", 2)
        prune_ms = (time.perf_counter() - started) * 1000
        manifest = root / checkpoint.STORE_DIR / "manifests" / f"bench-{iterations}.json.gz"
        return {
            "files": first.files,
            "bytes": first.bytes,
            "changed": changed,
            "iterations": iterations,
            "filesystem": filesystem_of(str(top)),
            "first_record_ms": round(first_ms, 1),
            "first_added_bytes": first.added_bytes,
            "record_ms": _spread(record_ms),
            "added_bytes": {"p50": int(percentile([float(a) for a in added], 50)), "max": max(added)},
            "hashed_files": hashed,
            "manifest_bytes": manifest.stat().st_size,
            "restore_ms": {k: v for k, v in _spread(restore_ms).items() if k != "max"},
            "baseline_ms": _spread(baseline_ms),
            "prune_ms": round(prune_ms, 1),
            "pruned": len(pruned),
            "candidates": candidates,
        }
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 50), 1),
        "p95": round(percentile(values, 95), 1),
        "max": round(max(values), 1),
    }


def table(figures: dict[str, Any]) -> str:
    rows = [
        (
            "workspace",
            f"{figures['files']} files, {figures['bytes'] / 2**20:.0f} MiB ({figures['filesystem']})",
        ),
        (
            "first (full) record",
            f"{figures['first_record_ms']} ms, {figures['first_added_bytes']} bytes added",
        ),
        (
            f"record, {figures['changed']} changed",
            "p50 {p50} ms, p95 {p95} ms, max {max} ms".format(**figures["record_ms"]),
        ),
        (
            "  bytes added",
            "p50 {p50}, max {max} (manifest {m})".format(
                m=figures["manifest_bytes"], **figures["added_bytes"]
            ),
        ),
        ("  files read", ", ".join(str(h) for h in figures["hashed_files"])),
        (
            f"restore, {figures['changed']} dirty",
            "p50 {p50} ms, p95 {p95} ms".format(**figures["restore_ms"]),
        ),
        ("mode None (changes only)", "p50 {p50} ms, p95 {p95} ms".format(**figures["baseline_ms"])),
        ("prune to 2", f"{figures['prune_ms']} ms ({figures['pruned']} pruned)"),
    ]
    found = figures.get("candidates")
    if found:
        rows += [
            (f"candidates ({found['count']})", "one after the other, as their lock makes them"),
            ("  copy (restore into empty)", "p50 {p50} ms, p95 {p95} ms".format(**found["copy_ms"])),
            ("  end record", "p50 {p50} ms, p95 {p95} ms".format(**found["end_record_ms"])),
            ("  end bytes added", "p50 {p50}, max {max}".format(**found["end_added_bytes"])),
            (
                "  promotion of the winner",
                f"{found['promote_ms']} ms ({found['promote_written']} files written)",
            ),
            ("  the copies removed", f"{found['remove_copies_ms']} ms"),
        ]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--megabytes", type=float, default=200.0)
    parser.add_argument("--changed", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--dir", default=DEFAULT_BASE, help="the workspace is made under it (its filesystem)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--candidates", type=int, default=0, help="measure a best-of-N iteration of N")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    if filesystem_of(args.dir) == "tmpfs":
        print(f"note: {args.dir} is a tmpfs: the figures are memory speeds, not a volume's")
    figures = run(
        args.files, args.megabytes, args.changed, args.iterations, args.dir, args.seed, args.candidates
    )
    print(table(figures))
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
