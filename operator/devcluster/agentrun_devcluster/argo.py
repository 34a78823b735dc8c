"""Argo Workflows' workflow-controller, built from its Go module for the side-by-side benchmark.

The scale benchmark compares the operator with the best-known controller of looping pod workflows
on the same control plane (docs/operator.md#scale-argo). Nothing prebuilt is downloaded: the
controller is `go build` of `github.com/argoproj/argo-workflows/v4/cmd/workflow-controller` at the
one version the Go module proxy serves here, in a throwaway module of its own (its dependency
versions are Argo's, not pinned to the control plane's), cached beside the control plane. It is a
benchmark tool only: not among `toolchain.TOOLS`, so `make test` and `agentrun dev up` never build
it or wait for it. Its CRDs come from the same module's `manifests/`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from agentrun_devcluster import toolchain
from agentrun_devcluster.toolchain import Progress, Tool, ToolchainError

ARGO_WORKFLOWS_VERSION = "4.0.5"  # the only v4 the Go module proxy lists here
ARGO_MODULE = "github.com/argoproj/argo-workflows/v4"

_ARGO_LDFLAGS = " ".join(
    [
        "-s -w",
        f"-X {ARGO_MODULE}.version=v{ARGO_WORKFLOWS_VERSION}",
        f"-X {ARGO_MODULE}.gitTag=v{ARGO_WORKFLOWS_VERSION}",
        f"-X {ARGO_MODULE}.gitTreeState=clean",
    ]
)

ARGO = Tool(
    name="argo-workflow-controller",
    binaries=("workflow-controller",),
    packages=(f"{ARGO_MODULE}/cmd/workflow-controller",),
    version=f"argo-workflows {ARGO_WORKFLOWS_VERSION}",
    go_mod=lambda: (
        f"module agentrun.local/bench/argo\n\ngo 1.26.0\n\nrequire {ARGO_MODULE} v{ARGO_WORKFLOWS_VERSION}\n"
    ),
    ldflags=_ARGO_LDFLAGS,
)


def ensure_argo(progress: Progress | None = None) -> Path:
    """The `workflow-controller` binary, built on first use (several minutes) and cached."""
    return toolchain.ensure_on_demand(
        ARGO,
        f"argo: building {ARGO_MODULE} v{ARGO_WORKFLOWS_VERSION} workflow-controller",
        f"Argo Workflows' workflow-controller ({ARGO_MODULE} v{ARGO_WORKFLOWS_VERSION})",
        "the benchmark's AgentRun figures do not need it (docs/operator.md#scale-argo)",
        progress,
    )


def module_dir() -> Path:
    """The unpacked source of the Argo module in Go's module cache (downloaded when missing)."""
    go = toolchain.find_go()
    toolchain.cache_root().mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [go, "mod", "download", "-json", f"{ARGO_MODULE}@v{ARGO_WORKFLOWS_VERSION}"],
        capture_output=True,
        text=True,
        env=toolchain._go_env(downloads=True),
        cwd=toolchain.cache_root(),
        check=False,
    )
    if done.returncode != 0:
        raise ToolchainError(
            f"`go mod download {ARGO_MODULE}@v{ARGO_WORKFLOWS_VERSION}` failed: {done.stderr.strip()}"
        )
    return Path(json.loads(done.stdout)["Dir"])


def crd_files() -> list[Path]:
    """Argo's CRDs as its own install manifests ship them (`manifests/base/crds/minimal`)."""
    crds = module_dir() / "manifests" / "base" / "crds" / "minimal"
    files = sorted(p for p in crds.glob("*.yaml") if p.name != "kustomization.yaml")
    if not files:
        raise ToolchainError(f"no CRDs found in {crds}: the Argo module's layout changed")
    return files
