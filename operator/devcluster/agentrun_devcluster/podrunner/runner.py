"""The imperative shell of the pod runner: watch pods, bind them, run them, report them, kill them.

One thread watches pods (per watched namespace, or cluster-wide); every pod the runner takes gets a
`PodWorker` thread (worker.py) that walks it through the kubelet's life cycle and writes its status
with strategic-merge patches of `pods/status`; its volumes are made by volumes.py. A pod being
deleted has its processes stopped (SIGTERM, SIGKILL after the grace period) and is then confirmed
gone with a delete of grace 0, which is what makes a Job's `activeDeadlineSeconds` and a cancel work
through the real controllers.

Nothing is written outside the state directory:

    <state>/pv/<pv-name>/                     a PersistentVolume of the local provisioner (a claim's
                                              files, kept across pods until the claim is deleted)
    <state>/pods/<namespace>/<pod>/<uid>/     pod.json, pod-ip, tmp/, volumes/<name>/,
                                              containers/<name>/termination-log, logs/<name>/<n>.log
    <state>/run/pod-addresses/<address>       the pod directory holding that pod IP (addresses.py)
    <state>/run/pod-runner.health.json        the heartbeat `agentrun dev status` reads
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrun_devcluster import provisioner
from agentrun_devcluster.podrunner import spec as S
from agentrun_devcluster.podrunner.addresses import PodAddresses
from agentrun_devcluster.podrunner.api import SMP, Api, ApiError, pod_path, transient
from agentrun_devcluster.podrunner.config import Layout, RunnerConfig
from agentrun_devcluster.podrunner.logserver import LogServer
from agentrun_devcluster.podrunner.network import isolation_unavailable
from agentrun_devcluster.podrunner.process import ProcessRuntime
from agentrun_devcluster.podrunner.retry import backoff_delays, retry_until
from agentrun_devcluster.podrunner.runtime import ContainerRuntime
from agentrun_devcluster.podrunner.status import now_rfc3339
from agentrun_devcluster.podrunner.volumes import VolumeLookups
from agentrun_devcluster.podrunner.worker import PodWorker

log = logging.getLogger("agentrun.podrunner")


class PodRunner:
    """The runner: a Node, a watch, and a worker per pod."""

    def __init__(self, config: RunnerConfig) -> None:
        self.config = config
        self.layout = Layout(config.state_dir)
        self.runtime: ContainerRuntime = ProcessRuntime(config.container_path)
        self.api = Api(config.kubeconfig, config.state_dir / "run" / "pod-runner-client")
        self.volume_lookups = VolumeLookups(self.api, self.layout.volumes_root)
        self.lookups = S.Lookups(secret=self.volume_lookups.secret, config_map=self.volume_lookups.config_map)
        self.workers: dict[str, PodWorker] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.provisioner = provisioner.LocalProvisioner(
            self.api, config.state_dir, config.node_name, config.namespaces
        )
        self.watching: dict[str, bool] = {}
        self.last_error: str | None = None
        self.network_unavailable = isolation_unavailable()
        self.addresses = PodAddresses(self.layout.run_dir, self._holds_address)
        self.log_server = LogServer(
            self.current_pod_dir,
            self.container_running,
            self.api.ca_file,
            config.state_dir / "run" / "log-server",
        )

    # -- logs (logserver.py) --------------------------------------------------------------------
    def current_pod_dir(self, namespace: str, name: str) -> Path | None:
        """The directory of the pod `namespace/name` this runner runs now, else of its newest run."""
        with self.lock:
            for worker in self.workers.values():
                if worker.namespace == namespace and worker.name == name and not worker.gone:
                    return worker.dir
        base = self.layout.pods_dir(namespace, name)
        runs = list(base.glob("*/pod.json")) if base.is_dir() else []
        return max(runs, key=lambda p: p.stat().st_mtime).parent if runs else None

    def container_running(self, pod_dir: Path, container: str) -> bool:
        """Whether a container of the pod in `pod_dir` may still write to its log (runs, or is to
        start or restart)."""
        with self.lock:
            worker = next((w for w in self.workers.values() if w.dir == pod_dir), None)
        if worker is None or worker.gone or worker.shutdown:
            return False
        record = worker.records.get(container)
        if record is None:
            return False
        return (
            container in worker.procs or container in worker.restart_at or record.state.kind != "terminated"
        )

    def _holds_address(self, pod_dir: Path) -> bool:
        """Whether the pod of `pod_dir` still holds its address: this runner has a worker for it, or
        something of it runs (a pod of an earlier runner process not adopted yet)."""
        with self.lock:
            if any(worker.dir == pod_dir for worker in self.workers.values()):
                return True
        return self.runtime.any_alive(pod_dir)

    # -- node -----------------------------------------------------------------------------------
    def register_node(self) -> None:
        name = self.config.node_name
        now = now_rfc3339()
        mem_kib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 1024
        capacity = {"cpu": str(os.cpu_count() or 1), "memory": f"{mem_kib}Ki", "pods": "110"}
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "agents.proompteng.ai/local-pod-runner": "true",
                },
            },
        }
        try:
            self.api.request("POST", "/api/v1/nodes", node)
        except ApiError as exc:
            if exc.status != 409:
                raise
        status = {
            "capacity": capacity,
            "allocatable": capacity,
            # Only the InternalIP: the API server dials a node's Hostname address first, and
            # `agentrun-local` resolves nowhere (`kubectl logs` failed with "no such host").
            "addresses": [{"type": "InternalIP", "address": S.HOST_IP}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.log_server.port}},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "local pod runner is posting ready status",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "nodeInfo": {
                "kubeletVersion": "agentrun-local-pod-runner",
                "operatingSystem": "linux",
                "architecture": os.uname().machine,
                "containerRuntimeVersion": "bubblewrap",
                "kernelVersion": os.uname().release,
                "osImage": "host",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kubeProxyVersion": "",
            },
        }
        self.api.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": status}, SMP)

    # -- pods -----------------------------------------------------------------------------------
    def confirm_deletion(self, namespace: str, name: str, uid: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": uid},
        }
        with contextlib.suppress(ApiError):
            self.api.request("DELETE", pod_path(namespace, name), body)
        log.info("deleted %s/%s", namespace, name)

    def forget(self, uid: str) -> None:
        with self.lock:
            self.workers.pop(uid, None)

    def on_event(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        node = (pod.get("spec") or {}).get("nodeName")
        if node and node != self.config.node_name:
            return
        with self.lock:
            worker = self.workers.get(uid)
        if kind == "DELETED":
            if worker is not None:
                worker.mark_gone()
            return
        if worker is not None:
            worker.update(pod)
            if kind == "SYNC":
                worker.resync(pod)
            return
        if self.stopping.is_set():
            return
        pod_dir = self.layout.pod_dir(str(meta.get("namespace")), str(meta.get("name")), uid)
        if meta.get("deletionTimestamp") and not (node and self.runtime.any_alive(pod_dir)):
            if node:  # nothing of it runs here (any more): confirm at once
                self.confirm_deletion(str(meta["namespace"]), str(meta["name"]), uid)
            return
        phase = (pod.get("status") or {}).get("phase")
        if node and phase in ("Succeeded", "Failed"):
            return
        worker = PodWorker(self, pod)
        with self.lock:
            if uid in self.workers:
                return
            self.workers[uid] = worker
        worker.thread.start()

    def _watch(self, namespace: str | None) -> None:
        """List, then watch from the list's version; list again after any watch error (with
        backoff and jitter while the API server does not answer) and every `resync_seconds`."""
        path = pod_path(namespace) if namespace else "/api/v1/pods"
        key = namespace or "*"
        delays = backoff_delays(self.config.api_backoff)
        first = True
        while not self.stopping.is_set():
            try:
                listing = self.api.request("GET", path)
                delays = backoff_delays(self.config.api_backoff)
                seen = set()
                for pod in listing.get("items") or []:
                    seen.add(pod["metadata"]["uid"])
                    self.on_event("ADDED" if first else "SYNC", pod)
                first = False
                with self.lock:
                    vanished = [
                        w
                        for uid, w in self.workers.items()
                        if uid not in seen and (namespace is None or w.namespace == namespace)
                    ]
                for worker in vanished:
                    worker.mark_gone()
                version = str(listing["metadata"]["resourceVersion"])
                self.watching[key] = True
                resync_at = time.monotonic() + self.config.resync_seconds
                while not self.stopping.is_set() and time.monotonic() < resync_at:
                    left = max(1, int(resync_at - time.monotonic()))
                    for event in self.api.watch(path, version, timeout_seconds=left):
                        kind = event.get("type", "")
                        obj = event.get("object") or {}
                        if kind == "ERROR":
                            raise ApiError(int(obj.get("code") or 0), str(obj.get("message")))
                        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                        if kind != "BOOKMARK":
                            self.on_event(kind, obj)
                        if self.stopping.is_set():
                            return
            except Exception as exc:
                self.watching[key] = False
                self.last_error = f"watch {path}: {exc}"
                if not self.stopping.is_set():
                    delay = next(delays)
                    log.warning("watch of %s ended (%s); listing again in %.1fs", path, exc, delay)
                    self.stopping.wait(delay)

    def _heartbeat(self) -> None:
        self.layout.run_dir.mkdir(parents=True, exist_ok=True)
        with self.lock:
            pods = len(self.workers)
        doc = {
            "pid": os.getpid(),
            "node": self.config.node_name,
            "time": time.time(),
            "watching": all(self.watching.values()) and bool(self.watching),
            "pods": pods,
            "runtime": self.runtime.name,
            "last_error": self.last_error,
        }
        tmp = self.layout.health_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.layout.health_file)

    def run(self, ready: Callable[[], None] | None = None) -> None:
        """Register the node, watch and run pods until `stop()` (or SIGTERM via the CLI)."""
        self.log_server.start()
        retry_until(  # an API server still starting (or restarting) is waited for, as a kubelet does
            self.register_node,
            transient,
            time.sleep,
            self.config.api_backoff,
            lambda exc, delay: log.warning("registering the node failed (%s); retrying in %.1fs", exc, delay),
        )
        threading.Thread(
            target=self.provisioner.run, args=(self.stopping,), daemon=True, name="provisioner"
        ).start()
        targets: list[str | None] = list(self.config.namespaces) or [None]
        for ns in targets:
            self.watching[ns or "*"] = False
            threading.Thread(target=self._watch, args=(ns,), daemon=True, name=f"watch-{ns or 'all'}").start()
        if self.network_unavailable:
            log.info("%s", self.network_unavailable)
        log.info(
            "pod runner (%s runtime) on node %s watching %s (state %s)",
            self.runtime.name,
            self.config.node_name,
            ", ".join(self.config.namespaces) or "all namespaces",
            self.config.state_dir,
        )
        announced = False
        while not self.stopping.is_set():
            self._heartbeat()
            if not announced and all(self.watching.values()):
                announced = True
                if ready is not None:
                    ready()
            self.stopping.wait(0.2 if not announced else 2.0)
        self._shutdown()

    def stop(self) -> None:
        self.stopping.set()
        self.log_server.stop()
        self.provisioner.stop()

    def _shutdown(self) -> None:
        with self.lock:
            workers = list(self.workers.values())
        for worker in workers:  # containers keep running; a new runner adopts them (adopt.py)
            worker.stop()
        for worker in workers:
            worker.thread.join(timeout=10)
        self.runtime.close()
        self.layout.health_file.unlink(missing_ok=True)
        log.info("pod runner stopped")
