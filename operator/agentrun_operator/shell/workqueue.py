"""A deduplicating work queue: one reconcile at a time per AgentRun, level-triggered.

Watch events for a run, its Jobs and its Pods all collapse into one key; a key enqueued while it is
being reconciled is reconciled once more afterwards (never concurrently), so there is exactly one
writer of each run's status in this process. Delayed requeues keep only the earliest deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

Key = tuple[str, str]  # (namespace, name)
Reconcile = Callable[[Key], Awaitable[float | None]]

log = logging.getLogger("agentrun.queue")


class WorkQueue:
    def __init__(self, reconcile: Reconcile, workers: int = 8, ready: asyncio.Event | None = None) -> None:
        self._reconcile = reconcile
        self._ready = ready  # workers wait for it: keys may be queued before the cache is complete
        self._workers = workers
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._active: set[Key] = set()
        self._dirty: set[Key] = set()
        self._timers: dict[Key, tuple[float, asyncio.TimerHandle]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for i in range(self._workers):
            self._tasks.append(asyncio.create_task(self._work(), name=f"agentrun-worker-{i}"))

    async def stop(self) -> None:
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def enqueue(self, key: Key) -> None:
        if key in self._active:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._queue.put_nowait(key)

    def enqueue_after(self, key: Key, seconds: float) -> None:
        """Reconcile `key` after `seconds` (an earlier pending deadline wins)."""
        if seconds <= 0:
            self.enqueue(key)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        current = self._timers.get(key)
        if current is not None:
            if current[0] <= deadline:
                return
            current[1].cancel()

        def fire() -> None:
            self._timers.pop(key, None)
            self.enqueue(key)

        self._timers[key] = (deadline, loop.call_at(deadline, fire))

    def idle(self) -> bool:
        return not self._queued and not self._active

    async def _work(self) -> None:
        if self._ready is not None:
            await self._ready.wait()
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active.add(key)
            delay: float | None = None
            try:
                delay = await self._reconcile(key)
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed reconcile is retried, never fatal to the operator
                log.exception("reconcile failed", extra={"run": f"{key[0]}/{key[1]}"})
                delay = 2.0
            finally:
                self._active.discard(key)
                self._queue.task_done()
            if key in self._dirty:
                self._dirty.discard(key)
                self.enqueue(key)
            elif delay is not None:
                self.enqueue_after(key, delay)
