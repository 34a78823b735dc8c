"""`agentrun operator`: configuration from the environment, then kopf with our handlers."""

from __future__ import annotations

import asyncio
import logging
import os

import kopf
import uvloop
from prometheus_client import start_http_server

from agentrun_operator.config import OperatorConfig
from agentrun_operator.shell import logs
from agentrun_operator.shell.handlers import OperatorState, register

log = logging.getLogger("agentrun.main")


def run_operator(
    kubeconfig: str | None = None,
    metrics_port: int = 0,
    liveness_port: int = 0,
    log_format: str = "json",
    workers: int = 32,
    standalone: bool = True,
) -> int:
    logs.configure(log_format)
    config = OperatorConfig.from_env()
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig  # kopf's own login reads it too
    if metrics_port:
        start_http_server(metrics_port, addr="0.0.0.0")
    registry = kopf.OperatorRegistry()
    register(registry, OperatorState(config, kubeconfig, workers))
    namespaces = list(config.watched_namespaces)
    liveness = f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None
    # uvloop (kopf's `uvloop` extra; kopf's own CLI uses it the same way): the event loop and its TLS
    # in compiled code. In asyncio's own loop, TLS record handling and the loop's bookkeeping were a
    # fifth of the operator's CPU per iteration (docs/operator.md#performance).
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(
            kopf.operator(
                registry=registry,
                standalone=standalone,
                clusterwide=not namespaces,
                namespaces=namespaces,
                liveness_endpoint=liveness,
            )
        )
    return 0
