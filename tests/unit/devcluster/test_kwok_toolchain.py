"""KWOK's build through the toolchain (and Argo's benchmark controller's, built the same way): built
only on demand, and a failure is one line saying what and what to do (docs/local-dev.md#kwok)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from agentrun_devcluster import argo, toolchain
from agentrun_devcluster.toolchain import Progress, ToolchainError


def test_kwok_is_not_among_the_tools_every_runtime_builds() -> None:
    assert toolchain.KWOK not in toolchain.TOOLS
    assert all("kwok" not in t.binaries for t in toolchain.TOOLS)


@pytest.mark.parametrize(
    ("ensure", "what", "log", "hint"),
    [
        (toolchain.ensure_kwok, "KWOK (sigs.k8s.io/kwok v0.8.0)", "kwok.log", "retry"),
        (
            argo.ensure_argo,
            f"Argo Workflows' workflow-controller ({argo.ARGO_MODULE} v{argo.ARGO_WORKFLOWS_VERSION})",
            "argo-workflow-controller.log",
            "the benchmark's AgentRun figures do not need it",
        ),
    ],
    ids=["kwok", "argo"],
)
def test_no_go_is_one_line_naming_the_tool_and_what_to_do(
    ensure: Callable[[Progress], Path],
    what: str,
    log: str,
    hint: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no `go`
    monkeypatch.setenv("AGENTRUN_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ToolchainError) as err:
        ensure(lambda _m: None)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{what} could not be built: Go toolchain not found")
    assert log in message and hint in message and "docs/" in message


def test_a_failing_build_is_one_line_with_its_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if toolchain.shutil.which("go") is None:
        pytest.skip("needs the Go toolchain on PATH to run a (failing) build")
    monkeypatch.setenv("AGENTRUN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GOPROXY", "off")  # no module can be fetched: the build fails at once
    monkeypatch.setenv("GOFLAGS", "")
    broken = dataclasses.replace(
        toolchain.KWOK,
        go_mod=lambda: "module agentrun.local/kwok\n\ngo 1.26.0\n\nrequire example.invalid/nothing v0.0.1\n",
        packages=("example.invalid/nothing/cmd/kwok",),
    )
    monkeypatch.setattr(toolchain, "KWOK", broken)
    with pytest.raises(ToolchainError) as err:
        toolchain.ensure_kwok(lambda _m: None)
    message = str(err.value)
    assert "\n" not in message
    assert "could not be built" in message and "kwok.log" in message
