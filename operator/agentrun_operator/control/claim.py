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

What came of the claim is also the `fingerprint` container's termination message (`report_text`), a
small JSON document the operator reads from the pod status (`read_report`): a claim that could not
be taken becomes a Warning Event and a condition on the run, not only a log line.

Standard library only: this runs in the pod's init container, before `main`, on every iteration.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from dataclasses import dataclass
from typing import Final, Literal

CLAIMS_DIR: Final = ".agentrun-claims"
"""Under the mount path of the volume that holds the control file."""
PRUNE_AFTER_SECONDS: Final = 7 * 24 * 3600
"""Claims of Jobs older than this are removed when a new claim is taken (a Job's pods are long gone)."""

Outcome = Literal["claimed", "ours", "taken", "unavailable"]
REPORT_VERSION: Final = 1
MAX_DETAIL_CHARS: Final = 512
"""The report is a termination message (at most 4096 bytes kept): details are cut to this."""


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
        _make_claims_dir(claim_dir)
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


def _make_claims_dir(claim_dir: str) -> None:
    """The claims directory, group-writable when this process creates it.

    On a volume the kubelet gave the pod's `fsGroup` (group-owned, setgid), the directory inherits
    that group; `g+rwx` lets the helper of a later pod write there even when it runs as another uid
    of the same group (a restricted platform's arbitrary uid), whatever the umask."""
    try:
        os.mkdir(claim_dir, 0o775)
    except FileExistsError:
        return
    except FileNotFoundError:
        os.makedirs(claim_dir, exist_ok=True)
    mode = stat.S_IMODE(os.stat(claim_dir).st_mode)
    if mode & 0o070 != 0o070:
        os.chmod(claim_dir, mode | 0o070)


def report_text(claim: Claim, volume: str, claim_dir: str) -> str:
    """The `fingerprint` container's termination message: the claim's outcome, on which volume."""
    return json.dumps(
        {
            "v": REPORT_VERSION,
            "claim": claim.outcome,
            "volume": volume[:253],
            "dir": claim_dir[:1024],
            "detail": claim.detail[:MAX_DETAIL_CHARS],
        },
        separators=(",", ":"),
    )


@dataclass(frozen=True)
class Report:
    """A claim outcome as the operator reads it back from a pod's status."""

    outcome: Outcome
    volume: str
    dir: str
    detail: str


def read_report(message: str | None) -> Report | None:
    """The claim report in a `fingerprint` termination message; None for anything else (no claim was
    tried, an older helper, garbage). Never raises."""
    if not message or '"claim"' not in message:
        return None
    try:
        doc = json.loads(message)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("v") != REPORT_VERSION:
        return None
    outcome = doc.get("claim")
    if outcome not in ("claimed", "ours", "taken", "unavailable"):
        return None
    texts = [doc.get(k) for k in ("volume", "dir", "detail")]
    volume, where, detail = (t if isinstance(t, str) else "" for t in texts)
    return Report(outcome, volume, where, detail)


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
