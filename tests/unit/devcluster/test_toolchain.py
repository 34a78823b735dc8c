"""The tool builder's bad-input paths: no Go, an old Go, a failing build, and the go.mod mapping."""

from __future__ import annotations

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
    helm = next(t for t in toolchain.TOOLS if t.name == "helm")
    assert "recipe 2" in toolchain._stamp_text(helm)
    kubernetes = next(t for t in toolchain.TOOLS if t.name == "kubernetes")
    assert "recipe" not in toolchain._stamp_text(kubernetes)
