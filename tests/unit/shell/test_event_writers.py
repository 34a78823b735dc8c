"""The Event writers beside the work queue (docs/operator.md#events): a reconcile hands its Events
over and goes on; the operator, stopping, waits for them a bounded time only."""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes_asyncio import client
from prometheus_client import REGISTRY

from agentrun_operator.planner.actions import EmitEvent
from agentrun_operator.shell.events import EventRecorder
from agentrun_operator.shell.kube import Kube

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
