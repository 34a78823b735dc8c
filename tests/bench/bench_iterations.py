"""Benchmark: iteration turnaround, API writes and operator CPU per iteration (docs/design.md#quality-bars).

Runs on the real local control plane with the operator as its own process and the kubelet driver
completing pods at once. Prints figures; asserts nothing about time (a slow shared machine is not a
failure). The baseline — a raw API round trip measured in the same run — puts the numbers in scale.

    .venv/bin/python -m tests.bench.bench_iterations [--runs 5] [--iterations 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from agentrun_operator import naming
from agentrun_operator.devcluster import processes, toolchain
from agentrun_operator.devcluster.controlplane import ControlPlane
from tests.integration.kubelet_driver import KubeletDriver, PodOutcome
from tests.support.manifests import agentrun
from tests.support.processes import OperatorProcess

NS = "bench"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(name: str, values: list[float], unit: str = "ms", scale: float = 1000.0) -> str:
    v = [x * scale for x in values]
    return (
        f"{name:<38} n={len(v):<5} p50={pct(v, 50):8.2f}{unit} p95={pct(v, 95):8.2f}{unit} "
        f"p99={pct(v, 99):8.2f}{unit} mean={statistics.fmean(v) if v else float('nan'):8.2f}{unit}"
    )


class JobWatch:
    """Streams Job ADDED events and records when each arrived (monotonic)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.added: dict[str, float] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> JobWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        url = f"{self.plane.server}/apis/batch/v1/namespaces/{NS}/jobs?watch=1&timeoutSeconds=3600"
        req = urllib.request.Request(url)
        ctx = self.plane._client_ssl()
        with urllib.request.urlopen(req, context=ctx, timeout=3600) as resp:
            for line in resp:
                event = json.loads(line)
                if event.get("type") == "ADDED":
                    self.added.setdefault(event["object"]["metadata"]["name"], time.monotonic())


def raw_round_trips(plane: ControlPlane, n: int = 200) -> tuple[list[float], list[float]]:
    gets, writes = [], []
    for i in range(n):
        t = time.perf_counter()
        plane.api_get(f"/api/v1/namespaces/{NS}/configmaps")
        gets.append(time.perf_counter() - t)
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"rt-{i}"}, "data": {"a": "b"}}
        t = time.perf_counter()
        plane.api_request("POST", f"/api/v1/namespaces/{NS}/configmaps", body)
        writes.append(time.perf_counter() - t)
    return gets, writes


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=20)
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="agentrun-bench-"))
    plane = ControlPlane(home, toolchain.ensure_tools(print))
    plane.start(crds_dir=Path(__file__).resolve().parents[2] / "crds")
    driver: KubeletDriver | None = None
    operator: OperatorProcess | None = None
    try:
        plane.kubectl("create", "namespace", NS)
        while plane.api_get(f"/api/v1/namespaces/{NS}/serviceaccounts/default")[0] != 200:
            time.sleep(0.1)
        gets, posts = raw_round_trips(plane)
        driver = KubeletDriver(plane, NS, lambda _pod: PodOutcome(), poll=0.01).start()
        watch = JobWatch(plane).start()
        port = processes.free_port()
        operator = OperatorProcess(
            plane,
            home / "operator",
            env={"AGENTS_CONTROLLER_WORKFLOW_LOOP_MAX_ITERATIONS": str(max(20, args.iterations))},
            args=(f"--metrics-port={port}", "--log-format=text"),
        ).start()
        assert operator.proc is not None
        before = scrape(port)
        cpu_before = cpu_seconds(operator.proc.pid)
        started = time.monotonic()
        for r in range(args.runs):
            run = agentrun(
                f"bench-{r}",
                [{"name": "loop", "loop": {"maxIterations": args.iterations}}],
                metadata={"namespace": NS},
                workload={"image": "busybox:1.36", "command": ["true"]},
            )
            plane.kubectl("create", "-f", "-", input_text=json.dumps(run))
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            items = json.loads(plane.kubectl("get", "ar", "-n", NS, "-o", "json"))["items"]
            if all((i.get("status") or {}).get("phase") in ("Succeeded", "Failed") for i in items):
                break
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        time.sleep(1.0)  # let trailing TTL patches and events land
        after = scrape(port)
        cpu = cpu_seconds(operator.proc.pid) - cpu_before

        iterations = args.runs * args.iterations
        turnaround = []
        for r in range(args.runs):
            for k in range(1, args.iterations):
                prev_job = naming.job_name(f"bench-{r}", 1, k, 1)
                nxt = naming.job_name(f"bench-{r}", 1, k + 1, 1)
                done = [t for pod, t in driver.finished_at.items() if pod.startswith(prev_job + "-")]
                if done and nxt in watch.added:
                    turnaround.append(watch.added[nxt] - min(done))

        def delta(prefix: str) -> float:
            return sum(v - before.get(k, 0.0) for k, v in after.items() if k.startswith(prefix))

        writes = {
            k.split("{", 1)[1].rstrip("}"): v - before.get(k, 0.0)
            for k, v in after.items()
            if k.startswith("agentrun_api_requests_total{")
            and 'verb="GET"' not in k
            and v - before.get(k, 0.0)
        }
        total_writes = sum(writes.values())
        plans = delta("agentrun_plan_duration_seconds_count")
        plan_seconds = delta("agentrun_plan_duration_seconds_sum")
        phases = json.loads(plane.kubectl("get", "ar", "-n", NS, "-o", "json"))["items"]
        print()
        print(
            f"runs={args.runs} iterations/run={args.iterations} iterations={iterations} wall={elapsed:.1f}s"
        )
        print("final phases:", sorted({(i.get("status") or {}).get("phase") for i in phases}))
        print(summary("baseline: raw API GET round trip", gets))
        print(summary("baseline: raw API POST round trip", posts))
        print(summary("iteration turnaround (pod done -> next Job)", turnaround))
        print(f"API writes per iteration: {total_writes / iterations:.2f} (total {total_writes:.0f})")
        for key, value in sorted(writes.items()):
            print(f"    {key}: {value / iterations:.2f}/iteration")
        print(f"reconciles: {plans:.0f} ({plans / iterations:.2f}/iteration)")
        print(
            f"planner time: mean {1000 * plan_seconds / max(plans, 1):.3f} ms per plan, "
            f"{1000 * plan_seconds / iterations:.3f} ms per iteration"
        )
        print(f"operator CPU: {1000 * cpu / iterations:.2f} ms per iteration (total {cpu:.2f}s)")
        print(f"driver errors: {len(driver.errors)}")
    finally:
        if operator is not None:
            operator.stop()
        if driver is not None:
            driver.stop()
        plane.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
