"""A pod's own network namespace, for pods that serve ports (docs/local-dev.md#network).

Pods share the host's network by default, so an agent CLI reaches what the host reaches. A pod
that declares `containerPorts` is a server, and two replicas of a server (the chart's operator with
peering: kopf's `/healthz` and `/metrics` on fixed ports) would collide on the host. Such a pod gets
what a CNI gives it on a cluster, minus the outside world: its own network namespace with a
loopback interface, where the API server is forwarded at the address and port its
`KUBERNETES_SERVICE_HOST/PORT` name, so in-cluster clients work unchanged.

One helper process per pod holds the namespace (the pause container's job). It forks: the child
enters a new network namespace and listens there; the parent stays in the host's namespace and, for
each connection the child accepts, dials the API server and passes the connected socket back over a
socket pair (SCM_RIGHTS). Sockets keep the namespace they were made in, so the child then simply
copies bytes between the two. Entering a network namespace needs root (CAP_SYS_ADMIN): elsewhere
every pod stays on the host's network, as before.

The helper runs in a session of its own and is recorded in `<pod>/network.json`, so it outlives a
restart of the runner as the pod's containers do, and a new runner keeps it (`adopt_or_start`).

    python -m agentrun_devcluster.podrunner.network HOST PORT
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentrun_devcluster.podrunner.procfs import process_start

CLONE_NEWNET = 0x40000000
READY = "pod network ready"
RECORD = "network.json"
_DIAL, _DIALED, _REFUSED = b"d", b"k", b"e"


def wants_own_network(pod_spec: Mapping[str, Any]) -> bool:
    """A pod that declares container ports (and not `hostNetwork`) gets its own namespace."""
    if pod_spec.get("hostNetwork"):
        return False
    containers = [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]
    return any(c.get("ports") for c in containers)


def isolation_unavailable() -> str | None:
    """Why pods cannot get their own network namespace here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root: pods with ports share the host's network"
    for tool in ("nsenter", "ip"):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing: pods with ports share the host's network"
    return None


@dataclass(frozen=True)
class NetworkRecord:
    """The helper (its session leader) and the child inside the namespace, as `network.json` has them."""

    pid: int
    pid_start: str
    namespace_pid: int

    def alive(self) -> bool:
        return process_start(self.pid) == self.pid_start and process_start(self.namespace_pid) is not None


def read_record(pod_dir: Path) -> NetworkRecord | None:
    try:
        return NetworkRecord(**json.loads((pod_dir / RECORD).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def stop_recorded(pod_dir: Path) -> None:
    """Kill the helper `pod_dir` records, if it still runs (`agentrun dev down`'s leftovers)."""
    record = read_record(pod_dir)
    if record is not None and record.alive():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, signal.SIGKILL)


def adopt_or_start(pod_dir: Path, api_host: str, api_port: int) -> PodNetwork:
    """The pod's helper: the one an earlier runner process recorded when it still runs (the pod's
    containers run in its namespace), else a new one, recorded."""
    record = read_record(pod_dir)
    if record is not None and record.alive():
        kept = PodNetwork(api_host, api_port, pod_dir / "network.log")
        kept.namespace_pid, kept.kept = record.namespace_pid, record
        return kept
    network = PodNetwork(api_host, api_port, pod_dir / "network.log").start()
    if network.proc is not None and network.namespace_pid is not None:
        start = process_start(network.proc.pid)
        if start is not None:
            record = NetworkRecord(network.proc.pid, start, network.namespace_pid)
            (pod_dir / RECORD).write_text(json.dumps(asdict(record)))
    return network


class PodNetwork:
    """The helper process holding one pod's network namespace (started here, or `kept` from an
    earlier runner process)."""

    def __init__(self, api_host: str, api_port: int, log_path: Path) -> None:
        self.api_host = api_host
        self.api_port = api_port
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.kept: NetworkRecord | None = None
        self.namespace_pid: int | None = None

    def start(self, timeout: float = 15.0) -> PodNetwork:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    __name__,
                    self.api_host,
                    str(self.api_port),
                ],
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        while time.monotonic() < deadline and self.proc.poll() is None:
            line = self.proc.stdout.readline()
            if line.startswith(READY.encode()):
                self.namespace_pid = int(line.split()[-1])
                return self
        self.stop()
        raise OSError(f"the pod's network namespace did not come up: {self.log_path.read_text()[-500:]}")

    def enter_argv(self) -> list[str]:
        """The prefix that runs a command inside this namespace."""
        return ["nsenter", f"--net=/proc/{self.namespace_pid}/ns/net", "--"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        if self.kept is not None and self.kept.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.kept.pid, signal.SIGKILL)


# -- the helper process ------------------------------------------------------------------------
def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                sock.shutdown(how)


def _serve_inside(channel: socket.socket, host: str, port: int) -> None:
    """The child: a new network namespace, loopback up, the API server's address served in it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    listener = socket.create_server((host, port), backlog=64)
    print(f"{READY} {os.getpid()}", flush=True)
    while True:
        conn, _ = listener.accept()
        channel.sendall(_DIAL)
        answer, fds, _flags, _addr = socket.recv_fds(channel, 1, 1)
        if not answer:
            return  # the parent is gone
        if answer != _DIALED or not fds:
            conn.close()
            continue
        upstream = socket.socket(fileno=fds[0])
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _dial_for(channel: socket.socket, host: str, port: int) -> None:
    """The parent, in the host's namespace: one connection to the API server per request."""
    while channel.recv(1):
        try:
            upstream = socket.create_connection((host, port), timeout=10)
        except OSError:
            channel.sendall(_REFUSED)
            continue
        upstream.settimeout(None)
        socket.send_fds(channel, [_DIALED], [upstream.fileno()])
        upstream.close()


def main(argv: list[str]) -> int:
    host, port = argv[0], int(argv[1])
    parent_end, child_end = socket.socketpair()
    if os.fork() == 0:
        parent_end.close()
        try:
            _serve_inside(child_end, host, port)
        finally:
            os._exit(1)
    child_end.close()
    _dial_for(parent_end, host, port)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
