"""A small informer: LIST, then WATCH from the list's resourceVersion, into the watch cache.

Jobs and Pods are watched without kopf (docs/design.md#handlers): an iteration causes some five pod
events (created, bound, started, finished, its Job's finalizer removed) and about as many Job events
(created, started, ready, completed, TTL set), and in the profile kopf's per-event machinery — a
worker per object, handler bookkeeping, its logging — cost more than everything the operator does
with them. AgentRuns, about one event an iteration, come through kopf (shell/handlers.py).
Here an event costs one JSON decode of the whole object (shell/codec.py: no field is cut, nothing
depends on the order the server writes fields in) and one cache update; the run is enqueued only
when what its planner sees changed.

Restart safety is the cache's (shell/cache.py): the work queue waits until the first LIST is in the
cache. A watch that ends (its timeout, a broken or silent connection) is resumed from the last
resourceVersion it delivered (bookmarks included), as client-go's reflector does: the API server
replays every change since, so nothing in between is missed, and no periodic LIST of every pod is
decoded. When it no longer has that version (410 Gone) or refuses the watch, a fresh LIST is merged
into the cache instead.

Bad input (docs/design.md#watch-path): a line that is not JSON ends the watch, which resumes from the
last version delivered, so the API server sends the event again (a cut line comes whole); an event of
another shape than `{"type", "object"}` is skipped with a warning; an object lacking fields is read
as having none (every reader reads with defaults, shell/observe.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from aiohttp import ClientTimeout

from agentrun_operator.shell import metrics
from agentrun_operator.shell.cache import Key, RunCache
from agentrun_operator.shell.codec import decode_json
from agentrun_operator.shell.kube import Kube, KubeError
from agentrun_operator.shell.observe import resource_version

log = logging.getLogger("agentrun.informer")

WATCH_SECONDS = 270  # renewed before load balancers cut an idle stream
SILENT_SECONDS = 70  # a stream silent this long is taken for dead (as kopf's): list again
RETRY_SECONDS = 1.0
FORBIDDEN_RETRY_SECONDS = 300.0  # an optional kind the operator may not list: try again this seldom


class Fed(Protocol):
    """What an informer keeps in line: a `Store` (cache.py), or the volume Events' (volume_waits.py).
    Each call answers the run key to re-plan, if any; `clock` is taken before a LIST is sent."""

    def upsert(self, obj: dict[str, Any]) -> Key | None: ...

    def delete(self, obj: dict[str, Any]) -> Key | None: ...

    def ending(self, obj: dict[str, Any]) -> bool:
        """Whether the object just taken in ends an attempt (a turnaround, shell/workqueue.py)."""
        ...

    def clock(self) -> int: ...

    def relist(
        self, items: Iterable[dict[str, Any]], since: int, namespaces: set[str] | None
    ) -> set[Key]: ...


class Informer:
    """Keeps `store` in line with one kind's objects in the watched namespaces."""

    def __init__(
        self,
        kube: Kube,
        cache: RunCache,
        store: Fed,
        prefix: str,
        plural: str,
        selector: str | None,
        namespaces: tuple[str, ...],
        on_change: Callable[[Key, bool], None],
        optional: bool = False,
        unlisted: str = "reading them per reconcile",
        fields: str | None = None,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.store = store
        self.prefix = prefix
        self.plural = plural
        self.selector = selector
        self.fields = fields  # a field selector (Events: `involvedObject.kind=Pod,reason=FailedMount`)
        self.scopes: list[str | None] = list(namespaces) or [None]
        self.on_change = on_change  # (run key, whether the change ends an attempt: `Fed.ending`)
        # An optional kind (what runs refer to) is also read with a GET on a cache miss: when the
        # operator may not list it (RBAC from before it was watched), the cache stays empty and
        # every read falls back to GET, as before; its gate opens anyway.
        self.optional = optional
        self.unlisted = unlisted  # what the operator does instead, for the warning
        self.gate = f"informer:{plural}" + (f"?{fields}" if fields else "")
        self._listed: set[str | None] = set()
        # Per scope, the resourceVersion the next watch resumes from (absent: LIST first).
        self._resume: dict[str | None, str] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._received_at = time.monotonic()  # the last LIST, watch response or event
        cache.add_gate(self.gate)

    def silent_for(self, now: float) -> float | None:
        """Seconds since the API server last answered this informer; None once a task of it has
        died (shell/health.py)."""
        if any(task.done() for task in self._tasks):
            return None
        return max(now - self._received_at, 0.0)

    def start(self) -> None:
        self._received_at = time.monotonic()
        for scope in self.scopes:
            self._tasks.append(asyncio.create_task(self._run(scope), name=f"informer-{self.plural}-{scope}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _run(self, scope: str | None) -> None:
        while True:
            try:
                resume = self._resume.pop(scope, None)
                await self._watch(scope, await self._list(scope) if resume is None else resume)
            except asyncio.CancelledError:
                raise
            except KubeError as exc:
                if self.optional and exc.status in (403, 404):
                    log.warning(
                        "cannot list %s (grant list and watch on them); %s: %s",
                        self.plural,
                        self.unlisted,
                        exc,
                    )
                    self._mark_listed(scope)
                    await asyncio.sleep(FORBIDDEN_RETRY_SECONDS)
                else:
                    log.warning("%s watch interrupted, listing again: %s", self.plural, exc)
                    await asyncio.sleep(RETRY_SECONDS)
            except Exception as exc:  # a broken, silent or garbled stream: resume after a pause, never die
                log.warning("%s watch interrupted, resuming: %s", self.plural, exc)
                await asyncio.sleep(RETRY_SECONDS)

    async def _list(self, scope: str | None) -> str | None:
        since = self.store.clock()
        items, version = await self.kube.list_with_version(
            self.prefix, self.plural, scope, self.selector, fields=self.fields
        )
        self._received_at = time.monotonic()
        for key in self.store.relist(items, since, {scope} if scope else None):
            self.on_change(key, False)  # a change the watch missed: no turnaround to hurry
        self._mark_listed(scope)
        return version

    def _mark_listed(self, scope: str | None) -> None:
        if scope not in self._listed:
            self._listed.add(scope)
            if len(self._listed) == len(self.scopes):
                self.cache.open_gate(self.gate)

    async def _watch(self, scope: str | None, version: str | None) -> None:
        path = f"{self.prefix}/namespaces/{scope}/{self.plural}" if scope else f"{self.prefix}/{self.plural}"
        query = {"watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": str(WATCH_SECONDS)}
        if self.selector:
            query["labelSelector"] = self.selector
        if self.fields:
            query["fieldSelector"] = self.fields
        if version is not None:
            query["resourceVersion"] = version
            self._resume[scope] = version
        metrics.api_request("WATCH", self.plural)
        raw = await self.kube.send(
            "GET",
            path,
            query,
            {"Accept": "application/json"},
            timeout=ClientTimeout(total=WATCH_SECONDS + 30, sock_connect=10, sock_read=SILENT_SECONDS),
        )
        try:
            if raw.status != 200:
                self._resume.pop(scope, None)  # e.g. 410 Gone: list afresh
                raise RuntimeError(f"watch {self.plural}: HTTP {raw.status}")
            self._received_at = time.monotonic()
            # One event per line. Lines are split here from whatever arrived, not read with
            # `readline`, whose per-line bookkeeping cost more than a third of a small event's decoding.
            rest = b""
            async for chunk in raw.content.iter_any():
                self._received_at = time.monotonic()
                lines = (rest + chunk if rest else chunk).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    if line and not self._event(scope, line):
                        return
            if rest:
                self._event(scope, rest)
        finally:
            raw.release()

    def _event(self, scope: str | None, line: bytes) -> bool:
        """Apply one watch event to the cache; False when the watch must end (an ERROR event). Text
        that is not JSON raises ValueError: the watch ends and resumes (`_run`)."""
        event = decode_json(line)
        kind = event.get("type") if isinstance(event, dict) else None
        obj = event.get("object") if isinstance(event, dict) else None
        if kind not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR") or not isinstance(obj, dict):
            log.warning("%s watch: skipped an event of unknown shape: %.200s", self.plural, line)
            return True
        if kind == "ERROR":  # e.g. 410 Gone: our version is too old; list afresh
            self._resume.pop(scope, None)
            log.info("%s watch ended: %s", self.plural, obj.get("message"))
            return False
        version = resource_version(obj)
        if version is not None:
            self._resume[scope] = version
        if kind == "BOOKMARK":
            return True
        deleted = kind == "DELETED"
        key = self.store.delete(obj) if deleted else self.store.upsert(obj)
        if key is not None:
            self.on_change(key, not deleted and self.store.ending(obj))
        return True
