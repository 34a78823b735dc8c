"""One pod's life on the local pod runner, as the kubelet lives it: bind, volumes, containers in
order, probes of nothing, status patches, deletion.

`PodRunner` (runner.py) makes a `PodWorker` for every pod of its node; the worker's thread walks the
pod through its life cycle and writes its status with strategic-merge patches of `pods/status`,
retried with backoff until they land or the pod is gone. Its containers run through the runner's
`ContainerRuntime` (runtime.py, the worker's only way to them); a later runner adopts those still
running (adopt.py). The worker sees its runner only as a `Host` (below), so the two modules import
in one direction.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import shutil
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from agentrun_devcluster.podrunner import spec as S
from agentrun_devcluster.podrunner.addresses import PodAddresses
from agentrun_devcluster.podrunner.adopt import Launches
from agentrun_devcluster.podrunner.api import SMP, Api, ApiError, pod_path, transient
from agentrun_devcluster.podrunner.config import Layout, RunnerConfig
from agentrun_devcluster.podrunner.events import PodEvents
from agentrun_devcluster.podrunner.network import wants_own_network
from agentrun_devcluster.podrunner.retry import retry_until
from agentrun_devcluster.podrunner.runtime import ContainerRuntime, Launch, PodSandbox, RunningContainer
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
from agentrun_devcluster.podrunner.volumes import VolumeLookups, volume_dir
from agentrun_devcluster.podrunner.volumes import binds as volume_binds

log = logging.getLogger("agentrun.podrunner")
_LOST_MESSAGE = "The container could not be located when the pod was terminated"


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


DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"


class _Stop(Exception):
    """The worker must stop now (the pod is gone or the runner shuts down)."""


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
    if not start_time:
        return time.monotonic()
    try:
        started = datetime.datetime.fromisoformat(start_time.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.monotonic()
    return time.monotonic() - max(0.0, time.time() - started)


def _tail(path: Path, size: int = 512) -> str:
    """The end of a log, for a failed hook's message."""
    try:
        return _read_part(path, -size).decode("utf-8", "replace").strip()
    except OSError:
        return ""


class Host(Protocol):
    """What a worker uses of the runner that made it (runner.py's `PodRunner`)."""

    config: RunnerConfig
    layout: Layout
    api: Api
    runtime: ContainerRuntime
    volume_lookups: VolumeLookups
    lookups: S.Lookups
    network_unavailable: str | None
    addresses: PodAddresses

    def confirm_deletion(self, namespace: str, name: str, uid: str) -> None: ...

    def forget(self, uid: str) -> None: ...


class PodWorker:
    """Walks one pod through the kubelet's life cycle in its own thread."""

    def __init__(self, runner: Host, pod: dict[str, Any]) -> None:
        self.runner = runner
        self.api = runner.api
        self.events = PodEvents(runner.api, pod, runner.config.node_name)
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
        self.pid_namespace: PodSandbox | None = None
        self.pod_ip: str | None = None
        """The pod's own address (addresses.py), the host's on `hostNetwork`; None: not known here."""
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
        view = PodView(self.restart_policy, self.start_time, self.verdict, self._conditions, self.pod_ip)
        status = build_status(list(self.records.values()), view)
        comparable = {
            **status,
            "conditions": [{**c, "lastTransitionTime": None} for c in status["conditions"]],
        }
        if comparable == self._published:
            return
        try:
            self.api.request(
                "PATCH", pod_path(self.namespace, self.name) + "/status", {"status": status}, SMP
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
                if self.pid_namespace is not None:
                    self.pid_namespace.stop()
                self._cleanup()
                self.runner.addresses.release(self.dir)
            self.runner.forget(self.uid)

    def _life(self) -> None:
        if not self.spec.get("nodeName") and not self._bind():
            return
        phase = (self.pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            self._await_deletion()
            return
        launched = self.runner.runtime.earlier_launches(self.pod, self.dir, self.records, now_rfc3339())
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
            if not self._assign_address():
                self._await_deletion()
                return
            self.publish()
            if not self._start_network() or not self._start_pid_namespace() or not self._prepare_volumes():
                self._await_deletion()
                return
        self._run_containers(started=frozenset(launched))
        self._finish()
        if self.pid_namespace is not None:  # the sandbox ends with the pod's containers, as a kubelet's
            self.pid_namespace.stop()
            self.pid_namespace = None
        self._await_deletion()

    def _adopt(self, launched: Launches) -> bool:
        """Take over a pod an earlier runner process started: containers still running are
        adopted, ended ones reported with the exit code and message they left (see adopt.py)."""
        status = self.pod.get("status") or {}
        self.start_time = status.get("startTime") or now_rfc3339()
        self.started_mono = _started_monotonic(self.start_time)
        self.pod_ip = S.HOST_IP if S.uses_host_network(self.pod) else self.runner.addresses.keep(self.dir)
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
            self.procs[name] = self.runner.runtime.adopt(record, self._notify)
        log.info(
            "pod %s/%s: adopted %s from an earlier runner process",
            self.namespace,
            self.name,
            ", ".join(f"{n} ({'running' if not p.done else 'ended'})" for n, p in self.procs.items()),
        )
        self._reap()  # the ended ones are terminated before the first write (never back to running)
        self.publish()  # the network and PID namespaces: the earlier runner's, where they still run
        return self._start_network() and self._start_pid_namespace() and self._prepare_volumes(adopting=True)

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
        # kubectl's default container: the pod's annotation when it names one, else the first
        chosen = ((self.pod.get("metadata") or {}).get("annotations") or {}).get(DEFAULT_CONTAINER)
        if chosen in mains:
            mains = [chosen]
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

    def _assign_address(self) -> bool:
        """The pod's IP: its own loopback address (addresses.py), or the host's for a pod on
        `hostNetwork`, as a kubelet gives it."""
        if S.uses_host_network(self.pod):
            self.pod_ip = S.HOST_IP
            return True
        try:
            self.pod_ip = self.runner.addresses.assign(self.dir, self.uid)
        except OSError as exc:
            self._fail_pod("FailedCreatePodSandBox", f"could not give the pod an address: {exc}")
            return False
        return True

    def _start_network(self) -> bool:
        """A pod serving ports gets its own network namespace (see `network.py`) where possible."""
        if not wants_own_network(self.spec) or self.runner.network_unavailable is not None:
            return True
        endpoint = urllib.parse.urlsplit(self.api.server)
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self.network = self.runner.runtime.start_network(
                self.dir, endpoint.hostname or "127.0.0.1", endpoint.port or 443
            )
        except OSError as exc:
            self._fail_pod("FailedCreatePodSandBox", f"could not set up the pod's network: {exc}")
            return False
        return True

    def _start_pid_namespace(self) -> bool:
        """A pod with `shareProcessNamespace` gets one PID namespace for all its containers and hooks,
        held by a pause-like PID 1 (pidns.py), kept from an earlier
        runner process when it still runs (its containers run in it)."""
        if not S.shares_process_namespace(self.pod):
            return True
        try:
            self.pid_namespace = self.runner.runtime.start_pid_namespace(self.pod, self.dir)
        except OSError as exc:
            self._fail_pod("FailedCreatePodSandBox", f"could not set up the pod's PID namespace: {exc}")
            return False
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
                    self.volume_dirs[volume.name] = (
                        kept if keep else volume_dir(volume, self.pod, self.dir, self.runner.volume_lookups)
                    )
                return True
            except S.VolumeMountError as exc:  # the kubelet's FailedMount Event, the pod left creating
                message = str(exc)
                self.events.warning(exc.event_reason, message)
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

    # -- containers -----------------------------------------------------------------------------
    def binds(self, container: Mapping[str, Any], env: Mapping[str, str]) -> list[Bind]:
        return volume_binds(container, self.volumes, self.volume_dirs, env)

    def _launch(self, name: str) -> None:
        """Start one container (records a waiting or terminated state instead when it cannot)."""
        container = self.specs[name]
        rec = self.records[name]
        restart = rec.restart_count
        try:
            base = self.runner.runtime.base_env(self.pod, self.api.server)
            env = S.resolve_env(self.pod, container, self.runner.lookups, base, self.pod_ip or S.HOST_IP)
            now = now_rfc3339()
            proc = self._spawn(name, container, env, restart, started_at=now)
        except S.ContainerConfigError as exc:  # wait, retry
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
        self._post_start(name, env, restart)

    def _post_start(self, name: str, env: dict[str, str], restart: int) -> None:
        """Run the container's postStart exec hook to its end, as the kubelet does before it counts the
        container started (so a sidecar's next container waits for it). A hook that fails, or cannot
        start, kills the container (`FailedPostStartHook`), which restarts by its policy. The hook runs
        as a process of the container's image, env and mounts, not inside the container's own
        processes (docs/local-dev.md#pod-runner-hooks)."""
        command = S.post_start_command(self.specs[name])
        if command is None or name not in self.procs:
            return
        self.publish()  # running, not started yet: what the API shows while the hook runs
        hook_name = f"{name}-poststart"
        container = S.hook_container(self.specs[name], command)
        failure: str | None = None
        try:
            proc = self._spawn(hook_name, container, env, restart)
        except (S.ContainerConfigError, S.StartError) as exc:
            failure = str(exc)
        else:
            while not proc.done:
                if self._interrupted():
                    proc.kill()
                    return
                self._wait(1.0)
            if proc.exit_code != 0:
                failure = f"exit code {proc.exit_code}: {_tail(proc.log_path)}"
        if failure is None:
            return
        log.info("pod %s/%s container %s: FailedPostStartHook: %s", self.namespace, self.name, name, failure)
        grace = float(self.spec.get("terminationGracePeriodSeconds", S.DEFAULT_GRACE_SECONDS))
        self._stop_container(name, time.monotonic() + grace)

    def _spawn(
        self,
        name: str,
        container: Mapping[str, Any],
        env: dict[str, str],
        restart: int,
        started_at: str | None = None,
    ) -> RunningContainer:
        """Start a container (`started_at`: recorded for adoption) or a hook (None: not recorded)."""
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
            binds=self.binds(container, env),
            termination_file=term_file,
            pod_dir=self.dir,
            log_path=self.dir / "logs" / name / f"{restart}.log",
            restart=restart,
            started_at=started_at,
            network=self.network,
            pid_namespace=self.pid_namespace,
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
        if proc.lost:  # an adopted container that ended unseen, no exit code left
            reason, message = "ContainerStatusUnknown", _LOST_MESSAGE
        elif failure is not None:  # the sandbox or container could not be set up
            code, reason = 128, "StartError"
            message = failure
        else:
            term_file = self.dir / "containers" / name / "termination-log"
            data = _read_part(term_file, -S.MAX_TERMINATION_MESSAGE) if term_file.exists() else None
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
