"""The work queue: one reconcile at a time per key, coalescing, delayed requeue, failures retried."""

from __future__ import annotations

import asyncio
import random

from agentrun_operator.shell.workqueue import (
    BACKGROUND,
    FRONT,
    RETRY_BASE_SECONDS,
    RETRY_MAX_SECONDS,
    TURNAROUND,
    Key,
    WorkQueue,
    retry_delay,
)
from tests.support.polling import until


def idle(queue: WorkQueue) -> bool:
    """Nothing queued and nothing being reconciled (the queue's own bookkeeping)."""
    return not queue._queued and not queue._active


def test_never_two_reconciles_of_one_key_and_events_meanwhile_coalesce() -> None:
    async def scenario() -> tuple[int, int]:
        running: set[Key] = set()
        overlaps = 0
        calls = 0
        gate = asyncio.Event()

        async def reconcile(key: Key) -> float | None:
            nonlocal overlaps, calls
            calls += 1
            if key in running:
                overlaps += 1
            running.add(key)
            await gate.wait()
            running.discard(key)
            return None

        queue = WorkQueue(reconcile, workers=4)
        queue.start()
        key = ("ns", "run")
        queue.enqueue(key)
        await until(lambda: calls == 1)
        for _ in range(10):  # ten events while the first reconcile runs
            queue.enqueue(key)
        gate.set()
        await until(lambda: idle(queue))
        await queue.stop()
        return overlaps, calls

    overlaps, calls = asyncio.run(scenario())
    assert overlaps == 0
    assert calls == 2  # the running one, then exactly one more for everything that came meanwhile


def test_requeue_after_and_failure_retry() -> None:
    """Each reconcile's start is timed: a requeue or retry comes no sooner than its delay (a lower
    bound holds on any machine; how much later is the machine's business)."""

    async def scenario() -> tuple[dict[str, list[float]], bool]:
        loop = asyncio.get_running_loop()
        seen: dict[str, list[float]] = {}

        async def reconcile(key: Key) -> float | None:
            starts = seen.setdefault(key[1], [])
            starts.append(loop.time())
            if key[1] == "boom" and len(starts) == 1:
                raise RuntimeError("transient")
            if key[1] == "later" and len(starts) == 1:
                return 0.05
            return None

        def count(name: str) -> int:
            return len(seen.get(name, []))

        queue = WorkQueue(reconcile, workers=2)
        queue.start()
        queue.enqueue(("ns", "later"))
        queue.enqueue(("ns", "boom"))
        await until(lambda: count("later") == 2 and count("boom") == 2)
        # an earlier deadline wins over a later one: x comes long before 10 s, and only once
        queue.enqueue_after(("ns", "x"), 10)
        queue.enqueue_after(("ns", "x"), 0.01)
        await until(lambda: count("x") == 1 and idle(queue), timeout=5)
        later_timer_left = ("ns", "x") in queue._timers
        await queue.stop()
        return seen, later_timer_left

    seen, later_timer_left = asyncio.run(scenario())
    assert len(seen["later"]) == 2 and seen["later"][1] - seen["later"][0] >= 0.05
    assert len(seen["boom"]) == 2 and seen["boom"][1] - seen["boom"][0] >= RETRY_BASE_SECONDS / 2
    assert len(seen["x"]) == 1 and not later_timer_left


def test_retry_delay_grows_exponentially_with_jitter_and_a_cap() -> None:
    rng = random.Random(12)
    for failures in range(1, 12):
        step = min(RETRY_MAX_SECONDS, RETRY_BASE_SECONDS * 2 ** (failures - 1))
        delays = [retry_delay(failures, rng) for _ in range(200)]
        assert all(step / 2 <= d <= step for d in delays)
        assert len(set(delays)) > 100  # jittered: retries of many runs spread out
    assert retry_delay(50, rng) <= RETRY_MAX_SECONDS
    assert retry_delay(1, random.Random(3)) == retry_delay(1, random.Random(3))


def test_failing_key_backs_off_and_events_do_not_bypass_it() -> None:
    """A reconcile that keeps failing is not retried at once, even when events for it arrive while it
    runs (the hot loop the local default showed); the pending retry is at least half a step away."""

    async def scenario() -> tuple[int, float, float]:
        calls = 0
        gate = asyncio.Event()

        async def reconcile(key: Key) -> float | None:
            nonlocal calls
            calls += 1
            await gate.wait()
            raise RuntimeError("HTTP 503")

        queue = WorkQueue(reconcile, workers=2)
        queue.start()
        key = ("ns", "run")
        queue.enqueue(key)
        await until(lambda: calls == 1)
        queue.enqueue(key)  # an event while the failing reconcile runs
        loop = asyncio.get_running_loop()
        failed_at = loop.time()
        gate.set()
        await until(lambda: key in queue._timers)  # the failure handled: its retry scheduled
        deadline = queue._timers[key][0]
        calls_before_the_retry = calls
        await queue.stop()
        return calls_before_the_retry, deadline - failed_at, float(queue._failures[key])

    calls, wait, failures = asyncio.run(scenario())
    assert calls == 1
    assert wait >= RETRY_BASE_SECONDS / 2
    assert failures == 1


def _order_after_first(asks: list[tuple[str, int]]) -> list[str]:
    """The order one worker reconciles keys in, when `asks` ((name, lane), in order) come while it is
    busy with the key "first"; "first" may be among them (asked for during its own reconcile)."""

    async def scenario() -> list[str]:
        order: list[str] = []
        gate = asyncio.Event()

        async def reconcile(key: Key) -> float | None:
            if key[1] == "first" and not order:
                await gate.wait()
            order.append(key[1])
            return None

        queue = WorkQueue(reconcile, workers=1)
        queue.start()
        queue.enqueue(("ns", "first"))
        await until(lambda: ("ns", "first") in queue._active)  # the one worker is busy with "first"
        for name, lane in asks:
            queue.enqueue(("ns", name), lane)
        gate.set()
        await until(lambda: idle(queue))
        await queue.stop()
        return order

    return asyncio.run(scenario())


def test_background_keys_wait_for_the_front_lane_and_an_event_moves_one_forward() -> None:
    """The resync's keys (background) are reconciled only when no event-driven key waits."""
    asks = [
        ("idle-1", BACKGROUND),
        ("idle-2", BACKGROUND),
        ("moved", BACKGROUND),
        ("event", FRONT),
        ("moved", FRONT),  # an event for a run the resync had queued
        ("event", BACKGROUND),  # already waiting in front: stays there
    ]
    assert _order_after_first(asks) == ["first", "event", "moved", "idle-1", "idle-2"]


def test_turnaround_keys_go_before_the_front_lane_also_when_asked_for_during_their_reconcile() -> None:
    """A pod that stopped (a turnaround) is reconciled before other events' keys, also one asked for
    in the front lane first; a key asked for during its own reconcile keeps the earliest lane it was
    asked for."""
    asks = [
        ("event", FRONT),
        ("idle", BACKGROUND),
        ("ended", FRONT),
        ("ended", TURNAROUND),  # its pod stopped: moves up
        ("first", FRONT),
        ("first", TURNAROUND),  # asked for twice during its reconcile: once more, as a turnaround
        ("first", BACKGROUND),
    ]
    assert _order_after_first(asks) == ["first", "ended", "first", "event", "idle"]


def test_a_standby_reconciles_nothing_and_its_queued_keys_run_once_it_serves() -> None:
    async def scenario() -> tuple[list[Key], list[Key]]:
        done: list[Key] = []

        async def reconcile(key: Key) -> float | None:
            done.append(key)
            return None

        serving = asyncio.Event()
        queue = WorkQueue(reconcile, workers=2, serving=serving)
        queue.start()
        keys = [("ns", f"r{i}") for i in range(5)]
        for key in keys:
            queue.enqueue(key)
            queue.enqueue(key)  # still queued while standing by: collapses into the first
        # Standing by is the behaviour under test: a spell of it (any length) in which nothing runs.
        await asyncio.sleep(0.05)
        while_standing_by = list(done)
        serving.set()
        await until(lambda: len(done) >= len(keys) and idle(queue))  # idle: no second round can come
        await queue.stop()
        return while_standing_by, done

    while_standing_by, done = asyncio.run(scenario())
    assert while_standing_by == []
    assert sorted(done) == [("ns", f"r{i}") for i in range(5)]  # each once
