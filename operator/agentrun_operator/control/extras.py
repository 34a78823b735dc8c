"""What the reporter tells besides the control file: the commit a Git checkout is at, and the size and
digest of output artifacts (docs/api.md#version-control, docs/api.md#output-artifacts).

Standard library only (``fingerprint`` imports it, and must start fast), no `git` program needed
(the operator image has none): HEAD is read from the checkout's `.git` as Git stores it. Nothing here
raises; what cannot be read is None.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from typing import Any, Final

MAX_DIGEST_BYTES: Final = 256 * 1024 * 1024
"""Larger artifacts are reported with their size only: hashing them would hold the pod's end up."""
_OBJECT_ID: Final = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
_MAX_REF_DEPTH: Final = 5


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(4096).strip()
    except OSError:
        return None


def git_dir(checkout: str) -> str | None:
    """The checkout's Git directory: `.git`, or where a `.git` file (`gitdir: …`) points."""
    dot_git = os.path.join(checkout, ".git")
    if os.path.isdir(dot_git):
        return dot_git
    text = _read(dot_git)
    if text and text.startswith("gitdir:"):
        target = text.removeprefix("gitdir:").strip()
        return target if os.path.isabs(target) else os.path.normpath(os.path.join(checkout, target))
    return None


def _packed_ref(gdir: str, ref: str) -> str | None:
    text = _read_all(os.path.join(gdir, "packed-refs"))
    for line in (text or "").splitlines():
        parts = line.split(" ", 1)
        if len(parts) == 2 and parts[1].strip() == ref and _OBJECT_ID.match(parts[0]):
            return parts[0]
    return None


def _read_all(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(16 * 1024 * 1024)
    except OSError:
        return None


def head_commit(checkout: str) -> str | None:
    """The commit HEAD of the checkout is at (a detached HEAD or a branch, loose or packed); None when
    there is no checkout, or its branch has no commit yet."""
    gdir = git_dir(checkout)
    if gdir is None:
        return None
    common = _read(os.path.join(gdir, "commondir"))
    common_dir = os.path.normpath(os.path.join(gdir, common)) if common else gdir
    value = _read(os.path.join(gdir, "HEAD"))
    for _ in range(_MAX_REF_DEPTH):
        if value is None:
            return None
        if _OBJECT_ID.match(value):
            return value
        if not value.startswith("ref:"):
            return None
        ref = value.removeprefix("ref:").strip()
        loose = _read(os.path.join(gdir, ref)) or _read(os.path.join(common_dir, ref))
        value = loose if loose else _packed_ref(common_dir, ref)
    return None


def artifact_fact(name: str, path: str) -> dict[str, Any]:
    """`{name, path, size, digest: sha256:<hex>}` of an artifact file; `{name, path, missing: true}`
    when there is no regular file there; no digest above `MAX_DIGEST_BYTES`."""
    fact: dict[str, Any] = {"name": name, "path": path}
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                return {**fact, "missing": True}
            fact["size"] = info.st_size
            if info.st_size <= MAX_DIGEST_BYTES:
                digest = hashlib.sha256()
                for chunk in iter(lambda: handle.read(1024 * 1024), b""):
                    digest.update(chunk)
                fact["digest"] = f"sha256:{digest.hexdigest()}"
    except OSError:
        return {**fact, "missing": True}
    return fact
