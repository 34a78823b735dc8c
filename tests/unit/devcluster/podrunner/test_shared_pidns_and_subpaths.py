"""The sandbox's PID namespace choice and the kubelet's subPath safety (pure, or on a temp dir)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrun_devcluster.podrunner import spec as S
from agentrun_devcluster.podrunner.sandbox import bwrap_argv
from agentrun_devcluster.podrunner.volumes import binds

GATE = 'failed to prepare subPath for volumeMount "agentrun-meta" of container "main"'


def _argv(**kwargs: object) -> list[str]:
    return bwrap_argv("bwrap", ["sh"], [], "/tmp/pod", [], [], "/", **kwargs)  # type: ignore[arg-type]


def test_a_shared_pid_namespace_is_joined_instead_of_made() -> None:
    joined = _argv(pidns_fd=7, command_is_pid_1=False)
    assert joined[joined.index("--pidns") + 1] == "7"
    assert "--unshare-pid" not in joined and "--as-pid-1" not in joined
    alone = _argv(command_is_pid_1=True)
    assert "--unshare-pid" in alone and "--as-pid-1" in alone and "--pidns" not in alone
    assert "--userns" not in joined  # root: the host's user namespace owns the pod's
    # Not root (docs/local-dev.md#non-root): the user namespace owning the pod's PID namespace first.
    unprivileged = _argv(pidns_fd=7, userns_fd=6, command_is_pid_1=False)
    assert unprivileged.index("--userns") < unprivileged.index("--pidns")
    assert unprivileged[unprivileged.index("--userns") + 1] == "6"


def _mounts(sub: str) -> dict[str, object]:
    return {"name": "main", "volumeMounts": [{"name": "agentrun-meta", "mountPath": "/gate", "subPath": sub}]}


def test_a_subpath_leaving_its_volume_is_a_config_error_until_fixed(tmp_path: Path) -> None:
    volume = tmp_path / "meta"
    volume.mkdir()
    volumes = {"agentrun-meta": S.Volume("agentrun-meta", "emptyDir", {})}
    (volume / "gate").symlink_to("/")
    with pytest.raises(S.ContainerConfigError) as refused:
        binds(_mounts("gate"), volumes, {"agentrun-meta": volume})
    assert str(refused.value) == GATE and refused.value.reason == "CreateContainerConfigError"
    (volume / "up").symlink_to("..")
    with pytest.raises(S.ContainerConfigError, match="failed to prepare subPath"):
        binds(_mounts("up/escaped"), volumes, {"agentrun-meta": volume})
    assert not (tmp_path / "escaped").exists()  # nothing was made outside the volume
    (volume / "gate").unlink()
    (volume / "gate").mkdir()
    assert binds(_mounts("gate"), volumes, {"agentrun-meta": volume})[0].source == str(volume / "gate")
    (volume / "inside").symlink_to("gate")  # a symlink that stays within the volume is fine
    assert binds(_mounts("inside"), volumes, {"agentrun-meta": volume})[0].source == str(volume / "inside")
    made = binds(_mounts("made/here"), volumes, {"agentrun-meta": volume})[0]
    assert (volume / "made" / "here").is_dir() and made.source == str(volume / "made" / "here")


def test_a_missing_subpath_before_a_refused_one_is_made_all_the_same(tmp_path: Path) -> None:
    """As the kubelet prepares a container's mounts in order, a missing subPath is made before a
    later one is refused: `main`'s knock tells the reporter the kubelet tried to start `main` while
    its gate was shut (docs/design.md#hook-lost)."""
    volume = tmp_path / "meta"
    volume.mkdir()
    (volume / "gate").symlink_to("/")
    volumes = {"agentrun-meta": S.Volume("agentrun-meta", "emptyDir", {})}
    container = {
        "name": "main",
        "volumeMounts": [
            {"name": "agentrun-meta", "mountPath": "/knock", "subPath": "knock"},
            {"name": "agentrun-meta", "mountPath": "/gate", "subPath": "gate"},
        ],
    }
    with pytest.raises(S.ContainerConfigError) as refused:
        binds(container, volumes, {"agentrun-meta": volume})
    assert str(refused.value) == GATE
    assert (volume / "knock").is_dir()
