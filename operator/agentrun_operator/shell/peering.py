"""Hot standby with kopf's own peering: the work queue serves while kopf's peering lets this replica
serve (docs/operations.md#ha).

kopf decides which replica serves: every replica writes its identity, priority and a keep-alive
into the peering object named for this operator (`--peering-name`, the chart's `peering.name`), and
by kopf's documented rule a replica pauses while it sees a live peer of higher or equal priority.
Its peering is mandatory here, so a replica starts paused. kopf pauses its own watches (the
AgentRuns', shell/handlers.py); the Job and Pod informers and the work queue are the operator's
own, so they must pause with it.

kopf offers no public query of its pause state, so the operator reads what kopf decides from: the
peering objects themselves, through the API (an informer, as for Jobs, with a field selector on the
object's name), with the identity and priority it gives kopf (`kopf.operator(identity=…,
priority=…)`), under the same rule (`allows`). This replica serves once its own entry is in every
peering object (kopf's first keep-alive) and no live peer there has a priority as high as its own;
a blocking peer whose keep-alive runs out is re-checked at that moment. An entry that cannot be
read counts as a live peer of the highest priority (fails closed: a standby stays a standby).
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
import random
import socket
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from agentrun_operator.shell import metrics
from agentrun_operator.shell.observe import parse_time

log = logging.getLogger("agentrun.peering")

DEFAULT_PEERING_NAME = "agentrun-operator"
"""Not kopf's `default`: a peering object shared with another kopf operator makes it a peer."""
PEERING_API = "/apis/kopf.dev/v1"
DEFAULT_LIFETIME = 60  # seconds: kopf's default keep-alive lifetime, for an entry that names none

Key = tuple[str, str]
Obj = dict[str, Any]


def choose_priority(rng: random.Random | None = None) -> int:
    """A random priority per replica: kopf pauses every replica that sees an equal one, so that no
    two tie; the highest serves, the others stand by."""
    return (rng or random.Random()).randint(1, 2**30)


def own_identity(rng: random.Random | None = None) -> str:
    """This replica's peering identity: `POD_ID` (the chart sets the pod's name, kopf's convention),
    else user, host and a random part, as kopf makes its own."""
    if os.environ.get("POD_ID"):
        return os.environ["POD_ID"]
    try:
        user = getpass.getuser()
    except Exception:  # no user name in the pod's environment
        user = str(os.getuid())
    suffix = "".join((rng or random.Random()).choices("abcdefghijklmnopqrstuvwxyz0123456789", k=6))
    return f"{user}@{socket.gethostname()}/{suffix}"


def allows(status: Any, identity: str, priority: int, now: datetime) -> tuple[bool, float | None]:
    """(whether this peering object's entries let this replica serve, seconds until the first
    blocking peer's keep-alive runs out). kopf's rule: a live peer -- seen within its lifetime --
    of a priority as high as this replica's pauses it; and kopf writes this replica's own entry
    first (mandatory peering: no entry yet, no serving)."""
    entries = status if isinstance(status, dict) else {}
    if identity not in entries:
        return False, None
    blocking: list[float] = []
    for peer, entry in entries.items():
        if peer == identity or entry is None:
            continue
        try:
            seen = parse_time(entry.get("lastseen"))
            lifetime = timedelta(seconds=int(entry.get("lifetime", DEFAULT_LIFETIME)))
            their = int(entry.get("priority", 0))
        except (AttributeError, TypeError, ValueError):
            return False, None  # unreadable: a peer that may outrank us (fails closed)
        if seen is None:
            return False, None
        left = (seen + lifetime - now).total_seconds()
        if left > 0 and their >= priority:
            blocking.append(left)
    return (False, min(blocking)) if blocking else (True, None)


class Peering:
    """`serving` is set while every peering object lets this replica serve, cleared otherwise. An
    informer of the peering objects feeds it (the `Fed` calls: shell/informer.py)."""

    def __init__(self, identity: str, priority: int, name: str, namespaces: Iterable[str]) -> None:
        self.identity, self.priority, self.name = identity, priority, name
        self.namespaces = tuple(namespaces)
        self.plural = "kopfpeerings" if self.namespaces else "clusterkopfpeerings"
        self.serving = asyncio.Event()
        self._status: dict[tuple[str, str], Any] = {}
        self._clock = 0
        self._taken: dict[tuple[str, str], int] = {}
        self._recheck: asyncio.TimerHandle | None = None
        metrics.SERVING.set(0)

    # -- Fed ---------------------------------------------------------------------------------------
    def upsert(self, obj: Obj) -> Key | None:
        where = self._where(obj)
        if where[1] == self.name:
            self._clock += 1
            self._taken[where] = self._clock
            self._status[where] = obj.get("status")
            self.decide()
        return None

    def delete(self, obj: Obj) -> Key | None:
        self._status.pop(self._where(obj), None)
        self.decide()
        return None

    def ending(self, obj: Obj) -> bool:
        return False  # a peer's change is no run's turnaround

    def clock(self) -> int:
        return self._clock

    def relist(self, items: Iterable[Obj], since: int, namespaces: set[str] | None) -> set[Key]:
        items = list(items)
        listed = {self._where(obj) for obj in items}
        for obj in items:
            self.upsert(obj)
        for where in list(self._status):
            in_scope = namespaces is None or where[0] in namespaces
            if in_scope and where not in listed and self._taken.get(where, 0) <= since:
                self._status.pop(where, None)
        self.decide()
        return set()

    # -- the decision -------------------------------------------------------------------------------
    def decide(self, now: datetime | None = None) -> None:
        """Serve or stand by, from every peering object as last seen; re-check when a blocking
        peer's keep-alive runs out (no event says so)."""
        now = now or datetime.now(UTC)
        expected = len(self.namespaces) or 1
        verdicts = [allows(status, self.identity, self.priority, now) for status in self._status.values()]
        serve = len(verdicts) == expected and all(ok for ok, _ in verdicts)
        waits = [left for _, left in verdicts if left is not None]
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        if waits:
            self._recheck = asyncio.get_running_loop().call_later(min(waits) + 0.1, self.decide)
        if serve == self.serving.is_set():
            return
        metrics.SERVING.set(1 if serve else 0)
        if serve:
            log.info("serving: kopf's peering lets this replica serve", extra={"identity": self.identity})
            self.serving.set()
        else:
            log.info("standing by: a live peer has a priority as high", extra={"identity": self.identity})
            self.serving.clear()

    def stop(self) -> None:
        if self._recheck is not None:
            self._recheck.cancel()

    @staticmethod
    def _where(obj: Obj) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return str(meta.get("namespace") or ""), str(meta.get("name") or "")
