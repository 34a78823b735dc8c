"""A pod's `fsGroup` on its volumes, as the kubelet applies it (its `SetVolumeOwnership`).

The kubelet gives a volume that supports ownership management (`emptyDir`, a `local`
PersistentVolume, most CSI drivers; not `hostPath`) to the pod's `fsGroup` before any container
starts: every file and directory is chgrp'ed to the group and made group-readable and -writable
(`g+rw`; a directory also `g+x` and `u+x`), and every directory gets the setgid bit, so what
containers create there stays in the group. A read-only volume is left as it is. With
`fsGroupChangePolicy: OnRootMismatch` the walk is skipped when the volume's root already has the
group, the permissions and (a directory) the setgid bit. Every container's process also gets
`fsGroup` as a supplemental group (on a real node; the pod runner runs every container as its own
user).

The local pod runner does the same, so a root-owned `0755` volume of the local provisioner behaves as
on a real node (docs/local-dev.md#volumes).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

log = logging.getLogger("agentrun.podrunner")

RW_MASK: Final = 0o660
RO_MASK: Final = 0o440
EXEC_MASK: Final = 0o110
ON_ROOT_MISMATCH: Final = "OnRootMismatch"


def fs_group(pod: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """The pod's `fsGroup` and `fsGroupChangePolicy` (None, None when it sets none)."""
    ctx = (pod.get("spec") or {}).get("securityContext") or {}
    group = ctx.get("fsGroup")
    return (None if group is None else int(group)), ctx.get("fsGroupChangePolicy")


def needs_change(root: Path, group: int, read_only: bool = False) -> bool:
    """Whether the volume's root is not set up for `group` yet (the `OnRootMismatch` test)."""
    try:
        info = os.stat(root)
    except OSError:
        return True
    if info.st_gid != group:
        return True
    wanted = RO_MASK if read_only else RW_MASK
    is_dir = stat.S_ISDIR(info.st_mode)
    if is_dir:
        wanted |= EXEC_MASK
    if info.st_mode & wanted != wanted:
        return True
    return is_dir and not info.st_mode & stat.S_ISGID


def new_mode(mode: int, read_only: bool = False) -> int:
    """A file's or directory's permission bits once given to the group (pure)."""
    mask = RO_MASK if read_only else RW_MASK
    if stat.S_ISDIR(mode):
        mask |= stat.S_ISGID | EXEC_MASK
    return stat.S_IMODE(mode) | mask


def _change(path: str, group: int, read_only: bool) -> None:
    info = os.lstat(path)
    os.lchown(path, -1, group)
    if stat.S_ISLNK(info.st_mode):
        return  # a symlink's own mode means nothing; its target is changed where it lies in the volume
    os.chmod(path, new_mode(info.st_mode, read_only))


def set_volume_ownership(root: Path, group: int, policy: str | None, read_only: bool = False) -> int:
    """Give the volume at `root` to `group`; how many entries were changed (0 when skipped).

    Symlinks are not followed (their targets may lie outside the volume). Errors on single entries
    are logged and skipped: a file that vanished meanwhile must not keep the pod from starting."""
    if policy == ON_ROOT_MISMATCH and not needs_change(root, group, read_only):
        return 0
    changed = 0
    for directory, dirs, files in os.walk(root, followlinks=False):
        entries = [directory] if directory == str(root) else []
        entries += [os.path.join(directory, name) for name in (*dirs, *files)]
        for path in entries:
            try:
                _change(path, group, read_only)
                changed += 1
            except OSError as exc:
                log.warning("fsGroup %s: cannot change %s: %s", group, path, exc)
    return changed


def apply_fs_group(root: Path, pod: Mapping[str, Any], read_only: bool = False) -> None:
    """The kubelet's ownership step for one volume of `pod` (nothing when it has no `fsGroup`, when
    the volume is read-only, or when the runner cannot chgrp: not root)."""
    group, policy = fs_group(pod)
    if group is None or read_only or os.geteuid() != 0:
        return
    changed = set_volume_ownership(root, group, policy)
    if changed:
        log.info("fsGroup %s applied to %s (%d entries, policy %s)", group, root, changed, policy or "Always")
