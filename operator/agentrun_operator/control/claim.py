"""One pod per Job runs the iteration: a claim file on the state volume, taken before `main` starts.

The Job controller may start a Job's pod twice: when its pod create reaches etcd but the answer is
lost (an API server restart), it creates another, and deletes the excess one only once it sees both
(Kubernetes documents this: with `parallelism: 1` "the same program may sometimes be started
twice"). Both would run the iteration on the same volume. So the `fingerprint` init container of
every iteration pod claims the Job first: it creates `<volume>/.agentrun-claims/<job uid>` with
`O_EXCL`, holding its pod's uid (not under `.agentrun/`, where the control file usually is: a
directory the helper made there could keep a `main` of another uid from writing its control file).
The pod that finds the claim taken by another pod waits before `main` (pending, never running it)
until the Job controller deletes it as the excess pod, or deletes it when the Job ends. The Job has
`backoffLimit: 0`, so a Job never legitimately has a second pod to run: a claim held by another pod
always means a duplicate (docs/concepts.md#exactly-once).

Standard library only: this runs in the pod's init container, before `main`, on every iteration.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from typing import Final, Literal

CLAIMS_DIR: Final = ".agentrun-claims"
"""Under the mount path of the volume that holds the control file."""
PRUNE_AFTER_SECONDS: Final = 7 * 24 * 3600
"""Claims of Jobs older than this are removed when a new claim is taken (a Job's pods are long gone)."""

Outcome = Literal["claimed", "ours", "taken", "unavailable"]


@dataclass(frozen=True)
class Claim:
    outcome: Outcome
    detail: str = ""
    """`taken`: the pod uid holding it; `unavailable`: why no claim could be taken."""


def claim_job(claim_dir: str, job_uid: str, pod_uid: str) -> Claim:
    """Take the Job's claim for this pod, or say who holds it (or why none can be taken)."""
    if not job_uid or not pod_uid:
        return Claim("unavailable", "no Job or pod uid (the downward API gave none)")
    path = os.path.join(claim_dir, job_uid)
    try:
        os.makedirs(claim_dir, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        holder = _read(path)
        if holder is None:
            return Claim("unavailable", f"the claim {path} exists but cannot be read")
        return Claim("ours") if holder == pod_uid else Claim("taken", holder)
    except OSError as exc:
        return Claim("unavailable", f"cannot create {path}: {os.strerror(exc.errno or errno.EIO)}")
    try:
        os.write(fd, pod_uid.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return Claim("claimed")


def _read(path: str) -> str | None:
    """The claim's holder; a claim just created and not written yet is read again briefly."""
    for _ in range(50):
        try:
            with open(path, encoding="utf-8") as handle:
                holder = handle.read().strip()
        except OSError:
            return None
        if holder:
            return holder
        time.sleep(0.02)
    return None


def prune_claims(claim_dir: str, now: float, max_age: float = PRUNE_AFTER_SECONDS) -> int:
    """Remove claims older than `max_age` seconds; how many were removed (errors are skipped)."""
    removed = 0
    try:
        entries = list(os.scandir(claim_dir))
    except OSError:
        return 0
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False) and now - entry.stat().st_mtime > max_age:
                os.unlink(entry.path)
                removed += 1
        except OSError:
            continue
    return removed
