"""The work queue pauses when kopf's peering pauses this replica: `Peering` reads the peering
objects as kopf does -- a live peer of a priority as high pauses, this replica's own entry first --
from the objects' own contents, through no part of kopf (docs/operations.md#ha)."""

from __future__ import annotations

import asyncio
import datetime
import random
from typing import Any

from agentrun_operator.shell.peering import (
    DEFAULT_PEERING_NAME,
    Peering,
    allows,
    choose_priority,
    own_identity,
)

ME = "agentrun-operator-a"
MINE = 100
NOW = datetime.datetime(2026, 11, 28, 6, 0, tzinfo=datetime.UTC)


def _entry(priority: Any, seconds_ago: float = 0, lifetime: int = 60) -> dict[str, Any]:
    seen = NOW - datetime.timedelta(seconds=seconds_ago)
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}


def _object(status: dict[str, Any], name: str = DEFAULT_PEERING_NAME, ns: str = "") -> dict[str, Any]:
    meta = {"name": name, **({"namespace": ns} if ns else {})}
    return {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": meta, "status": status}


def test_a_live_peer_of_a_priority_as_high_pauses_and_a_lower_or_dead_one_does_not() -> None:
    assert allows({ME: _entry(MINE)}, ME, MINE, NOW) == (True, None)
    assert allows({ME: _entry(MINE), "b": _entry(MINE - 1)}, ME, MINE, NOW) == (True, None)
    assert allows({ME: _entry(MINE), "b": _entry(MINE + 1, 50)}, ME, MINE, NOW) == (False, 10.0)
    assert allows({ME: _entry(MINE), "b": _entry(MINE, 30)}, ME, MINE, NOW) == (False, 30.0)  # a tie
    assert allows({ME: _entry(MINE), "b": _entry(MINE + 1, 61)}, ME, MINE, NOW) == (True, None)  # dead
    assert allows({ME: _entry(MINE), "b": None}, ME, MINE, NOW) == (True, None)  # a removed entry


def test_without_its_own_entry_or_with_an_unreadable_one_a_replica_stands_by() -> None:
    assert allows({}, ME, MINE, NOW) == (False, None)  # kopf has not written its keep-alive yet
    assert allows(None, ME, MINE, NOW) == (False, None)
    for odd in ({"priority": "high"}, {"lastseen": "yesterday"}, "x", {"lifetime": []}):
        assert allows({ME: _entry(MINE), "b": odd}, ME, MINE, NOW) == (False, None), odd


def test_standby_until_its_entry_is_seen_then_serves_and_pauses_for_a_higher_peer() -> None:
    async def scenario() -> list[bool]:
        peering = Peering(ME, MINE, DEFAULT_PEERING_NAME, ())
        seen = [peering.serving.is_set()]
        peering.relist([_object({})], peering.clock(), None)
        seen.append(peering.serving.is_set())
        now = datetime.datetime.now(datetime.UTC)
        mine = {"priority": MINE, "lifetime": 60, "lastseen": now.isoformat()}
        peering.upsert(_object({ME: mine}))
        seen.append(peering.serving.is_set())
        higher = {"priority": MINE + 1, "lifetime": 60, "lastseen": now.isoformat()}
        peering.upsert(_object({ME: mine, "b": higher}))
        seen.append(peering.serving.is_set())
        peering.upsert(_object({ME: mine, "b": None}))
        seen.append(peering.serving.is_set())
        peering.upsert(_object({"b": higher}, name="another-operator"))  # not ours: changes nothing
        seen.append(peering.serving.is_set())
        peering.delete(_object({}))
        seen.append(peering.serving.is_set())
        peering.stop()
        return seen

    assert asyncio.run(scenario()) == [False, False, True, False, True, True, False]


def test_a_blocking_peer_whose_keep_alive_runs_out_is_rechecked_then() -> None:
    async def scenario() -> bool:
        peering = Peering(ME, MINE, DEFAULT_PEERING_NAME, ())
        now = datetime.datetime.now(datetime.UTC)
        mine = {"priority": MINE, "lifetime": 60, "lastseen": now.isoformat()}
        fading = {
            "priority": MINE + 1,
            "lifetime": 60,
            "lastseen": (now - datetime.timedelta(seconds=59.7)).isoformat(),
        }
        peering.upsert(_object({ME: mine, "b": fading}))
        assert not peering.serving.is_set()
        await asyncio.wait_for(peering.serving.wait(), 30)  # no event: the re-check serves
        peering.stop()
        return peering.serving.is_set()

    assert asyncio.run(scenario())


def test_with_one_peering_object_per_namespace_it_serves_only_while_none_pauses_it() -> None:
    async def scenario() -> list[bool]:
        peering = Peering(ME, MINE, DEFAULT_PEERING_NAME, ("a", "b"))
        assert peering.plural == "kopfpeerings"
        now = datetime.datetime.now(datetime.UTC).isoformat()
        mine = {"priority": MINE, "lifetime": 60, "lastseen": now}
        higher = {"priority": MINE + 1, "lifetime": 60, "lastseen": now}
        peering.upsert(_object({ME: mine}, ns="a"))
        seen = [peering.serving.is_set()]  # b not seen yet
        peering.upsert(_object({ME: mine}, ns="b"))
        seen.append(peering.serving.is_set())
        peering.upsert(_object({ME: mine, "x": higher}, ns="b"))
        seen.append(peering.serving.is_set())
        peering.stop()
        return seen

    assert asyncio.run(scenario()) == [False, True, False]


def test_priorities_are_drawn_so_that_replicas_do_not_tie_and_identities_differ() -> None:
    rng = random.Random(7)
    assert len({choose_priority(rng) for _ in range(1000)}) == 1000
    assert own_identity(random.Random(1)) != own_identity(random.Random(2))
