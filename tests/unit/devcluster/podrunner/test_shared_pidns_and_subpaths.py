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
    # bwrap enters a joined namespace through an intermediate process that exits at once: a command
    # with a parent-death signal set before that exit is SIGKILLed as it starts (sandbox.py).
    assert "--die-with-parent" not in joined and "--die-with-parent" in alone
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


def _expr_mount(expr: str, **extra: str) -> dict[str, object]:
    return {
        "name": "main",
        "volumeMounts": [{"name": "ws", "mountPath": "/ws", "subPathExpr": expr, **extra}],
    }


def test_a_subpath_expr_is_expanded_with_the_containers_environment(tmp_path: Path) -> None:
    """As the kubelet does for an Indexed Job's pod: `$(JOB_COMPLETION_INDEX)`, from the pod's
    job-completion-index annotation, picks the candidate's own directory (made when missing)."""
    volume = tmp_path / "ws"
    volume.mkdir()
    volumes = {"ws": S.Volume("ws", "emptyDir", {})}
    pod = {"metadata": {"annotations": {"batch.kubernetes.io/job-completion-index": "3"}}}
    container = {
        "name": "main",
        "env": [
            {
                "name": "JOB_COMPLETION_INDEX",
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                    }
                },
            }
        ],
        "args": ["$(JOB_COMPLETION_INDEX)"],
        **_expr_mount(".agentrun/candidates/run_1_2/$(JOB_COMPLETION_INDEX)"),
    }
    env = S.resolve_env(pod, container, S.Lookups(), {})
    assert S.container_argv({**container, "command": ["echo"]}, env) == ["echo", "3"]
    made = binds(container, volumes, {"ws": volume}, env)[0]
    assert made.source == str(volume / ".agentrun" / "candidates" / "run_1_2" / "3") and made.target == "/ws"
    assert (volume / ".agentrun" / "candidates" / "run_1_2" / "3").is_dir()
    # An undefined variable is left as written, as the kubelet leaves it.
    assert binds(_expr_mount("a/$(NOPE)"), volumes, {"ws": volume}, env)[0].source == str(
        volume / "a" / "$(NOPE)"
    )
    # Expanding to nothing mounts the whole volume.
    assert binds(_expr_mount("$(EMPTY)"), volumes, {"ws": volume}, {"EMPTY": ""})[0].source == str(volume)


@pytest.mark.parametrize("value", ["../escape", "/abs", "a/../../b"])
def test_a_subpath_expr_that_expands_outside_its_volume_is_refused(tmp_path: Path, value: str) -> None:
    volume = tmp_path / "ws"
    volume.mkdir()
    volumes = {"ws": S.Volume("ws", "emptyDir", {})}
    with pytest.raises(S.StartError, match=r"must be a relative path without '\.\.'"):
        binds(_expr_mount("$(SUB)"), volumes, {"ws": volume}, {"SUB": value})
    assert not (tmp_path / "escape").exists()


def test_subpath_and_subpath_expr_together_are_refused(tmp_path: Path) -> None:
    volumes = {"ws": S.Volume("ws", "emptyDir", {})}
    with pytest.raises(S.StartError, match="mutually exclusive"):
        binds(_expr_mount("x", subPath="y"), volumes, {"ws": tmp_path}, {})
