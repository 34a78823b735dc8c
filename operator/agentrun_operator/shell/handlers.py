"""kopf wiring: watch AgentRuns and their labelled Jobs and Pods, feed one work queue.

Only `on.event` handlers are used, so kopf itself never writes to our objects (no finalizers, no
progress annotations): the reconciler is the one writer of status, and API writes per iteration stay
few. A child's event re-plans its parent (level-triggered); a periodic resync catches anything a
watch may have missed. Settings are chosen for latency and documented in docs/operations.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
from typing import Any

import kopf

from agentrun_operator import naming
from agentrun_operator.api import GROUP, VERSION
from agentrun_operator.config import OperatorConfig
from agentrun_operator.jobs.builder import ANNOTATION_RUN_NAME
from agentrun_operator.planner.context import TERMINAL_RUN_PHASES
from agentrun_operator.shell import metrics
from agentrun_operator.shell.kube import Kube, in_cluster_server
from agentrun_operator.shell.reconciler import Reconciler
from agentrun_operator.shell.workqueue import Key, WorkQueue

log = logging.getLogger("agentrun.handlers")


class EventOnlyDiffBase(kopf.DiffBaseStorage):
    """No diff base: with only `on.event` handlers kopf never needs one.

    kopf builds and deep-copies an "essence" of every watched object for change detection; for pods
    that was most of the operator's CPU per iteration. A constant empty essence skips that work.
    """

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        return {}

    def fetch(self, *, body: Any) -> Any:
        return None

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        return None


class OperatorState:
    """What the handlers share: set up at startup, torn down at cleanup."""

    def __init__(self, config: OperatorConfig, kubeconfig: str | None, workers: int) -> None:
        self.config = config
        self.kubeconfig = kubeconfig
        self.workers = workers
        self.kube: Kube | None = None
        self.queue: WorkQueue | None = None
        self.reconciler: Reconciler | None = None
        self.resync_task: asyncio.Task[None] | None = None

    def enqueue(self, key: Key) -> None:
        if self.queue is not None:
            self.queue.enqueue(key)

    async def reconcile(self, key: Key) -> float | None:
        assert self.reconciler is not None
        result = await self.reconciler.reconcile(*key)
        return result.requeue_after

    async def resync(self) -> None:
        """Periodically enqueue every run that is not finished (or may still need its TTL)."""
        assert self.kube is not None
        while True:
            await asyncio.sleep(self.config.resync_seconds)
            try:
                namespaces: list[str | None] = list(self.config.watched_namespaces) or [None]
                counts: dict[str, int] = {}
                for ns in namespaces:
                    for run in await self.kube.list_custom("agentruns", ns):
                        meta = run["metadata"]
                        phase = (run.get("status") or {}).get("phase") or "Pending"
                        counts[phase] = counts.get(phase, 0) + 1
                        if phase not in TERMINAL_RUN_PHASES or (run.get("spec") or {}).get(
                            "ttlSecondsAfterFinished"
                        ):
                            self.enqueue((meta["namespace"], meta["name"]))
                for phase in ("Pending", "Running", *sorted(TERMINAL_RUN_PHASES)):
                    metrics.RUNS.labels(phase=phase).set(counts.get(phase, 0))
            except Exception:  # the next round retries; a resync must never kill the operator
                log.exception("resync failed")


def _owner_run(body: Any) -> str | None:
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == "AgentRun" and ref.get("apiVersion", "").startswith(GROUP + "/"):
            return str(ref.get("name"))
    return None


def register(registry: kopf.OperatorRegistry, state: OperatorState) -> None:
    """Register the handlers on `registry` (not the global one, so tests can build their own)."""

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        """kopf's own credential readers: in-cluster ServiceAccount first (at the address the pod's
        environment names, see `in_cluster_server`), then the kubeconfig."""
        in_cluster = kopf.login_with_service_account(**kwargs)
        server = in_cluster_server(os.environ)
        if in_cluster is not None and server is not None:
            in_cluster = dataclasses.replace(in_cluster, server=server)
        return in_cluster or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Low batching: our own queue de-duplicates, and turnaround is measured in milliseconds.
        settings.batching.batch_window = 0.01
        settings.batching.idle_timeout = 5.0
        settings.watching.server_timeout = 270
        settings.watching.client_timeout = 300
        settings.watching.connect_timeout = 10
        settings.watching.reconnect_backoff = 1.0
        # Server-side filtering: only our Jobs and Pods reach the operator at all.
        settings.watching.label_selectors["batch", "v1", "jobs"] = naming.LABEL_RUN
        settings.watching.label_selectors["v1", "pods"] = naming.LABEL_RUN
        if state.config.watched_namespaces:
            # Namespaced RBAC cannot list namespaces or CRDs; without this kopf retries that for a minute.
            settings.scanning.disabled = True
        # Hot standby: kopf pauses every operator that sees a peer of equal priority, so each
        # replica takes a distinct one (the highest serves, the others wait).
        settings.peering.priority = random.randint(1, 2**30)
        settings.posting.level = logging.WARNING  # kopf's own Events only for its problems
        settings.persistence.finalizer = f"{GROUP}/kopf-finalizer"
        settings.persistence.diffbase_storage = EventOnlyDiffBase()
        state.kube = await Kube.connect(state.kubeconfig)
        state.reconciler = Reconciler(state.kube, state.config)
        state.queue = WorkQueue(state.reconcile, workers=state.workers)
        state.queue.start()
        state.resync_task = asyncio.create_task(state.resync())
        log.info(
            "operator started",
            extra={
                "loops_enabled": state.config.loops_enabled,
                "max_iterations_cap": state.config.loop_max_iterations,
                "history_limit": state.config.loop_status_history_limit,
                "namespaces": ",".join(state.config.watched_namespaces) or "*",
            },
        )

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        if state.resync_task is not None:
            state.resync_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await state.resync_task
        if state.queue is not None:
            await state.queue.stop()
        if state.kube is not None:
            await state.kube.close()

    @kopf.on.event(GROUP, VERSION, "agentruns", registry=registry)
    def on_agentrun(body: Any, type: str | None, **_: Any) -> None:
        if type == "DELETED":
            return
        meta = body.get("metadata", {})
        state.enqueue((meta.get("namespace"), meta.get("name")))

    @kopf.on.event("batch", "v1", "jobs", labels={naming.LABEL_RUN: kopf.PRESENT}, registry=registry)
    def on_job(body: Any, **_: Any) -> None:
        run = _owner_run(body)
        if run:
            state.enqueue((body["metadata"]["namespace"], run))

    @kopf.on.event("", "v1", "pods", labels={naming.LABEL_RUN: kopf.PRESENT}, registry=registry)
    def on_pod(body: Any, **_: Any) -> None:
        meta = body.get("metadata", {})
        run = (meta.get("annotations") or {}).get(ANNOTATION_RUN_NAME) or (meta.get("labels") or {}).get(
            naming.LABEL_RUN
        )
        if run:
            state.enqueue((meta["namespace"], run))
