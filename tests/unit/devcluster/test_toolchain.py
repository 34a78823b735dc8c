"""The tool builder's bad-input paths: no Go, an old Go, a failing build, and the go.mod mapping."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest

from agentrun_devcluster import toolchain
from agentrun_devcluster.toolchain import Tool, ToolchainError


def test_missing_go_says_exactly_what_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing here, so no `go`
    monkeypatch.setenv("AGENTRUN_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ToolchainError) as err:
        toolchain.ensure_tools(lambda _m: None)
    message = str(err.value)
    assert "`go` is not on PATH" in message
    assert "Go >= 1.26" in message


def test_too_old_go_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "go"
    fake.write_text("#!/bin/sh\necho go1.21.5\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolchainError, match=r"Go 1\.21\.5 .* too old"):
        toolchain.find_go()


def test_failed_build_names_the_command_and_the_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if toolchain.shutil.which("go") is None:
        pytest.skip("needs the Go toolchain on PATH to run a (failing) build")
    monkeypatch.setenv("AGENTRUN_CACHE_DIR", str(tmp_path / "cache"))
    broken = Tool(
        name="broken",
        binaries=("broken",),
        packages=(".",),
        version="0.0.1",
        go_mod=lambda: "module agentrun.local/broken\n\ngo 1.24.0\n",
        extra_files={"main.go": "package main\n\nfunc main() { this is not go }\n"},
    )
    with pytest.raises(ToolchainError) as err:
        toolchain.build_tool(broken, lambda _m: None)
    message = str(err.value)
    assert "command: (cd " in message and "go build" in message
    log = Path(message.split("full log: ")[1].split()[0])
    assert log.exists() and "syntax error" in log.read_text()
    assert not toolchain.is_built(broken)


def test_staging_modules_are_read_from_the_upstream_go_mod() -> None:
    upstream = """module k8s.io/kubernetes
require (
\tk8s.io/api v0.0.0
\tk8s.io/utils v0.0.0-20250101
)
replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tgithub.com/x/y => github.com/x/z v1.0.0
)
replace k8s.io/kubectl => ./staging/src/k8s.io/kubectl
"""
    assert toolchain.staging_modules(upstream) == ["k8s.io/api", "k8s.io/client-go", "k8s.io/kubectl"]


def test_cache_location_is_outside_the_repo_and_overridable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUN_CACHE_DIR", "/tmp/somewhere")
    assert (
        toolchain.bin_dir()
        == Path("/tmp/somewhere/controlplane") / f"v{toolchain.KUBERNETES_VERSION}" / "bin"
    )
    monkeypatch.delenv("AGENTRUN_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert str(toolchain.bin_dir()).startswith(os.path.expanduser("~/.cache/agentrun-operator/"))


def test_helm_gets_the_kubernetes_version_of_the_client_go_it_links() -> None:
    flags = toolchain.helm_kube_version_ldflags("v0.36.2")
    for pkg in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
        assert f"-X {pkg}.k8sVersionMajor=1" in flags
        assert f"-X {pkg}.k8sVersionMinor=36" in flags


def test_helm_kube_version_refuses_an_unreadable_module_version() -> None:
    with pytest.raises(toolchain.ToolchainError, match="client-go"):
        toolchain.helm_kube_version_ldflags("(devel)")


def test_a_changed_build_recipe_makes_the_cached_tool_stale() -> None:
    plane, pause = toolchain.TOOLS
    assert "recipe 2" in toolchain._stamp_text(plane)  # 2: with kube-scheduler and the kubelet
    assert "recipe" not in toolchain._stamp_text(pause)
    assert "recipe 3" in toolchain._stamp_text(dataclasses.replace(plane, recipe=3))


def test_the_real_nodes_pause_is_a_small_build_of_its_own() -> None:
    _plane, pause = toolchain.TOOLS
    assert pause.binaries == ("pause",) and pause.packages == (".",)
    assert "syscall.Wait4" in pause.extra_files["main.go"]  # reaps what it inherits as PID 1


def test_one_build_makes_all_seven_binaries_with_each_tools_version_flags() -> None:
    plane, _pause = toolchain.TOOLS
    assert set(plane.binaries) == {
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubelet",
        "kubectl",
        "etcd",
        "helm",
    }
    assert f"component-base/version.gitVersion=v{toolchain.KUBERNETES_VERSION}" in plane.ldflags
    assert f"helm/v3/internal/version.version=v{toolchain.HELM_VERSION}" in plane.ldflags
    assert "-s -w" in plane.ldflags and plane.gcflags == "all=-dwarf=false"
    assert "cmd/etcd/main.go" in plane.extra_files


KUBERNETES_GO_MOD = """module agentrun.local/controlplane/tools

go 1.26.0

require k8s.io/kubernetes v1.36.3

replace (
\tk8s.io/api => k8s.io/api v0.36.3
\tk8s.io/client-go => k8s.io/client-go v0.36.3
)
"""

KUBERNETES_GRAPH = """agentrun.local/controlplane/tools
google.golang.org/grpc v1.79.3
k8s.io/api v0.0.0 => k8s.io/api v0.36.3
k8s.io/kubernetes v1.36.3
"""


def test_the_combined_module_adds_helm_and_etcd_and_pins_every_kubernetes_dependency() -> None:
    combined = toolchain.combined_go_mod(KUBERNETES_GO_MOD, KUBERNETES_GRAPH)
    assert f"\thelm.sh/helm/v3 v{toolchain.HELM_VERSION}\n" in combined
    assert f"\tgo.etcd.io/etcd/server/v3 v{toolchain.ETCD_VERSION}\n" in combined
    # helm asks for a newer grpc than Kubernetes; the pin keeps Kubernetes' own.
    assert "\tgoogle.golang.org/grpc => google.golang.org/grpc v1.79.3\n" in combined
    assert "\tk8s.io/kubernetes => k8s.io/kubernetes v1.36.3\n" in combined
    # a staging module keeps its one mapping; the main module is not pinned
    assert combined.count("k8s.io/api =>") == 1
    assert "agentrun.local/controlplane/tools =>" not in combined
    assert combined.endswith(")\n")


def test_an_unexpected_kubernetes_go_mod_is_refused() -> None:
    with pytest.raises(ToolchainError, match="unexpected shape"):
        toolchain.combined_go_mod("module x\n", KUBERNETES_GRAPH)


def test_downloads_run_many_at_once_and_compiles_one_per_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOMAXPROCS", raising=False)
    assert toolchain._go_env(downloads=True)["GOMAXPROCS"] == str(toolchain.DOWNLOAD_PARALLELISM)
    assert "GOMAXPROCS" not in toolchain._go_env()
