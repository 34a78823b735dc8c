"""Build the local control plane's tools from upstream Go modules, once, into a cache.

Nothing prebuilt is downloaded: `kube-apiserver`, `kube-controller-manager` and `kubectl` come from
`k8s.io/kubernetes` (each staging module mapped to its published `v0.X.Y`), `etcd` from
`go.etcd.io/etcd/server/v3` at the version that Kubernetes release pins, and `helm` from
`helm.sh/helm/v3`. All five are one `go build` in one module whose dependency versions are pinned to
Kubernetes' own, so a package they share is compiled once. The cache lives outside the repository and
is reused when present. See docs/development.md#local-control-plane for why these versions.

Prometheus and promtool (for the monitoring tests, docs/development.md#prometheus) are a build of
their own from `github.com/prometheus/prometheus`, with no pins: only the tests that need them build
them (`ensure_prometheus`), never `agentrun dev up`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agentrun_devcluster.processes import exclusive

KUBERNETES_VERSION = "1.36.3"
ETCD_VERSION = "3.6.8"  # the etcd k8s.io/kubernetes v1.36.3 pins in its go.mod
HELM_VERSION = "3.21.4"  # the Helm v3 release built against k8s.io v0.36
# Prometheus v3.16.0: its Go module is versioned v0.3XX.Y for Prometheus v3.XX.Y.
PROMETHEUS_MODULE_VERSION = "0.316.0"
PROMETHEUS_VERSION = "3.16.0"
MIN_GO = (1, 26)  # k8s.io/kubernetes v1.36 declares `go 1.26.0`
KWOK_VERSION = "0.8.0"  # sigs.k8s.io/kwok: built against k8s.io v0.36, as the control plane

Progress = Callable[[str], None]


class ToolchainError(RuntimeError):
    """A tool could not be built; the message names the command and the log."""


@dataclass(frozen=True)
class Tool:
    """One Go build: a throwaway module that requires upstream and builds some packages."""

    name: str
    binaries: tuple[str, ...]
    packages: tuple[str, ...]
    version: str
    go_mod: Callable[[], str]
    extra_files: dict[str, str] = field(default_factory=dict)
    ldflags: str = "-s -w"
    # The compiler's own flags; DWARF is stripped at link time (`-s -w`), so it is not generated.
    gcflags: str = "all=-dwarf=false"
    # Flags that depend on the resolved module graph (read with `go list -m`), as upstream Makefiles do.
    module_ldflags: Callable[[Callable[[str], str]], str] | None = None
    # Bumped when the build recipe changes, so a cache built the old way is rebuilt.
    recipe: int = 1
    # Go build tags (`-tags`), space-separated.
    tags: str = ""


def cache_root() -> Path:
    """The tool cache: `$AGENTRUN_CACHE_DIR` or `~/.cache/agentrun-operator`."""
    base = os.environ.get("AGENTRUN_CACHE_DIR")
    if base:
        return Path(base).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "agentrun-operator"


def toolchain_dir() -> Path:
    return cache_root() / "controlplane" / f"v{KUBERNETES_VERSION}"


def bin_dir() -> Path:
    return toolchain_dir() / "bin"


# `go` fetches at most GOMAXPROCS modules at once: 2 on a 2-core machine, where the ~210 modules of a
# first build took 95 s to resolve and download, against 20 s at 32. The commands that only resolve
# and download run with this; compiles keep the default (one per core).
DOWNLOAD_PARALLELISM = 32


def _go_env(downloads: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env["GOFLAGS"] = "-mod=mod -buildvcs=false"
    env.setdefault("CGO_ENABLED", "0")
    env["GOTOOLCHAIN"] = "local"
    if downloads:
        env["GOMAXPROCS"] = str(DOWNLOAD_PARALLELISM)
    return env


def find_go() -> str:
    """Return the `go` binary or explain exactly what is missing."""
    go = shutil.which("go")
    if go is None:
        raise ToolchainError(
            "Go toolchain not found: `go` is not on PATH. The local control plane builds "
            f"kube-apiserver, kube-controller-manager, kubectl, etcd and helm from source and needs "
            f"Go >= {MIN_GO[0]}.{MIN_GO[1]}. Install Go (https://go.dev/doc/install) and retry."
        )
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False)
    raw = out.stdout.strip().removeprefix("go")
    try:
        major, minor = (int(p) for p in raw.split(".")[:2])
    except ValueError as exc:
        raise ToolchainError(f"cannot read the Go version from `{go} env GOVERSION`: {raw!r}") from exc
    if (major, minor) < MIN_GO:
        raise ToolchainError(
            f"Go {raw} at {go} is too old: Kubernetes v{KUBERNETES_VERSION} needs Go >= "
            f"{MIN_GO[0]}.{MIN_GO[1]}. Install a newer Go and retry."
        )
    return go


def _kubernetes_go_mod() -> str:
    """A go.mod mapping every staging module of k8s.io/kubernetes to its published v0.X.Y."""
    go = find_go()
    proc = subprocess.run(
        [go, "mod", "download", "-json", f"k8s.io/kubernetes@v{KUBERNETES_VERSION}"],
        capture_output=True,
        text=True,
        env=_go_env(downloads=True),
        cwd=cache_root(),
        check=False,
    )
    if proc.returncode != 0:
        raise ToolchainError(
            f"`go mod download k8s.io/kubernetes@v{KUBERNETES_VERSION}` failed:\n{proc.stderr.strip()}"
        )
    upstream = Path(json.loads(proc.stdout)["GoMod"]).read_text()
    staging = staging_modules(upstream)
    staging_version = "v0." + KUBERNETES_VERSION.split(".", 1)[1]
    lines = [
        "module agentrun.local/controlplane/tools",
        "",
        "go 1.26.0",
        "",
        f"require k8s.io/kubernetes v{KUBERNETES_VERSION}",
        "",
        "replace (",
        *(f"\t{mod} => {mod} {staging_version}" for mod in staging),
        ")",
        "",
    ]
    return "\n".join(lines)


def _controlplane_go_mod() -> str:
    """Kubernetes' go.mod, plus helm and etcd, with every module Kubernetes uses pinned to its version.

    The pins (`replace` to the version Kubernetes' own module graph selects) keep kube-apiserver,
    kube-controller-manager and kubectl byte-for-byte the dependency set of a Kubernetes-only build,
    and make helm and etcd link those same packages instead of compiling their own versions of them.
    """
    kubernetes = _kubernetes_go_mod()
    graph_dir = toolchain_dir() / "src" / "kubernetes-graph"
    graph_dir.mkdir(parents=True, exist_ok=True)
    (graph_dir / "go.mod").write_text(kubernetes)
    go = find_go()
    done = subprocess.run(
        [go, "list", "-m", "all"],
        cwd=graph_dir,
        env=_go_env(downloads=True),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise ToolchainError(
            f"`go list -m all` for Kubernetes v{KUBERNETES_VERSION} failed:\n{done.stderr.strip()}"
        )
    return combined_go_mod(kubernetes, done.stdout)


def combined_go_mod(kubernetes_go_mod: str, kubernetes_graph: str) -> str:
    """Add helm and etcd to Kubernetes' go.mod and pin the graph `go list -m all` printed for it."""
    replaced = {line.split()[0] for line in kubernetes_go_mod.splitlines() if " => " in line}
    pins = [
        f"\t{parts[0]} => {parts[0]} {parts[1]}"
        for parts in (line.split() for line in kubernetes_graph.splitlines()[1:])  # [0] is the main module
        if len(parts) == 2 and parts[0] not in replaced
    ]
    require = f"require k8s.io/kubernetes v{KUBERNETES_VERSION}"
    if require not in kubernetes_go_mod or not kubernetes_go_mod.rstrip().endswith(")"):
        raise ToolchainError("unexpected shape of the generated Kubernetes go.mod")
    combined = kubernetes_go_mod.replace(
        require,
        "require (\n"
        f"\tk8s.io/kubernetes v{KUBERNETES_VERSION}\n"
        f"\tgo.etcd.io/etcd/server/v3 v{ETCD_VERSION}\n"
        f"\thelm.sh/helm/v3 v{HELM_VERSION}\n"
        ")",
    )
    return combined.rstrip()[:-1] + "\n".join(pins) + "\n)\n"


def staging_modules(upstream_go_mod: str) -> list[str]:
    """The modules k8s.io/kubernetes replaces with its own ./staging directories."""
    modules: list[str] = []
    for line in upstream_go_mod.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] == "=>" and parts[2].startswith("./staging/"):
            modules.append(parts[0])
        elif len(parts) == 4 and parts[0] == "replace" and parts[3].startswith("./staging/"):
            modules.append(parts[1])
    return sorted(set(modules))


_K8S_LDFLAGS = " ".join(
    [
        "-s -w",
        f"-X k8s.io/component-base/version.gitVersion=v{KUBERNETES_VERSION}",
        f"-X k8s.io/component-base/version.gitMajor={KUBERNETES_VERSION.split('.')[0]}",
        f"-X k8s.io/component-base/version.gitMinor={KUBERNETES_VERSION.split('.')[1]}",
        "-X k8s.io/component-base/version.gitTreeState=clean",
        f"-X k8s.io/client-go/pkg/version.gitVersion=v{KUBERNETES_VERSION}",
    ]
)

_ETCD_MAIN = """// Command etcd is upstream etcd's own entry point, built from go.etcd.io/etcd/server/v3.
package main

import (
\t"os"

\t"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
"""


_PAUSE_MAIN = """// Command pause is the real node's sandbox process: it holds a pod's namespaces, reaps the
// processes it inherits as PID 1 of a pod that shares its process namespace, and exits on SIGTERM.
package main

import (
\t"os"
\t"os/signal"
\t"syscall"
)

func main() {
\tsignals := make(chan os.Signal, 8)
\tsignal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
\tfor sig := range signals {
\t\tif sig != syscall.SIGCHLD {
\t\t\tos.Exit(0)
\t\t}
\t\tfor {
\t\t\tvar status syscall.WaitStatus
\t\t\tif pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
\t\t\t\tbreak
\t\t\t}
\t\t}
\t}
}
"""


def helm_kube_version_ldflags(client_go_version: str) -> str:
    """The Kubernetes version Helm assumes without a cluster, as helm's own Makefile sets it.

    Without these flags `helm template` and `helm lint` take Kubernetes v1.20 and refuse charts that
    declare `kubeVersion: >=1.29` (ours does). Upstream derives them from the client-go it links:
    `v0.36.2` → major 1, minor 36.
    """
    parts = client_go_version.lstrip("v").split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise ToolchainError(f"cannot read a Kubernetes version from k8s.io/client-go {client_go_version!r}")
    major, minor = str(int(parts[0]) + 1), parts[1]
    return " ".join(
        f"-X helm.sh/helm/v3/{pkg}.k8sVersion{part}={value}"
        for pkg in ("pkg/lint/rules", "pkg/chartutil")
        for part, value in (("Major", major), ("Minor", minor))
    )


_HELM_LDFLAGS = (
    f"-X helm.sh/helm/v3/internal/version.version=v{HELM_VERSION}"
    " -X helm.sh/helm/v3/internal/version.metadata="
    " -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
)

# One build of all seven binaries: `-X` of a package a binary does not link is ignored, so the
# Kubernetes and helm version flags can share one `-ldflags`.
TOOLS: tuple[Tool, ...] = (
    Tool(
        name="controlplane",
        binaries=(
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubelet",
            "kubectl",
            "etcd",
            "helm",
        ),
        packages=(
            "k8s.io/kubernetes/cmd/kube-apiserver",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
            "k8s.io/kubernetes/cmd/kube-scheduler",
            "k8s.io/kubernetes/cmd/kubelet",
            "k8s.io/kubernetes/cmd/kubectl",
            "./cmd/etcd",
            "helm.sh/helm/v3/cmd/helm",
        ),
        version=f"kubernetes {KUBERNETES_VERSION} etcd {ETCD_VERSION} helm {HELM_VERSION}",
        go_mod=_controlplane_go_mod,
        extra_files={"cmd/etcd/main.go": _ETCD_MAIN},
        ldflags=f"{_K8S_LDFLAGS} {_HELM_LDFLAGS}",
        module_ldflags=lambda module_version: helm_kube_version_ldflags(module_version("k8s.io/client-go")),
        recipe=2,  # 2: kube-scheduler and the kubelet for the real-node runtime
    ),
    Tool(
        name="pause",
        binaries=("pause",),
        packages=(".",),
        version="1",
        go_mod=lambda: "module agentrun.local/pause\n\ngo 1.26.0\n",
        extra_files={"main.go": _PAUSE_MAIN},
    ),
)


KWOK = Tool(
    name="kwok",
    binaries=("kwok",),
    packages=("sigs.k8s.io/kwok/cmd/kwok",),
    version=KWOK_VERSION,
    go_mod=lambda: f"module agentrun.local/kwok\n\ngo 1.26.0\n\nrequire sigs.k8s.io/kwok v{KWOK_VERSION}\n",
)
"""KWOK, the simulated nodes of the scale benchmark (docs/local-dev.md#kwok): not among `TOOLS`, so
only what asks for it (`ensure_kwok`) builds it, and no other runtime waits for it or fails with it.
Its own module (its dependency versions are KWOK's, not pinned to the control plane's)."""

_PROMETHEUS_GO_MOD = f"""module agentrun.local/monitoring/tools

go 1.26.7

require github.com/prometheus/prometheus v{PROMETHEUS_MODULE_VERSION}
"""

# Prometheus' own release flags (its .promu.yml) minus `builtinassets`: without that tag the web UI's
# assets are not embedded (web/ui/ui.go serves them from disk, and the tests use only the API), so
# nothing needs Node. `remove_all_sd` leaves out every service discovery (AWS, Azure, GCE, Kubernetes,
# ... SDKs: most of the build); the tests scrape with `static_configs`.
PROMETHEUS = Tool(
    name="prometheus",
    binaries=("prometheus", "promtool"),
    packages=(
        "github.com/prometheus/prometheus/cmd/prometheus",
        "github.com/prometheus/prometheus/cmd/promtool",
    ),
    version=f"prometheus {PROMETHEUS_VERSION}",
    go_mod=lambda: _PROMETHEUS_GO_MOD,
    ldflags=f"-s -w -X github.com/prometheus/common/version.Version={PROMETHEUS_VERSION}",
    tags="netgo remove_all_sd",
)


def _stamp(tool: Tool) -> Path:
    return bin_dir() / f".{tool.name}.built"


def _stamp_text(tool: Tool) -> str:
    recipe = f" recipe {tool.recipe}" if tool.recipe > 1 else ""
    return f"{tool.name} {tool.version} {' '.join(tool.binaries)}{recipe}\n"


def is_built(tool: Tool) -> bool:
    stamp = _stamp(tool)
    if not stamp.exists() or stamp.read_text() != _stamp_text(tool):
        return False
    return all(os.access(bin_dir() / b, os.X_OK) for b in tool.binaries)


def _build_lock() -> contextlib.AbstractContextManager[None]:
    """Serialise builds across processes (pytest and `agentrun dev up` may race)."""
    return exclusive(toolchain_dir() / ".lock")


def _run_logged(
    cmd: list[str], cwd: Path, log: Path, progress: Progress, label: str, downloads: bool = False
) -> None:
    """Run a long build, streaming to a log file and printing a heartbeat with what it is doing."""
    started = time.monotonic()
    counts = {"packages": 0, "downloads": 0}
    last = [""]
    with log.open("a") as out:
        out.write(f"$ (cd {cwd} && {' '.join(cmd)})\n")
        out.flush()
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=_go_env(downloads), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        stop = threading.Event()

        def heartbeat() -> None:
            while not stop.wait(30):
                progress(
                    f"  {label}: {time.monotonic() - started:5.0f}s, {counts['downloads']} modules "
                    f"downloaded, {counts['packages']} packages compiled (last: {last[0]})"
                )

        beat = threading.Thread(target=heartbeat, daemon=True)
        beat.start()
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()  # so `tail -f` on the log shows progress
            text = line.strip()
            if text.startswith("go: downloading"):
                counts["downloads"] += 1
            elif text and not text.startswith("go:") and " " not in text:
                counts["packages"] += 1
                last[0] = text
        rc = proc.wait()
        stop.set()
    if rc != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-25:])
        raise ToolchainError(
            f"building {label} failed (exit {rc}).\n  command: (cd {cwd} && {' '.join(cmd)})\n"
            f"  full log: {log}\n  last lines:\n{tail}"
        )


def _module_version(go: str, work: Path, module: str) -> str:
    """The version of `module` in the build's resolved module graph (`go list -m`), after `replace`."""
    done = subprocess.run(
        [go, "list", "-f", "{{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}", "-m", module],
        cwd=work,
        env=_go_env(downloads=True),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise ToolchainError(f"`go list -m {module}` in {work} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def build_tool(tool: Tool, progress: Progress) -> None:
    go = find_go()
    work = toolchain_dir() / "src" / tool.name
    logs = toolchain_dir() / "logs"
    work.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    bin_dir().mkdir(parents=True, exist_ok=True)
    (work / "go.mod").write_text(tool.go_mod())
    for name, text in tool.extra_files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    log = logs / f"{tool.name}.log"
    log.write_text("")
    out_dir = work / "out"
    out_dir.mkdir(exist_ok=True)
    ldflags = tool.ldflags
    if tool.module_ldflags is not None:
        ldflags = f"{ldflags} {tool.module_ldflags(lambda module: _module_version(go, work, module))}"
    flags = ["-v", "-trimpath", "-gcflags", tool.gcflags, "-ldflags", ldflags]
    tagged = ["-tags", tool.tags] if tool.tags else []
    flags += tagged
    cmd = [go, "build", *flags, "-o", f"{out_dir}/", *tool.packages]
    if tool.packages == (".",):
        cmd = [go, "build", *flags, "-o", str(out_dir / tool.binaries[0])]
        _run_logged([go, "mod", "tidy"], work, log, progress, f"{tool.name} (go mod tidy)", downloads=True)
    # Load every package first, which downloads the modules they are in, many at a time; `-e` leaves
    # a package's own errors to the build, which reports them.
    fetch = [go, "list", "-e", "-deps", *tagged, "-f", "{{if false}}{{end}}", *tool.packages]
    _run_logged(fetch, work, log, progress, f"{tool.name} (downloading modules)", downloads=True)
    started = time.monotonic()
    _run_logged(cmd, work, log, progress, f"{tool.name} ({tool.version})")
    for binary in tool.binaries:
        built = out_dir / binary
        if not built.exists():
            raise ToolchainError(f"building {tool.name} produced no {binary}; see {log}")
        os.replace(built, bin_dir() / binary)
    _stamp(tool).write_text(_stamp_text(tool))
    progress(f"built {tool.name} ({tool.version}) in {time.monotonic() - started:.0f}s -> {bin_dir()}")


def ensure_tools(progress: Progress | None = None, tools: tuple[Tool, ...] = TOOLS) -> Path:
    """Build whatever is missing and return the bin directory; reuse the cache when complete."""
    say: Progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if all(is_built(t) for t in tools):
        what = f"Kubernetes v{KUBERNETES_VERSION}" if tools == TOOLS else ", ".join(t.version for t in tools)
        say(f"control plane tools: reusing cache at {bin_dir()} ({what})")
        return bin_dir()
    with _build_lock():
        for tool in tools:
            if is_built(tool):
                say(f"control plane tools: {tool.name} ({tool.version}) cached")
                continue
            say(
                f"control plane tools: building {tool.name} ({tool.version}) from upstream Go modules "
                f"(first run only; log: {toolchain_dir() / 'logs' / (tool.name + '.log')})"
            )
            build_tool(tool, say)
    return bin_dir()


def ensure_on_demand(
    tool: Tool, building: str, failed: str, hint: str, progress: Progress | None = None
) -> Path:
    """The first binary of a tool no runtime needs (KWOK; Argo's controller for a benchmark), built
    from its Go module on first use, under the build lock, and cached beside the control plane.

    A failure is one line: `failed` could not be built, the first line of why, the build log, `hint`
    (what to do); `building` is said before a build starts."""
    say: Progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    path = bin_dir() / tool.binaries[0]
    if is_built(tool):
        return path
    log = toolchain_dir() / "logs" / f"{tool.name}.log"
    with _build_lock():
        if not is_built(tool):
            say(f"{building} (first run only; log: {log})")
            try:
                build_tool(tool, say)
            except ToolchainError as exc:
                first = str(exc).splitlines()[0] if str(exc) else "unknown error"
                raise ToolchainError(f"{failed} could not be built: {first} — see {log}; {hint}") from None
    return path


def ensure_kwok(progress: Progress | None = None) -> Path:
    """The `kwok` binary, built from its Go module on first use and cached beside the control plane."""
    return ensure_on_demand(
        KWOK,
        f"kwok: building sigs.k8s.io/kwok v{KWOK_VERSION} from its Go module",
        f"KWOK (sigs.k8s.io/kwok v{KWOK_VERSION})",
        "retry `python -m agentrun_devcluster.kwok up` once the Go module proxy answers "
        "(docs/local-dev.md#kwok); other runtimes do not need it",
        progress,
    )


def tool_path(binary: str) -> Path:
    return bin_dir() / binary


def ensure_prometheus(progress: Progress | None = None) -> Path:
    """Prometheus and promtool, built from upstream once (about as long as the control plane); the
    bin directory that holds them."""
    return ensure_tools(progress, (PROMETHEUS,))
