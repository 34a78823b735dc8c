"""The work queue pauses when kopf's own peering pauses: `KopfPause` follows kopf's decision, driven
here through kopf's own decision function (so a kopf release that changes it fails these tests)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import random
from collections.abc import Callable, Coroutine
from typing import Any

import kopf
import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._core.engines import peering as kopf_peering
from prometheus_client import REGISTRY

from agentrun_operator.shell.peering import DEFAULT_PEERING_NAME, KopfPause, choose_priority

ME = "agentrun-operator-a"
MY_PRIORITY = 100


def _event(status: dict[str, Any], name: str = DEFAULT_PEERING_NAME) -> dict[str, Any]:
    return {"type": "MODIFIED", "object": {"metadata": {"name": name}, "status": status}}


def _live(priority: Any, seconds_ago: float = 0) -> dict[str, Any]:
    seen = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds_ago)
    return {"priority": priority, "lifetime": 60, "lastseen": seen.isoformat()}


class Kopf:
    """kopf's peering decision for one peering object, as its orchestrator wires it: a toggle of the
    operator's pause set, mandatory peering (it starts on), kopf's `process_peering_event`."""

    def __init__(self, toggles: aiotoggles.ToggleSet, toggle: aiotoggles.Toggle) -> None:
        self.toggles, self.toggle = toggles, toggle
        self.settings = kopf.OperatorSettings()
        self.settings.peering.name = DEFAULT_PEERING_NAME
        self.settings.peering.priority = MY_PRIORITY

    async def sees(self, status: dict[str, Any], name: str = DEFAULT_PEERING_NAME) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                kopf_peering.process_peering_event(
                    raw_event=_event(status, name),  # type: ignore[arg-type]
                    namespace=None,
                    resource=None,  # type: ignore[arg-type]
                    identity=kopf_peering.Identity(ME),
                    settings=self.settings,
                    autoclean=False,
                    conflicts_found=self.toggle,
                ),
                timeout=0.2,  # it then sleeps until a blocking peer's keep-alive expires
            )

    @property
    def paused(self) -> bool:
        return self.toggles.is_on()


async def _kopf(objects: int = 1) -> tuple[list[Kopf], KopfPause]:
    pause = KopfPause(peering_objects=objects)
    pause.install()
    toggles = aiotoggles.ToggleSet(any)
    return [Kopf(toggles, await toggles.make_toggle(True, name=f"p{i}")) for i in range(objects)], pause


def in_loop(scenario: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    @functools.wraps(scenario)
    def test() -> None:
        asyncio.run(scenario())

    return test


def _serving_metric() -> float | None:
    return REGISTRY.get_sample_value("agentrun_serving")


@in_loop
async def test_standby_until_kopf_reads_the_peering_object_then_serves_without_a_higher_peer() -> None:
    (kopf_,), pause = await _kopf()
    try:
        assert kopf_.paused and not pause.serving.is_set() and _serving_metric() == 0
        await kopf_.sees({ME: _live(MY_PRIORITY), "lower": _live(MY_PRIORITY - 1)})
        assert not kopf_.paused and pause.serving.is_set() and _serving_metric() == 1
        # A higher peer appears (a `kopf freeze`, a foreign operator under our name): both pause.
        await kopf_.sees({ME: _live(MY_PRIORITY), "higher": _live(MY_PRIORITY + 1)})
        assert kopf_.paused and not pause.serving.is_set() and _serving_metric() == 0
        # An equal peer pauses too (kopf pauses all of them).
        await kopf_.sees({ME: _live(MY_PRIORITY), "equal": _live(MY_PRIORITY)})
        assert kopf_.paused and not pause.serving.is_set()
        # Its keep-alive expired (a peer killed outright): serve again.
        await kopf_.sees({ME: _live(MY_PRIORITY), "higher": _live(MY_PRIORITY + 1, seconds_ago=120)})
        assert not kopf_.paused and pause.serving.is_set()
    finally:
        pause.uninstall()


@in_loop
async def test_an_unparseable_entry_fails_kopfs_decision_and_never_starts_a_standby() -> None:
    """kopf's decision raises and turns no toggle (kopf then stops the whole operator, which
    tests/integration/test_chart.py shows): a standby never starts serving on it."""
    (kopf_,), pause = await _kopf()
    try:
        for garbage in ({"priority": "high"}, "not a mapping", {"lifetime": "long"}, {"lastseen": "x"}):
            with pytest.raises(Exception):  # noqa: B017 - kopf's decision fails: its toggle, and ours, stay
                await kopf_.sees({ME: _live(MY_PRIORITY), "odd": garbage})
            assert kopf_.paused and not pause.serving.is_set(), garbage
        await kopf_.sees({ME: _live(MY_PRIORITY)})
        assert pause.serving.is_set()
        for garbage in ({"priority": "high"}, "not a mapping"):
            with pytest.raises(Exception):  # noqa: B017
                await kopf_.sees({ME: _live(MY_PRIORITY), "odd": garbage})
            assert not kopf_.paused and pause.serving.is_set()  # and a server stays the server
    finally:
        pause.uninstall()


@in_loop
async def test_another_operators_peering_object_is_not_ours() -> None:
    (kopf_,), pause = await _kopf()
    try:
        await kopf_.sees({"other-operator": _live(MY_PRIORITY + 1)}, name="default")
        assert kopf_.paused and not pause.serving.is_set()  # not read at all: still unresolved
        await kopf_.sees({ME: _live(MY_PRIORITY)})
        await kopf_.sees({"other-operator": _live(MY_PRIORITY + 1)}, name="default")
        assert pause.serving.is_set()
    finally:
        pause.uninstall()


@in_loop
async def test_with_one_peering_object_per_namespace_it_serves_only_while_none_pauses_it() -> None:
    (first, second), pause = await _kopf(objects=2)
    try:
        await first.sees({ME: _live(MY_PRIORITY)})
        assert not pause.serving.is_set()  # the other namespace's object is not read yet
        await second.sees({ME: _live(MY_PRIORITY)})
        assert pause.serving.is_set()
        await second.sees({ME: _live(MY_PRIORITY), "higher": _live(MY_PRIORITY + 1)})
        assert not pause.serving.is_set() and first.paused
        await first.sees({ME: _live(MY_PRIORITY), "higher": _live(MY_PRIORITY + 1)})
        await second.sees({ME: _live(MY_PRIORITY)})
        assert not pause.serving.is_set()
        await first.sees({ME: _live(MY_PRIORITY)})
        assert pause.serving.is_set()
    finally:
        pause.uninstall()


def test_priorities_are_drawn_so_that_replicas_do_not_tie() -> None:
    drawn = {choose_priority(random.Random(seed)) for seed in range(50)}
    assert len(drawn) == 50 and all(1 <= p <= 2**30 for p in drawn)
