"""The warm pod's supervisor, simulated outside the cluster for the KWOK plane (docs/local-dev.md#kwok).

KWOK simulates the kubelet; this process simulates what runs in a warm loop's pod
(docs/design.md#warm-iterations), so that the scale benchmark measures the released operator with
warm iterations: it watches the namespace's pods with the warm label (`naming.LABEL_WARM`), and for
each Running one with a pod IP (KWOK gives loopback IPs, `agentrun_devcluster.kwok.POD_CIDR`) it
listens on that IP at the port of the pod's reporter (`--warm-port`) and plays its supervisor as
docs/design.md#warm-channel says: every request's signature checked with the run's key (the Secret
the pod mounts), every answer signed, the long poll, start / ack / stop, 400 / 401 / 404 / 409.

Each iteration runs at once (or for the workload's `AGENTRUN_SIM_SECONDS`): its result's envelope is
the one KWOK's Stages write for an iteration pod (the control payload of the workload's env
`AGENTRUN_SIM_CONTROL`, exit code 0); a workload with `AGENTRUN_SIM_HANG=true` runs for good. The
pod's first iteration (`--warm-first-id`) starts as soon as the pod is Running. On `stop`, or
`--warm-idle-seconds` after an acknowledgement, it ends the pod as the kubelet would (the pod's
status: Succeeded, every container terminated with exit code 0, the reporter's termination message
the last result's envelope with `"warm": {"id", "exitCode"}`): those are the kubelet's writes, not
the operator's. A pod being deleted is no longer served; a pod whose IP changes (KWOK may play a
pod's Running Stage twice) is served at its new one.

A benchmark part, not product code: nothing in the operator knows it. What it saw (the iterations
each run ran, the turnarounds, the requests by answer) is served on `--stats-port` (`GET /stats`)
and written to `--out` when it ends.

    python -m tests.bench.warm_sim --plane PLANE_HOME --namespace bench --stats-port 18080
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import json
import os
import signal
import ssl
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import aiohttp
from aiohttp import web

from agentrun_devcluster import processes
from agentrun_devcluster.controlplane import ControlPlane
from agentrun_devcluster.kwok_stages import CONTROL_ENV, HANG_ENV
from agentrun_operator import naming
from agentrun_operator.control import warm_auth
from agentrun_operator.control.envelope import attach_warm, decode_envelope, encode_envelope
from agentrun_operator.control.warm import Refusal, ack_takes, start_runs, stop_ends, valid_env, valid_id
from agentrun_operator.control.warm_server import json_object, state_query
from agentrun_operator.jobs.reporter_container import REPORTER_CONTAINER, WORKLOAD_CONTAINERS
from agentrun_operator.jobs.warm_pod import FIRST_ID_ARG, KEY_ITEM
from tests.support.processes import GroupProcess

ROOT = Path(__file__).resolve().parents[2]

READY_LINE: Final = "warm-sim ready"
MAX_BODY: Final = 1024 * 1024
MAX_WAIT_SECONDS: Final = 60.0
"""The longest long poll (docs/design.md#warm-channel)."""
DEFAULT_IDLE_SECONDS: Final = 300.0
SECONDS_ENV: Final = "AGENTRUN_SIM_SECONDS"
"""The workload env that makes each simulated iteration of a warm pod run this many seconds (a
benchmark's offered load below what the operator can take; unset: at once)."""

Answer = tuple[int, dict[str, Any]]


def _now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _arg(args: list[str], name: str) -> str | None:
    """The value after `name` in a container's args, if any."""
    if name in args:
        at = args.index(name)
        if at + 1 < len(args):
            return args[at + 1]
    return None


def envelope_for(control: str | None, path: str) -> str:
    """The envelope KWOK's iteration Stage writes for the same pod (agentrun_devcluster/kwok_stages.py
    `_ENVELOPE`): `found` with the control payload verbatim, else `missing`."""
    quoted = json.dumps(path)
    if control:
        size = len(control.encode())
        return f'{{"v":1,"status":"found","path":{quoted},"size":{size},"reason":null,"control":{control}}}'
    return f'{{"v":1,"status":"missing","path":{quoted},"size":null,"reason":null,"control":null}}'


@dataclass(frozen=True)
class WarmPod:
    """What the simulator reads of a warm pod: where it listens, its run, its first id and idle time,
    the envelope its iterations report, and the Secret holding its run's key."""

    namespace: str
    name: str
    uid: str
    run: str
    ip: str
    port: int
    first_id: str
    idle_seconds: float
    envelope: str
    hang: bool
    secret: str
    containers: tuple[tuple[str, str], ...]  # (name, image)
    seconds: float = 0.0
    """How long each iteration runs (`SECONDS_ENV`); 0: it finishes at once."""


def warm_pod_of(pod: dict[str, Any]) -> WarmPod | None:
    """The warm pod a pod object describes, once it is Running with an IP; None otherwise (not warm,
    not yet Running, being deleted, or without what a warm pod's reporter is given)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    labels = meta.get("labels") or {}
    if labels.get(naming.LABEL_WARM) != "true" or meta.get("deletionTimestamp"):
        return None
    if status.get("phase") != "Running" or not status.get("podIP"):
        return None
    containers = spec.get("containers") or []
    reporter = next((c for c in containers if c.get("name") == REPORTER_CONTAINER), None)
    if reporter is None:
        return None
    args = [str(a) for a in reporter.get("args") or []]
    first_id, port = _arg(args, FIRST_ID_ARG), _arg(args, "--warm-port")
    if first_id is None or port is None or not port.isdigit():
        return None
    control, hang, seconds = None, False, 0.0
    for container in containers:
        if container.get("name") in WORKLOAD_CONTAINERS:
            for var in container.get("env") or []:
                if var.get("name") == CONTROL_ENV:
                    control = var.get("value")
                elif var.get("name") == HANG_ENV:
                    hang = var.get("value") == "true"
                elif var.get("name") == SECONDS_ENV:
                    with contextlib.suppress(TypeError, ValueError):
                        seconds = max(0.0, float(var.get("value")))
    secret = next(
        (
            str((v.get("secret") or {}).get("secretName"))
            for v in spec.get("volumes") or []
            if v.get("name") == naming.WARM_KEY_VOLUME
        ),
        naming.warm_secret_name(str(labels.get(naming.LABEL_RUN, ""))),
    )
    idle = _arg(args, "--warm-idle-seconds")
    return WarmPod(
        namespace=str(meta.get("namespace")),
        name=str(meta.get("name")),
        uid=str(meta.get("uid", "")),
        run=str(labels.get(naming.LABEL_RUN, "")),
        ip=str(status["podIP"]),
        port=int(port),
        first_id=first_id,
        idle_seconds=float(idle) if idle and idle.isdigit() else DEFAULT_IDLE_SECONDS,
        envelope=envelope_for(control, _arg(args, "--path") or ""),
        hang=hang,
        secret=secret,
        containers=tuple((str(c.get("name")), str(c.get("image", ""))) for c in containers),
        seconds=seconds,
    )


@dataclass
class Ledger:
    """What the simulator saw, across pods: the benchmark's lost/repeated check and turnaround."""

    ran: collections.Counter[str] = field(default_factory=collections.Counter)
    """`run/id` -> how many times that iteration id started (its pod's first included): 1 each."""
    turnarounds: list[float] = field(default_factory=list)
    """Seconds from a result available in a pod to the next start received by that pod, for results
    of iterations the operator started there."""
    first_turnarounds: list[float] = field(default_factory=list)
    """The same from the result of a pod's first iteration, which the simulator finishes the moment
    the pod is Running, before the operator could have connected: it measures the channel's setup."""
    requests: collections.Counter[str] = field(default_factory=collections.Counter)
    """`METHOD /path STATUS` -> count."""
    refused: collections.Counter[str] = field(default_factory=collections.Counter)
    """The 401s by why: no signature, one made with the key of a pod this IP had before (the
    operator's channel to a pod that is gone: KWOK gives its IP again), another wrong one, a replayed
    nonce."""
    ips_reused: int = 0
    """Pods served at an IP an earlier pod had (KWOK gives a deleted pod's IP again)."""
    ip_changes: int = 0
    """Pods whose IP changed while Running (KWOK can play a pod's Running Stage twice, each play
    taking an IP): served at the new one from then on, as the operator calls it there."""
    ip_conflicts: int = 0
    """Pods given an IP a live pod still had: the older one is no longer served."""
    duplicate_starts: int = 0
    """Starts of the id running or just finished: a no-op, as the channel says."""
    pods_served: int = 0
    pods_ended: collections.Counter[str] = field(default_factory=collections.Counter)
    """Pods this simulator ended as a kubelet would, by why (`stop`, `idle`)."""
    pods_gone: int = 0
    end_failures: int = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "ran": dict(self.ran),
            "turnarounds": list(self.turnarounds),
            "first_turnarounds": list(self.first_turnarounds),
            "requests": dict(self.requests),
            "refused": dict(self.refused),
            "ips_reused": self.ips_reused,
            "ip_changes": self.ip_changes,
            "ip_conflicts": self.ip_conflicts,
            "duplicate_starts": self.duplicate_starts,
            "pods_served": self.pods_served,
            "pods_ended": dict(self.pods_ended),
            "pods_gone": self.pods_gone,
            "end_failures": self.end_failures,
        }


@dataclass
class _Result:
    id: str
    exit_code: int
    envelope: str
    finished_at: str
    available: float  # monotonic
    first: bool  # the pod's first iteration
    acked: bool = False


class Supervisor:
    """One warm pod's supervisor, as control/warm.py's answers the channel (docs/design.md#warm-channel):
    the same state, the same answers and refusals (its `valid_id`, `valid_env` and `Refusal`), the
    long poll; what `main` does is played by the clock. `end(supervisor, why, message)` ends the pod
    (the kubelet's part)."""

    def __init__(
        self,
        pod: WarmPod,
        key: bytes,
        ledger: Ledger,
        end: Callable[[Supervisor, str, str], Coroutine[Any, Any, None]],
        former_keys: Callable[[str], list[bytes]] = lambda _ip: [],
    ) -> None:
        self.pod = pod
        self.key = key
        self.ledger = ledger
        self._end = end
        # The keys of the pods this IP had before: a request signed with one of them was meant for
        # such a pod (a channel the operator has not let go of yet), not forged.
        self._former_keys = former_keys
        self.nonces = warm_auth.NonceMemory()
        # As the real one starts: the pod's first iteration waits for `main` (startedAt null).
        self.version = 1
        self.phase = "running"
        self.running: tuple[str, str | None] | None = (pod.first_id, None)  # (id, startedAt)
        self.result: _Result | None = None
        self.acknowledged: set[str] = set()
        self.ended = False
        self._changed = asyncio.Event()
        self._idle: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._begin(pod.first_id)  # `main` takes it at once: nothing to wait for here

    # -- the state ---------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        result = self.result
        return {
            "v": 1,
            "version": self.version,
            "phase": self.phase,
            "running": {"id": self.running[0], "startedAt": self.running[1]} if self.running else None,
            "result": (
                {
                    "id": result.id,
                    "exitCode": result.exit_code,
                    "envelope": result.envelope,
                    "finishedAt": result.finished_at,
                    "acked": result.acked,
                }
                if result is not None
                else None
            ),
        }

    def _bump(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self, seen: int | None, seconds: float) -> None:
        """Until the state's version is not `seen`, at most `seconds` (at once without `seen`)."""
        if seen is None or seen != self.version or seconds <= 0 or self.ended:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), seconds)

    # -- iterations ----------------------------------------------------------------------------------

    def _begin(self, id_: str) -> None:
        """`main` takes iteration `id_`; it finishes at once, or after the workload's `SECONDS_ENV`, or
        never when it plays a container that never ends."""
        self.ledger.ran[f"{self.pod.run}/{id_}"] += 1
        self.running = (id_, _now_text())
        self.phase = "running"
        self._bump()
        if self.pod.hang:
            return
        loop = asyncio.get_running_loop()
        if self.pod.seconds > 0:
            loop.call_later(self.pod.seconds, self._finish, id_)
        else:
            loop.call_soon(self._finish, id_)

    def _finish(self, id_: str) -> None:
        if self.ended or self.running is None or self.running[0] != id_:
            return
        self.running = None
        self.phase = "idle"
        first = id_ == self.pod.first_id
        self.result = _Result(id_, 0, self.pod.envelope, _now_text(), time.monotonic(), first)
        self._bump()

    def _idle_clock(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = asyncio.get_running_loop().call_later(self.pod.idle_seconds, self._idle_out)

    def _idle_out(self) -> None:
        if self.ended or self.running is not None or self.result is None or not self.result.acked:
            return
        self.phase = "stopping"
        self._bump()
        self._exit("idle")

    def _exit(self, why: str) -> None:
        """`main`'s loop has ended; the supervisor exits 0 with its termination message (as
        control/warm.py `termination_text`: the last result's envelope with `warm`)."""
        result = self.result
        assert result is not None
        envelope = attach_warm(
            decode_envelope(result.envelope), {"id": result.id, "exitCode": result.exit_code}
        )
        task = asyncio.get_running_loop().create_task(self._end(self, why, encode_envelope(envelope)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        """The pod is gone (deleted, or ended): no more timers; pending long polls answer at once."""
        self.ended = True
        if self._idle is not None:
            self._idle.cancel()
        self._changed.set()

    # -- the requests (control/warm.py Supervisor.start, ack, stop) -------------------------------------

    def _ids(self) -> tuple[str | None, str | None, bool]:
        """What the requests' rules read (control/warm.py `start_runs`, `ack_takes`, `stop_ends`)."""
        result = self.result
        running = self.running[0] if self.running is not None else None
        return running, (result.id if result is not None else None), (result is not None and result.acked)

    def start(self, iteration: str, env: dict[str, str]) -> dict[str, Any]:
        result = self.result
        if not start_runs(self.phase, *self._ids(), self.acknowledged, iteration):
            self.ledger.duplicate_starts += 1
            return self.state()
        if result is not None:
            took = time.monotonic() - result.available
            (self.ledger.first_turnarounds if result.first else self.ledger.turnarounds).append(took)
            if not result.acked:
                result.acked = True
                self.acknowledged.add(result.id)
        if self._idle is not None:
            self._idle.cancel()
        self._begin(iteration)
        return self.state()

    def ack(self, iteration: str) -> dict[str, Any]:
        result = self.result
        if ack_takes(*self._ids(), self.acknowledged, iteration) and result is not None:
            result.acked = True
            self.acknowledged.add(iteration)
            self._bump()
            if self.running is None:
                self._idle_clock()
        return self.state()

    def stop(self, iteration: str) -> dict[str, Any]:
        if not stop_ends(self.phase, *self._ids(), self.acknowledged, iteration):
            return self.state()
        result = self.result
        if result is not None and result.id == iteration:
            result.acked = True
        self.acknowledged.add(iteration)
        if self._idle is not None:
            self._idle.cancel()
        self.phase = "stopping"
        self._bump()
        self._exit("stop")
        return self.state()

    # -- the channel (control/warm_server.py) ------------------------------------------------------------

    async def answer(self, request: web.BaseRequest) -> web.Response:
        """One request, checked and answered as the supervisor's server does; every answer signed
        (over an empty nonce when the request had none readable)."""
        parsed = warm_auth.parse_authorization(request.headers.get("Authorization"))
        nonce = parsed[0] if parsed is not None else ""
        try:
            body = await self._body(request)
            self._check(request, body, parsed)
            status, doc = 200, await self._route(request, body)
        except Refusal as refusal:
            status, doc = refusal.status, {"error": refusal.message}
        text = json.dumps(doc, separators=(",", ":")).encode()
        headers = {
            "Content-Type": "application/json",
            warm_auth.ANSWER_HEADER: warm_auth.answer_signature(self.key, nonce, status, text),
        }
        self.ledger.requests[f"{request.method} {request.path} {status}"] += 1
        return web.Response(status=status, body=text, headers=headers)

    @staticmethod
    async def _body(request: web.BaseRequest) -> bytes:
        if request.headers.get("Transfer-Encoding"):
            raise Refusal(400, "a request body must come with Content-Length")
        if (request.content_length or 0) > MAX_BODY:
            raise Refusal(400, f"the request body is over {MAX_BODY} bytes")
        return await request.read()

    def _check(self, request: web.BaseRequest, body: bytes, parsed: tuple[str, str] | None) -> None:
        target = request.raw_path
        if parsed is None:
            self._refuse("no signature")
        assert parsed is not None
        nonce, signature = parsed
        if not warm_auth.request_is_signed(self.key, request.method, target, nonce, signature, body):
            meant = any(
                warm_auth.request_is_signed(key, request.method, target, nonce, signature, body)
                for key in self._former_keys(self.pod.ip)
            )
            self._refuse("signed for the pod this IP had before" if meant else "wrong signature")
        if not self.nonces.first_use(nonce):
            self.ledger.refused["replayed nonce"] += 1
            raise Refusal(401, "the request's nonce was used before (a replay)")

    def _refuse(self, why: str) -> None:
        self.ledger.refused[why] += 1
        raise Refusal(401, "the request is not signed with this run's key")

    async def _route(self, request: web.BaseRequest, body: bytes) -> dict[str, Any]:
        if request.method == "GET" and request.path == "/v1/state":
            seen, wait = state_query(request.query_string)
            await self.wait_change(seen, wait)
            return self.state()
        if request.method == "POST" and request.path in ("/v1/start", "/v1/ack", "/v1/stop"):
            doc = json_object(body)
            iteration = valid_id(doc.get("id"))
            if request.path == "/v1/start":
                return self.start(iteration, valid_env(doc.get("env")))
            return self.ack(iteration) if request.path == "/v1/ack" else self.stop(iteration)
        raise Refusal(404, f"no endpoint {request.method} {request.path[:200]}")


class Served:
    """A pod's listening socket and its HTTP server."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.http = web.Server(self._handle, handler_cancellation=True)
        self.server: asyncio.Server | None = None

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self.supervisor.answer(request)

    async def listen(self) -> None:
        pod = self.supervisor.pod
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(self.http, pod.ip, pod.port, reuse_address=True, backlog=64)

    async def close(self) -> None:
        self.supervisor.close()
        await self._stop_listening()

    async def _stop_listening(self) -> None:
        """The listening socket closes at once (its IP may be another pod's next); the connections it
        accepted are closed behind (an idle keep-alive one holds `shutdown` for its timeout)."""
        if self.server is not None:
            self.server.close()
        shutdown = asyncio.ensure_future(self.http.shutdown(1.0))
        _CLOSING.add(shutdown)
        shutdown.add_done_callback(_CLOSING.discard)

    async def move(self, ip: str) -> None:
        """The pod's IP changed: listen on the new one (the same supervisor, its state kept)."""
        await self._stop_listening()
        self.supervisor.pod = replace(self.supervisor.pod, ip=ip)
        self.http = web.Server(self._handle, handler_cancellation=True)
        await self.listen()


_CLOSING: set[asyncio.Future[None]] = set()
"""Connections being closed behind their pod's listening socket (`Served._stop_listening`)."""


async def closed() -> None:
    """Every connection of a pod no longer served is closed."""
    while _CLOSING:
        await asyncio.gather(*list(_CLOSING), return_exceptions=True)


class Simulator:
    """Watches the namespace's warm pods and serves each Running one (`Served`) until it is deleted
    or ended."""

    def __init__(self, plane: ControlPlane, namespace: str, ledger: Ledger | None = None) -> None:
        self.plane = plane
        self.namespace = namespace
        self.ledger = ledger or Ledger()
        self.served: dict[str, Served] = {}  # by pod uid
        self.by_ip: dict[str, str] = {}  # pod IP -> uid
        self.ips_seen: set[str] = set()
        self.latest_ip: dict[str, str] = {}  # uid -> the pod's IP in its newest event
        self.former_keys: dict[str, list[bytes]] = collections.defaultdict(list)  # IP -> gone pods' keys
        self.starting: set[str] = set()
        self.done: set[str] = set()  # uids ended or gone: never served again
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            ctx = ssl.create_default_context(cafile=str(self.plane.pki.ca_cert))
            ctx.load_cert_chain(
                str(self.plane.pki.client_cert("admin")), str(self.plane.pki.client_key("admin"))
            )
            self._session = aiohttp.ClientSession(
                base_url=self.plane.server, connector=aiohttp.TCPConnector(ssl=ctx, limit=64)
            )
        return self._session

    async def close(self) -> None:
        for served in list(self.served.values()):
            await served.close()
        self.served.clear()
        await closed()
        if self._session is not None:
            await self._session.close()

    # -- the watch -----------------------------------------------------------------------------------

    async def list_pods(self) -> str:
        """Serve every warm pod there is, and no longer those that are not (deleted while the watch
        could not resume); the list's resourceVersion, to watch from."""
        selector = quote(f"{naming.LABEL_WARM}=true")
        async with self.session().get(
            f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={selector}"
        ) as resp:
            resp.raise_for_status()
            doc = await resp.json()
        items = doc.get("items") or []
        listed = {str((pod.get("metadata") or {}).get("uid", "")) for pod in items}
        for uid in [uid for uid in self.served if uid not in listed]:
            self._spawn(self.gone(uid))
        for pod in items:
            self.on_pod("ADDED", pod)
        return str((doc.get("metadata") or {}).get("resourceVersion") or "")

    async def watch(self, version: str) -> None:
        """Follow the namespace's warm pods from `version`, re-listing when the watch cannot resume."""
        selector = quote(f"{naming.LABEL_WARM}=true")
        while True:
            path = (
                f"/api/v1/namespaces/{self.namespace}/pods?watch=1&allowWatchBookmarks=true"
                f"&timeoutSeconds=300&labelSelector={selector}&resourceVersion={version}"
            )
            try:
                async with self.session().get(path, timeout=aiohttp.ClientTimeout(total=None)) as resp:
                    resp.raise_for_status()
                    buffer = b""
                    async for chunk in resp.content.iter_any():
                        buffer += chunk
                        while b"\n" in buffer:
                            line, buffer = buffer.split(b"\n", 1)
                            if not line.strip():
                                continue
                            event = json.loads(line)
                            obj = event.get("object") or {}
                            if event.get("type") == "ERROR":
                                raise _Gone
                            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                            if event.get("type") != "BOOKMARK":
                                self.on_pod(str(event.get("type")), obj)
            except _Gone:
                version = await self._relist()
            except Exception as exc:  # never a dead watch: the pods would go unserved
                print(f"warm-sim: pod watch broke ({type(exc).__name__}: {exc}); resuming", flush=True)
                await asyncio.sleep(0.5)

    async def _relist(self) -> str:
        while True:
            try:
                return await self.list_pods()
            except Exception as exc:
                print(f"warm-sim: listing pods failed ({type(exc).__name__}: {exc}); again", flush=True)
                await asyncio.sleep(0.5)

    def on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        phase = (pod.get("status") or {}).get("phase")
        if kind == "DELETED" or meta.get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
            self._spawn(self.gone(uid))
            return
        ip = (pod.get("status") or {}).get("podIP")
        if ip:
            self.latest_ip[uid] = str(ip)
        served = self.served.get(uid)
        if served is not None and ip and served.supervisor.pod.ip != ip:
            self._spawn(self.follow_ip(uid))
        if uid in self.served or uid in self.starting or uid in self.done:
            return
        warm = warm_pod_of(pod)
        if warm is not None:
            self.starting.add(uid)
            self._spawn(self.serve(warm))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- one pod ---------------------------------------------------------------------------------------

    async def read_key(self, pod: WarmPod) -> bytes | None:
        async with self.session().get(f"/api/v1/namespaces/{pod.namespace}/secrets/{pod.secret}") as resp:
            if resp.status != 200:
                return None
            doc = await resp.json()
        raw = (doc.get("data") or {}).get(KEY_ITEM)
        return base64.b64decode(raw).strip() if raw else None

    async def serve(self, pod: WarmPod) -> None:
        try:
            key = await self.read_key(pod)
            if key is None:
                print(f"warm-sim: no key in Secret {pod.secret} for pod {pod.name}", flush=True)
                return
            if pod.uid in self.done:
                return
            await self._free(pod.ip, pod.name)
            served = Served(Supervisor(pod, key, self.ledger, self.end_pod, self.former_keys.__getitem__))
            await served.listen()
            if pod.uid in self.done:  # deleted meanwhile
                await served.close()
                return
            self.served[pod.uid] = served
            self.by_ip[pod.ip] = pod.uid
            self.ledger.ips_reused += pod.ip in self.ips_seen
            self.ips_seen.add(pod.ip)
            self.ledger.pods_served += 1
            if self.latest_ip.get(pod.uid, pod.ip) != pod.ip:  # it changed meanwhile
                self._spawn(self.follow_ip(pod.uid))
        except (aiohttp.ClientError, OSError) as exc:
            print(f"warm-sim: cannot serve pod {pod.name} at {pod.ip}:{pod.port}: {exc}", flush=True)
        finally:
            self.starting.discard(pod.uid)

    async def _free(self, ip: str, name: str) -> None:
        """No other pod is served at `ip`: one that is gone is let go of (KWOK gives a deleted pod's
        IP again); one that is not is a conflict (said, and let go of too)."""
        previous = self.by_ip.get(ip)
        if previous is None:
            return
        if previous not in self.done:
            self.ledger.ip_conflicts += 1
            other = self.served[previous].supervisor.pod.name if previous in self.served else previous
            print(f"warm-sim: pod {name} was given {ip}, which live pod {other} has", flush=True)
        await self.gone(previous)

    async def follow_ip(self, uid: str) -> None:
        """A served pod's IP changed: serve it at the new one."""
        served, ip = self.served.get(uid), self.latest_ip.get(uid)
        if served is None or ip is None or served.supervisor.pod.ip == ip:
            return
        old = served.supervisor.pod.ip
        self.ledger.ip_changes += 1
        print(f"warm-sim: pod {served.supervisor.pod.name} moved from {old} to {ip}", flush=True)
        if self.by_ip.get(old) == uid:
            del self.by_ip[old]
        await self._free(ip, served.supervisor.pod.name)
        try:
            await served.move(ip)
        except OSError as exc:
            print(f"warm-sim: cannot serve pod {served.supervisor.pod.name} at {ip}: {exc}", flush=True)
            return
        self.by_ip[ip] = uid

    async def gone(self, uid: str) -> None:
        """The pod is deleted or ended: stop serving it."""
        if uid in self.done and uid not in self.served:
            return
        self.done.add(uid)
        served = self.served.pop(uid, None)
        if served is None:
            return
        self.ledger.pods_gone += 1
        ip = served.supervisor.pod.ip
        if self.by_ip.get(ip) == uid:
            del self.by_ip[ip]
        self.former_keys[ip] = [*self.former_keys[ip][-7:], served.supervisor.key]
        await served.close()

    async def end_pod(self, supervisor: Supervisor, why: str, message: str) -> None:
        """What the kubelet writes when the pod's containers have ended: the pod's status."""
        pod = supervisor.pod
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        statuses = []
        for name, image in pod.containers:
            terminated: dict[str, Any] = {
                "exitCode": 0,
                "reason": "Completed",
                "startedAt": now,
                "finishedAt": now,
            }
            if name == REPORTER_CONTAINER:
                terminated["message"] = message
            statuses.append(
                {
                    "name": name,
                    "image": image,
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"terminated": terminated},
                }
            )
        conditions = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
            {
                "type": "ContainersReady",
                "status": "False",
                "reason": "PodCompleted",
                "lastTransitionTime": now,
            },
        ]
        patch = {"status": {"phase": "Succeeded", "conditions": conditions, "containerStatuses": statuses}}
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
        headers = {"Content-Type": "application/merge-patch+json"}
        try:
            async with self.session().patch(path, data=json.dumps(patch), headers=headers) as resp:
                if resp.status == 200:
                    self.ledger.pods_ended[why] += 1
                else:
                    self.ledger.end_failures += 1
                    print(f"warm-sim: ending pod {pod.name}: {resp.status} {await resp.text()}", flush=True)
        except aiohttp.ClientError as exc:
            self.ledger.end_failures += 1
            print(f"warm-sim: ending pod {pod.name}: {exc}", flush=True)
        await self.gone(pod.uid)


class _Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


async def _stats_server(ledger: Ledger, port: int) -> web.AppRunner:
    async def stats(_request: web.Request) -> web.Response:
        return web.json_response(ledger.snapshot())

    app = web.Application()
    app.router.add_get("/stats", stats)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def run(plane_home: Path, namespace: str, stats_port: int, out: Path | None) -> None:
    plane = ControlPlane(plane_home, Path("/nonexistent"))
    simulator = Simulator(plane, namespace)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = await _stats_server(simulator.ledger, stats_port)
    version = await simulator.list_pods()
    watch = asyncio.create_task(simulator.watch(version))
    print(
        f"{READY_LINE}: serving the warm pods of namespace {namespace}; stats on 127.0.0.1:{stats_port}",
        flush=True,
    )
    await stop.wait()
    watch.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watch
    if out is not None:
        out.write_text(json.dumps(simulator.ledger.snapshot()))
    await simulator.close()
    await runner.cleanup()


class WarmSimProcess(GroupProcess):
    """The simulator as a process of the benchmark or test (`start`, `stats`, `stop`): the warm pods
    of `namespace` on the plane kept under `plane_home`."""

    ready_text = READY_LINE
    what = "simulated warm supervisor"

    def __init__(self, plane_home: Path, namespace: str, log_dir: Path) -> None:
        super().__init__(log_dir / "warm-sim.log")
        self.plane_home = plane_home
        self.namespace = namespace
        self.out = log_dir / "warm-sim.json"
        self.stats_port = 0

    def start(self) -> WarmSimProcess:
        self.stats_port = processes.free_port()
        argv = [
            sys.executable,
            "-m",
            "tests.bench.warm_sim",
            f"--plane={self.plane_home}",
            f"--namespace={self.namespace}",
            f"--stats-port={self.stats_port}",
            f"--out={self.out}",
        ]
        paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        self._spawn(argv, dict(os.environ, PYTHONPATH=os.pathsep.join(paths)), timeout=120)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stats(self) -> dict[str, Any]:
        """What it saw so far (`Ledger.snapshot`)."""
        url = f"http://127.0.0.1:{self.stats_port}/stats"
        with urllib.request.urlopen(url, timeout=60) as resp:
            return dict(json.loads(resp.read()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.bench.warm_sim", description=__doc__.split("\n\n")[0])
    ap.add_argument("--plane", type=Path, required=True, help="the control plane's home (its PKI and ports)")
    ap.add_argument("--namespace", default="bench", help="the namespace whose warm pods to serve")
    ap.add_argument("--stats-port", type=int, required=True, help="GET /stats on 127.0.0.1:PORT")
    ap.add_argument("--out", type=Path, default=None, help="write the stats here when stopped")
    args = ap.parse_args(argv)
    asyncio.run(run(args.plane, args.namespace, args.stats_port, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
