"""The bubblewrap (`bwrap`) command line that runs one container (building it is pure).

The sandbox's `/` is a tmpfs holding the host's top-level entries bind-mounted read-only (symlinks
such as `/bin -> usr/bin` re-created as symlinks), so a mount path like `/workspace` can be created
without touching the host; then a fresh `/dev` and `/proc`, the pod's own `/tmp`, the volumes (in
depth order, so nested mounts work) and the termination-message files, and finally `/` is made
read-only. Writable are only the volumes, the pod's tmp and the termination-message files.

PID namespaces are shaped as the kubelet's would be (docs/local-dev.md#pod-runner-signals). Without
the pod's `shareProcessNamespace` each container gets its own (`--unshare-pid`) and the command is
PID 1 of it (`--as-pid-1`), as in a container of its own: the kernel gives a PID 1 no default signal
disposition, so without a handler it ignores SIGTERM and only SIGKILL ends it; when it exits, the
kernel kills everything left in the namespace (as the runtime kills a container's leftover
processes). With it, the command joins the pod's shared namespace (`--pidns FD`, held by the pod's
pause-like helper, pidns.py): it is not PID 1, so a SIGTERM ends it unless it handles it, and its
leftovers are killed by its shim (adopt.py: the container is a process group of its own). A runner
that is not root joins the user namespace that owns the pod's PID namespace first (`--userns FD`,
pidns.py). Where the pod has no shared namespace (`AGENTRUN_PODRUNNER_PIDNS=off`), bwrap's small
init is PID 1 of a namespace of the container's own and the command PID 2, with the same signal
semantics.
`--die-with-parent` ties a sandbox with a PID namespace of its own to its parent, the shim that
records its exit code in its own session (adopt.py), so the sandbox outlives a restart of the runner
but not a kill of its shim. A command joining the pod's shared namespace is never given it: to enter
that namespace bwrap forks once more and its intermediate process exits at once, and a command that
set its parent-death signal before that exit was done (a loaded machine) was SIGKILLed as it started
(exit 137, nothing logged). Its leftovers go with its process group or with the pod's PID 1 instead.
Mounts live only in the sandbox's mount namespace: nothing is left mounted on the host, ever.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SKIPPED_TOP_LEVEL = frozenset({"proc", "dev", "tmp"})


class SandboxUnavailable(RuntimeError):
    """`bwrap` is missing or cannot create namespaces here."""


@dataclass(frozen=True)
class HostEntry:
    """A top-level entry of the host's `/`: a directory, a file or a symlink (with its target)."""

    name: str
    kind: str  # dir | file | symlink
    target: str = ""


@dataclass(frozen=True)
class Bind:
    """Host path `source` mounted at `target` in the sandbox."""

    source: str
    target: str
    read_only: bool = False


def host_root_entries(root: str = "/") -> list[HostEntry]:
    """The entries of a host directory, by default `/` (sockets and devices are left out)."""
    entries: list[HostEntry] = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if os.path.islink(path):
            entries.append(HostEntry(name, "symlink", os.readlink(path)))
        elif os.path.isdir(path):
            entries.append(HostEntry(name, "dir"))
        elif os.path.isfile(path):
            entries.append(HostEntry(name, "file"))
    return entries


def find_bwrap() -> str:
    """The `bwrap` executable, or SandboxUnavailable saying how to install it."""
    path = shutil.which("bwrap") or next(
        (p for p in ("/usr/bin/bwrap", "/usr/local/bin/bwrap") if os.access(p, os.X_OK)), None
    )
    if path is None:
        raise SandboxUnavailable(
            "bubblewrap (`bwrap`) is not installed; the local pod runner needs it to mount each pod's "
            "volumes. Install it with `make setup` (as root) or `apt-get install -y bubblewrap`."
        )
    return path


def _depth(path: str) -> int:
    return len([p for p in path.split("/") if p])


def _covers(target: str, path: str) -> bool:
    """True when a mount at `target` hides `path`."""
    root = target.rstrip("/") or "/"
    return root == "/" or path == root or path.startswith(root + "/")


def bwrap_argv(
    bwrap: str,
    argv: Sequence[str],
    host_entries: Iterable[HostEntry],
    pod_tmp: str,
    binds: Iterable[Bind],
    files: Iterable[Bind],
    workdir: str,
    status_fd: int | None = None,
    hostname: str | None = None,
    expand: Sequence[tuple[str, Sequence[HostEntry]]] = (),
    tool_paths: Sequence[str] = (),
    command_is_pid_1: bool = False,
    pidns_fd: int | None = None,
    userns_fd: int | None = None,
) -> list[str]:
    """The full command line: sandbox set-up, then `--` and the container's argv.

    `command_is_pid_1`: the command is PID 1 of its namespace (a container without the pod's
    `shareProcessNamespace`), else bwrap's init is. `pidns_fd`: an open file of the pod's shared PID
    namespace (pidns.py), which the command joins instead (not as PID 1, and with no init of bwrap's);
    `userns_fd`: the user namespace that owns it, joined first (a runner that is not root).

    `expand` lists host directories re-created as a tmpfs holding their entries (see
    `spec.resolve_on_host`), so mount points can be made inside them; they end read-only too.
    """
    binds = sorted(binds, key=lambda b: (_depth(b.target), b.target))
    top_level_targets = {b.target.strip("/") for b in binds if _depth(b.target) == 1}
    out = [bwrap, "--tmpfs", "/"]
    for entry in host_entries:
        if entry.name in SKIPPED_TOP_LEVEL or entry.name in top_level_targets:
            continue
        path = "/" + entry.name
        if entry.kind == "symlink":
            out += ["--symlink", entry.target, path]
        else:
            out += ["--ro-bind", path, path]
    out += ["--dev", "/dev", "--proc", "/proc", "--bind", pod_tmp, "/tmp"]
    for path in tool_paths:
        # The host's tools (the venv with `agentrun`, an editable source tree) may live under the
        # host's /tmp, which the pod's own /tmp hides: show them again, read-only, at their paths.
        if path.startswith("/tmp/"):
            out += ["--ro-bind", path, path]
    expand = sorted(expand, key=lambda e: (_depth(e[0]), e[0]))
    for directory, entries in expand:
        out += ["--tmpfs", directory]
        for entry in entries:
            path = f"{directory.rstrip('/')}/{entry.name}"
            if entry.kind == "symlink":
                out += ["--symlink", entry.target, path]
            else:
                out += ["--ro-bind", path, path]
    for bind in binds:
        out += ["--ro-bind" if bind.read_only else "--bind", bind.source, bind.target]
    for path in tool_paths:
        # A volume mounted over them (an `emptyDir` at /tmp, as the chart's operator pod has) hides
        # them again: bind them once more on top, so `agentrun` is found wherever the checkout lives.
        if path.startswith("/tmp/") and any(_covers(bind.target, path) for bind in binds):
            out += ["--ro-bind", path, path]
    for file in files:
        out += ["--ro-bind" if file.read_only else "--bind", file.source, file.target]
    for directory, _entries in reversed(expand):
        out += ["--remount-ro", directory]
    out += ["--remount-ro", "/"]
    if pidns_fd is None:
        out += ["--die-with-parent"]  # not with --pidns: see the module docstring
    out += ["--chdir", workdir]
    if pidns_fd is not None:
        if userns_fd is not None:
            out += ["--userns", str(userns_fd)]
        out += ["--pidns", str(pidns_fd)]
    else:
        out += ["--unshare-pid", *(["--as-pid-1"] if command_is_pid_1 else [])]
    if hostname:
        out += ["--unshare-uts", "--hostname", hostname]
    if status_fd is not None:
        out += ["--json-status-fd", str(status_fd)]
    out += ["--", *argv]
    return out
