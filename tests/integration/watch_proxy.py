"""A plain-HTTP proxy in front of the real API server that can delay or drop watch events.

The operator is pointed at it with its own kubeconfig; every request is forwarded as the admin user.
Watch streams (`?watch=...`) are relayed line by line through a policy the test sets per resource
plural (`jobs`, `pods`, `agentruns`): delay each event by some seconds, drop the events a predicate
picks, send other text in an event's place (`rewrite`: bad input), or keep the first streams open
without sending anything (`silent_streams`); `end_streams` closes a kind's open streams, as a load
balancer or a restarted API server would, and the policy keeps each ERROR event the API server sent
(`errors`: e.g. its 410 Gone). That is how the tests make a watch lag, lose events or go wrong
against real parts. Every other request is forwarded as it is and noted in `requests`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import ssl
import threading
from collections.abc import Callable
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

    def end_streams(self, plural: str) -> int:
        """Close every open watch stream of `plural` (its clients see the stream end and watch
        again); returns how many were open."""
        assert self._loop is not None

        async def end() -> int:
            streams = list(self._open.get(plural, ()))
            for upstream in streams:
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
        watching = request.query.get("watch") in ("1", "true", "True")
        if not watching:
            self.requests.append((request.method, request.path))
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
            return response
