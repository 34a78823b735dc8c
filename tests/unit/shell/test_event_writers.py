"""The Event writers beside the work queue (docs/operator.md#events): a reconcile hands its Events
over and goes on; the operator, stopping, waits for them a bounded time only. A warm loop's routine
hand-overs are held, not written, until the flush interval or the run's end."""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes_asyncio import client
from prometheus_client import REGISTRY

from agentrun_operator.planner.actions import EmitEvent
from agentrun_operator.planner.context import TERMINAL_RUN_PHASES
from agentrun_operator.shell.events import MAX_MESSAGE, EventRecorder
from agentrun_operator.shell.kube import Kube
from tests.unit.planner.test_warm import run_warm, warm_world

RUN: dict[str, Any] = {
    "apiVersion": "agents.proompteng.ai/v1alpha1",
    "kind": "AgentRun",
    "metadata": {"name": "run", "namespace": "ns", "uid": "uid-run", "resourceVersion": "7"},
}


class SilentServer:
    """Accepts connections and reads requests, never answers: an API server that froze."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.requests.set()
        await reader.read()  # until the client gives up
        writer.close()


def test_stopping_waits_for_unposted_events_only_a_grace_period() -> None:
    async def body() -> int:
        silent = SilentServer()
        server = await asyncio.start_server(silent.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        configuration = client.Configuration()
        configuration.host = f"http://127.0.0.1:{port}"
        kube = Kube(configuration)
        recorder = EventRecorder(kube, "test")
        recorder.start(writers=1)
        for k in range(3):  # one run: one writer, in order
            await recorder.submit(RUN, [EmitEvent("Normal", "IterationStarted", f"iteration {k}")], False)
        await silent.requests.wait()  # the first POST hangs on the frozen server
        await recorder.stop(grace_seconds=0.2)
        await kube.close()
        server.close()
        return silent.connections

    # Waiting for all three would have sent all three, each after the one before timed out.
    assert asyncio.run(body()) == 1


def test_a_submit_without_started_writers_posts_in_the_reconcile() -> None:
    """A recorder never started (a Reconciler built alone, as in tests) writes at once, as before."""

    class Recording:
        def __init__(self) -> None:
            self.posted: list[str] = []

        async def create_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
            self.posted.append(event["message"])
            return {"metadata": {"name": "run.1"}}

    kube = Recording()
    recorder = EventRecorder(kube, "test")  # type: ignore[arg-type]
    asyncio.run(recorder.submit(RUN, [EmitEvent("Normal", "IterationStarted", "iteration 1")], False))
    assert kube.posted == ["iteration 1"]


def test_events_past_a_full_backlog_are_dropped_and_counted() -> None:
    """An API server that answers slower than runs make Events: the reconcile never waits, and what
    does not fit the backlog is dropped, counted in `agentrun_events_dropped_total`."""

    async def body() -> int:
        silent = SilentServer()
        server = await asyncio.start_server(silent.handle, "127.0.0.1", 0)
        configuration = client.Configuration()
        configuration.host = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        kube = Kube(configuration)
        recorder = EventRecorder(kube, "test")
        recorder.start(writers=1, backlog=1)
        for k in range(3):  # handed over without a pause: the writer has taken none yet
            await recorder.submit(RUN, [EmitEvent("Normal", "IterationStarted", f"iteration {k}")], False)
        await silent.requests.wait()
        await recorder.stop(grace_seconds=0.2)
        await kube.close()
        server.close()
        return recorder.dropped

    def dropped() -> float:
        return REGISTRY.get_sample_value("agentrun_events_dropped_total") or 0.0

    before = dropped()
    assert asyncio.run(body()) == 2
    assert dropped() - before == 2


class EventsKube:
    """Answers Event writes as the API server does (a posted Event gets its generated name) and
    records each, in order."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, dict[str, Any]]] = []
        self.gate: asyncio.Event | None = None  # when set, a POST waits for it

    async def create_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
        self.writes.append(("POST", event))
        if self.gate is not None:
            await self.gate.wait()
        return {**event, "metadata": {**event["metadata"], "name": f"run.{len(self.writes)}"}}

    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.writes.append(("PATCH", {"name": name, **patch}))
        return {"metadata": {"name": name}, **patch}

    def summary(self) -> list[tuple[str, str, int]]:
        """Each write as (verb, reason or the patched Event's name, count)."""
        return [(verb, body.get("reason", body.get("name")), body["count"]) for verb, body in self.writes]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def recorder() -> tuple[EventRecorder, EventsKube, Clock]:
    kube, clock = EventsKube(), Clock()
    return EventRecorder(kube, "test", clock=clock), kube, clock  # type: ignore[arg-type]


NAMESPACES = {"uid-run": "ns"}
LOOP_STARTED = [
    EmitEvent("Normal", "LoopStarted", "step a: loop started (maxIterations 10)"),
    EmitEvent("Normal", "IterationStarted", "step a: iteration 1/10 attempt 1/1 started (Job run-1)"),
]


def hand_over(n: int, warm: bool = True) -> list[EmitEvent]:
    """What the planner asks for when iteration `n` succeeded and `n + 1` starts (in the warm pod:
    every Event `fold`, planner/attempts.py)."""
    where = " in warm pod run-1-pod" if warm else ""
    return [
        EmitEvent(
            "Normal", "IterationSucceeded", f"step a: iteration {n}/10 succeeded (Job run-1)", fold=warm
        ),
        EmitEvent("Normal", "ConditionEvaluated", f"step a: iteration {n}: true, another", fold=warm),
        EmitEvent(
            "Normal",
            "IterationStarted",
            f"step a: iteration {n + 1}/10 attempt 1/1 started{where}",
            fold=warm,
        ),
    ]


def run_end(warm: bool = True) -> list[EmitEvent]:
    return [
        EmitEvent("Normal", "IterationSucceeded", "step a: iteration 10/10 succeeded (Job run-1)", fold=warm),
        EmitEvent("Normal", "LoopCompleted", "step a: loop stopped: LoopMaxIterationsReached"),
        EmitEvent("Normal", "RunSucceeded", "Completed: all 1 steps finished"),
    ]


def test_a_warm_hand_over_is_held_and_folds_without_a_write() -> None:
    async def body() -> None:
        events, kube, clock = recorder()
        await events.record(RUN, LOOP_STARTED, False)
        for n in range(1, 4):
            clock.now += 2
            await events.record(RUN, hand_over(n), False)
        assert kube.summary() == [("POST", "LoopStarted", 1)]
        await events.flush_due(NAMESPACES)  # not due yet
        assert len(kube.writes) == 1

    asyncio.run(body())


def test_a_held_series_is_posted_flush_seconds_after_its_first_event_then_patched_as_any() -> None:
    async def body() -> None:
        events, kube, clock = recorder()
        await events.record(RUN, hand_over(1), False)
        clock.now += 30
        await events.record(RUN, hand_over(2), False)
        clock.now += 29.5
        await events.flush_due(NAMESPACES)
        assert kube.writes == []
        clock.now += 0.5  # 60 s since the first Event
        await events.flush_due(NAMESPACES)
        ((verb, posted),) = kube.writes
        assert (verb, posted["reason"], posted["type"], posted["count"]) == (
            "POST",
            "IterationStarted",
            "Normal",
            2,
        )
        assert posted["message"].endswith("iteration 3/10 attempt 1/1 started in warm pod run-1-pod")
        assert posted["firstTimestamp"] <= posted["lastTimestamp"]
        # Posted, it is an ordinary series: a fold is patched `flush_seconds` after that write.
        await events.record(RUN, hand_over(3), False)
        clock.now += 59
        await events.flush_due(NAMESPACES)
        assert len(kube.writes) == 1
        clock.now += 1
        await events.flush_due(NAMESPACES)
        assert kube.summary()[1:] == [("PATCH", "run.1", 3)]

    asyncio.run(body())


def test_at_the_runs_end_a_held_series_is_one_more_part_of_its_final_event() -> None:
    """A warm 10-iteration run within the flush interval: 2 Event writes, no PATCH."""

    async def body() -> None:
        events, kube, clock = recorder()
        await events.record(RUN, LOOP_STARTED, False)
        for n in range(1, 10):
            clock.now += 1.5
            await events.record(RUN, hand_over(n), False)
        await events.record(RUN, run_end(), True)
        assert kube.summary() == [("POST", "LoopStarted", 1), ("POST", "RunSucceeded", 1)]
        final = kube.writes[1][1]
        assert final["type"] == "Normal"
        own, _, held = final["message"].partition("; IterationStarted (x9 over 12s): ")
        assert own.endswith("; RunSucceeded: Completed: all 1 steps finished")
        # Its newest message's end, where a hand-over names the iteration it started.
        assert held.startswith("…") and held.endswith(
            "IterationStarted: step a: iteration 10/10 attempt 1/1 started in warm pod run-1-pod"
        )
        assert events._runs == {}  # nothing left to flush

    asyncio.run(body())


def test_a_finish_without_events_of_its_own_posts_held_series_as_they_are() -> None:
    async def body() -> None:
        events, kube, clock = recorder()
        await events.record(RUN, hand_over(1), False)
        clock.now += 5
        await events.record(RUN, hand_over(2), False)
        await events.record(RUN, [], True)
        assert kube.summary() == [("POST", "IterationStarted", 2)]

    asyncio.run(body())


def test_stopping_posts_held_series() -> None:
    async def body() -> None:
        events, kube, _ = recorder()
        await events.record(RUN, hand_over(1), False)
        await events.record(RUN, hand_over(2), False)
        await events.flush_all(NAMESPACES)
        assert kube.summary() == [("POST", "IterationStarted", 2)]

    asyncio.run(body())


def test_an_event_that_is_not_routine_posts_the_held_series_of_its_reason_at_once() -> None:
    """A retry's start in a new pod is not held back behind the warm hand-overs before it."""

    async def body() -> None:
        events, kube, _ = recorder()
        await events.record(RUN, hand_over(1), False)
        await events.record(
            RUN, [EmitEvent("Normal", "IterationStarted", "step a: iteration 2/10 attempt 2/2")], False
        )
        assert kube.summary() == [("POST", "IterationStarted", 2)]
        assert kube.writes[0][1]["message"] == "step a: iteration 2/10 attempt 2/2"

    asyncio.run(body())


def test_a_cold_runs_events_are_written_as_they_always_were() -> None:
    async def body() -> None:
        events, kube, clock = recorder()
        await events.record(RUN, LOOP_STARTED, False)
        for n in range(1, 10):
            clock.now += 1.5
            # Each decision of a cold loop is its own Event (split_decisions), the rest one series.
            await events.record(RUN, hand_over(n, warm=False), False)
        await events.record(RUN, run_end(warm=False), True)
        decisions = [("POST", "ConditionEvaluated", 1)]
        assert kube.summary() == [
            ("POST", "LoopStarted", 1),
            *decisions,
            ("POST", "IterationStarted", 1),
            *decisions * 8,
            ("POST", "RunSucceeded", 1),
            ("PATCH", "run.3", 9),
        ]
        assert "IterationStarted (x" not in kube.writes[-2][1]["message"]

    asyncio.run(body())


def test_truncation_of_the_final_event_cuts_the_held_summary_not_the_runs_end() -> None:
    async def body() -> None:
        events, kube, _ = recorder()
        long = [EmitEvent("Normal", "IterationStarted", "x" * 2000, fold=True)]
        await events.record(RUN, long, False)
        await events.record(RUN, long, False)
        end = [
            EmitEvent("Normal", "LoopCompleted", "y" * 900),
            EmitEvent("Normal", "RunSucceeded", "Completed: all 1 steps finished"),
        ]
        await events.record(RUN, end, True)
        ((verb, final),) = kube.writes
        assert (verb, final["reason"]) == ("POST", "RunSucceeded")
        assert len(final["message"]) == MAX_MESSAGE and final["message"].endswith("…")
        own, _, held = final["message"].partition("; IterationStarted (x2 over 0s): ")
        assert own == f"LoopCompleted: {'y' * 900}; RunSucceeded: Completed: all 1 steps finished"
        assert held.startswith("…xxx")

    asyncio.run(body())


def test_a_held_series_the_resync_is_posting_is_not_also_merged_into_the_runs_end() -> None:
    """The resync's flush and the run's writer take turns on a run: a held series being posted is
    not also a part of the final Event written meanwhile."""

    async def body() -> None:
        events, kube, clock = recorder()
        await events.record(RUN, hand_over(1), False)
        clock.now += 60  # due
        kube.gate = asyncio.Event()
        flushing = asyncio.create_task(events.flush_due(NAMESPACES))
        while not kube.writes:  # the held series' POST is on its way
            await asyncio.sleep(0)
        finishing = asyncio.create_task(events.record(RUN, run_end(), True))
        kube.gate.set()
        await asyncio.gather(flushing, finishing)
        assert kube.summary() == [("POST", "IterationStarted", 1), ("POST", "RunSucceeded", 1)]
        assert "IterationStarted" not in kube.writes[1][1]["message"].rpartition("RunSucceeded")[2]

    asyncio.run(body())


def test_a_warm_run_through_the_planner_costs_two_event_writes() -> None:
    """The planner's Events of a warm 10-iteration run, reconcile by reconcile, as the reconciler
    hands them over: the loop's start and the run's end, nothing per iteration."""
    world = warm_world(max_iterations=10)
    run_warm(world, 10)
    assert world.phase == "Succeeded"

    async def body() -> None:
        events, kube, clock = recorder()
        for plan in world.plans:
            clock.now += 1
            planned = [a for a in plan.actions if isinstance(a, EmitEvent)]
            await events.record(RUN, planned, plan.status.phase in TERMINAL_RUN_PHASES)
        assert kube.summary() == [("POST", "LoopStarted", 1), ("POST", "RunSucceeded", 1)]
        assert "; IterationStarted (x9 over " in kube.writes[1][1]["message"]

    asyncio.run(body())
