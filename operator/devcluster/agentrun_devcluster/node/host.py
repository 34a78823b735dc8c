"""What the real node needs from the host and leaves on it: packages, the pod network, host paths.

The node runs only where it can run as a node does: as root, with Debian's containerd, runc and
CNI plugins (installed with apt-get when missing). Everything it makes outside its own directory is
removed by `dev down`: the bridge with the host's address on the pod subnet (which the CNI plugin
then uses), the blackhole route that keeps the pod subnet from ever leaving the machine, the fixed
host paths the kubelet and libcni write (recorded when made: only those that did not exist before),
and the kubelet's cgroups.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from agentrun_devcluster.node.config import BLACKHOLE_METRIC, BRIDGE, BRIDGE_ADDRESS, POD_SUBNET, NodePaths
from agentrun_devcluster.podrunner.runtime import RuntimeUnavailable

Progress = Callable[[str], None]

PACKAGES = ("containerd", "runc", "containernetworking-plugins")
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
FIXED_HOST_PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/usr/libexec/kubernetes",
    "/var/lib/cni",
    "/var/run/netns",
    "/etc/cni",
)
"""Paths the kubelet, containerd or libcni write whatever their configuration says."""
CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBELET_CGROUPS = ("kubepods", "kubepods.slice")


class NodeUnavailable(RuntimeUnavailable):
    """The real node cannot run on this host; the message says what and what to do, in one line."""


def cni_bin_dir() -> str | None:
    for directory in CNI_BIN_DIRS:
        if all(os.access(Path(directory) / p, os.X_OK) for p in CNI_PLUGINS):
            return directory
    return None


def missing_packages() -> list[str]:
    missing = [p for p, exe in (("containerd", "containerd"), ("runc", "runc")) if shutil.which(exe) is None]
    if cni_bin_dir() is None:
        missing.append("containernetworking-plugins")
    return missing


def host_problem() -> str | None:
    """Why the node cannot run here (None: it can, possibly after installing packages)."""
    if os.geteuid() != 0:
        return (
            "--runtime kubelet needs root (the kubelet mounts volumes and makes cgroups and network "
            "namespaces); run as root, or use the local pod runner: `agentrun dev up --runtime process`"
        )
    if not CGROUP_ROOT.is_dir():
        return f"--runtime kubelet needs cgroups mounted at {CGROUP_ROOT}; use `--runtime process` here"
    if missing_packages() and shutil.which("apt-get") is None:
        return (
            f"--runtime kubelet needs Debian's {', '.join(missing_packages())} and there is no apt-get to "
            "install them; install them, or use `--runtime process`"
        )
    return None


def ensure_packages(say: Progress) -> str:
    """Install containerd, runc and the CNI plugins from the distribution when missing; the CNI
    plugins' directory."""
    problem = host_problem()
    if problem is not None:
        raise NodeUnavailable(problem)
    missing = missing_packages()
    if missing:
        from agentrun_devcluster.dockerengine import EngineUnavailable, apt_install

        try:
            apt_install(PACKAGES, "the real node", say)
        except EngineUnavailable as exc:
            raise NodeUnavailable(
                f"--runtime kubelet: installing {' '.join(PACKAGES)} failed: {exc}; install them with "
                "`apt-get install -y containerd runc containernetworking-plugins`, or use `--runtime process`"
            ) from None
    directory = cni_bin_dir()
    if directory is None or shutil.which("containerd") is None or shutil.which("runc") is None:
        raise NodeUnavailable(
            f"--runtime kubelet: {', '.join(missing_packages())} still missing after apt-get; install "
            "containerd, runc and containernetworking-plugins by hand, or use `--runtime process`"
        )
    return directory


# ------------------------------------------------------------------------------- the record


def _read_record(paths: NodePaths) -> dict[str, list[str]]:
    try:
        data = json.loads(paths.host_paths_record.read_text())
    except (OSError, ValueError):
        return {}
    return {k: [str(x) for x in v] for k, v in data.items() if isinstance(v, list)}


def _write_record(paths: NodePaths, record: dict[str, list[str]]) -> None:
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.host_paths_record.write_text(json.dumps(record, indent=1, sort_keys=True))


def record_host_state(paths: NodePaths) -> None:
    """Before the node starts: which fixed host paths and kubelet cgroups are not there yet (those
    are ours to remove), kept from an earlier start so a restart does not adopt what it made."""
    record = _read_record(paths)
    if "paths" not in record:
        record["paths"] = [p for p in FIXED_HOST_PATHS if not os.path.lexists(p)]
    if "cgroups" not in record:
        record["cgroups"] = [
            str(CGROUP_ROOT / controller.name / name)
            for controller in _cgroup_controllers()
            for name in KUBELET_CGROUPS
            if not (controller / name).exists()
        ]
    _write_record(paths, record)


def _cgroup_controllers() -> list[Path]:
    try:
        return [p for p in CGROUP_ROOT.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return []


# ------------------------------------------------------------------------------- network


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    """iproute2's `ip`; a host without it answers exit 127 (nothing of ours can be in its network)."""
    try:
        return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return subprocess.CompletedProcess(["ip", *args], 127, "", "ip: command not found (install iproute2)")


def _blackhole_metrics() -> list[int]:
    """The metrics of the blackhole routes the host has for exactly the pod subnet."""
    shown = _ip("-j", "route", "show", "table", "main", "exact", POD_SUBNET, "type", "blackhole")
    try:
        routes = json.loads(shown.stdout or "[]") if shown.returncode == 0 else []
    except ValueError:
        return []
    return [int(r.get("metric") or 0) for r in routes if isinstance(r, dict)]


def _subnet_users() -> list[str]:
    """Interfaces other than the bridge that have an address in the pod subnet."""
    shown = _ip("-o", "-4", "addr", "show", "to", POD_SUBNET)
    return sorted({line.split()[1] for line in shown.stdout.splitlines() if len(line.split()) > 1} - {BRIDGE})


def ensure_pod_network() -> None:
    """The pod subnet on this host: a blackhole route for it (so nothing of it ever leaves the
    machine, whatever else the host routes), then the bridge with the host's address, whose connected
    route wins over the blackhole (metric 0 before `BLACKHOLE_METRIC`), so the host reaches its pods
    over the bridge and nowhere else. Idempotent; a blackhole of an older node (metric 0, which
    would shadow the bridge's route) is replaced."""
    users = _subnet_users()
    if users:
        raise NodeUnavailable(
            f"--runtime kubelet: the pod subnet {POD_SUBNET} is already on this host's "
            f"{', '.join(users)}; the node needs it for its pods alone"
        )
    steps: list[tuple[str, ...]] = [
        ("route", "replace", "blackhole", POD_SUBNET, "metric", str(BLACKHOLE_METRIC)),
        *(
            ("route", "del", "blackhole", POD_SUBNET, "metric", str(m))
            for m in _blackhole_metrics()
            if m != BLACKHOLE_METRIC
        ),
    ]
    if _ip("link", "show", BRIDGE).returncode != 0:
        steps.append(("link", "add", BRIDGE, "type", "bridge"))
    steps += [("addr", "replace", BRIDGE_ADDRESS, "dev", BRIDGE), ("link", "set", BRIDGE, "up")]
    for step in steps:
        done = _ip(*step)
        if done.returncode != 0:
            raise NodeUnavailable(f"--runtime kubelet: `ip {' '.join(step)}` failed: {done.stderr.strip()}")


def remove_network() -> list[str]:
    """The bridge (its address and route go with it) and the pod subnet's blackhole routes, when
    present; what was removed."""
    removed = []
    if _ip("link", "del", BRIDGE).returncode == 0:
        removed.append(f"link {BRIDGE} ({BRIDGE_ADDRESS})")
    for metric in _blackhole_metrics():
        if _ip("route", "del", "blackhole", POD_SUBNET, "metric", str(metric)).returncode == 0:
            removed.append(f"route blackhole {POD_SUBNET} metric {metric}")
    return removed


# ------------------------------------------------------------------------------- teardown


def mounts_under(roots: Iterable[Path]) -> list[str]:
    """Mount points under any of `roots`, deepest first (the order to unmount them)."""
    prefixes = [str(r.resolve()) for r in roots]
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if any(point == p or point.startswith(p + "/") for p in prefixes):
                found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def unmount_all(roots: Iterable[Path]) -> int:
    """Unmount (lazily, as a last resort) everything mounted under `roots`; how many."""
    count = 0
    for _ in range(3):  # a mount may hide another at the same point
        points = mounts_under(roots)
        if not points:
            break
        for point in points:
            if subprocess.run(["umount", point], capture_output=True, check=False).returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
            count += 1
    return count


def _remove_cgroup(path: Path) -> bool:
    """rmdir a cgroup bottom-up (a cgroup with processes cannot go: left, and said)."""
    if not path.is_dir():
        return False
    for child in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            child.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()
    return not path.exists()


def remove_host_state(paths: NodePaths) -> list[str]:
    """Remove the host paths and cgroups the node made (per its record); what was removed."""
    record = _read_record(paths)
    removed = []
    for cgroup in record.get("cgroups", []):
        if _remove_cgroup(Path(cgroup)):
            removed.append(cgroup)
    for path in record.get("paths", []):
        if os.path.lexists(path):
            unmount_all([Path(path)])
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.lexists(path):
                removed.append(path)
    paths.host_paths_record.unlink(missing_ok=True)
    return removed
