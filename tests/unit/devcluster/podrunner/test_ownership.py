"""The pod's `fsGroup` on its volumes, as the kubelet applies it (podrunner/ownership.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agentrun_devcluster.podrunner import ownership as O

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chgrp to another group needs root")


def test_the_pod_s_fs_group_and_policy() -> None:
    pod = {"spec": {"securityContext": {"fsGroup": 2000, "fsGroupChangePolicy": "OnRootMismatch"}}}
    assert O.fs_group(pod) == (2000, "OnRootMismatch")
    assert O.fs_group({"spec": {}}) == (None, None)


@pytest.mark.parametrize(
    ("mode", "read_only", "expected"),
    [
        (stat.S_IFDIR | 0o755, False, 0o2775),  # a directory: g+rwx, setgid
        (stat.S_IFREG | 0o644, False, 0o664),  # a file: g+rw, no x added
        (stat.S_IFREG | 0o755, False, 0o775),
        (stat.S_IFREG | 0o600, True, 0o640),  # read-only: g+r only
        (stat.S_IFDIR | 0o700, True, 0o2750),
    ],
)
def test_new_modes_are_the_kubelet_s(mode: int, read_only: bool, expected: int) -> None:
    assert O.new_mode(mode, read_only) == expected


@root_only
def test_a_root_owned_0755_volume_becomes_group_writable_with_setgid(tmp_path: Path) -> None:
    volume = tmp_path / "pv"
    (volume / "sub").mkdir(parents=True)
    (volume / "sub" / "file").write_text("x")
    (volume / "link").symlink_to("/etc/hostname")
    for path in (volume, volume / "sub"):
        path.chmod(0o755)
    (volume / "sub" / "file").chmod(0o644)
    assert O.needs_change(volume, 4242)
    assert O.set_volume_ownership(volume, 4242, None) == 4
    for path, mode in ((volume, 0o2775), (volume / "sub", 0o2775), (volume / "sub" / "file", 0o664)):
        info = os.stat(path)
        assert (info.st_gid, stat.S_IMODE(info.st_mode)) == (4242, mode), path
    assert os.lstat(volume / "link").st_gid == 4242
    assert os.stat("/etc/hostname").st_gid != 4242  # the symlink's target outside is left alone
    assert not O.needs_change(volume, 4242)


@root_only
def test_on_root_mismatch_walks_only_when_the_root_is_not_set_up(tmp_path: Path) -> None:
    volume = tmp_path / "pv"
    volume.mkdir()
    O.set_volume_ownership(volume, 4242, "OnRootMismatch")
    (volume / "later").write_text("made by root after the walk")
    assert O.set_volume_ownership(volume, 4242, "OnRootMismatch") == 0  # the root is right: skipped
    assert os.stat(volume / "later").st_gid == 4242  # setgid: new files join the group anyway
    assert O.set_volume_ownership(volume, 4343, "OnRootMismatch") == 2  # another group: walked again
    assert O.set_volume_ownership(volume, 4343, None) == 2  # Always: walked every time


def test_nothing_is_changed_without_fs_group_or_on_a_read_only_volume(tmp_path: Path) -> None:
    volume = tmp_path / "pv"
    volume.mkdir(mode=0o755)
    before = os.stat(volume)
    O.apply_fs_group(volume, {"spec": {}})
    O.apply_fs_group(volume, {"spec": {"securityContext": {"fsGroup": 4242}}}, read_only=True)
    after = os.stat(volume)
    assert (after.st_gid, after.st_mode) == (before.st_gid, before.st_mode)
