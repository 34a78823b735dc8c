"""AgentRuns reach the reconciler through kopf's event handler (shell/handlers.py), which hands each
event to `OperatorState.agentrun_event`: it feeds the watch cache and the work queue. That the
handler is registered, and that kopf writes nothing to a run it delivers (no finalizer, no
annotation), is shown against the real API server (tests/integration/test_operator_loops.py)."""

from __future__ import annotations

from typing import Any, cast

import kopf

from agentrun_operator.api import GROUP, VERSION
from agentrun_operator.config import OperatorConfig
from agentrun_operator.shell.handlers import OperatorState
from agentrun_operator.shell.workqueue import Key


def _state() -> OperatorState:
    return OperatorState(OperatorConfig(), None, workers=1)


def _run(version: int, phase: str | None = None, generation: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AgentRun",
        "metadata": {
            "name": "r",
            "namespace": "ns",
            "uid": "u",
            "resourceVersion": str(version),
            "generation": generation,
        },
        "spec": {},
        "status": {"phase": phase} if phase else {},
    }


class Queue:
    def __init__(self) -> None:
        self.keys: list[Key] = []

    def enqueue(self, key: Key, background: bool = False) -> None:
        self.keys.append(key)


def test_an_agentrun_event_fills_the_cache_and_enqueues_only_what_the_planner_reads() -> None:
    """What kopf's AgentRun handler does with each event (`OperatorState.agentrun_event`)."""
    state = _state()
    queue = Queue()
    state.queue = queue  # type: ignore[assignment]

    def deliver(kind: str | None, obj: dict[str, Any]) -> None:
        state.agentrun_event(cast(kopf.RawEvent, {"type": kind, "object": obj}))

    deliver(None, _run(1))  # kopf's initial listing
    assert queue.keys == [("ns", "r")] and state.cache.run("ns", "r") is not None
    deliver("MODIFIED", _run(1))  # the same version again: no news
    assert queue.keys == [("ns", "r")]
    deliver("MODIFIED", _run(2, phase="Running"))
    assert queue.keys == [("ns", "r")] * 2
    with state.cache.runs.window("ns", "r") as seen:  # our status write, answered before its event
        pass
    state.cache.runs.answer(_run(4, phase="Succeeded"), seen)
    deliver("MODIFIED", _run(3, phase="Pending"))  # before our write in the watch's order: skipped
    assert state.cache.run("ns", "r")["status"] == {"phase": "Succeeded"}  # type: ignore[index]
    deliver(None, _run(5, phase="Running"))  # kopf lists again: the listing is the watch's from now
    assert state.cache.run("ns", "r")["status"] == {"phase": "Running"}  # type: ignore[index]
    assert queue.keys == [("ns", "r")] * 3
    deliver("DELETED", _run(6, phase="Running"))
    assert queue.keys == [("ns", "r")] * 4 and state.cache.run("ns", "r") is None
