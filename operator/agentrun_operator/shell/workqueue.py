"""A deduplicating work queue: one reconcile at a time per AgentRun, level-triggered.

Watch events for a run, its Jobs and its Pods all collapse into one key; a key enqueued while it is
being reconciled is reconciled once more afterwards (never concurrently), so there is exactly one
writer of each run's status in this process. Delayed requeues keep only the earliest deadline.

Keys wait in one of three lanes, and a worker takes a key from a lane only when the lanes before it
are empty (docs/operator.md#reconcile, "Turnarounds first"):
- `turnaround`: a watch event that stops a run's pod or fails its Job (`Store.ending`). The
  reconcile it asks for records the iteration and creates the next Job: the latency a user waits on.
- `front`: every other watch event and every timer.
- `background`: the periodic resync, so a resync of many idle runs never delays an iteration.
A key asked for again in an earlier lane moves up; a key asked for while it is being reconciled is
reconciled once more afterwards, in the earliest lane it was asked for meanwhile.

A reconcile that raises (the API server is down, slow or answered 5xx; a watch is reconnecting) is
retried per key with exponential backoff and jitter (`retry_delay`): no hot loop against a failing
API server, no thundering herd of every run at once when it comes back. A success resets the count.

The golden signals (docs/operator.md#metrics) are taken at the queue's boundary only: depth by lane
as keys enter and leave it, the wait from a key's entry to its reconcile starting, busy workers.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Final

from agentrun_operator.shell import metrics

Key = tuple[str, str]  # (namespace, name)
Reconcile = Callable[[Key], Awaitable[float | None]]

log = logging.getLogger("agentrun.queue")

TURNAROUND: Final = 0
FRONT: Final = 1
BACKGROUND: Final = 2
LANE_NAMES: Final = ("turnaround", "front", "background")  # the `lane` label of the queue's metrics

RETRY_BASE_SECONDS: Final = 1.0
RETRY_MAX_SECONDS: Final = 60.0


def retry_delay(failures: int, rng: random.Random | None = None) -> float:
    """Seconds before the retry after `failures` consecutive failed reconciles of one key.

    Exponential (1 s, 2 s, 4 s, … capped at 60 s) with "equal jitter": a uniform draw from the upper
    half of that step, so retries of many runs spread out but never come sooner than half the step.
    """
    step = min(RETRY_MAX_SECONDS, RETRY_BASE_SECONDS * 2.0 ** max(failures - 1, 0))
    return step / 2 + (rng or random).uniform(0.0, step / 2)


class WorkQueue:
    def __init__(
        self,
        reconcile: Reconcile,
        workers: int = 8,
        ready: asyncio.Event | None = None,
        serving: asyncio.Event | None = None,
    ) -> None:
        self._reconcile = reconcile
        self._ready = ready  # workers wait for it: keys may be queued before the cache is complete
        # Workers also wait for it before each key (a standby replica, shell/peering.py): the key
        # stays queued meanwhile, so events for it still collapse into it.
        self._serving = serving
        self._workers = workers
        # (lane, sequence, key): lane 0 first, then in order; an entry whose key has been taken or
        # moved to an earlier lane since is skipped.
        self._queue: asyncio.PriorityQueue[tuple[int, int, Key]] = asyncio.PriorityQueue()
        self._queued: dict[Key, int] = {}  # key -> its lane
        self._sequence = 0
        self._active: set[Key] = set()
        self._dirty: dict[Key, int] = {}  # asked for during its reconcile -> the earliest lane asked
        self._timers: dict[Key, tuple[float, asyncio.TimerHandle]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._failures: dict[Key, int] = {}
        self._progress_at = time.monotonic()  # a reconcile finished, or work arrived at an idle queue
        self._enqueued_at: dict[Key, float] = {}  # when a queued key entered the queue (any lane)
        self._depth = [metrics.QUEUE_DEPTH.labels(lane=name) for name in LANE_NAMES]
        self._waited = [metrics.QUEUE_SECONDS.labels(lane=name) for name in LANE_NAMES]
        for gauge in self._depth:
            gauge.set(0)

    def stalled_for(self, now: float) -> float | None:
        """Seconds keys have waited while no reconcile finished (0 while idle, paused or not yet
        ready); None when a worker has died (shell/health.py)."""
        if any(task.done() for task in self._tasks):
            return None
        paused = self._serving is not None and not self._serving.is_set()
        unready = self._ready is not None and not self._ready.is_set()
        if not self._queued or paused or unready:
            return 0.0
        return max(now - self._progress_at, 0.0)

    def start(self) -> None:
        metrics.QUEUE_WORKERS.set(self._workers)
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

    def enqueue(self, key: Key, lane: int = FRONT) -> None:
        """Reconcile `key` soon, once the lanes before `lane` are empty."""
        if key in self._active:
            self._dirty[key] = min(lane, self._dirty.get(key, lane))
            return
        if not self._queued and not self._active:
            self._progress_at = time.monotonic()  # the wait starts now, not at the last reconcile
        if key in self._queued and self._queued[key] <= lane:
            return
        if key in self._queued:
            self._depth[self._queued[key]].dec()  # moved to an earlier lane
        self._depth[lane].inc()
        self._enqueued_at.setdefault(key, time.monotonic())
        self._queued[key] = lane
        self._sequence += 1
        self._queue.put_nowait((lane, self._sequence, key))

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

    async def _work(self) -> None:
        if self._ready is not None:
            await self._ready.wait()
        while True:
            lane, _, key = await self._queue.get()
            if self._serving is not None and not self._serving.is_set():
                await self._serving.wait()
                self._progress_at = time.monotonic()  # resumed: the wait starts now
            if self._queued.get(key) != lane:  # taken already, or moved to an earlier lane
                self._queue.task_done()
                continue
            del self._queued[key]
            self._depth[lane].dec()
            self._waited[lane].observe(time.monotonic() - self._enqueued_at.pop(key))
            self._active.add(key)
            metrics.QUEUE_BUSY.inc()
            delay: float | None = None
            failed = False
            try:
                delay = await self._reconcile(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed reconcile is retried with backoff, never fatal
                failed = True
                metrics.RECONCILE_ERRORS.inc()
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                delay = retry_delay(failures)
                log.warning(
                    "reconcile failed; retrying with backoff",
                    exc_info=failures == 1,  # the traceback once; then one line per retry
                    extra={
                        "run": f"{key[0]}/{key[1]}",
                        "error": f"{type(exc).__name__}: {exc}"[:500],
                        "failures": failures,
                        "retry_in_seconds": round(delay, 2),
                    },
                )
            else:
                self._failures.pop(key, None)
            finally:
                self._active.discard(key)
                metrics.QUEUE_BUSY.dec()
                self._queue.task_done()
                self._progress_at = time.monotonic()
            asked = self._dirty.pop(key, None)
            if asked is not None and not failed:  # a failure waits out its backoff regardless
                self.enqueue(key, asked)
            elif delay is not None:
                self.enqueue_after(key, delay)
