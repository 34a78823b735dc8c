"""What the real node says when the host cannot run it, and what it removes again.

docs/local-dev.md#real-node
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrun_devcluster.node import host
from agentrun_devcluster.node.config import NodePaths
from agentrun_devcluster.node.node import _last_error


def test_not_root_is_one_line_naming_the_fix_and_the_pod_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host.os, "geteuid", lambda: 1000)
    problem = host.host_problem()
    assert problem is not None and "\n" not in problem
    assert "needs root" in problem and "--runtime process" in problem


def test_missing_packages_without_apt_get_name_the_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host.os, "geteuid", lambda: 0)
    monkeypatch.setattr(host.shutil, "which", lambda _name: None)
    monkeypatch.setattr(host, "cni_bin_dir", lambda: None)
    problem = host.host_problem()
    assert problem is not None
    assert "containerd, runc, containernetworking-plugins" in problem and "--runtime process" in problem


def test_a_component_that_did_not_start_is_named_by_its_last_error_line() -> None:
    log = "\n".join(
        ["time=1 level=info msg=starting", 'time=2 level=error msg="listen: address already in use"', "bye"]
    )
    assert "address already in use" in _last_error(log)
    assert _last_error("") == "no output"


def test_only_the_host_paths_that_were_not_there_are_recorded_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    existed, made = tmp_path / "existed", tmp_path / "made"
    existed.mkdir()
    monkeypatch.setattr(host, "FIXED_HOST_PATHS", (str(existed), str(made)))
    monkeypatch.setattr(host, "_cgroup_controllers", lambda: [])
    paths = NodePaths(tmp_path / "node")
    host.record_host_state(paths)
    assert json.loads(paths.host_paths_record.read_text())["paths"] == [str(made)]
    made.mkdir()
    (made / "device-plugins").mkdir()
    host.record_host_state(paths)  # a restart keeps the first record: what it made stays its own
    assert json.loads(paths.host_paths_record.read_text())["paths"] == [str(made)]
    assert host.remove_host_state(paths) == [str(made)]
    assert existed.exists() and not made.exists() and not paths.host_paths_record.exists()


def test_mounts_are_unmounted_deepest_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    root = tmp_path.resolve()
    info = "\n".join(
        f"1 2 0:1 / {point} rw - tmpfs tmpfs rw"
        for point in (f"{root}/a", f"{root}/a/b/c", "/elsewhere", f"{root}/a/b")
    )
    monkeypatch.setattr(host.Path, "read_text", lambda self, *a, **k: info)
    assert host.mounts_under([root]) == [f"{root}/a/b/c", f"{root}/a/b", f"{root}/a"]


def test_containerd_reaches_no_registry_every_pull_goes_to_a_closed_loopback_port() -> None:
    from urllib.parse import urlparse

    from agentrun_devcluster.node.node import NO_REGISTRY_ENV

    proxies = [
        v for k, v in NO_REGISTRY_ENV.items() if k.lower().endswith("_proxy") and k.lower() != "no_proxy"
    ]
    assert len(proxies) == 4 and {urlparse(p).hostname for p in proxies} == {"127.0.0.1"}
    assert NO_REGISTRY_ENV["NO_PROXY"] == NO_REGISTRY_ENV["no_proxy"] == ""  # no host bypasses it
