"""The real node of the local default: containerd, the upstream kubelet and kube-scheduler.

`agentrun dev up --runtime kubelet` runs these instead of the local pod runner, beside the same
control plane: containerd from the distribution as its own instance, the kubelet and kube-scheduler
from the same cached tool build as the API server, the local provisioner as a small service (the
node owns its disks), and the images the examples use imported into containerd (no registry: a pause
image made here, busybox and the operator image from the local Docker engine). Each is a detached
process with a pid file under `<state>/run/`, like the control plane's components, so `dev status`,
`dev logs`, `dev restart` and `dev down` know them. docs/local-dev.md#real-node
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from agentrun_devcluster import processes, toolchain
from agentrun_devcluster.controlplane import ControlPlane, ControlPlaneError
from agentrun_devcluster.node import host
from agentrun_devcluster.node.config import (
    NODE_NAME,
    PAUSE_IMAGE,
    NodePaths,
    cni_conflist,
    containerd_config,
    kubelet_config,
)
from agentrun_devcluster.node.images import import_images

CONTAINERD = "containerd"
KUBELET = "kubelet"
SCHEDULER = "kube-scheduler"
PROVISIONER = "provisioner"
NODE_COMPONENTS = (CONTAINERD, SCHEDULER, PROVISIONER, KUBELET)
"""In start order; stopped in reverse."""

Progress = Callable[[str], None]
OWNER_FILE = Path("/run/agentrun-real-node/owner")


def node_owner(owner_file: Path | None = None) -> Path | None:
    """The state directory of the state that runs the host's real node, if one does."""
    try:
        text = (owner_file or OWNER_FILE).read_text().strip()
    except OSError:
        return None
    return Path(text) if text else None


"""Host-wide: the state directory whose real node runs here. The node is a host-wide thing (a
bridge, a route, fixed host paths, the kubelet's cgroups), so a second local default gets none."""
NO_REGISTRY_ENV = {
    key: "http://127.0.0.1:9" for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
} | {"NO_PROXY": "", "no_proxy": ""}
"""containerd never reaches a registry: every pull goes to a closed loopback port as its proxy, so an
image that is not on the node fails at once (`ErrImagePull`), with no DNS query and no traffic off
the machine (docs/local-dev.md#real-node)."""
HOST_LOCK = Path("/run/agentrun-real-node/lock")
"""Held by whoever needs the host's only real node for a while (the tests' session fixture)."""


def _insecure_get(url: str) -> int:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the component's own self-signed serving certificate
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return int(resp.status)
    except (OSError, ssl.SSLError):
        return 0


class RealNode:
    """Start, check and stop the node kept under `<plane home>/node`."""

    def __init__(self, plane: ControlPlane, progress: Progress | None = None) -> None:
        self.plane = plane
        self.paths = NodePaths(plane.home / "node")
        self.say: Progress = progress or (lambda _m: None)

    # -- ports -----------------------------------------------------------------------------------
    @property
    def _ports_file(self) -> Path:
        return self.paths.root / "ports.json"

    def ports(self) -> dict[str, int]:
        try:
            data = json.loads(self._ports_file.read_text())
            return {k: int(v) for k, v in data.items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def _port(self, name: str) -> int:
        """A remembered port, or a new free one (remembered)."""
        ports = self.ports()
        if not ports.get(name) or processes.port_open(ports[name]):
            ports[name] = processes.free_port()
            self.paths.root.mkdir(parents=True, exist_ok=True)
            self._ports_file.write_text(json.dumps(ports))
        return ports[name]

    # -- health ----------------------------------------------------------------------------------
    def healthy(self, name: str) -> bool:
        ports = self.ports()
        if name == CONTAINERD:
            return self._ctr("version").returncode == 0
        if name == KUBELET:
            return _insecure_get(f"http://127.0.0.1:{ports.get('kubelet_healthz', 0)}/healthz") == 200
        if name == SCHEDULER:
            return _insecure_get(f"https://127.0.0.1:{ports.get('scheduler', 0)}/healthz") == 200
        record = processes.read_record(self.plane.run_dir, name)
        return record is not None and record.alive()

    def node_ready(self) -> bool:
        """The Node is Ready and carries no NoSchedule/NoExecute taint (pods can land on it)."""
        code, body = self.plane.api_get(f"/api/v1/nodes/{NODE_NAME}")
        if code != 200:
            return False
        node = json.loads(body)
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in node.get("status", {}).get("conditions", [])
        )
        blocking = [
            t for t in node.get("spec", {}).get("taints") or [] if t.get("effect") != "PreferNoSchedule"
        ]
        return ready and not blocking

    # -- commands --------------------------------------------------------------------------------
    def _ctr(self, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        """Run containerd's `ctr` on the node's socket; never raises on a failure (callers read
        returncode): a host without `ctr` has no containerd of ours to answer (exit 127, as a shell)."""
        argv = ["ctr", "--address", str(self.paths.containerd_socket), "--namespace", "k8s.io", *args]
        try:
            return subprocess.run(argv, input=stdin, capture_output=True, check=False, timeout=600)
        except FileNotFoundError:
            return subprocess.CompletedProcess(argv, 127, b"", b"ctr: command not found")

    def _kubeconfig(self, user: str, path: Path) -> Path:
        pki = self.plane.pki

        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        doc: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {"server": self.plane.server, "certificate-authority-data": b64(pki.ca_cert)},
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": b64(pki.client_cert(user)),
                        "client-key-data": b64(pki.client_key(user)),
                    },
                }
            ],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
            "current-context": "local",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        path.chmod(0o600)
        return path

    def _argv(self, name: str, cni_dir: str) -> list[str]:
        bin_dir = toolchain.bin_dir()
        if name == CONTAINERD:
            self.paths.containerd_config.parent.mkdir(parents=True, exist_ok=True)
            self.paths.containerd_config.write_text(containerd_config(self.paths, cni_dir))
            self.paths.cni_conf_dir.mkdir(parents=True, exist_ok=True)
            (self.paths.cni_conf_dir / "10-agentrun.conflist").write_text(cni_conflist(self.paths))
            return [_which("containerd"), "--config", str(self.paths.containerd_config)]
        if name == SCHEDULER:
            kubeconfig = self._kubeconfig("scheduler", self.paths.scheduler_kubeconfig)
            return [
                str(bin_dir / "kube-scheduler"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={self._port('scheduler')}",
                "--v=1",
            ]
        if name == PROVISIONER:
            return [
                sys.executable,
                "-m",
                "agentrun_operator.cli",
                "dev",
                "provisioner",
                f"--kubeconfig={self.plane.kubeconfig}",
                f"--state-dir={self.plane.home}",
                f"--node={NODE_NAME}",
            ]
        self.paths.kubelet_config.write_text(
            kubelet_config(
                self.paths, self.plane.pki.ca_cert, self._port("kubelet"), self._port("kubelet_healthz")
            )
        )
        return [
            str(bin_dir / "kubelet"),
            f"--config={self.paths.kubelet_config}",
            f"--kubeconfig={self._kubeconfig('kubelet', self.paths.kubelet_kubeconfig)}",
            f"--root-dir={self.paths.kubelet_dir}",
            f"--hostname-override={NODE_NAME}",
            "--v=1",
        ]

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, images: list[str], timeout: float = 180.0) -> None:
        """Bring up what is down (kept when it runs and answers), import the images, wait for the
        Node to be Ready and schedulable."""
        started = time.monotonic()
        self._claim_host()
        cni_dir = host.ensure_packages(self.say)
        host.record_host_state(self.paths)
        host.ensure_pod_network()
        for name in NODE_COMPONENTS:
            self._ensure(name, cni_dir, timeout)
            if name == CONTAINERD:
                import_images(self._ctr, self.paths.images_dir, images, self.say)
        self._wait("the node to be Ready and schedulable", self.node_ready, timeout, KUBELET)
        self.say(
            f"  node {NODE_NAME} ready in {time.monotonic() - started:.0f}s (sandbox image {PAUSE_IMAGE})"
        )

    def _other_owner_running(self) -> tuple[Path, list[str]] | None:
        """The state directory of another state whose real node still runs here, and what runs."""
        owner = node_owner()
        if owner is None or owner == self.plane.home:
            return None
        alive = [
            n
            for n in (CONTAINERD, KUBELET)
            if (r := processes.read_record(owner / "run", n)) is not None and r.alive()
        ]
        return (owner, alive) if alive else None

    def _claim_host(self) -> None:
        """Refuse to start beside the real node of another state directory that still runs."""
        other = self._other_owner_running()
        if other is not None:
            owner, alive = other
            raise host.NodeUnavailable(
                f"--runtime kubelet: the real node of another local default runs on this host "
                f"(state {owner}: {', '.join(alive)}); there is one per host. Stop it first "
                f"(`AGENTRUN_DEV_HOME={owner} agentrun dev down`), or use `--runtime process`"
            )
        OWNER_FILE.parent.mkdir(parents=True, exist_ok=True)
        OWNER_FILE.write_text(f"{self.plane.home}\n")

    def _ensure(self, name: str, cni_dir: str, timeout: float) -> None:
        record = processes.read_record(self.plane.run_dir, name)
        if record is not None and record.alive():
            if self.healthy(name):
                self.say(f"  {name} already running (pid {record.pid})")
                return
            processes.stop_process(self.plane.run_dir, name)
        self._start(name, cni_dir, timeout)

    def _start(self, name: str, cni_dir: str, timeout: float) -> None:
        log = self.plane.log_dir / f"{name}.log"
        offset = log.stat().st_size if log.exists() else 0
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
        if name == CONTAINERD:
            env.update(NO_REGISTRY_ENV)
        proc = processes.start_process(self.plane.run_dir, name, self._argv(name, cni_dir), log, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if self.healthy(name):
                self.say(f"  {name} ready (pid {proc.pid})")
                return
            time.sleep(0.2)
        text = log.read_bytes()[offset:].decode(errors="replace")
        processes.stop_process(self.plane.run_dir, name)
        raise host.NodeUnavailable(
            f"--runtime kubelet: {name} did not start (exit code {proc.poll()}); log {log}: "
            f"{_last_error(text)}. `agentrun dev restart {name}` tries again; `agentrun dev up "
            "--runtime process` uses the local pod runner instead"
        )

    def restart(self, name: str, timeout: float = 180.0) -> None:
        if name not in NODE_COMPONENTS:
            raise ControlPlaneError(f"no node component {name!r}; one of: {', '.join(NODE_COMPONENTS)}")
        processes.stop_process(self.plane.run_dir, name, grace=20)
        self._start(name, host.ensure_packages(self.say), timeout)

    def _wait(self, what: str, check: Callable[[], bool], timeout: float, component: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.2)
        raise host.NodeUnavailable(
            f"--runtime kubelet: timed out after {timeout:.0f}s waiting for {what}; see "
            f"{self.plane.log_dir / (component + '.log')}"
        )

    def ever_started(self) -> bool:
        """Whether a real node ever ran from this state (its directory, made before anything of the
        node starts, or a record of one of its components), or a node's owner file is on the host
        (the node of this or another state, whose leftovers a stop may have to remove)."""
        return (
            self.paths.root.exists()
            or node_owner() is not None
            or any(processes.read_record(self.plane.run_dir, name) is not None for name in NODE_COMPONENTS)
        )

    def stop(self) -> list[str]:
        """Stop every pod's containers, the components, and remove what the node made on the host.

        Nothing at all when no real node ever ran from this state: the pod runner's local default
        needs no containerd, `ctr` or `ip`, and its `dev down` touches none of them."""
        if not self.ever_started():
            return []
        stopped = []
        if processes.stop_process(self.plane.run_dir, KUBELET, grace=20):
            stopped.append(KUBELET)
        if self.healthy(CONTAINERD):
            killed = self._kill_all_tasks()
            if killed:
                stopped.append(f"{killed} containers")
        for name in (PROVISIONER, SCHEDULER, CONTAINERD):
            if processes.stop_process(self.plane.run_dir, name, grace=20):
                stopped.append(name)
        _kill_shims(self.paths.containerd_socket)
        unmounted = host.unmount_all([self.paths.root])
        removed: list[str] = []
        if self._other_owner_running() is None:
            # The bridge, the blackhole route and the host paths are the host's one node's: a state
            # that does not own it (a pod-runner default's `dev down` while a real node of another
            # state runs) leaves them alone.
            removed = host.remove_network() + host.remove_host_state(self.paths)
        with contextlib.suppress(OSError):
            if node_owner() == self.plane.home:
                OWNER_FILE.unlink()
        if unmounted or removed:
            self.say(f"  node: {unmounted} mounts unmounted; removed {', '.join(removed) or 'nothing else'}")
        return stopped

    def _kill_all_tasks(self) -> int:
        listed = self._ctr("tasks", "ls", "-q")
        tasks = listed.stdout.decode().split() if listed.returncode == 0 else []
        for task in tasks:
            self._ctr("tasks", "kill", "--all", "--signal", "SIGKILL", task)
        deadline = time.monotonic() + 10
        for task in tasks:
            while time.monotonic() < deadline and self._ctr("tasks", "delete", task).returncode != 0:
                time.sleep(0.2)
        for container in self._ctr("containers", "ls", "-q").stdout.decode().split():
            self._ctr("containers", "delete", container)
        return len(tasks)


def _kill_shims(socket: Path) -> None:
    """containerd's shims outlive it (by design, for upgrades): those of our socket go with the node."""
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            argv = (proc_dir / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and str(socket).encode() in argv:
            with contextlib.suppress(OSError):
                os.kill(int(proc_dir.name), 9)


def _which(name: str) -> str:
    import shutil

    found = shutil.which(name)
    if found is None:
        raise host.NodeUnavailable(f"--runtime kubelet: {name} is not installed; `apt-get install -y {name}`")
    return found


def _last_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if any(word in line.lower() for word in ("error", "failed", "fatal", "refused")):
            return line[-400:]
    return lines[-1][-400:] if lines else "no output"
