"""A plain-HTTP proxy in front of the real API server that can delay or drop watch events.

The operator is pointed at it with its own kubeconfig; every request is forwarded as the admin user.
Watch streams (`?watch=...`) are relayed line by line through a policy the test sets per resource
plural (`jobs`, `pods`, `agentruns`): delay each event by some seconds, drop the events a predicate
picks, send other text in an event's place (`rewrite`: bad input), or keep the first streams open
without sending anything (`silent_streams`); `end_streams` closes a kind's open streams, as a load
balancer or a restarted API server would, and the policy keeps each ERROR event the API server sent
(`errors`: e.g. its 410 Gone) and counts the streams the API server ended (`ended`: e.g. at their
`timeoutSeconds`). That is how the tests make a watch lag, lose events or go wrong against real
parts. Every other request is forwarded as it is and noted in `requests`.

`hold` keeps one request from the API server until the test releases it (forwarded then, or
dropped): a write the operator is in the middle of (the test can kill the operator while it waits
for the answer), or a watch about to be resumed (the test can change objects while no watch is
open). The test waits for the request to arrive (`Hold.arrived`), never for a while.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import ClientError, ClientResponse, ClientSession, ClientTimeout, TCPConnector, web

from agentrun_devcluster import processes
from agentrun_devcluster.controlplane import ControlPlane


@dataclass
class StreamPolicy:
    delay_seconds: float = 0.0
    drop: Callable[[dict[str, Any]], bool] | None = None  # given the watch event; True drops it
    # Given the event's line (with its newline), the lines to send instead; None sends it as it is.
    rewrite: Callable[[bytes], list[bytes] | None] | None = None
    rewritten: int = 0
    silent_streams: int = 0  # this many streams, the first ones opened, send nothing at all
    errors: list[dict[str, Any]] = field(default_factory=list)  # the object of each ERROR event sent
    dropped: int = 0
    relayed: int = 0
    streams: int = 0  # watch streams opened under this policy
    ended: int = 0  # streams the API server ended (its timeoutSeconds, say), not `end_streams`
    delivered: list[tuple[str, str]] = field(default_factory=list)  # (type, name) of each event relayed


@dataclass(frozen=True)
class Call:
    """A request as it reached the proxy."""

    method: str
    path: str
    query: Mapping[str, str]
    body: bytes

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in ("1", "true", "True")

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class Hold:
    """The first request matching `matches` after the hold is set: kept from the API server until
    `release` (then forwarded as it is, or dropped: answered 503 without reaching the server)."""

    def __init__(self, matches: Callable[[Call], bool], loop: asyncio.AbstractEventLoop) -> None:
        self.matches = matches
        self.call: Call | None = None  # the request held, once it arrived
        self.arrived = threading.Event()
        self.forward = True
        self._loop = loop
        self._released = asyncio.Event()  # set on the proxy's loop only

    def release(self, forward: bool = True) -> None:
        self.forward = forward
        self._loop.call_soon_threadsafe(self._released.set)

    async def keep(self, call: Call) -> bool:
        """Hold `call` until released; whether to forward it."""
        self.call = call
        self.arrived.set()
        await self._released.wait()
        return self.forward


def _plural(path: str) -> str:
    parts = [p for p in path.split("/") if p]
    return parts[-1] if parts else ""


@dataclass
class WatchProxy:
    plane: ControlPlane
    home: Path
    policies: dict[str, StreamPolicy] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path) of every non-watch call
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None
    _session: ClientSession | None = None
    _open: dict[str, set[ClientResponse]] = field(default_factory=dict)  # open upstream watches by plural
    _holds: list[Hold] = field(default_factory=list)  # set and not taken yet (the proxy's loop's)
    _ending: set[ClientResponse] = field(default_factory=set)  # being closed by `end_streams`

    @property
    def kubeconfig(self) -> Path:
        return self.home / "proxy-kubeconfig"

    def start(self) -> WatchProxy:
        self.port = processes.free_port()
        self.home.mkdir(parents=True, exist_ok=True)
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "proxy", "user": {"token": "proxy"}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
            "current-context": "proxy",
        }
        self.kubeconfig.write_text(yaml.safe_dump(doc))
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), daemon=True, name="watch-proxy")
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("watch proxy did not start")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is not None:
            # Open watch streams hold the runner's cleanup; the loop is stopped regardless.
            with contextlib.suppress(concurrent.futures.TimeoutError):
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def hold(self, matches: Callable[[Call], bool]) -> Hold:
        """Keep the next request that `matches` (a watch or any other) from the API server until the
        returned hold is released; requests that do not match go on meanwhile."""
        loop = self._loop
        assert loop is not None

        async def add() -> Hold:
            hold = Hold(matches, loop)
            self._holds.append(hold)
            return hold

        return asyncio.run_coroutine_threadsafe(add(), loop).result(timeout=10)

    def end_streams(self, plural: str) -> int:
        """Close every open watch stream of `plural` (its clients see the stream end and watch
        again); returns how many were open."""
        assert self._loop is not None

        async def end() -> int:
            streams = list(self._open.get(plural, ()))
            for upstream in streams:
                self._ending.add(upstream)
                upstream.close()
            return len(streams)

        return asyncio.run_coroutine_threadsafe(end(), self._loop).result(timeout=10)

    def _serve(self, started: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        loop.run_until_complete(self._startup())
        started.set()
        loop.run_forever()
        # Handlers still relaying a watch are cancelled and run to their end here: closing the loop
        # under them would leave coroutines that fail when collected ("Event loop is closed").
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()

    async def _startup(self) -> None:
        ctx: ssl.SSLContext = self.plane._client_ssl()
        self._session = ClientSession(
            connector=TCPConnector(ssl=ctx, limit=0), timeout=ClientTimeout(total=None)
        )
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "authorization")}
        body = await request.read()
        url = self.plane.server + request.path_qs
        call = Call(request.method, request.path, dict(request.query), body)
        watching = call.watch
        if not watching:
            self.requests.append((request.method, request.path))
        hold = next((h for h in self._holds if h.matches(call)), None)
        if hold is not None:
            self._holds.remove(hold)
            if not await hold.keep(call):
                return web.Response(status=503, text="dropped by the test's watch proxy")
        async with self._session.request(request.method, url, headers=headers, data=body or None) as upstream:
            if not watching:
                payload = await upstream.read()
                return web.Response(
                    status=upstream.status,
                    body=payload,
                    headers={"Content-Type": upstream.headers.get("Content-Type", "application/json")},
                )
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.headers.get("Content-Type", "application/json").split(";")[0]
            await response.prepare(request)
            plural = _plural(request.path)
            policy = self.policies.get(plural)
            if policy is not None:
                policy.streams += 1
                if policy.streams <= policy.silent_streams:
                    await asyncio.sleep(3600)  # a stream that goes silent: the client gives up on it
            # Each event is held until `delay_seconds` after it arrived (a lag, not a backlog).
            lines: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
            loop = asyncio.get_running_loop()

            async def read() -> None:
                try:
                    async for line in upstream.content:
                        await lines.put((loop.time(), line))
                    if policy is not None and upstream not in self._ending:
                        policy.ended += 1  # the API server ended it
                except ClientError:  # closed by `end_streams`
                    pass
                finally:
                    await lines.put(None)

            self._open.setdefault(plural, set()).add(upstream)
            reader = asyncio.create_task(read())
            try:
                while (item := await lines.get()) is not None:
                    received, line = item
                    if policy is not None:
                        event = json.loads(line)
                        if event.get("type") == "ERROR":
                            policy.errors.append(event.get("object") or {})
                        if policy.drop is not None and policy.drop(event):
                            policy.dropped += 1
                            continue
                        wait = received + policy.delay_seconds - loop.time()
                        if wait > 0:
                            await asyncio.sleep(wait)
                        policy.relayed += 1
                        policy.delivered.append(
                            (
                                str(event.get("type")),
                                str(((event.get("object") or {}).get("metadata") or {}).get("name")),
                            )
                        )
                        instead = policy.rewrite(line) if policy.rewrite is not None else None
                        if instead is not None:
                            policy.rewritten += 1
                            for other in instead:
                                await response.write(other)
                            continue
                    await response.write(line)
            finally:
                reader.cancel()
                self._open[plural].discard(upstream)
                self._ending.discard(upstream)
            return response
