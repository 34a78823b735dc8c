"""The pod runner's retry schedule and loop (pure: no clock, no API)."""

from __future__ import annotations

import itertools

import pytest

from agentrun_devcluster.podrunner.api import ApiError, transient
from agentrun_devcluster.podrunner.retry import Backoff, backoff_delays, retry_until


def test_delays_grow_to_the_cap_with_full_jitter() -> None:
    ceilings = [hi for _lo, hi in itertools.islice(_draws(Backoff(first=0.5, factor=2, cap=4)), 6)]
    assert ceilings == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def _draws(policy: Backoff) -> list[tuple[float, float]]:
    seen: list[tuple[float, float]] = []

    def draw(lo: float, hi: float) -> float:
        seen.append((lo, hi))
        return hi

    delays = backoff_delays(policy, draw)
    for _ in range(6):
        next(delays)
    return seen


def test_retries_transient_errors_until_the_attempt_lands() -> None:
    answers: list[Exception | str] = [ApiError(0, "refused"), ApiError(503, "unavailable"), "ok"]
    slept: list[float] = []

    def attempt() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert retry_until(attempt, transient, slept.append, Backoff(first=1, cap=1)) == "ok"
    assert len(slept) == 2 and all(0 <= s <= 1 for s in slept)


def test_a_permanent_refusal_is_not_retried() -> None:
    def attempt() -> None:
        raise ApiError(422, "invalid")

    with pytest.raises(ApiError):
        retry_until(attempt, transient, lambda _s: None)


class _Gone(Exception):
    pass


def test_the_sleep_can_stop_the_retries_when_the_pod_is_gone() -> None:
    def attempt() -> None:
        raise ApiError(0, "timed out")

    def sleep(_seconds: float) -> None:
        raise _Gone

    with pytest.raises(_Gone):
        retry_until(attempt, transient, sleep)


@pytest.mark.parametrize(
    ("status", "retried"),
    [
        (0, True),
        (401, True),
        (403, True),
        (429, True),
        (500, True),
        (503, True),
        (404, False),
        (409, False),
        (422, False),
    ],
)
def test_which_api_failures_are_transient(status: int, retried: bool) -> None:
    assert transient(ApiError(status, "x")) is retried
