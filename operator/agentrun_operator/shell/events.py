"""Events, aggregated: at most one Event write per reconcile, repeated reasons folded into a series.

The planner asks for Events per transition (docs/concepts.md#events); posting each as its own object
cost 2-3 writes per iteration. Here (docs/operator.md#events):

- the Events one reconcile plans become one Event: `Reason: message` of each joined in order, type
  `Warning` when any is, reason the most telling one (`rank`);
- an Event whose reason and type repeat the run's existing series only updates that series in memory
  (count, lastTimestamp, newest message); the series object is patched when `flush_seconds` have
  passed since it was last written, when the run finishes, or when the operator stops, so
  `kubectl describe` shows e.g. `IterationStarted (x19 over 40s)` with the newest message;
- a decision (`ConditionEvaluated`: a loop's condition after an iteration) is its own Event, never
  merged nor folded, so each iteration's decision stays findable (a series would keep only the
  newest message). Its name is derived from the run and the decision, so a replayed plan posts it
  once. Past `MAX_DECISION_EVENTS` of one run (per operator process) decisions fold as the rest do;
- a routine reconcile (its Events all `fold` and `Normal`: a warm loop's hand-over) starts no
  series of its own: the series is held in memory and posted `flush_seconds` after its first Event
  or when the operator stops; if the run finishes first, it becomes one part of the run's final
  Event. A warm iteration thus costs no Event write (a held series is lost if the process is killed).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agentrun_operator import naming
from agentrun_operator.api import API_VERSION, format_timestamp
from agentrun_operator.planner.actions import EmitEvent
from agentrun_operator.shell import metrics
from agentrun_operator.shell.kube import Kube, KubeError

log = logging.getLogger("agentrun.events")

# Higher wins the merged Event's reason: a failed validation (the run's end names only its reason,
# and the docs promise a Warning Event `InvalidSpec`), a run's end, a loop's, warnings, iterations.
_RANK = {
    "InvalidSpec": 55,
    "RunSucceeded": 50,
    "RunFailed": 50,
    "RunCancelled": 50,
    "LoopCompleted": 40,
    "LoopStarted": 40,
    "IterationFailed": 35,
    "IterationRetrying": 30,
    "StepSkipped": 20,
}
MAX_MESSAGE = 1024
HELD_MESSAGE = 200
"""A held series' newest message, as a part of the run's final Event, is clipped to its last this many
characters: the summary comes after the run's end, and truncation at `MAX_MESSAGE` cuts it first."""
DECISION_REASONS = frozenset({"ConditionEvaluated"})
MAX_DECISION_EVENTS = 200
"""Decisions posted as Events of their own per run (and operator process); later ones fold. A loop
of 1,000 iterations keeps the first 200 decisions as Events, its status keeps every counter."""


def split_decisions(events: Sequence[EmitEvent], posted: int) -> tuple[list[EmitEvent], list[EmitEvent]]:
    """The decisions to post as Events of their own (while fewer than `MAX_DECISION_EVENTS` were),
    and the rest, to merge into one."""
    own: list[EmitEvent] = []
    rest: list[EmitEvent] = []
    for event in events:
        if event.reason in DECISION_REASONS and not event.fold and posted + len(own) < MAX_DECISION_EVENTS:
            own.append(event)
        else:
            rest.append(event)
    return own, rest


def decision_event_name(run_name: str, uid: str, event: EmitEvent) -> str:
    """A decision Event's name: the run's, then a digest of the run's uid and the decision (its
    message names the step and the iteration), so posting it again after a replay adopts it."""
    digest = hashlib.sha256(f"{uid}\0{event.reason}\0{event.message}".encode()).hexdigest()[:16]
    return f"{run_name[:200]}.{digest}"


def merge(events: Sequence[EmitEvent], held: Sequence[str] = ()) -> EmitEvent:
    """One Event for all a reconcile planned: the most telling reason (the latest among equals).
    `held`: summaries of held series (`held_summary`), parts after the reconcile's own."""
    warning = any(e.type == "Warning" for e in events)
    best = events[0]
    for event in events[1:]:
        if rank(event) >= rank(best):
            best = event
    if len(events) == 1 and not held:
        message = events[0].message
    else:  # each part keeps its reason, so describe (and a grep for a reason) still finds it
        message = "; ".join([*(f"{e.reason}: {e.message.rstrip('.')}" for e in events), *held])
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 1] + "…"
    return EmitEvent("Warning" if warning else "Normal", best.reason, message)


def held_summary(reason: str, series: Series) -> str:
    """A held series as a part of another Event: `IterationStarted (x9 over 12s): <newest message>`."""
    message = series.message.rstrip(".")
    if len(message) > HELD_MESSAGE:  # its newest part last: a hand-over's start is its end
        message = "…" + message[-(HELD_MESSAGE - 1) :]
    if series.count == 1:
        return f"{reason}: {message}"
    return f"{reason} (x{series.count} over {_span(series.last_seen - series.first_seen)}): {message}"


def _span(seconds: float) -> str:
    whole = max(0, round(seconds))
    if whole < 120:
        return f"{whole}s"
    return f"{whole // 60}m" if whole < 7200 else f"{whole // 3600}h"


def rank(event: EmitEvent) -> int:
    return _RANK.get(event.reason, 10 if event.type == "Warning" else 0)


def _now() -> str:
    return format_timestamp(datetime.now(UTC).replace(microsecond=0))


@dataclass
class Series:
    name: str  # the Event object's name; "" while held (not posted yet)
    count: int
    message: str
    first_timestamp: str
    last_timestamp: str
    first_seen: float  # the recorder's clock at the first Event, at the newest, at the last write
    last_seen: float
    written_at: float
    dirty: bool = False

    @property
    def held(self) -> bool:
        return not self.name

    def fold(self, event: EmitEvent, now: float) -> None:
        self.count += 1
        self.message = event.message
        self.last_timestamp = _now()
        self.last_seen = now
        self.dirty = True


@dataclass
class RunSeries:
    involved: dict[str, Any]  # the run, as its Events' involvedObject
    by_reason: dict[tuple[str, str], Series] = field(default_factory=dict)
    decisions: int = 0  # decision Events posted as their own
    # Held by `record` and by a flush: a held series is posted once, never also merged at the end.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


WRITERS = 8
"""Tasks posting Events beside the workers; a run's Events always go through the same one, in order."""
BACKLOG = 10_000
"""Reconciles' Events waiting for a writer; past this they are dropped (logged), as client-go's
broadcaster drops when its queue is full: an Event must never hold up a run."""


STOP_GRACE_SECONDS = 10.0
"""How long the operator, stopping, waits for its writers to post what reconciles handed them."""


class EventRecorder:
    """Posts what reconciles plan. Once `start`ed, off the work queue's path: `submit` returns at once
    and writer tasks post (docs/operator.md#events). Each Event write waited for in the reconcile cost
    a busy API server's full latency: at 1,000 concurrent runs on two cores, 0.2 s each, about a
    third of a reconcile (docs/operator.md#scale)."""

    def __init__(
        self,
        kube: Kube,
        instance: str,
        flush_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.instance = instance
        self.flush_seconds = flush_seconds
        self.clock = clock
        self._runs: dict[str, RunSeries] = {}  # by run uid
        self._backlogs: list[asyncio.Queue[tuple[dict[str, Any], list[EmitEvent], bool]]] = []
        self._writers: list[asyncio.Task[None]] = []
        self.dropped = 0

    def start(self, writers: int = WRITERS, backlog: int = BACKLOG) -> None:
        self._backlogs = [asyncio.Queue(maxsize=max(1, backlog // writers)) for _ in range(writers)]
        self._writers = [asyncio.create_task(self._write(q)) for q in self._backlogs]

    async def stop(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        """Post what is waiting (for `grace_seconds` at most: an API server that is gone must not
        hold the operator's exit), then stop the writers."""
        waiting = asyncio.gather(*(backlog.join() for backlog in self._backlogs))
        try:
            await asyncio.wait_for(waiting, grace_seconds)
        except TimeoutError:
            left = sum(backlog.qsize() for backlog in self._backlogs)
            log.warning("stopping with events not posted", extra={"reconciles": left})
        for task in self._writers:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._writers, self._backlogs = [], []

    async def submit(self, run: dict[str, Any], events: Sequence[EmitEvent], finished: bool) -> None:
        """`record`, by a writer task when started (returns at once), else here and now."""
        if not self._backlogs:
            await self.record(run, events, finished)
            return
        if not events and not finished:
            return
        uid = str(run["metadata"]["uid"])
        backlog = self._backlogs[
            int(hashlib.blake2b(uid.encode(), digest_size=4).hexdigest(), 16) % len(self._backlogs)
        ]
        try:
            backlog.put_nowait((run, list(events), finished))
        except asyncio.QueueFull:
            self.dropped += 1
            metrics.EVENTS_DROPPED.inc()
            log.warning(
                "event backlog full; events of a reconcile dropped", extra={"run": run["metadata"]["name"]}
            )

    async def _write(self, backlog: asyncio.Queue[tuple[dict[str, Any], list[EmitEvent], bool]]) -> None:
        while True:
            run, events, finished = await backlog.get()
            try:
                await self.record(run, events, finished)
            except Exception:  # best effort, as every Event write
                log.exception("events not posted")
            finally:
                backlog.task_done()

    async def record(self, run: dict[str, Any], events: Sequence[EmitEvent], finished: bool) -> None:
        """Post (or fold into a series, or hold) what one reconcile planned; flush all when `finished`."""
        if not events and not finished:
            return
        uid = str(run["metadata"]["uid"])
        run_series = self._runs.setdefault(uid, RunSeries(_involved(run)))
        run_series.involved = _involved(run)
        async with run_series.lock:
            try:
                await self._record(run_series, events, finished)
            finally:
                if finished:
                    self._runs.pop(uid, None)

    async def _record(self, run_series: RunSeries, events: Sequence[EmitEvent], finished: bool) -> None:
        involved = run_series.involved
        own, events = split_decisions(events, run_series.decisions)
        for decision in own:
            run_series.decisions += 1
            name = decision_event_name(str(involved["name"]), str(involved["uid"]), decision)
            await self._post(run_series, decision, name=name)
        series_of = run_series.by_reason
        if events:
            # Routine: a warm loop's hand-over, which no one waits to see (docs/operator.md#events).
            routine = not finished and all(e.fold and e.type == "Normal" for e in events)
            plain = merge(events)
            key: tuple[str, str] = (plain.type, plain.reason)
            held: list[tuple[str, str]] = []
            if finished:  # held series end as parts of the run's final Event, after its own
                held = [k for k, s in series_of.items() if s.held and k != key]
            event = merge(events, [held_summary(k[1], series_of[k]) for k in held])
            for k in held:
                del series_of[k]
            series = series_of.get(key)
            now = self.clock()
            if series is None and routine:
                stamp = _now()
                series_of[key] = Series("", 1, event.message, stamp, stamp, now, now, now)
            elif series is None:
                await self._post(run_series, event)
            else:
                series.fold(event, now)
                if series.held:  # an Event that is not routine is not held back by routine ones
                    if not routine or now - series.first_seen >= self.flush_seconds:
                        await self._post_held(run_series, key, series)
                elif now - series.written_at >= self.flush_seconds:
                    await self._patch(involved["namespace"], series)
        if finished:
            for key, series in list(series_of.items()):
                if series.held:  # no Event of the run's end to merge into: posted as it is
                    await self._post_held(run_series, key, series)
                elif series.dirty:
                    await self._patch(involved["namespace"], series)

    async def flush_due(self, namespaces: dict[str, str]) -> None:
        """Post held series whose first Event is `flush_seconds` old, and patch series that changed
        and were last written `flush_seconds` ago (the resync calls it).

        `namespaces` maps a run's uid to its namespace."""
        await self._flush(namespaces, wait=False)

    async def flush_all(self, namespaces: dict[str, str]) -> None:
        """Post every held series and patch every changed one now (the operator is stopping)."""
        self.flush_seconds = 0.0
        await self._flush(namespaces, wait=True)

    async def _flush(self, namespaces: dict[str, str], wait: bool) -> None:
        for uid, run_series in list(self._runs.items()):
            ns = namespaces.get(uid)
            if ns is None:
                self._runs.pop(uid, None)  # the run is gone
                continue
            if run_series.lock.locked() and not wait:
                continue  # its writer is at it; the next resync comes back
            async with run_series.lock:
                if self._runs.get(uid) is not run_series:
                    continue  # finished meanwhile: its series were written
                now = self.clock()
                for key, series in list(run_series.by_reason.items()):
                    if series.held and now - series.first_seen >= self.flush_seconds:
                        await self._post_held(run_series, key, series)
                    elif series.dirty and now - series.written_at >= self.flush_seconds:
                        await self._patch(ns, series)

    async def _post(self, run_series: RunSeries, action: EmitEvent, name: str | None = None) -> None:
        """Post `action` as a new Event (a series, unless `name` is given: a decision of its own)."""
        now = _now()
        created = await self._create(
            run_series.involved, action.type, action.reason, action.message, 1, now, now, name
        )
        if created and not name:  # a decision is no series: nothing folds into it
            clock = self.clock()
            series = Series(created, 1, action.message, now, now, clock, clock, clock)
            run_series.by_reason[(action.type, action.reason)] = series

    async def _post_held(self, run_series: RunSeries, key: tuple[str, str], series: Series) -> None:
        """Post a held series as it stands; from then on it is an ordinary series."""
        type_, reason = key
        created = await self._create(
            run_series.involved,
            type_,
            reason,
            series.message,
            series.count,
            series.first_timestamp,
            series.last_timestamp,
        )
        if not created:  # best effort: the next routine Event starts a new one
            run_series.by_reason.pop(key, None)
            return
        series.name = created
        series.dirty = False
        series.written_at = self.clock()

    async def _create(
        self,
        involved: dict[str, Any],
        type_: str,
        reason: str,
        message: str,
        count: int,
        first_timestamp: str,
        last_timestamp: str,
        name: str | None = None,
    ) -> str:
        """POST an Event; its name, "" when it was not posted."""
        namespace = involved["namespace"]
        identity = {"name": name} if name else {"generateName": f"{involved['name'][:200]}."}
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {**identity, "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:MAX_MESSAGE],
            "type": type_,
            "firstTimestamp": first_timestamp,
            "lastTimestamp": last_timestamp,
            "count": count,
            "source": {"component": "agentrun-operator"},
            "reportingComponent": f"{naming.GROUP}/agentrun-operator",
            "reportingInstance": self.instance,
        }
        try:
            created = await self.kube.create_event(namespace, event)
        except KubeError as exc:  # Events are best effort; never fail a reconcile on them
            if not (name and exc.status == 409):  # a decision posted before a replay: it is there
                log.warning("event not posted: %s", exc)
            return ""
        return str((created.get("metadata") or {}).get("name") or "")

    async def _patch(self, namespace: str, series: Series) -> None:
        series.dirty = False
        series.written_at = self.clock()
        patch = {
            "count": series.count,
            "lastTimestamp": series.last_timestamp,
            "message": series.message[:MAX_MESSAGE],
        }
        try:
            await self.kube.patch_event(namespace, series.name, patch)
        except KubeError as exc:
            log.warning("event series not updated: %s", exc)


def _involved(run: dict[str, Any]) -> dict[str, Any]:
    meta = run["metadata"]
    return {
        "apiVersion": run.get("apiVersion", API_VERSION),
        "kind": "AgentRun",
        "name": meta["name"],
        "namespace": meta["namespace"],
        "uid": meta["uid"],
        "resourceVersion": meta.get("resourceVersion"),
    }
