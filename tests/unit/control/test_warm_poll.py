"""How often the warm supervisor's main thread looks for an iteration's exit code
(control/warm.py `Supervisor.poll_seconds`): often while an iteration is young and while a result
waits for the operator's next start, seldom otherwise. Found by the real-node benchmark
(docs/operator.md#performance-warm): between iterations the thread slept 100 ms at a time, so a short
iteration the operator started during such a sleep was seen ended up to 100 ms late."""

from __future__ import annotations

from agentrun_operator.control.envelope import ControlEnvelope
from agentrun_operator.control.warm import (
    EXIT_FAST_SECONDS,
    EXIT_POLL,
    EXIT_POLL_LATER,
    Result,
    Running,
    Settings,
    Supervisor,
)


class _Reports:
    def fingerprint_again(self) -> None:
        return None

    def report(self, first: bool) -> ControlEnvelope:
        return ControlEnvelope(status="missing", path="/w/c.json", reason="none")


def _supervisor() -> Supervisor:
    return Supervisor(Settings("/nonexistent", "1-1", 300, "/w/c.json"), _Reports())


def _result(since: float, acked: bool = False) -> Result:
    envelope = ControlEnvelope(status="missing", path="/w/c.json", reason="none")
    return Result("1-1", 0, envelope, "{}", "2026-12-05T00:00:00.000Z", acked=acked, since=since)


def test_a_young_iteration_is_looked_at_often_and_a_long_one_seldom() -> None:
    supervisor = _supervisor()
    supervisor.running = Running("2-1", "2026-12-05T00:00:00.000Z", since=100.0)
    assert supervisor.poll_seconds(100.0) == EXIT_POLL
    assert supervisor.poll_seconds(100.0 + EXIT_FAST_SECONDS) == EXIT_POLL_LATER


def test_a_result_waiting_for_the_next_start_keeps_the_looks_often() -> None:
    supervisor = _supervisor()
    supervisor.running = None
    supervisor.result = _result(since=50.0)
    assert supervisor.poll_seconds(50.0) == EXIT_POLL  # the start comes within milliseconds
    assert supervisor.poll_seconds(50.0 + EXIT_FAST_SECONDS) == EXIT_POLL_LATER  # the operator is away


def test_an_acknowledged_result_or_none_is_idle_and_looked_at_seldom() -> None:
    supervisor = _supervisor()
    supervisor.running = None
    supervisor.result = _result(since=50.0, acked=True)
    assert supervisor.poll_seconds(50.0) == EXIT_POLL_LATER
    supervisor.result = None
    assert supervisor.poll_seconds(50.0) == EXIT_POLL_LATER
