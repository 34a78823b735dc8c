"""Hot standby with kopf peering: which replica serves (docs/operations.md#ha).

kopf keeps the peering object (a `KopfPeering` per watched namespace, or the `ClusterKopfPeering`,
named `default`): each replica writes its identity, priority and a keep-alive into its `status`.
kopf pauses only the watches *it* runs, and the operator watches AgentRuns, Jobs and Pods with its
own informers (docs/operator.md#reconcile), so the pause is decided here, by the same rule kopf
applies: a replica stands by while the peering object shows a live peer of higher or equal
priority (kopf pauses every operator that sees an equal one; each replica draws a random priority,
so one serves). A standby keeps its caches filled and queues its work; `PeeringGate.serving` holds
the work queue's workers until it serves.
"""

from __future__ import annotations

import asyncio
import datetime
import getpass
import logging
import random
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agentrun_operator.shell import metrics
from agentrun_operator.shell.cache import Key, Store
from agentrun_operator.shell.observe import parse_time

log = logging.getLogger("agentrun.peering")

PEERING_NAME = "default"
"""kopf's default peering object name (the operator does not set another)."""

DEFAULT_LIFETIME_SECONDS = 60  # kopf's, for an entry that does not say


@dataclass(frozen=True)
class PeeringIdentity:
    """Who this replica is in the peering object, and its priority: both handed to kopf, which
    writes the keep-alives, and both read here to find the peers that outrank it."""

    identity: str
    priority: int

    @classmethod
    def choose(cls, env: Mapping[str, str], rng: random.Random | None = None) -> PeeringIdentity:
        """The pod's name (`POD_ID`, as kopf reads it), else kopf's own form for an operator run
        by hand: user@host/start time/random. A random priority, so that no two replicas tie."""
        draw = rng or random.Random()
        identity = env.get("POD_ID")
        if not identity:
            now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d%H%M%S")
            identity = f"{getpass.getuser()}@{socket.gethostname()}/{now}/{draw.randrange(16**3):03x}"
        return cls(identity=identity, priority=draw.randint(1, 2**30))


@dataclass(frozen=True)
class Peer:
    identity: str
    priority: int
    deadline: datetime.datetime  # its last keep-alive plus its lifetime


def _lastseen(value: Any, now: datetime.datetime) -> datetime.datetime:
    """A peer's keep-alive time (`parse_time`), as kopf reads it: missing or unreadable is now, one
    without a zone is UTC."""
    parsed = parse_time(value) if isinstance(value, str) else None
    if parsed is None:
        return now
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def parse_peers(status: Mapping[str, Any], now: datetime.datetime) -> list[Peer]:
    """The peers of a peering object's `status` (identity -> priority, lifetime, lastseen).

    Read as kopf reads them: a missing `lastseen` counts as now, a missing lifetime as 60 s. An entry
    that is not of that shape is skipped (a peer that writes garbage cannot stop us from serving)."""
    peers: list[Peer] = []
    for identity, info in status.items():
        if not isinstance(info, Mapping):
            continue
        try:
            priority = int(info.get("priority", 0))
            lifetime = int(info.get("lifetime", DEFAULT_LIFETIME_SECONDS))
        except (TypeError, ValueError):
            continue
        lastseen = _lastseen(info.get("lastseen"), now)
        peers.append(Peer(str(identity), priority, lastseen + datetime.timedelta(seconds=lifetime)))
    return peers


def blocking_peers(peers: Iterable[Peer], own: PeeringIdentity, now: datetime.datetime) -> list[Peer]:
    """The live peers (keep-alive not expired) other than us with a priority not below ours."""
    return [
        p for p in peers if p.deadline > now and p.identity != own.identity and p.priority >= own.priority
    ]


def peering_store() -> Store:
    """Peering objects by (namespace, name), each kept as its `status` alone."""
    return Store(
        lambda obj: str((obj.get("metadata") or {}).get("name") or ""),
        lambda obj: dict(obj.get("status") or {}),
        keep_body=False,
    )


class PeeringGate:
    """`serving` is set while no live peer outranks this replica, cleared while one does."""

    def __init__(self, own: PeeringIdentity, store: Store) -> None:
        self.own = own
        self.store = store
        self.serving = asyncio.Event()
        self._decided: bool | None = None
        self._timer: asyncio.TimerHandle | None = None

    def changed(self, _key: Key) -> None:
        """A peering object changed (the informer's callback)."""
        self.decide()

    def blockers(self, now: datetime.datetime) -> list[Peer]:
        out: list[Peer] = []
        for key in self.store.run_keys():
            if key[1] != PEERING_NAME:
                continue
            found, status = self.store.view_of(key, PEERING_NAME)
            if found and isinstance(status, Mapping):
                out += blocking_peers(parse_peers(status, now), self.own, now)
        return out

    def decide(self) -> None:
        """Serve or stand by, from the peering objects as last seen; while standing by, decide again
        when the first blocking peer's keep-alive expires (a peer killed outright writes nothing)."""
        now = datetime.datetime.now(datetime.UTC)
        blockers = self.blockers(now)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        serve = not blockers
        if blockers:
            wait = min(p.deadline for p in blockers) - now
            self._timer = asyncio.get_running_loop().call_later(wait.total_seconds() + 0.1, self.decide)
        if serve == self._decided:
            return
        self._decided = serve
        metrics.SERVING.set(1 if serve else 0)
        if serve:
            log.info(
                "serving: no live peer of higher or equal priority", extra={"identity": self.own.identity}
            )
            self.serving.set()
        else:
            log.info(
                "standing by: a peer of higher or equal priority serves",
                extra={
                    "identity": self.own.identity,
                    "priority": self.own.priority,
                    "peers": ",".join(sorted(p.identity for p in blockers)),
                },
            )
            self.serving.clear()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def peering_kind(namespaces: tuple[str, ...]) -> tuple[str, str]:
    """(API prefix, plural) of the peering objects kopf uses: namespaced when namespaces are listed."""
    return ("/apis/kopf.dev/v1", "kopfpeerings" if namespaces else "clusterkopfpeerings")
