"""`agentrun operator`: configuration from the environment, then kopf with our handlers."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from typing import Any, cast

import kopf
import uvloop
from prometheus_client import start_http_server

from agentrun_operator.config import OperatorConfig
from agentrun_operator.shell import admission, logs
from agentrun_operator.shell.handlers import OperatorState, register
from agentrun_operator.shell.peering import DEFAULT_PEERING_NAME, Peering, choose_priority, own_identity

log = logging.getLogger("agentrun.main")

GC_YOUNG_THRESHOLD = 20_000
"""Allocations between two collections of the youngest generation (CPython's default: 700)."""


def tune_gc() -> None:
    """Fewer, cheaper cycle collections (docs/operator.md#reconcile).

    Every watch event and reconcile allocates thousands of short-lived dicts; with CPython's default
    threshold the cycle collector ran every few hundred of them and walked the long-lived objects
    (modules, pydantic schemas, kopf's registries) each time it promoted: 9 % of the operator's CPU
    samples. Everything alive at start-up is frozen out of collection (it lives as long as the
    process), and the youngest generation is collected every 20,000 allocations instead of 700.
    Memory is still reclaimed by reference counting at once; only cycles wait a little longer.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def run_operator(
    kubeconfig: str | None = None,
    metrics_port: int = 0,
    liveness_port: int = 0,
    log_format: str = "json",
    workers: int = 32,
    standalone: bool = True,
    peering_name: str = DEFAULT_PEERING_NAME,
) -> int:
    logs.configure(log_format)
    config = OperatorConfig.from_env()
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig  # kopf's own login reads it too
    if metrics_port:
        start_http_server(metrics_port, addr="0.0.0.0")
    registry = kopf.OperatorRegistry()
    namespaces = list(config.watched_namespaces)
    # With peering, kopf decides which replica serves; the work queue pauses when kopf pauses: it
    # reads the peering objects with the identity and priority given to kopf (shell/peering.py).
    identity, priority = own_identity(), choose_priority()
    pause = None if standalone else Peering(identity, priority, peering_name, namespaces)
    register(registry, OperatorState(config, kubeconfig, workers, pause))
    admission.register(registry, config, kubeconfig)  # the admission webhook, when configured
    liveness = f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None
    tune_gc()
    # uvloop (kopf's `uvloop` extra; kopf's own CLI uses it the same way): the event loop and its TLS
    # in compiled code. In asyncio's own loop, TLS record handling and the loop's bookkeeping were a
    # fifth of the operator's CPU per iteration (docs/operator.md#performance).
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(
            kopf.operator(
                registry=registry,
                standalone=standalone,
                peering_name=None if standalone else peering_name,  # mandatory: no peering object, no serving
                priority=None if standalone else priority,
                identity=cast(Any, identity),  # kopf's `Identity` is a NewType of str
                clusterwide=not namespaces,
                namespaces=namespaces,
                liveness_endpoint=liveness,
            )
        )
    return 0
