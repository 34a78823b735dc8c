"""The work queue: one reconcile at a time per key, coalescing, delayed requeue, failures retried."""

from __future__ import annotations

import asyncio

from agentrun_operator.shell.workqueue import Key, WorkQueue


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
        await asyncio.sleep(0.01)
        for _ in range(10):  # ten events while the first reconcile runs
            queue.enqueue(key)
        gate.set()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if queue.idle():
                break
        await queue.stop()
        return overlaps, calls

    overlaps, calls = asyncio.run(scenario())
    assert overlaps == 0
    assert calls == 2  # the running one, then exactly one more for everything that came meanwhile


def test_requeue_after_and_failure_retry() -> None:
    async def scenario() -> list[str]:
        seen: list[str] = []

        async def reconcile(key: Key) -> float | None:
            seen.append(key[1])
            if key[1] == "boom" and seen.count("boom") == 1:
                raise RuntimeError("transient")
            if key[1] == "later" and seen.count("later") == 1:
                return 0.05
            return None

        queue = WorkQueue(reconcile, workers=2)
        queue.start()
        queue.enqueue(("ns", "later"))
        queue.enqueue(("ns", "boom"))
        await asyncio.sleep(0.3)
        # an earlier deadline wins over a later one
        queue.enqueue_after(("ns", "x"), 10)
        queue.enqueue_after(("ns", "x"), 0.01)
        await asyncio.sleep(0.1)
        await queue.stop()
        return seen

    seen = asyncio.run(scenario())
    assert seen.count("later") == 2
    assert seen.count("x") == 1
    assert seen.count("boom") == 1  # retried after 2 s, which this test does not wait for
