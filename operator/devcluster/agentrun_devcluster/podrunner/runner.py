"""The imperative shell of the pod runner: watch pods, bind them, run them, report them, kill them.

One thread watches pods (per watched namespace, or cluster-wide); every pod the runner takes gets a
`PodWorker` thread that walks it through the kubelet's life cycle and writes its status with
strategic-merge patches of `pods/status`. A pod being deleted has its processes stopped (SIGTERM,
SIGKILL after the grace period) and is then confirmed gone with a delete of grace 0, which is what
makes a Job's `activeDeadlineSeconds` and a cancel work through the real controllers.

Nothing is written outside the state directory:

    <state>/pv/<pv-name>/                     a PersistentVolume of the local provisioner (a claim's
                                              files, kept across pods until the claim is deleted)
    <state>/pods/<namespace>/<pod>/<uid>/     pod.json, tmp/, volumes/<name>/,
                                              containers/<name>/termination-log, logs/<name>/<n>.log
    <state>/run/pod-runner.health.json        the heartbeat `agentrun dev status` reads
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import shutil
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agentrun_devcluster import provisioner
from agentrun_devcluster.podrunner import adopt
from agentrun_devcluster.podrunner import spec as S
from agentrun_devcluster.podrunner.api import Api, ApiError, pod_path
from agentrun_devcluster.podrunner.docker import DockerContainer, DockerPodNetwork
from agentrun_devcluster.podrunner.network import (
    PodNetwork,
    isolation_unavailable,
    wants_own_network,
)
from agentrun_devcluster.podrunner.process import ContainerProcess, default_container_path
from agentrun_devcluster.podrunner.retry import Backoff, backoff_delays, retry_until
from agentrun_devcluster.podrunner.runtime import (
    Launch,
    PodSandbox,
    RunningContainer,
    make_runtime,
)
from agentrun_devcluster.podrunner.sandbox import Bind
from agentrun_devcluster.podrunner.status import (
    ContainerRecord,
    PodVerdict,
    PodView,
    State,
    build_status,
    initial_records,
    now_rfc3339,
    pod_phase,
)

log = logging.getLogger("agentrun.podrunner")

DEFAULT_NODE = "agentrun-local"
HEALTH_FILE = "pod-runner.health.json"
_SMP = "application/strategic-merge-patch+json"
_LOST_MESSAGE = "The container could not be located when the pod was terminated"


@dataclass(frozen=True)
class RunnerConfig:
    kubeconfig: Path
    state_dir: Path
    node_name: str = DEFAULT_NODE
    namespaces: tuple[str, ...] = ()
    container_path: str = field(default_factory=default_container_path)
    restart_backoff: float = 10.0
    retry_seconds: float = 2.0
    runtime: str = "process"
    """process | docker | auto (see runtime.py)."""
    resync_seconds: float = 30.0
    """How often the runner lists its pods again (a missed event is noticed by then)."""
    api_backoff: Backoff = field(default_factory=Backoff)
    """Retries of binds, status writes and watches while the API server does not answer."""


@dataclass(frozen=True)
class Layout:
    """Where the runner keeps things under its state directory."""

    root: Path

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def health_file(self) -> Path:
        return self.run_dir / HEALTH_FILE

    @property
    def volumes_root(self) -> Path:
        """The local provisioner's volumes live under here (and only these are mounted for claims)."""
        return self.root / "pv"

    def pods_dir(self, namespace: str, name: str) -> Path:
        return self.root / "pods" / namespace / name

    def pod_dir(self, namespace: str, name: str, uid: str) -> Path:
        return self.pods_dir(namespace, name) / uid


def _state_from_dict(raw: Mapping[str, Any] | None) -> State | None:
    if not raw:
        return None
    if "running" in raw:
        return State("running", started_at=(raw["running"] or {}).get("startedAt"))
    if "terminated" in raw:
        t = raw["terminated"] or {}
        return State(
            "terminated",
            reason=t.get("reason"),
            message=t.get("message"),
            exit_code=t.get("exitCode"),
            started_at=t.get("startedAt"),
            finished_at=t.get("finishedAt"),
        )
    w = raw.get("waiting") or {}
    return State("waiting", reason=w.get("reason"), message=w.get("message"))


def ran_before(pod: Mapping[str, Any]) -> bool:
    """True when the pod's status shows containers that ran (under an earlier runner process)."""
    status = pod.get("status") or {}
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        state = cs.get("state") or {}
        if "running" in state or "terminated" in state:
            return True
    return False


def _read_part(path: Path, offset: int, size: int | None = None) -> bytes:
    """`size` bytes from `offset` (negative: from the end) of a file, b"" when it cannot be read."""
    try:
        with path.open("rb") as handle:
            if offset < 0:
                handle.seek(max(0, path.stat().st_size + offset))
            else:
                handle.seek(offset)
            return handle.read() if size is None else handle.read(size)
    except OSError:
        return b""


class _Stop(Exception):
    """The worker must stop now (the pod is gone or the runner shuts down)."""


def transient(exc: Exception) -> bool:
    """An API failure worth retrying: no answer, a timeout, throttling, a server error, or the
    authorizer not ready yet (401/403 right after an API server restart)."""
    return isinstance(exc, ApiError) and (exc.status in (0, 401, 403, 408, 429) or exc.status >= 500)


def _status_digest(status: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a resync compares: the phase and each container's state and restart count."""
    containers = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    return (
        status.get("phase"),
        sorted(
            (str(c.get("name")), json.dumps(c.get("state"), sort_keys=True), int(c.get("restartCount") or 0))
            for c in containers
        ),
    )


def _started_monotonic(start_time: str | None) -> float:
    """The monotonic clock's reading when the pod started (for its activeDeadlineSeconds)."""
    import datetime

    if not start_time:
        return time.monotonic()
    try:
        started = datetime.datetime.fromisoformat(start_time.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.monotonic()
    return time.monotonic() - max(0.0, time.time() - started)


class PodWorker:
    """Walks one pod through the kubelet's life cycle in its own thread."""

    def __init__(self, runner: PodRunner, pod: dict[str, Any]) -> None:
        self.runner = runner
        self.api = runner.api
        self.pod = pod
        meta = pod["metadata"]
        self.namespace = str(meta["namespace"])
        self.name = str(meta["name"])
        self.uid = str(meta["uid"])
        self.spec: dict[str, Any] = pod.get("spec") or {}
        self.restart_policy = str(self.spec.get("restartPolicy") or "Always")
        self.dir = runner.layout.pod_dir(self.namespace, self.name, self.uid)
        self.cond = threading.Condition()
        self.deleting = bool(meta.get("deletionTimestamp"))
        self.gone = False
        self.shutdown = False
        self.records: dict[str, ContainerRecord] = initial_records(self.spec)
        self.kinds = {s.name: s.kind for s in S.start_order(self.spec)}
        self.specs = {s.name: s.spec for s in S.start_order(self.spec)}
        self.procs: dict[str, RunningContainer] = {}
        self.restart_at: dict[str, float] = {}
        self.verdict: PodVerdict | None = None
        self.start_time: str | None = None
        self.started_mono = time.monotonic()
        self.volumes: dict[str, S.Volume] = {}
        self.volume_dirs: dict[str, Path] = {}
        self._published: dict[str, Any] | None = None
        self.network: PodSandbox | None = None
        self.adopted_network: adopt.NetworkRecord | None = None
        self._conditions: list[dict[str, Any]] = list((pod.get("status") or {}).get("conditions") or [])
        self.thread = threading.Thread(
            target=self._main, daemon=True, name=f"pod-{self.namespace}/{self.name}"
        )

    # -- events from the watch ------------------------------------------------------------------
    def update(self, pod: dict[str, Any]) -> None:
        with self.cond:
            self.pod = pod
            if pod["metadata"].get("deletionTimestamp"):
                self.deleting = True
            self.cond.notify_all()

    def mark_gone(self) -> None:
        with self.cond:
            self.gone = True
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.shutdown = True
            self.cond.notify_all()

    def resync(self, pod: Mapping[str, Any]) -> None:
        """The periodic resync: when the API server's status of the pod is not what we last wrote
        (a write it lost, e.g. an etcd restored from an older state), write ours again."""
        with self.cond:
            if self._published is not None and _status_digest(pod.get("status") or {}) != _status_digest(
                self._published
            ):
                self._published = None
                self.cond.notify_all()

    def _notify(self, _proc: object = None) -> None:
        with self.cond:
            self.cond.notify_all()

    # -- helpers --------------------------------------------------------------------------------
    def _check(self) -> None:
        if self.shutdown or self.gone:
            raise _Stop

    def _wait(self, seconds: float) -> None:
        """Sleep up to `seconds`, waking on any event; raise _Stop when the pod is gone."""
        with self.cond:
            self._check()
            self.cond.wait(timeout=max(0.0, seconds))
        self._check()

    def _deadline_left(self) -> float | None:
        deadline = self.spec.get("activeDeadlineSeconds")
        if deadline is None:
            return None
        return float(deadline) - (time.monotonic() - self.started_mono)

    def _interrupted(self) -> bool:
        """Deletion or the pod's own activeDeadlineSeconds: stop running containers."""
        left = self._deadline_left()
        if left is not None and left <= 0 and self.verdict is None:
            self.verdict = PodVerdict(
                "Failed",
                "DeadlineExceeded",
                f"Pod was active on the node longer than the specified deadline "
                f"({self.spec.get('activeDeadlineSeconds')}s)",
            )
        return self.deleting or self.verdict is not None

    def _set(self, name: str, state: State, **changes: Any) -> None:
        self.records[name] = replace(self.records[name], state=state, **changes)

    def publish(self) -> None:
        """Write the pod status when it changed, retried with backoff until it lands or the pod is gone."""
        retry_until(
            self._write_status,
            transient,
            self._wait,
            self.runner.config.api_backoff,
            self._retrying("status write"),
        )

    def _retrying(self, what: str) -> Callable[[Exception, float], None]:
        def note(exc: Exception, delay: float) -> None:
            log.warning(
                "%s of %s/%s failed (%s); retrying in %.1fs", what, self.namespace, self.name, exc, delay
            )

        return note

    def _write_status(self) -> None:
        """One status write (strategic merge: our conditions merge by type); transient errors raise."""
        view = PodView(self.restart_policy, self.start_time, self.verdict, self._conditions)
        status = build_status(list(self.records.values()), view)
        comparable = {
            **status,
            "conditions": [{**c, "lastTransitionTime": None} for c in status["conditions"]],
        }
        if comparable == self._published:
            return
        try:
            self.api.request(
                "PATCH", pod_path(self.namespace, self.name) + "/status", {"status": status}, _SMP
            )
        except ApiError as exc:
            if exc.status == 404:
                self.mark_gone()
                return
            if transient(exc):
                raise
            log.warning("status of %s/%s refused: %s", self.namespace, self.name, exc)
            return
        self._published = comparable
        self._conditions = status["conditions"]

    # -- the life cycle -------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._life()
        except _Stop:
            pass
        except Exception as exc:  # the runner never dies of one pod
            log.exception("pod %s/%s: runner error", self.namespace, self.name)
            with contextlib.suppress(Exception):
                self._kill_all()
                self.verdict = PodVerdict("Failed", "RunnerError", f"local pod runner error: {exc}")
                self.publish()
                self._await_deletion()
        finally:
            if not self.shutdown:  # a runner that stops leaves its containers running (adopt.py)
                for proc in list(self.procs.values()):
                    proc.kill()
                if self.network is not None:
                    self.network.stop()
                if self.adopted_network is not None:
                    adopt.stop_network(self.adopted_network)
                self._cleanup()
            self.runner.forget(self.uid)

    def _life(self) -> None:
        if not self.spec.get("nodeName") and not self._bind():
            return
        phase = (self.pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            self._await_deletion()
            return
        launched = adopt.read_launches(self.dir)
        launched.update(  # started, then the runner died before it wrote the record
            self.runner.runtime.unrecorded_launches(self.pod, self.dir, self.records, launched, now_rfc3339())
        )
        if launched:  # an earlier runner process started this pod: its containers may still run
            if not self._adopt(launched):
                self._await_deletion()
                return
        elif ran_before(self.pod):
            self._report_lost()
            self._await_deletion()
            return
        else:
            self.start_time = now_rfc3339()
            self._write_pod_json()
            self.publish()
            if not self._start_network() or not self._prepare_volumes():
                self._await_deletion()
                return
        self._run_containers(started=frozenset(launched))
        self._finish()
        self._await_deletion()

    def _adopt(self, launched: dict[str, adopt.LaunchRecord]) -> bool:
        """Take over a pod an earlier runner process started: containers still running are
        adopted, ended ones reported with the exit code and message they left (see adopt.py)."""
        status = self.pod.get("status") or {}
        self.start_time = status.get("startTime") or now_rfc3339()
        self.started_mono = _started_monotonic(self.start_time)
        previous = {
            cs.get("name"): cs
            for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
        }
        for name, record in launched.items():
            if name not in self.records:
                continue
            cs = previous.get(name) or {}
            last = (
                _state_from_dict(cs.get("lastState"))
                if int(cs.get("restartCount") or 0) == record.restart
                else None
            )
            self.records[name] = replace(
                self.records[name],
                state=State("running", started_at=record.started_at),
                restart_count=record.restart,
                container_id=record.container_id,
                last_state=last,
            )
            self.procs[name] = adopt.adopt_container(record, self._notify)
        log.info(
            "pod %s/%s: adopted %s from an earlier runner process",
            self.namespace,
            self.name,
            ", ".join(f"{n} ({'running' if not p.done else 'ended'})" for n, p in self.procs.items()),
        )
        self._reap()  # the ended ones are terminated before the first write (never back to running)
        self.publish()
        network = adopt.read_network(self.dir)
        if network is not None and network.alive() and self.runner.runtime.name == "process":
            self.adopted_network = network
            endpoint = urllib.parse.urlsplit(self.api.server)
            adopted = PodNetwork(
                endpoint.hostname or "127.0.0.1", endpoint.port or 443, self.dir / "network.log"
            )
            adopted.namespace_pid = network.namespace_pid
            self.network = adopted
        else:
            if network is not None:  # the docker runtime's forwarder: a new one into the kept pause container
                adopt.stop_network(network)
            if not self._start_network():
                return False
        return self._prepare_volumes(adopting=True)

    def _bind(self) -> bool:
        """Bind the pod to this node, retried with backoff until it lands or the pod is gone; False
        when another node has it (or it was deleted meanwhile)."""
        bound = retry_until(
            self._bind_once, transient, self._wait, self.runner.config.api_backoff, self._retrying("bind")
        )
        if bound:
            log.info("bound %s/%s to %s", self.namespace, self.name, self.runner.config.node_name)
        return bound

    def _bind_once(self) -> bool:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.runner.config.node_name},
        }
        try:
            self.api.request("POST", pod_path(self.namespace, self.name) + "/binding", body)
            return True
        except ApiError as exc:
            if transient(exc):
                raise
            refusal = exc
        # Refused (e.g. 409: already bound, perhaps by our own earlier attempt whose answer was lost).
        current = self.api.get(pod_path(self.namespace, self.name))
        if current is None or (current.get("spec") or {}).get("nodeName") != self.runner.config.node_name:
            log.info("pod %s/%s not bound here: %s", self.namespace, self.name, refusal)
            return False
        return True

    def _write_pod_json(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        mains = [s.name for s in S.start_order(self.spec) if s.kind == "main"]
        doc = {
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "containers": [s.name for s in S.start_order(self.spec)],
            "default": mains[0] if mains else None,
            "created": now_rfc3339(),
        }
        (self.dir / "pod.json").write_text(json.dumps(doc, indent=1))

    def _report_lost(self) -> None:
        status = self.pod.get("status") or {}
        raw = {
            cs.get("name"): cs
            for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
        }
        now = now_rfc3339()
        for name, rec in list(self.records.items()):
            cs = raw.get(name) or {}
            state = _state_from_dict(cs.get("state"))
            if state is None or state.kind != "terminated":
                state = State(
                    "terminated",
                    reason="ContainerStatusUnknown",
                    message=_LOST_MESSAGE,
                    exit_code=137,
                    started_at=state.started_at if state else None,
                    finished_at=now,
                )
            self.records[name] = replace(rec, state=state, restart_count=int(cs.get("restartCount") or 0))
        self.start_time = status.get("startTime")
        self.verdict = PodVerdict(
            "Failed",
            "ContainerStatusUnknown",
            "the local pod runner was restarted while this pod ran; its processes are gone",
        )
        self.publish()

    def _fail_pod(self, reason: str, message: str) -> None:
        """A pod the runner cannot run: Failed, every container terminated with 128 and the message."""
        now = now_rfc3339()
        for name in self.records:
            self._set(
                name,
                State("terminated", reason="StartError", message=message, exit_code=128, finished_at=now),
            )
        self.verdict = PodVerdict("Failed", reason, message)
        self.publish()

    def _start_network(self) -> bool:
        """A pod serving ports gets its own network namespace (see `network.py`) where possible."""
        if not wants_own_network(self.spec) or self.runner.network_unavailable is not None:
            return True
        endpoint = urllib.parse.urlsplit(self.api.server)
        try:
            self.network = self.runner.runtime.start_network(
                self.pod, endpoint.hostname or "127.0.0.1", endpoint.port or 443, self.dir / "network.log"
            )
        except OSError as exc:
            self._fail_pod("FailedCreatePodSandBox", f"could not set up the pod's network: {exc}")
            return False
        net = self.network.forwarder if isinstance(self.network, DockerPodNetwork) else self.network
        if isinstance(net, PodNetwork) and net.proc is not None and net.namespace_pid is not None:
            adopt.write_network(self.dir, net.proc.pid, net.namespace_pid)
        return True

    # -- volumes --------------------------------------------------------------------------------
    def _prepare_volumes(self, adopting: bool = False) -> bool:
        """The pod's volume directories; `adopting`: they exist and running containers use them,
        so a secret or configMap volume is kept as it is instead of being written again."""
        try:
            self.volumes = S.plan_volumes(self.spec)
        except S.PodProblem as problem:
            log.info("pod %s/%s refused: %s", self.namespace, self.name, problem.message)
            self._fail_pod(problem.reason, problem.message)
            return False
        while True:
            try:
                for volume in self.volumes.values():
                    kept = self.dir / "volumes" / volume.name
                    keep = adopting and volume.kind != "persistentVolumeClaim" and kept.is_dir()
                    self.volume_dirs[volume.name] = kept if keep else self._volume_dir(volume)
                return True
            except S.ContainerConfigError as exc:
                message = str(exc)
            except ApiError as exc:  # a claim or secret lookup while the API server is away
                if not transient(exc):
                    raise
                message = f"waiting for the API server: {exc}"
            for name, rec in self.records.items():
                if rec.state.kind == "waiting":
                    self._set(name, State("waiting", reason="ContainerCreating", message=message))
            self.publish()
            if self._interrupted():
                return self._stop_unstarted()
            self._wait(self.runner.config.retry_seconds)

    def _volume_dir(self, volume: S.Volume) -> Path:
        if volume.kind == "persistentVolumeClaim":
            return self.runner.claim_volume_dir(self.namespace, volume.claim)
        path = self.dir / "volumes" / volume.name
        if volume.kind == "emptyDir":
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o777)  # as the kubelet makes it: any container user may write
            return path
        files = self._volume_files(volume)
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        mode = int(volume.source.get("defaultMode", 0o644))
        for rel, (data, item_mode) in files.items():
            target = path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(item_mode if item_mode is not None else mode)
        return path

    def _volume_files(self, volume: S.Volume) -> dict[str, tuple[bytes, int | None]]:
        """Files of a secret, configMap, downwardAPI or projected volume; missing objects retry."""
        sources: list[tuple[str, Mapping[str, Any]]]
        if volume.kind == "projected":
            sources = [(k, v) for src in volume.source.get("sources") or [] for k, v in src.items()]
        else:
            sources = [(volume.kind, volume.source)]
        files: dict[str, tuple[bytes, int | None]] = {}
        for kind, src in sources:
            files.update(self._source_files(volume.name, kind, src))
        for rel in files:
            if S.normalise_mount_path("/" + rel) is None or rel.startswith("/"):
                raise S.ContainerConfigError(f'volume "{volume.name}": bad item path {rel!r}')
        return files

    def _source_files(
        self, volume: str, kind: str, src: Mapping[str, Any]
    ) -> dict[str, tuple[bytes, int | None]]:
        if kind == "serviceAccountToken":
            token = self.runner.service_account_token(self.pod, src)
            return {str(src.get("path", "token")): (token.encode(), None)}
        if kind == "downwardAPI":
            return {
                str(item["path"]): (
                    S.field_value(self.pod, str(item["fieldRef"]["fieldPath"])).encode(),
                    item.get("mode"),
                )
                for item in src.get("items") or []
                if item.get("fieldRef")
            }
        if kind not in ("secret", "configMap"):
            raise S.ContainerConfigError(f'volume "{volume}": unsupported projection {kind}')
        name = str(src.get("secretName") or src.get("name") or "")
        data: Mapping[str, bytes] | None
        if kind == "secret":
            data = self.runner.secret(self.namespace, name)
        else:
            raw = self.runner.config_map(self.namespace, name)
            data = None if raw is None else {k: v.encode() for k, v in raw.items()}
        if data is None:
            if src.get("optional"):
                return {}
            raise S.ContainerConfigError(
                f'MountVolume.SetUp failed for volume "{volume}" : {kind.lower()} "{name}" not found'
            )
        items = src.get("items")
        if not items:
            return {k: (v, None) for k, v in data.items()}
        out: dict[str, tuple[bytes, int | None]] = {}
        for item in items:
            key = str(item.get("key"))
            if key not in data:
                if src.get("optional"):
                    continue
                raise S.ContainerConfigError(f'volume "{volume}": key {key!r} not found in {kind} "{name}"')
            out[str(item.get("path") or key)] = (data[key], item.get("mode"))
        return out

    # -- containers -----------------------------------------------------------------------------
    def _binds(self, container: Mapping[str, Any]) -> list[Bind]:
        binds = []
        for mount in container.get("volumeMounts") or []:
            source = self.volume_dirs[str(mount["name"])]
            sub = str(mount.get("subPath") or "")
            if sub:
                if S.normalise_mount_path("/" + sub) is None or sub.startswith("/"):
                    raise S.StartError(f"subPath {sub!r} must be a relative path without '..'")
                source = source / sub
                source.mkdir(parents=True, exist_ok=True)
            claim_ro = bool(self.volumes[str(mount["name"])].source.get("readOnly"))
            volume_kind = self.volumes[str(mount["name"])].kind
            read_only = (
                bool(mount.get("readOnly"))
                or claim_ro
                or volume_kind in ("secret", "configMap", "projected", "downwardAPI")
            )
            binds.append(Bind(str(source), str(mount["mountPath"]), read_only))
        return binds

    def _launch(self, name: str) -> None:
        """Start one container (records a waiting or terminated state instead when it cannot)."""
        container = self.specs[name]
        rec = self.records[name]
        restart = rec.restart_count
        try:
            base = self.runner.runtime.base_env(self.pod, self.api.server)
            env = S.resolve_env(self.pod, container, self.runner.lookups, base)
            now = now_rfc3339()
            proc = self._spawn(name, container, env, restart)
        except S.ContainerConfigError as exc:  # also ErrImageNeverPull: wait, retry
            self._set(name, State("waiting", reason=exc.reason, message=str(exc)))
            self.restart_at[name] = time.monotonic() + self.runner.config.retry_seconds
            return
        except ApiError as exc:  # an env lookup while the API server is away: wait and retry
            if not transient(exc):
                raise
            self._set(
                name,
                State("waiting", reason="ContainerCreating", message=f"waiting for the API server: {exc}"),
            )
            self.restart_at[name] = time.monotonic() + self.runner.config.retry_seconds
            return
        except S.StartError as exc:
            log.info("pod %s/%s container %s: %s", self.namespace, self.name, name, exc)
            self._set(
                name,
                State(
                    "terminated",
                    reason=exc.reason,
                    message=str(exc),
                    exit_code=exc.exit_code,
                    started_at=None,
                    finished_at=now,
                ),
            )
            self._after_exit(name)
            return
        self.procs[name] = proc
        self._set(name, State("running", started_at=now), container_id=proc.container_id)
        if isinstance(proc, ContainerProcess | DockerContainer):  # a later runner can adopt it
            pid, runtime = (
                (proc.pid, "process") if isinstance(proc, ContainerProcess) else (proc.proc.pid, "docker")
            )
            record = adopt.launch_record(
                self.dir, name, restart, pid, now, proc.container_id, proc.log_path, runtime
            )
            if record is not None:
                adopt.write_launch(self.dir, record)

    def _spawn(
        self, name: str, container: Mapping[str, Any], env: dict[str, str], restart: int
    ) -> RunningContainer:
        term_dir = self.dir / "containers" / name
        term_dir.mkdir(parents=True, exist_ok=True)
        term_file = term_dir / "termination-log"
        term_file.write_bytes(b"")
        term_file.chmod(0o666)  # as the kubelet: writable by the container's user, whoever that is
        launch = Launch(
            pod=self.pod,
            name=name,
            container=container,
            env=env,
            binds=self._binds(container),
            termination_file=term_file,
            pod_dir=self.dir,
            log_path=self.dir / "logs" / name / f"{restart}.log",
            restart=restart,
            network=self.network,
        )
        return self.runner.runtime.start(launch, self._notify)

    def _collect(self, name: str) -> None:
        """A process has ended: record its terminated state and termination message."""
        proc = self.procs.pop(name)
        code = proc.exit_code if proc.exit_code is not None else 137
        container = self.specs[name]
        rec = self.records[name]
        reason = S.exit_reason(code)
        message: str | None
        failure = proc.start_failure()
        if getattr(proc, "lost", False):  # an adopted container that ended unseen, no exit code left
            reason, message = "ContainerStatusUnknown", _LOST_MESSAGE
        elif failure is not None:  # the sandbox or container could not be set up
            code, reason = 128, "StartError"
            message = failure
        else:
            term_file = self.dir / "containers" / name / "termination-log"
            data = _read_part(term_file, 0, S.MAX_TERMINATION_MESSAGE) if term_file.exists() else None
            policy = str(container.get("terminationMessagePolicy") or "File")
            message = S.termination_message(data, policy, code, lambda: _read_part(proc.log_path, -65536))
        self._set(
            name,
            State(
                "terminated",
                reason=reason,
                message=message,
                exit_code=code,
                signal=None,
                started_at=rec.state.started_at,
                finished_at=now_rfc3339(),
            ),
        )
        self._after_exit(name)

    def _after_exit(self, name: str) -> None:
        """Schedule a restart when the kubelet would restart this container."""
        rec = self.records[name]
        code = rec.state.exit_code or 0
        if self.deleting or self.verdict is not None:
            return
        if self.kinds[name] == "sidecar" and self._mains_done():
            return
        if S.should_restart(self.restart_policy, self.kinds[name], code):
            delay = S.restart_backoff(rec.restart_count + 1, base=self.runner.config.restart_backoff)
            self.restart_at[name] = time.monotonic() + delay

    def _restart_due(self) -> None:
        now = time.monotonic()
        for name, when in list(self.restart_at.items()):
            if when > now or self._interrupted():
                continue
            del self.restart_at[name]
            rec = self.records[name]
            if rec.state.kind == "terminated":
                self.records[name] = replace(rec, last_state=rec.state, restart_count=rec.restart_count + 1)
            self._launch(name)

    def _reap(self) -> None:
        for name, proc in list(self.procs.items()):
            if proc.done:
                self._collect(name)

    def _mains_done(self) -> bool:
        mains = [n for n, k in self.kinds.items() if k == "main"]
        return all(self.records[n].terminated and n not in self.restart_at for n in mains)

    def _next_wake(self) -> float:
        waits = [1.0, *(when - time.monotonic() for when in self.restart_at.values())]
        left = self._deadline_left()
        if left is not None:
            waits.append(left)
        return max(0.0, min(waits))

    def _run_containers(self, started: frozenset[str] = frozenset()) -> None:
        """Init containers in order, then the main ones; `started`: adopted, not launched again."""
        order = S.start_order(self.spec)
        for step in order:
            if step.kind == "main":
                continue
            if step.name not in started:
                self._launch(step.name)
            self.publish()
            while True:  # sidecars: until started; regular init: until it succeeded
                self._reap()
                self._restart_due()
                rec = self.records[step.name]
                if self._interrupted():
                    self._stop_running()
                    return
                if step.kind == "sidecar" and rec.running:
                    break
                if step.kind == "init" and rec.succeeded:
                    break
                if step.kind == "init" and rec.terminated and step.name not in self.restart_at:
                    self._stop_running()  # restartPolicy Never: the pod failed
                    return
                self.publish()
                self._wait(self._next_wake())
            self.publish()
        for step in order:
            if step.kind == "main" and step.name not in started:
                self._launch(step.name)
        self.publish()
        while True:
            self._reap()
            self._restart_due()
            if self._interrupted():
                self._stop_running()
                return
            if self._mains_done():
                break
            self.publish()
            self._wait(self._next_wake())
        self.restart_at.clear()
        self.publish()  # the main containers' end, while the sidecars still run
        self._stop_sidecars(S.grace_seconds(self.pod))

    def _stop_sidecars(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        for name in S.sidecar_stop_order(self.spec):
            self._stop_container(name, deadline)

    def _stop_container(self, name: str, deadline: float) -> None:
        proc = self.procs.get(name)
        if proc is None:
            return
        proc.terminate()
        while not proc.done and time.monotonic() < deadline:
            with self.cond:
                if not proc.done:
                    self.cond.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
            if self.shutdown:
                break
        if not proc.done:
            proc.kill()
            end = time.monotonic() + 10
            while not proc.done and time.monotonic() < end:
                time.sleep(0.02)
        if proc.done:
            self._collect(name)

    def _stop_running(self) -> None:
        """Deleted or past its deadline: main containers first, then sidecars, within the grace period."""
        self.restart_at.clear()
        grace = (
            S.grace_seconds(self.pod)
            if self.deleting
            else float(self.spec.get("terminationGracePeriodSeconds", S.DEFAULT_GRACE_SECONDS))
        )
        deadline = time.monotonic() + grace
        mains = [n for n, k in self.kinds.items() if k != "sidecar" and n in self.procs]
        for name in mains:
            self.procs[name].terminate()
        for name in mains:
            self._stop_container(name, deadline)
        self._stop_sidecars(max(0.0, deadline - time.monotonic()))
        self._stop_unstarted()

    def _stop_unstarted(self) -> bool:
        now = now_rfc3339()
        for name, rec in self.records.items():
            if rec.state.kind == "waiting":
                self._set(
                    name,
                    State(
                        "terminated",
                        reason="ContainerStatusUnknown",
                        message=_LOST_MESSAGE,
                        exit_code=137,
                        finished_at=now,
                    ),
                )
        phase = pod_phase(list(self.records.values()), self.restart_policy)
        if self.verdict is None and self.deleting and phase not in ("Succeeded", "Failed"):
            mains = [r for r in self.records.values() if r.kind == "main"]
            ok = all(r.succeeded for r in mains)
            self.verdict = PodVerdict(
                "Succeeded" if ok else "Failed", "Terminated", "the pod was deleted while it ran"
            )
        return False

    def _kill_all(self) -> None:
        for proc in list(self.procs.values()):
            proc.kill()

    def _finish(self) -> None:
        self._reap()
        self.publish()

    def _await_deletion(self) -> None:
        """Hold the finished pod until it is deleted, then confirm the deletion (grace 0)."""
        while True:
            if self.deleting:
                self._stop_running()
                self.publish()
                self.runner.confirm_deletion(self.namespace, self.name, self.uid)
                raise _Stop
            self._wait(5.0)

    def _cleanup(self) -> None:
        """The pod is gone: drop its tmp and non-persistent volumes; logs stay for `agentrun dev logs`."""
        for sub in ("tmp", "volumes"):
            shutil.rmtree(self.dir / sub, ignore_errors=True)


class PodRunner:
    """The runner: a Node, a watch, and a worker per pod."""

    def __init__(self, config: RunnerConfig) -> None:
        self.config = config
        self.layout = Layout(config.state_dir)
        self.runtime = make_runtime(config.runtime, config.node_name, config.container_path)
        self.api = Api(config.kubeconfig, config.state_dir / "run" / "pod-runner-client")
        self.lookups = S.Lookups(secret=self.secret, config_map=self.config_map)
        self.workers: dict[str, PodWorker] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.provisioner = provisioner.LocalProvisioner(self.api, config.state_dir, config.namespaces)
        self.watching: dict[str, bool] = {}
        self.last_error: str | None = None
        self.network_unavailable = isolation_unavailable()

    # -- lookups --------------------------------------------------------------------------------
    def secret(self, namespace: str, name: str) -> Mapping[str, bytes] | None:
        obj = self.api.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
        return None if obj is None else S.secret_data(obj)

    def config_map(self, namespace: str, name: str) -> Mapping[str, str] | None:
        obj = self.api.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        if obj is None and name == "kube-root-ca.crt" and self.api.ca_file:
            return {"ca.crt": Path(self.api.ca_file).read_text()}  # no root-CA publisher runs locally
        if obj is None:
            return None
        data = {str(k): str(v) for k, v in (obj.get("data") or {}).items()}
        data.update({str(k): base64.b64decode(v).decode() for k, v in (obj.get("binaryData") or {}).items()})
        return data

    def service_account_token(self, pod: Mapping[str, Any], src: Mapping[str, Any]) -> str:
        meta = pod.get("metadata") or {}
        account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
        body: dict[str, Any] = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": int(src.get("expirationSeconds") or 3607),
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta.get("name"),
                    "uid": meta.get("uid"),
                },
            },
        }
        if src.get("audience"):
            body["spec"]["audiences"] = [src["audience"]]
        try:
            answer = self.api.request(
                "POST", f"/api/v1/namespaces/{meta.get('namespace')}/serviceaccounts/{account}/token", body
            )
        except ApiError as exc:
            raise S.ContainerConfigError(f"cannot get a token for serviceaccount {account}: {exc}") from None
        return str((answer.get("status") or {}).get("token", ""))

    # -- node -----------------------------------------------------------------------------------
    def claim_volume_dir(self, namespace: str, claim: str) -> Path:
        """The directory of the volume bound to a claim, as the kubelet would mount it (or wait)."""
        obj = self.api.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        if obj is None:
            raise S.ContainerConfigError(f'persistentvolumeclaim "{claim}" not found')
        volume_name = (obj.get("spec") or {}).get("volumeName")
        phase = (obj.get("status") or {}).get("phase") or "Pending"
        if phase != "Bound" or not volume_name:
            raise S.ContainerConfigError(f'persistentvolumeclaim "{claim}" is not bound yet (phase {phase})')
        volume = self.api.get(f"/api/v1/persistentvolumes/{volume_name}")
        if volume is None:
            raise S.ContainerConfigError(f'persistentvolume "{volume_name}" of claim "{claim}" not found')
        path = provisioner.local_path(volume)
        if not provisioner.is_under(path, self.layout.volumes_root):
            raise S.ContainerConfigError(
                f'persistentvolume "{volume_name}" of claim "{claim}" is not a directory of the local '
                f"provisioner (under {self.layout.volumes_root}); the local pod runner mounts only those"
            )
        directory = Path(str(path))
        directory.mkdir(parents=True, exist_ok=True)
        return directory

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
            "addresses": [
                {"type": "InternalIP", "address": S.HOST_IP},
                {"type": "Hostname", "address": name},
            ],
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
                "containerRuntimeVersion": "bubblewrap" if self.runtime.name == "process" else "docker",
                "kernelVersion": os.uname().release,
                "osImage": "host",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kubeProxyVersion": "",
            },
        }
        self.api.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": status}, _SMP)

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
        if meta.get("deletionTimestamp") and not (node and adopt.any_alive(pod_dir)):
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
