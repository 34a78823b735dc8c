"""kopf wiring: kopf runs the operator and delivers AgentRuns; Jobs, Pods and the rest come through our
informers.

kopf is the framework: login, startup and cleanup, peering, liveness and its probes. Its one
resource handler is an event handler for AgentRuns (`agentrun_event`), so it never writes to our
objects (no finalizers, no progress annotations): the reconciler is the one writer of status. The
handler and the informers (shell/informer.py) fill the cache (docs/operator.md#cache) and enqueue a
run only when what its planner can see changed (level-triggered); a periodic resync relists
everything, catching whatever a watch may have missed. With `--peering`, kopf's peering pauses a
standby, and the work queue with it (shell/peering.py). Settings: docs/operator.md#reconcile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime
from typing import Any, cast

import kopf

from agentrun_operator import naming
from agentrun_operator.api import GROUP, VERSION
from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner.context import TERMINAL_RUN_PHASES
from agentrun_operator.planner.fleet import summarize
from agentrun_operator.shell import health, metrics
from agentrun_operator.shell.cache import RunCache
from agentrun_operator.shell.events import EventRecorder
from agentrun_operator.shell.informer import Fed, Informer
from agentrun_operator.shell.kube import Kube, kopf_login
from agentrun_operator.shell.peering import PEERING_API, Peering
from agentrun_operator.shell.reconciler import Reconciler
from agentrun_operator.shell.resync import relist
from agentrun_operator.shell.warm_channels import WarmChannels
from agentrun_operator.shell.workqueue import BACKGROUND, FRONT, TURNAROUND, Key, WorkQueue

log = logging.getLogger("agentrun.handlers")


class OperatorState:
    """What the handlers share: set up at startup, torn down at cleanup."""

    def __init__(
        self,
        config: OperatorConfig,
        kubeconfig: str | None,
        workers: int,
        pause: Peering | None = None,
    ) -> None:
        self.config = config
        self.pause = pause  # None: standalone (serves at once)
        self.kubeconfig = kubeconfig
        self.workers = workers
        self.kube: Kube | None = None
        self.queue: WorkQueue | None = None
        self.reconciler: Reconciler | None = None
        self.events: EventRecorder | None = None
        self.warm: WarmChannels | None = None
        self.resync_task: asyncio.Task[None] | None = None
        self.ready_task: asyncio.Task[None] | None = None
        self.informers: list[Informer] = []
        self.cache = RunCache()
        self.reconciled_at: dict[Key, float] = {}  # monotonic time of each run's last reconcile

    def enqueue(self, key: Key | None, lane: int = FRONT) -> None:
        if key is not None and self.queue is not None:
            self.queue.enqueue(key, lane)

    def enqueue_watched(self, key: Key, ending: bool) -> None:
        """An informer's change: one that ends an attempt is a turnaround, reconciled first."""
        self.enqueue(key, TURNAROUND if ending else FRONT)

    def agentrun_event(self, event: kopf.RawEvent) -> None:
        """An AgentRun's watch event, from kopf: into the cache; the run is enqueued when what its
        planner reads changed (the echo of our own status write is not news). kopf delivers the
        objects of the LIST its watch starts from with no type (`Store.listed`)."""
        obj = dict(event["object"])
        kind, runs = event["type"], self.cache.runs
        key = runs.delete(obj) if kind == "DELETED" else runs.upsert(obj) if kind else runs.listed(obj)
        self.enqueue(key)

    def enqueue_namespace(self, key: Key, ending: bool = False) -> None:
        """Something runs refer to changed: re-plan the unfinished runs of its namespace."""
        for run_key in self.cache.runs.run_keys():
            run = self.cache.run(*run_key) if run_key[0] == key[0] else None
            if run is not None and (run.get("status") or {}).get("phase") not in TERMINAL_RUN_PHASES:
                self.enqueue(run_key)

    async def announce_ready(self) -> None:
        await self.cache.ready.wait()
        log.info("watch cache filled", extra=self.cache.sizes())

    async def reconcile(self, key: Key) -> float | None:
        assert self.reconciler is not None
        self.reconciled_at[key] = time.monotonic()
        result = await self.reconciler.reconcile(*key)
        if self.cache.run(*key) is None:
            self.reconciled_at.pop(key, None)
        return result.requeue_after

    def due_for_resync(self, key: Key) -> bool:
        """Not re-planned for a whole resync period. A run that was is left alone: its plan saw the
        cache as it was then, every change since has enqueued it, and its timers are armed."""
        last = self.reconciled_at.get(key)
        return last is None or time.monotonic() - last >= self.config.resync_seconds

    async def resync(self) -> None:
        """Periodically relist into the cache, then enqueue every run that changed, and every run
        that is not finished (or may still need its TTL) and was not re-planned since the last round."""
        await self.cache.ready.wait()
        while True:
            await asyncio.sleep(self.config.resync_seconds)
            try:
                await self.resync_once()
            except Exception:  # the next round retries; a resync must never kill the operator
                log.exception("resync failed")

    async def resync_once(self) -> None:
        assert self.kube is not None
        changed = await relist(self.kube, self.cache, self.config.watched_namespaces)
        if changed:
            log.info("resync found changes the watches had missed", extra={"runs": len(changed)})
        phases: list[str] = []
        runs: list[dict[str, Any]] = []
        for key in self.cache.runs.run_keys():
            run = self.cache.run(*key)
            if run is None:
                continue
            runs.append(run)
            phase = (run.get("status") or {}).get("phase") or "Pending"
            phases.append(phase)
            ttl = (run.get("spec") or {}).get("ttlSecondsAfterFinished")
            if (phase not in TERMINAL_RUN_PHASES or ttl) and self.due_for_resync(key):
                self.enqueue(key, BACKGROUND)  # behind every event-driven reconcile
        for key in changed:
            self.enqueue(key)
        metrics.count_runs(phases)
        fleet = summarize(runs, datetime.now(UTC))
        metrics.LONGEST_NO_PROGRESS.set(fleet.no_progress_max)
        metrics.LONGEST_APPROVAL_WAIT.set(fleet.approval_wait_max)
        metrics.STATUS_NEAR_BUDGET.set(fleet.near_budget)
        if self.events is not None:
            await self.events.flush_due(self.cache.run_namespaces_by_uid())


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's diff base, not kept: it serves change handlers (`on.create`/`on.update`), and the operator
    has only an event handler. kopf's default builds it anew for every event, a deep copy of the whole
    AgentRun (its status included) and a diff: the larger part of kopf's cost per event
    (docs/design.md#handlers). Nothing is read, built or written."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


API_ERROR_BACKOFFS: tuple[float, ...] = (1, 2, 4, 8, 15, *(30,) * 18)
"""kopf's delays between attempts of one of kopf's own API requests (its AgentRun and peering watches,
its keep-alives; not the operator's informers or writes) that failed with a 5xx, a timeout or a
refused connection (then it gives up, and a watch of kopf's that gives up stops the operator).
kopf's default (about a minute in all) is shorter than an API server takes to come back on a
loaded machine: after a restart it answers 503 ("before all known HTTP paths have been installed")
until its CRD paths are served. These wait up to 30 s apart, about 10 minutes in all, longer than
`agentrun dev up` waits for an API server to start (300 s)."""


def register(registry: kopf.OperatorRegistry, state: OperatorState) -> None:
    """Register the handlers on `registry` (not the global one, so tests can build their own)."""

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo | None:
        """kopf logs in from the operator's one credential stack (shell/kube.py): in-cluster
        ServiceAccount (at the address the pod's environment names), else the kubeconfig."""
        return await kopf_login(state.kubeconfig)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.watching.server_timeout = 270
        settings.watching.client_timeout = 300
        settings.watching.connect_timeout = 10
        settings.watching.reconnect_backoff = 1.0
        settings.networking.error_backoffs = API_ERROR_BACKOFFS
        # kopf would list namespaces and CRDs (and watch CRDs) to find resources for handlers it does
        # not have; namespaced RBAC refuses that, and nothing of ours needs it.
        settings.scanning.disabled = True
        settings.posting.level = logging.WARNING  # kopf's own Events only for its problems
        settings.persistence.diffbase_storage = NoDiffBase()
        # Not a line per AgentRun event ("Handler ... succeeded"): kopf's warnings and errors only.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        state.kube = await Kube.connect(state.kubeconfig)
        state.events = EventRecorder(state.kube, "agentrun-operator")
        state.events.start()
        state.warm = WarmChannels(state.kube, state.config.warm_port, state.enqueue)
        state.reconciler = Reconciler(
            state.kube, state.config, state.cache, events=state.events, warm=state.warm
        )
        namespaces = state.config.watched_namespaces
        kube, cache = state.kube, state.cache
        ours = f"/apis/{GROUP}/{VERSION}"

        def watch(store: Fed, prefix: str, plural: str, selector: str | None, **how: Any) -> None:
            state.informers.append(Informer(kube, cache, store, prefix, plural, selector, namespaces, **how))

        # Standalone serves; with peering kopf decides (0 until it does).
        if state.pause is None:
            metrics.SERVING.set(1)
        serving = state.pause.serving if state.pause is not None else None
        state.queue = WorkQueue(state.reconcile, workers=state.workers, ready=cache.ready, serving=serving)
        # Jobs and Pods through our own informers, filtered by label on the server: an iteration
        # causes about ten of their events, and kopf's per-event machinery cost more than our use of
        # each (docs/design.md#handlers). Each event is decoded whole. AgentRuns come through kopf
        # (`agentrun_event`).
        watch(cache.jobs, "/apis/batch/v1", "jobs", naming.LABEL_RUN, on_change=state.enqueue_watched)
        watch(cache.pods, "/api/v1", "pods", naming.LABEL_RUN, on_change=state.enqueue_watched)
        # Why a pod's volume cannot be attached or mounted: Events only, not the pod's status
        # (docs/design.md#pod-waits). One watch per reason, filtered on the server by field (a field
        # selector takes no set of values), so only these Events are sent; core/v1, the API the
        # kubelet and the attach/detach controller post them with.
        for reason, events in cache.volume_events.items():
            watch(
                events,
                "/api/v1",
                "events",
                None,
                on_change=state.enqueue_watched,
                optional=True,
                unlisted="a volume that cannot be attached or mounted is not named in the step's message",
                fields=f"involvedObject.kind=Pod,reason={reason}",
            )
        # What runs refer to (Agents, AgentProviders, ImplementationSpecs): few, small, rarely
        # changed, and read by every reconcile of a run that names them.
        for plural, store in cache.references.items():
            watch(store, ours, plural, None, on_change=state.enqueue_namespace, optional=True)
        if state.pause is not None:  # kopf's peering objects, read as kopf reads them
            peering = state.pause
            watch(
                peering,
                PEERING_API,
                peering.plural,
                None,
                on_change=state.enqueue_watched,
                fields=f"metadata.name={peering.name}",
            )
        for informer in state.informers:
            informer.start()
        state.queue.start()
        state.ready_task = asyncio.create_task(state.announce_ready())
        state.resync_task = asyncio.create_task(state.resync())
        log.info(
            "operator started",
            extra={
                "loops_enabled": state.config.loops_enabled,
                "max_iterations_cap": state.config.loop_max_iterations,
                "history_limit": state.config.loop_status_history_limit,
                "namespaces": ",".join(namespaces) or "*",
                "peering": state.pause is not None,
            },
        )

    @kopf.on.event(GROUP, VERSION, "agentruns", registry=registry)
    async def agentrun_event(event: kopf.RawEvent, **_: Any) -> None:
        """AgentRuns reach the reconciler through kopf: its watch (paused with its peering), our
        cache and work queue. kopf writes nothing for an event handler (no finalizer, no progress)."""
        state.agentrun_event(event)

    @kopf.on.probe(id="operator", registry=registry, errors=kopf.ErrorsMode.PERMANENT)
    async def probe(**_: Any) -> dict[str, int]:
        """`/healthz` fails (500) when an informer stopped receiving or the work queue stopped
        draining (shell/health.py); else it reports the cache's sizes."""
        return health.probe(state.informers, state.queue, state.cache.sizes(), time.monotonic())

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        for task in (state.resync_task, state.ready_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for informer in state.informers:
            await informer.stop()
        if state.queue is not None:
            await state.queue.stop()
        if state.pause is not None:
            state.pause.stop()
        if state.warm is not None:
            with contextlib.suppress(Exception):
                await state.warm.close()
        if state.events is not None:
            uids = state.cache.run_namespaces_by_uid()
            with contextlib.suppress(Exception):  # best effort on the way out
                await state.events.stop()
                await state.events.flush_all(uids)
        if state.kube is not None:
            await state.kube.close()
