"""`/healthz` (kopf's probes) reports an informer that stopped receiving and a work queue that
stopped draining; a standby's paused queue and a quiet but live watch are healthy."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import kopf
import pytest

from agentrun_operator.config import OperatorConfig
from agentrun_operator.shell import health
from agentrun_operator.shell.cache import RunCache
from agentrun_operator.shell.handlers import OperatorState
from agentrun_operator.shell.informer import Informer
from agentrun_operator.shell.kube import Kube
from agentrun_operator.shell.workqueue import Key, WorkQueue
from tests.support.polling import until


class Hanging:
    """A Kube whose LIST never answers (an API server that stopped talking)."""

    async def list_with_version(self, *_: Any, **__: Any) -> Any:
        await asyncio.Event().wait()


class Failing:
    async def list_with_version(self, *_: Any, **__: Any) -> Any:
        raise asyncio.InvalidStateError("a bug that escapes the informer's loop")


def _informer(kube: Any) -> Informer:
    cache = RunCache()
    return Informer(
        cast(Kube, kube), cache, cache.jobs, "/apis/batch/v1", "jobs", None, (), lambda _k, _e: None
    )


def test_an_informer_that_hears_nothing_is_silent_and_one_whose_task_died_has_stopped() -> None:
    async def scenario() -> tuple[float | None, float | None, list[str]]:
        silent = _informer(Hanging())
        silent.start()
        dead = _informer(Failing())
        dead._run = lambda scope: Failing().list_with_version()  # type: ignore[method-assign]
        dead.start()
        await until(lambda: dead.silent_for(time.monotonic()) is None, what="the dead informer's task to end")
        later = time.monotonic() + 1000
        found = health.problems([silent, dead], None, later)
        result = silent.silent_for(later), dead.silent_for(later), found
        await silent.stop()
        await dead.stop()
        return result

    silent, dead, found = asyncio.run(scenario())
    assert silent is not None and silent >= 1000
    assert dead is None
    assert found == [
        "the jobs informer has received nothing for 1000 s",
        "the jobs informer has stopped",
    ]


def test_a_queue_whose_reconciles_hang_stalls_and_a_paused_or_idle_one_does_not() -> None:
    async def scenario() -> dict[str, float | None]:
        hang = asyncio.Event()

        async def reconcile(_key: Key) -> float | None:
            await hang.wait()
            return None

        serving = asyncio.Event()
        queue = WorkQueue(reconcile, workers=1, serving=serving)
        queue.start()
        out: dict[str, float | None] = {"idle": queue.stalled_for(time.monotonic() + 1000)}
        queue.enqueue(("ns", "a"))
        await asyncio.sleep(0.01)  # a spell of standing by (the behaviour under test): nothing is taken
        out["paused"] = queue.stalled_for(time.monotonic() + 1000)  # a standby: waiting by design
        serving.set()
        await until(lambda: ("ns", "a") in queue._active)  # "a" is taken and hangs; "b" waits behind it
        queue.enqueue(("ns", "b"))
        out["stalled"] = queue.stalled_for(time.monotonic() + 1000)
        hang.set()
        await until(lambda: not queue._queued and not queue._active)
        out["drained"] = queue.stalled_for(time.monotonic() + 1000)
        queue._tasks[0].cancel()
        await asyncio.sleep(0)
        out["dead"] = queue.stalled_for(time.monotonic())
        await queue.stop()
        return out

    out = asyncio.run(scenario())
    assert out["idle"] == 0 and out["paused"] == 0 and out["drained"] == 0
    assert out["stalled"] is not None and out["stalled"] >= 1000
    assert out["dead"] is None
    assert health.problems([], _Stalled(400), 0) == [
        "the work queue has not drained for 400 s (no reconcile finished)"
    ]
    assert health.problems([], _Stalled(None), 0) == ["a work queue worker has stopped"]
    assert health.problems([], _Stalled(100), 0) == []


class _Stalled:
    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds

    def stalled_for(self, now: float) -> float | None:
        return self.seconds


def test_the_probe_reports_the_cache_and_fails_at_once_when_unhealthy() -> None:
    """kopf's `/healthz` runs the probe handler (shell/handlers.py), which answers this."""
    state = OperatorState(OperatorConfig(), None, workers=1)
    sizes = state.cache.sizes()
    assert health.probe([], None, sizes, 0) == sizes
    with pytest.raises(kopf.PermanentError) as failed:
        health.probe([], _Stalled(None), sizes, 0)
    assert "a work queue worker has stopped" in str(failed.value)
