"""The pure parts of the Docker side: the `docker create` command line of the pod runner's docker
runtime, the securityContext rules, the base images' recipe and layout, the image's build inputs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from agentrun_devcluster import baseimages, imagebuild
from agentrun_devcluster.podrunner import adopt
from agentrun_devcluster.podrunner import spec as S
from agentrun_devcluster.podrunner.docker import (
    LABEL_NODE,
    container_name,
    create_argv,
    exit_code,
    non_root_problem,
    user_flag,
)
from agentrun_devcluster.podrunner.runtime import ImageNeverPulled, Launch
from agentrun_devcluster.podrunner.sandbox import Bind

REPO = Path(__file__).resolve().parents[2]


def launch(container: dict[str, object], env: dict[str, str] | None = None, **pod_spec: object) -> Launch:
    pod = {"metadata": {"namespace": "e2e", "name": "it-1", "uid": "0123456789abcdef"}, "spec": pod_spec}
    return Launch(
        pod=pod,
        name=str(container.get("name", "main")),
        container=container,
        env=env or {"HOSTNAME": "it-1"},
        binds=[Bind("/state/pvc/e2e/ws", "/workspace"), Bind("/state/pods/x/volumes/meta", "/meta", True)],
        termination_file=Path("/state/pods/x/containers/main/termination-log"),
        pod_dir=Path("/state/pods/x"),
        log_path=Path("/state/pods/x/logs/main/0.log"),
        restart=2,
    )


def values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_command_becomes_the_entrypoint_and_args_follow_the_image() -> None:
    lc = launch(
        {"name": "main", "image": "busybox:1.36", "command": ["sh", "-c"], "args": ["echo $(WHO) $$HOME"]},
        env={"HOSTNAME": "it-1", "WHO": "me"},
    )
    argv = create_argv("docker", lc, "n", "node-a", {})
    assert argv[:2] == ["docker", "create"]
    assert argv[-4:] == ["sh", "busybox:1.36", "-c", "echo me $HOME"]
    assert values(argv, "--entrypoint") == ["sh"]


def test_without_command_the_image_entrypoint_runs_with_args_as_cmd() -> None:
    lc = launch({"name": "op", "image": "ghcr.io/x/op:1", "args": ["operator", "--peering"]})
    argv = create_argv("docker", lc, "n", "node-a", {})
    assert "--entrypoint" not in argv
    assert argv[-3:] == ["ghcr.io/x/op:1", "operator", "--peering"]


def test_volumes_termination_file_network_env_and_labels() -> None:
    lc = launch(
        {"name": "main", "image": "busybox:1.36", "command": ["true"]}, env={"A": "1", "B": "two words"}
    )
    argv = create_argv("docker", lc, "the-name", "node-a", {})
    assert values(argv, "--mount") == [
        "type=bind,source=/state/pvc/e2e/ws,target=/workspace",
        "type=bind,source=/state/pods/x/volumes/meta,target=/meta,readonly",
        "type=bind,source=/state/pods/x/containers/main/termination-log,target=/dev/termination-log",
    ]
    assert values(argv, "--network") == ["host"]
    assert values(argv, "--env") == ["A", "B"], "values travel in the client's environment, not argv"
    assert "two words" not in " ".join(argv)
    assert f"{LABEL_NODE}=node-a" in values(argv, "--label")
    assert values(argv, "--name") == ["the-name"]


def test_an_init_is_pid_1_only_in_a_pod_sharing_its_process_namespace() -> None:
    """As on a kubelet: without `shareProcessNamespace` the command is PID 1 of its container (and
    ignores SIGTERM without a handler); with it the pod's pause process is, here docker's init."""
    container = {"name": "main", "image": "busybox:1.36", "command": ["sleep", "9"]}
    assert "--init" not in create_argv("docker", launch(container), "n", "node-a", {})
    shared = launch(container, shareProcessNamespace=True)
    assert "--init" in create_argv("docker", shared, "n", "node-a", {})


def test_security_context_user_groups_and_read_only_root() -> None:
    lc = launch({"name": "main", "image": "i", "command": ["true"]})
    ctx = {"runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 2000, "readOnlyRootFilesystem": True}
    argv = create_argv("docker", lc, "n", "node", ctx)
    assert values(argv, "--user") == ["10001:10001"]
    assert values(argv, "--group-add") == ["2000"]
    assert "--read-only" in argv
    plain = create_argv("docker", lc, "n", "node", {})
    assert "--user" not in plain and "--read-only" not in plain


def test_user_flag_rules() -> None:
    assert user_flag({}) is None
    assert user_flag({"runAsUser": 5}) == "5"
    with pytest.raises(S.ContainerConfigError):
        user_flag({"runAsGroup": 5})


@pytest.mark.parametrize(
    ("ctx", "image_user", "refused"),
    [
        ({}, "", False),
        ({"runAsNonRoot": True}, "10001:10001", False),
        ({"runAsNonRoot": True}, "", True),
        ({"runAsNonRoot": True}, "root", True),
        ({"runAsNonRoot": True}, "agentrun", True),
        ({"runAsNonRoot": True, "runAsUser": 0}, "10001", True),
        ({"runAsNonRoot": True, "runAsUser": 7}, "", False),
    ],
)
def test_run_as_non_root(ctx: dict[str, object], image_user: str, refused: bool) -> None:
    assert (non_root_problem(ctx, image_user) is not None) is refused


def test_a_bad_mount_path_is_a_start_error() -> None:
    lc = launch({"name": "main", "image": "i", "command": ["true"]})
    bad = replace(lc, binds=[Bind("/x", "/proc/foo")])
    with pytest.raises(S.StartError, match="/proc"):
        create_argv("docker", bad, "n", "node", {})


def test_container_names_are_docker_safe_and_unique_per_restart() -> None:
    lc = launch({"name": "main", "image": "i"})
    assert container_name(lc) == "agentrun_e2e_it-1_main_01234567_2"
    assert container_name(replace(lc, restart=3)) != container_name(lc)


def test_a_missing_image_waits_like_the_kubelet() -> None:
    err = ImageNeverPulled("x")
    assert isinstance(err, S.ContainerConfigError), "the runner retries config errors"
    assert err.reason == "ErrImageNeverPull"


# ----------------------------------------------------------------------------------- base images


def test_debian_mirror_from_deb822_and_one_line_sources() -> None:
    deb822 = "Types: deb\n# comment\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
    assert baseimages.debian_mirror([deb822]) == "http://mirror.example/debian"
    one_line = "deb [arch=amd64] http://m2.example/debian/ bookworm main\n"
    assert (
        baseimages.debian_mirror(["deb https://x/apt cloud-sdk main\n", one_line])
        == "http://m2.example/debian"
    )
    security = "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n"
    assert baseimages.debian_mirror([security]) == baseimages.DEFAULT_MIRROR


def test_python_recipe_changes_with_its_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(baseimages, "HOST_CA_DIR", tmp_path)
    ca = tmp_path / "proxy.crt"
    ca.write_text("A")
    first = baseimages.python_recipe("http://a/debian", [ca])
    assert first == baseimages.python_recipe("http://a/debian", [ca])
    assert first != baseimages.python_recipe("http://b/debian", [ca])
    assert first != baseimages.python_recipe("http://a/debian", [])
    ca.write_text("B")
    assert first != baseimages.python_recipe("http://a/debian", [ca])


def test_git_recipe_names_the_mirror_and_packages() -> None:
    first = baseimages.git_recipe("http://a/debian")
    assert first == baseimages.git_recipe("http://a/debian") != baseimages.git_recipe("http://b/debian")
    assert first != baseimages.python_recipe("http://a/debian", [])
    assert "git" in baseimages.GIT_PACKAGES


def test_busybox_rootfs_layout(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "busybox").write_text("")
    baseimages.busybox_rootfs(tmp_path, ["busybox", "sh", "wc", "date"])
    assert (tmp_path / "bin" / "sh").readlink() == Path("busybox")
    assert not (tmp_path / "bin" / "busybox").is_symlink()
    assert (tmp_path / "tmp").stat().st_mode & 0o7777 == 0o1777
    assert (tmp_path / "etc" / "passwd").read_text().startswith("root:x:0:0:")


# ----------------------------------------------------------------------------------- the image build


def test_pinned_base_is_the_dockerfile_default() -> None:
    base = imagebuild.pinned_base((REPO / "Dockerfile").read_text())
    assert base.startswith("python:3.11") and "@sha256:" in base


def test_dockerignore_lets_in_exactly_what_the_hash_covers() -> None:
    lines = [ln for ln in (REPO / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    allowed = sorted(ln[1:].rstrip("/") for ln in lines if ln.startswith("!"))
    assert lines[0] == "*"
    assert allowed == sorted([*imagebuild.CONTEXT_FILES, *imagebuild.CONTEXT_DIRS])


def test_source_hash_follows_file_contents_base_and_args(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("1")
    files = [tmp_path / "a"]
    first = imagebuild.source_hash(tmp_path, files, "sha256:base", ["VERSION=1"])
    assert first == imagebuild.source_hash(tmp_path, files, "sha256:base", ["VERSION=1"])
    assert first != imagebuild.source_hash(tmp_path, files, "sha256:other", ["VERSION=1"])
    assert first != imagebuild.source_hash(tmp_path, files, "sha256:base", ["VERSION=2"])
    (tmp_path / "a").write_text("2")
    assert first != imagebuild.source_hash(tmp_path, files, "sha256:base", ["VERSION=1"])


def test_context_files_leave_out_bytecode_and_egg_info() -> None:
    files = imagebuild.context_files(REPO)
    assert REPO / "operator" / "agentrun_operator" / "cli.py" in files
    assert not [f for f in files if "__pycache__" in f.parts or any(p.endswith(".egg-info") for p in f.parts)]


def test_an_ended_container_reports_the_engines_exit_code_and_an_oom_kill_as_137() -> None:
    assert exit_code({"Status": "exited", "ExitCode": 3}, 137) == 3
    assert exit_code({"Status": "exited", "ExitCode": 0, "OOMKilled": True}, 137) == 137
    assert exit_code({}, 128) == 128


def test_a_docker_launch_record_is_written_without_a_live_client_and_old_records_are_the_process_kind(
    tmp_path: Path,
) -> None:
    gone_pid = 2**22 + 1  # above the kernel's pid_max: no such process
    record = adopt.launch_record(
        tmp_path, "main", 0, gone_pid, "t0", "docker://c1", tmp_path / "0.log", runtime="docker"
    )
    assert record is not None and record.runtime == "docker" and record.pid_start == ""
    adopt.write_launch(tmp_path, record)
    assert adopt.read_launches(tmp_path) == {"main": record}
    assert adopt.launch_record(tmp_path, "main", 0, gone_pid, "t0", "x", tmp_path / "0.log") is None
    old = {k: v for k, v in record.__dict__.items() if k != "runtime"}  # written before `runtime`
    (tmp_path / "containers" / "main" / adopt.LAUNCH_RECORD).write_text(json.dumps(old))
    assert adopt.read_launches(tmp_path)["main"].runtime == "process"
