"""The peering gate: which replica serves, decided from kopf's peering object as kopf decides it."""

from __future__ import annotations

import asyncio
import datetime
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from agentrun_operator.shell.peering import (
    PEERING_NAME,
    PeeringGate,
    PeeringIdentity,
    blocking_peers,
    parse_peers,
    peering_kind,
    peering_store,
)

NOW = datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.UTC)
ME = PeeringIdentity("me", 100)


def _seen(seconds_ago: float) -> str:
    return (NOW - datetime.timedelta(seconds=seconds_ago)).isoformat()


def test_identity_is_the_pod_name_or_kopfs_form_and_priorities_differ() -> None:
    assert PeeringIdentity.choose({"POD_ID": "op-7f9c"}).identity == "op-7f9c"
    manual = PeeringIdentity.choose({}, random.Random(1)).identity
    assert "@" in manual and manual.count("/") == 2
    drawn = {PeeringIdentity.choose({"POD_ID": "x"}, random.Random(seed)).priority for seed in range(50)}
    assert len(drawn) == 50 and all(1 <= p <= 2**30 for p in drawn)


def test_peers_are_read_as_kopf_writes_them_and_garbage_is_skipped() -> None:
    status: dict[str, Any] = {
        "a": {"priority": 5, "lifetime": 60, "lastseen": _seen(10)},
        "b": {"priority": "7"},  # no lastseen: now; no lifetime: 60 s
        "c": "not a peer",
        "d": {"priority": "high"},
        "e": {"priority": 1, "lastseen": "yesterday"},
    }
    peers = {p.identity: p for p in parse_peers(status, NOW)}
    assert set(peers) == {"a", "b", "e"}
    assert peers["a"].deadline == NOW + datetime.timedelta(seconds=50)
    assert peers["b"].priority == 7 and peers["b"].deadline == NOW + datetime.timedelta(seconds=60)


def test_only_live_others_of_higher_or_equal_priority_block() -> None:
    status = {
        "me": {"priority": 100, "lastseen": _seen(1)},
        "higher": {"priority": 200, "lastseen": _seen(1)},
        "equal": {"priority": 100, "lastseen": _seen(1)},
        "lower": {"priority": 99, "lastseen": _seen(1)},
        "dead": {"priority": 300, "lifetime": 60, "lastseen": _seen(61)},
    }
    blockers = blocking_peers(parse_peers(status, NOW), ME, NOW)
    assert sorted(p.identity for p in blockers) == ["equal", "higher"]


@settings(deadline=None, max_examples=200)  # pure, but datetime parsing varies on a loaded machine
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.tuples(st.integers(0, 10**9), st.integers(1, 120), st.integers(-100, 200)),
        max_size=6,
    )
)
def test_a_replica_blocks_exactly_when_kopf_would_pause_it(peers: dict[str, tuple[int, int, int]]) -> None:
    status = {
        name: {"priority": prio, "lifetime": life, "lastseen": _seen(ago)}
        for name, (prio, life, ago) in peers.items()
    }
    blockers = {p.identity for p in blocking_peers(parse_peers(status, NOW), ME, NOW)}
    expected = {
        name
        for name, (prio, life, ago) in peers.items()
        if name != ME.identity and prio >= ME.priority and ago < life
    }
    assert blockers == expected


def _peering(
    namespace: str, status: dict[str, Any], version: int, name: str = PEERING_NAME
) -> dict[str, Any]:
    meta = {
        "name": name,
        "namespace": namespace,
        "uid": f"u-{namespace}-{name}",
        "resourceVersion": str(version),
    }
    return {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": meta, "status": status}


def test_gate_serves_stands_by_and_takes_over_when_the_server_stops() -> None:
    async def scenario() -> list[bool]:
        store = peering_store()
        gate = PeeringGate(PeeringIdentity("me", 100), store)
        states: list[bool] = []
        gate.decide()  # nothing listed: no one outranks us
        states.append(gate.serving.is_set())
        assert REGISTRY.get_sample_value("agentrun_serving") == 1
        now = datetime.datetime.now(datetime.UTC).isoformat()
        gate.changed(
            store.upsert(_peering("ns", {"other": {"priority": 500, "lastseen": now}}, 1)) or ("", "")
        )
        states.append(gate.serving.is_set())
        assert REGISTRY.get_sample_value("agentrun_serving") == 0
        # Another object's peers, or another name, change nothing.
        store.upsert(_peering("ns", {"x": {"priority": 900, "lastseen": now}}, 2, name="someone-else"))
        gate.decide()
        states.append(gate.serving.is_set())
        # The serving peer leaves cleanly (kopf removes its entry): we take over.
        gate.changed(store.upsert(_peering("ns", {"me": {"priority": 100, "lastseen": now}}, 3)) or ("", ""))
        states.append(gate.serving.is_set())
        gate.stop()
        return states

    assert asyncio.run(scenario()) == [True, False, False, True]


def test_a_peer_killed_outright_is_outlived_by_its_lifetime() -> None:
    async def scenario() -> tuple[bool, bool]:
        store = peering_store()
        gate = PeeringGate(PeeringIdentity("me", 100), store)
        # A peer whose keep-alive ends a moment from now, and which never writes again.
        lastseen = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=59.8)
        store.upsert(
            _peering("ns", {"killed": {"priority": 500, "lifetime": 60, "lastseen": lastseen.isoformat()}}, 1)
        )
        gate.decide()
        before = gate.serving.is_set()
        await asyncio.wait_for(gate.serving.wait(), timeout=30)  # the gate's own timer re-decides
        gate.stop()
        return before, gate.serving.is_set()

    assert asyncio.run(scenario()) == (False, True)


def test_peering_kind_follows_the_operators_scope() -> None:
    assert peering_kind(("a", "b")) == ("/apis/kopf.dev/v1", "kopfpeerings")
    assert peering_kind(()) == ("/apis/kopf.dev/v1", "clusterkopfpeerings")
