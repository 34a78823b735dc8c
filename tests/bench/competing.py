"""Competing load for the scale benchmark: other clients of the same API server (docs/operator.md#scale-apf).

N ServiceAccounts of their own (`competitor-0`, …, namespace `competing`, each a distinct user and so
a distinct flow for API Priority and Fairness, in `workload-low` like any ServiceAccount) LIST the
namespace's M ConfigMaps back to back, each over one keep-alive connection: the pattern of a
controller or a script that relists instead of watching. A 429 (APF rejected the request) is retried
after the answer's Retry-After, as client-go does. The clients run in a process of their own, so
their reading does not take the benchmark's own watches' turns (and so its timestamps).

    competitors = Competitors(plane, clients=8, objects=1000, object_bytes=1024).prepare()
    competitors.start(); ...; stats = competitors.stop()
"""

from __future__ import annotations

import http.client
import multiprocessing
import multiprocessing.synchronize
import ssl
import threading
import time
from typing import Any

from agentrun_devcluster.controlplane import ControlPlane
from tests.bench.figures import distribution
from tests.support.tokens import service_account_token

NAMESPACE = "competing"


def _client(
    host: str, port: int, ca: str, token: str, path: str, stop: threading.Event | Any, out: list[Any]
) -> None:
    """One client: LIST `path` until `stop`; appends (status, seconds) per answer to `out`."""
    context = ssl.create_default_context(cafile=ca)
    conn: http.client.HTTPSConnection | None = None
    while not stop.is_set():
        if conn is None:
            conn = http.client.HTTPSConnection(host, port, context=context, timeout=60)
        started = time.monotonic()
        try:
            conn.request(
                "GET", path, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"}
            )
            resp = conn.getresponse()
            resp.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = None
            out.append((0, time.monotonic() - started))
            continue
        out.append((resp.status, time.monotonic() - started))
        if resp.status == 429:
            stop.wait(float(resp.getheader("Retry-After") or 1))


def _run(
    host: str,
    port: int,
    ca: str,
    tokens: list[str],
    path: str,
    stop: multiprocessing.synchronize.Event,
    results: Any,
) -> None:
    """The clients' process: one thread per token until `stop`, then their answers to `results`."""
    answers: list[list[Any]] = [[] for _ in tokens]
    threads = [
        threading.Thread(target=_client, args=(host, port, ca, token, path, stop, answers[i]), daemon=True)
        for i, token in enumerate(tokens)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put([a for per_client in answers for a in per_client])


class Competitors:
    """Other clients of the plane's API server, as ServiceAccounts: created, started, stopped."""

    def __init__(self, plane: ControlPlane, clients: int, objects: int, object_bytes: int = 1024) -> None:
        self.plane = plane
        self.clients = clients
        self.objects = objects
        self.object_bytes = object_bytes
        self.tokens: list[str] = []
        self._context = multiprocessing.get_context("spawn")
        self._stop = self._context.Event()
        self._results: Any = self._context.Queue()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._started = 0.0

    def prepare(self, create: Any, token_seconds: int = 7200) -> Competitors:
        """The namespace, its ConfigMaps (`create(path, bodies)` POSTs them), the ServiceAccounts,
        their right to list them, and a token each."""
        plane = self.plane
        plane.kubectl("create", "namespace", NAMESPACE, check=False)
        names = [f"competitor-{i}" for i in range(self.clients)]
        for name in names:
            plane.kubectl("create", "serviceaccount", name, "-n", NAMESPACE, check=False)
        # A Role of their own: the plane runs no ClusterRole aggregation, so `view` is empty there.
        role = ("role", "competitors", "-n", NAMESPACE, "--verb=list", "--resource=configmaps")
        plane.kubectl("create", *role)
        plane.kubectl(
            "create",
            "rolebinding",
            "competitors",
            "-n",
            NAMESPACE,
            "--role=competitors",
            *(f"--serviceaccount={NAMESPACE}:{name}" for name in names),
        )
        payload = "x" * self.object_bytes
        create(
            f"/api/v1/namespaces/{NAMESPACE}/configmaps",
            [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": f"c-{i}", "namespace": NAMESPACE},
                    "data": {"payload": payload},
                }
                for i in range(self.objects)
            ],
        )
        self.tokens = [service_account_token(plane, NAMESPACE, name, token_seconds) for name in names]
        return self

    def start(self) -> None:
        port = self.plane.ports().apiserver
        self._stop.clear()
        self._process = self._context.Process(
            target=_run,
            args=(
                "127.0.0.1",
                port,
                str(self.plane.pki.ca_cert),
                self.tokens,
                f"/api/v1/namespaces/{NAMESPACE}/configmaps",
                self._stop,
                self._results,
            ),
            daemon=True,
        )
        self._process.start()
        self._started = time.monotonic()

    def stop(self) -> dict[str, Any]:
        """Stop the clients; what they got: requests, answers by status, LIST latency of the 200s."""
        if self._process is None:
            return {}
        self._stop.set()
        answers: list[tuple[int, float]] = self._results.get(timeout=120)
        self._process.join(timeout=60)
        self._process = None
        seconds = time.monotonic() - self._started
        by_status: dict[str, int] = {}
        for status, _ in answers:
            by_status[str(status)] = by_status.get(str(status), 0) + 1
        ok = [s for status, s in answers if status == 200]
        return {
            "clients": self.clients,
            "objects": self.objects,
            "object_bytes": self.object_bytes,
            "seconds": seconds,
            "requests": len(answers),
            "requests_per_second": len(answers) / seconds if seconds else float("nan"),
            "by_status": by_status,
            "list_latency_ms": distribution(ok),
        }
