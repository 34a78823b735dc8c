"""Benchmark: the operator's cost curve on simulated nodes (KWOK), N runs x K iterations at once.

Starts a KWOK plane (agentrun_devcluster/kwok.py: the local control plane, kube-scheduler, KWOK and
fake nodes), the released operator as its own process, then creates N looped AgentRuns at once. KWOK
plays each iteration pod: it starts, ends, and its reporter's termination message carries the control
envelope for the payload the run declares (`AGENTRUN_SIM_CONTROL`, `{"continue":true}`, with the
CEL condition `iteration.last.control.continue == true` and `maxIterations: K`). It writes, for that
one size (docs/operator.md#scale):

- the operator's peak RSS (VmHWM) and CPU (utime + stime) per completed iteration,
- API requests per iteration by verb: all clients' (kube-apiserver's `apiserver_request_total`) and
  the operator's own (its `agentrun_api_requests_total`),
- work-queue latency: a pod's terminal status seen → the next iteration's Job seen, p50/p95/p99,
- iterations per second and the time until all runs ended,
- lost/repeated iterations (tests/bench/bench_iterations.py `lost_and_repeated`),
- the CPU seconds of etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok, so a
  figure limited by the two-core control plane says so,
- with `--unrelated-pods M`: M pods that are not the operator's (another namespace and labels),
  Running on the fake nodes before the runs start,
- with `--apf`: kube-apiserver with API Priority and Fairness on and the operator as the chart's
  ServiceAccount (tests/bench/apf.py); `--flow-schema` adds the chart's FlowSchema and priority
  level; `--competing-clients N`: N other ServiceAccounts LIST ConfigMaps back to back while the
  runs go (tests/bench/competing.py); `--apiserver-inflight S`: the API server's concurrency limit,
- with `--warm`: the runs' loops are warm (`loop.warm`: one pod runs all of a run's iterations,
  the operator calling its supervisor), the supervisor simulated outside the cluster
  (tests/bench/warm_sim.py, its own process, as KWOK simulates the kubelet); the turnaround is then
  a result available in the supervisor -> the next iteration's start received by it, and the
  lost/repeated check reads the status records, one Job per run, and the iterations the simulator
  ran (each id once).

Whatever the mode, the JSON carries `writes_per_iteration` (the operator's requests other than GET,
LIST and WATCH, per iteration), `iterations_per_second`, `turnaround_ms` (p50/p95/p99), `lost` and
`repeated`; with `--argo`, Argo's side under `argo` (its `steps_per_second`...).

It asserts nothing about time; the exit code is 1 only when an iteration was lost or repeated.

    .venv/bin/python -m tests.bench.bench_scale --runs 100 --iterations 3 --json /tmp/scale-100.json
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrun_devcluster import processes
from agentrun_devcluster.kwok import KWOK, SCHEDULER, KwokPlane
from agentrun_devcluster.kwok_stages import CONTROL_ENV, HANG_ENV
from agentrun_operator import naming
from tests.bench import apf, argo_side
from tests.bench.bench_iterations import FINAL, NS, JobWatch, lost_and_repeated
from tests.bench.competing import Competitors
from tests.bench.figures import cpu_seconds, distribution, line, peak_rss_mb, scrape
from tests.bench.harness import start_operator
from tests.bench.warm_sim import SECONDS_ENV, WarmSimProcess
from tests.bench.watch import ResumableWatch
from tests.support import metrics as prom
from tests.support.processes import OperatorProcess

ROOT = Path(__file__).resolve().parents[2]
UNRELATED_NS = "unrelated"
CONTROL = {"continue": True}
PLANE_PARTS = ("etcd", "kube-apiserver", "kube-controller-manager", SCHEDULER, KWOK)
PODS_PER_NODE = 1000


def scale_run(
    name: str,
    iterations: int,
    hang: bool = False,
    timeout_seconds: int = 0,
    node: str = "",
    warm: bool = False,
    seconds: float = 0.0,
) -> dict[str, Any]:
    """A looped AgentRun whose simulated iterations report `CONTROL` (no volume: docs/local-dev.md#kwok);
    `hang`: its container never ends; `timeout_seconds`: the step's per-attempt deadline; `node`: the
    fake node its pods must run on; `warm`: `loop.warm` (its workload has the `command` that needs);
    `seconds`: how long each warm iteration runs in the simulated supervisor (0: at once)."""
    env = [{"name": CONTROL_ENV, "value": json.dumps(CONTROL, separators=(",", ":"))}]
    if hang:
        env.append({"name": HANG_ENV, "value": "true"})
    if seconds:
        env.append({"name": SECONDS_ENV, "value": f"{seconds:g}"})
    workload: dict[str, Any] = {"image": "busybox:1.36", "command": ["true"], "env": env}
    if node:
        workload["nodeSelector"] = {"kubernetes.io/hostname": node}
    step: dict[str, Any] = {
        "name": "loop",
        "loop": {
            "maxIterations": iterations,
            "condition": {"type": "cel", "expression": "iteration.last.control.continue == true"},
        },
    }
    if warm:
        step["loop"]["warm"] = {}
    if timeout_seconds:
        step["timeoutSeconds"] = timeout_seconds
    spec: dict[str, Any] = {"workload": workload, "workflow": {"steps": [step]}}
    return {
        "apiVersion": "agents.proompteng.ai/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


class PodEnds(ResumableWatch):
    """Watches the runs' pods and records when each Job's pod was first seen terminal (monotonic)."""

    def __init__(self, kwok: KwokPlane) -> None:
        super().__init__(kwok.plane, f"/api/v1/namespaces/{NS}/pods", f"&labelSelector={naming.LABEL_RUN}")
        self.ended: dict[str, float] = {}
        self.start()

    def on_event(self, kind: str, obj: dict[str, Any], now: float) -> None:
        if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            job = ((obj.get("metadata") or {}).get("labels") or {}).get("job-name")
            if job:
                self.ended.setdefault(job, now)


class RunPhases(ResumableWatch):
    """Watches the runs and keeps each one's phase: how the benchmark learns that all runs ended.
    Polling with a LIST instead (10,000 runs' full statuses every few seconds) cost the API server
    more CPU than the operator's own requests (docs/operator.md#scale)."""

    def __init__(self, kwok: KwokPlane) -> None:
        super().__init__(kwok.plane, f"/apis/agents.proompteng.ai/v1alpha1/namespaces/{NS}/agentruns")
        self.phase: dict[str, str] = {}
        self.first_seen: dict[str, float] = {}  # when each run was first seen (monotonic)

    def ended(self) -> int:
        return sum(phase in FINAL for phase in list(self.phase.values()))

    def on_event(self, kind: str, obj: dict[str, Any], now: float) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        self.first_seen.setdefault(name, now)
        self.phase[name] = str((obj.get("status") or {}).get("phase") or "")


def api_requests(plane_metrics: dict[str, float]) -> collections.Counter[str]:
    """kube-apiserver's request counts by verb (every client's)."""
    by_verb: collections.Counter[str] = collections.Counter()
    for key, value in plane_metrics.items():
        if key.startswith("apiserver_request_total{"):
            labels = dict(
                part.split("=", 1)
                for part in key[len("apiserver_request_total{") : -1].split('",')
                if "=" in part
            )
            by_verb[labels.get("verb", "?").strip('"')] += value
    return by_verb


def histogram_quantiles(
    before: dict[str, float], after: dict[str, float], name: str, match: str = ""
) -> dict[str, float]:
    """p50/p95/p99 (ms, the upper bound of the bucket each falls in) and the count of a Prometheus
    histogram of the operator's, over the measured window; `match`: a label filter, e.g. `lane="front"`."""
    buckets: dict[float, float] = collections.defaultdict(float)
    prefix = f"{name}_bucket{{"
    for key, value in after.items():
        if key.startswith(prefix) and match in key:
            le = key.split('le="', 1)[1].split('"', 1)[0]
            buckets[math.inf if le == "+Inf" else float(le)] += value - before.get(key, 0.0)
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    out: dict[str, float] = {"n": total}
    for q in (50, 95, 99):
        rank = total * q / 100
        out[f"p{q}"] = next((1000 * b for b in bounds if buckets[b] >= rank), float("nan"))
    return out


def apiserver_metrics(kwok: KwokPlane) -> dict[str, float]:
    """kube-apiserver's request counts, and the API Priority and Fairness series of `apf.KEPT`."""
    code, body = kwok.plane.api_get("/metrics", timeout=60)
    out: dict[str, float] = {}
    if code != 200:
        return out
    for row in body.decode().splitlines():
        if row.startswith(("apiserver_request_total{", *apf.KEPT)):
            key, _, value = row.rpartition(" ")
            out[key] = float(value)
    return out


def plane_cpu(kwok: KwokPlane) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in PLANE_PARTS:
        record = processes.read_record(kwok.plane.run_dir, name)
        if record is not None and record.alive():
            out[name] = cpu_seconds(record.pid)
    return out


def job_controller_queue(kwok: KwokPlane) -> float | None:
    """kube-controller-manager's Job queue depth (`workqueue_depth{name="job"}`): a deep one says the
    Job controller, not the operator, is pacing the run (docs/operator.md#scale)."""
    code, body = kwok.plane.controller_manager_get("/metrics", timeout=30)
    if code != 200:
        return None
    samples = prom.parse(body.decode())
    return prom.value(samples, "workqueue_depth", name="job")  # `name`: a label (the metric is positional)


def create_all(kwok: KwokPlane, path: str, bodies: list[dict[str, Any]], threads: int = 8) -> None:
    """POST every body, a few at a time (N at once, as a platform's burst would)."""

    def post(body: dict[str, Any]) -> None:
        code, data = kwok.plane.api_request("POST", path, body, timeout=120)
        if code not in (201, 409):
            raise RuntimeError(f"create {body['metadata']['name']}: {code} {data[:300]!r}")

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(post, bodies))


def unrelated_pods(kwok: KwokPlane, count: int, timeout: float) -> float:
    """`count` pods that are not the operator's, Running on the fake nodes; returns the seconds taken."""
    started = time.monotonic()
    kwok.plane.kubectl("create", "namespace", UNRELATED_NS, check=False)
    bodies = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"other-{i}", "namespace": UNRELATED_NS, "labels": {"app": "other"}},
            "spec": {
                "containers": [{"name": "app", "image": "busybox:1.36"}],
                "automountServiceAccountToken": False,
            },
        }
        for i in range(count)
    ]
    create_all(kwok, f"/api/v1/namespaces/{UNRELATED_NS}/pods", bodies)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # No `limit`: a field-selected list has no remainingItemCount to count with.
        code, body = kwok.plane.api_request(
            "GET", f"/api/v1/namespaces/{UNRELATED_NS}/pods?fieldSelector=status.phase%3DRunning", timeout=120
        )
        if code == 200 and len(json.loads(body).get("items", [])) >= count:
            break
        time.sleep(5)
    return time.monotonic() - started


def list_all_runs(kwok: KwokPlane) -> list[dict[str, Any]]:
    """Every AgentRun of the namespace, paged (10,000 runs' statuses are one large list)."""
    runs: list[dict[str, Any]] = []
    token = ""
    while True:
        path = f"/apis/agents.proompteng.ai/v1alpha1/namespaces/{NS}/agentruns?limit=500"
        if token:
            path += f"&continue={token}"
        code, body = kwok.plane.api_request("GET", path, timeout=120)
        if code != 200:
            return runs
        doc = json.loads(body)
        runs.extend(doc.get("items", []))
        token = (doc.get("metadata") or {}).get("continue") or ""
        if not token:
            return runs


def status_bytes(runs: list[dict[str, Any]]) -> float:
    sizes = [len(json.dumps(r.get("status") or {}, separators=(",", ":"))) for r in runs]
    return sum(sizes) / len(sizes) if sizes else float("nan")


def simulator_check(
    check: dict[str, Any], runs: list[dict[str, Any]], names: list[str], iterations: int, ran: dict[str, int]
) -> dict[str, Any]:
    """`check` (the status records and the one Job of each run) with what the simulated supervisors
    ran added: every iteration of every run that ended started exactly once in a warm pod (`ran`:
    `run/id` -> starts), and nothing else of it."""
    ended = {
        r["metadata"]["name"] for r in runs if ((r.get("status") or {}).get("phase") or "") in FINAL
    } & set(names)
    lost, repeated = [], []
    wanted = {f"{name}/{k}-1" for name in ended for k in range(1, iterations + 1)}
    for key in sorted(wanted):
        count = ran.get(key, 0)
        if count == 0:
            lost.append(f"{key}: never started in a warm pod")
        elif count > 1:
            repeated.append(f"{key}: started {count} times")
    for key, count in sorted(ran.items()):
        if key not in wanted and key.split("/", 1)[0] in ended:
            repeated.append(f"{key}: started {count} times, not an iteration of the run's first attempt")
    return {
        **check,
        "lost": check["lost"] + len(lost),
        "repeated": check["repeated"] + len(repeated),
        "examples": (check["examples"] + lost + repeated)[:20],
        "simulator_iterations": sum(ran.values()),
    }


def measure(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    # Argo keeps a Workflow's pods (no podGC by default): room for all N x K of them as well.
    pods = args.runs + args.unrelated_pods + (args.runs * args.iterations if args.argo else 0)
    nodes = args.nodes or max(4, math.ceil(pods / PODS_PER_NODE) + 1)
    stages = (argo_side.stages_file(home / "argo"),) if args.argo else ()
    kwok = KwokPlane(
        home,
        nodes,
        progress=print,
        extra_stages=stages,
        controller_syncs=args.controller_syncs,
        profiling=args.profiling,
        apiserver_args=apf.apiserver_args(args.apf, args.apiserver_inflight),
    ).start(crds_dir=ROOT / "crds")
    if args.profiling:
        pki = kwok.plane.pki
        print(
            "profiles: /debug/pprof/ on the API server and the controller manager, e.g. "
            f"curl -sk --cert {pki.client_cert('admin')} --key {pki.client_key('admin')} "
            f"'{kwok.plane.server}/debug/pprof/profile?seconds=60' > cpu.pprof; go tool pprof -top cpu.pprof"
        )
    plane = kwok.plane
    operator: OperatorProcess | None = None
    competitors: Competitors | None = None
    simulator: WarmSimProcess | None = None
    try:
        plane.kubectl("create", "namespace", NS, check=False)
        while plane.api_get(f"/api/v1/namespaces/{NS}/serviceaccounts/default")[0] != 200:
            time.sleep(0.1)
        unrelated_seconds = (
            unrelated_pods(kwok, args.unrelated_pods, args.timeout) if args.unrelated_pods else 0
        )
        token_seconds = int(args.timeout) + 3600
        kubeconfig: Path | None = None  # the admin's
        classified = "the admin's (APF off)"
        if args.apf:  # the operator as the chart's ServiceAccount (tests/bench/apf.py)
            kubeconfig, classified = apf.operator_identity(
                plane, home, args.flow_schema, token_seconds, args.priority_level_shares
            )
            print(f"the operator's requests: {classified}")
        if args.competing_clients:
            competitors = Competitors(plane, args.competing_clients, args.competing_objects).prepare(
                lambda path, bodies: create_all(kwok, path, bodies), token_seconds
            )
        operator_env: dict[str, str] = {}
        if args.warm:  # the warm pods' supervisor, simulated (tests/bench/warm_sim.py); a port of the run's
            simulator = WarmSimProcess(home, NS, home / "warm-sim").start()
            operator_env["AGENTS_CONTROLLER_WARM_PORT"] = str(processes.free_port())
        watch = JobWatch(plane).start()
        pods = PodEnds(kwok)
        phases = RunPhases(kwok).start()
        operator, pid, port = start_operator(
            plane, home, args.iterations, 60, env=operator_env, workers=args.workers, kubeconfig=kubeconfig
        )
        rss_idle = peak_rss_mb(pid)
        before_op = scrape(port)
        before_api = apiserver_metrics(kwok)
        cpu_before = cpu_seconds(pid)
        plane_before = plane_cpu(kwok)
        sim_cpu_before = cpu_seconds(simulator.pid) if simulator is not None else 0.0
        names = [f"scale-{r}" for r in range(args.runs)]
        if competitors is not None:
            competitors.start()
        load_start = os.getloadavg()
        started = time.monotonic()
        create_all(
            kwok,
            f"/apis/agents.proompteng.ai/v1alpha1/namespaces/{NS}/agentruns",
            [
                scale_run(name, args.iterations, warm=args.warm, seconds=args.iteration_seconds)
                for name in names
            ],
        )
        created = time.monotonic() - started
        print(f"{args.runs} runs created in {created:.1f}s")
        deadline = time.monotonic() + args.timeout
        last_print = 0.0
        job_queue: list[float] = []
        while time.monotonic() < deadline:
            done = phases.ended()
            if done == len(names):
                break
            if time.monotonic() - last_print > 30:
                last_print = time.monotonic()
                depth = job_controller_queue(kwok)
                if depth is not None:
                    job_queue.append(depth)
                print(
                    f"  {time.monotonic() - started:6.0f}s: {done}/{len(names)} runs ended, "
                    f"{len(watch.added)} Jobs, operator RSS {peak_rss_mb(pid):.0f} MB, "
                    f"Job controller queue {depth if depth is None else int(depth)}"
                )
            time.sleep(1.0)
        elapsed = time.monotonic() - started
        load_end = os.getloadavg()
        competing = competitors.stop() if competitors is not None else {}
        time.sleep(2.0)  # trailing TTL patches and Events
        after_op = scrape(port)
        after_api = apiserver_metrics(kwok)
        cpu = cpu_seconds(pid) - cpu_before
        plane_after = plane_cpu(kwok)
        rss = peak_rss_mb(pid)
        runs = list_all_runs(kwok)
        check = lost_and_repeated(
            runs, names, args.iterations, watch, warm=frozenset(names) if args.warm else frozenset()
        )
        sim: dict[str, Any] = {}
        if simulator is not None:
            sim = simulator.stats()
            # The simulator's own cost (the supervisors of every pod, in one process), beside the plane's.
            sim["cpu_seconds"] = cpu_seconds(simulator.pid) - sim_cpu_before
            sim["peak_rss_mb"] = peak_rss_mb(simulator.pid)
            check = simulator_check(check, runs, names, args.iterations, sim.pop("ran"))
        done_iterations = max(1, check["completed_iterations"])
        latency = [
            watch.added[naming.job_name(name, 1, k + 1, 1)] - pods.ended[naming.job_name(name, 1, k, 1)]
            for name in names
            for k in range(1, args.iterations)
            if naming.job_name(name, 1, k, 1) in pods.ended
            and naming.job_name(name, 1, k + 1, 1) in watch.added
        ]
        first_job = [
            watch.added[naming.job_name(name, 1, 1, 1)] - phases.first_seen[name]
            for name in names
            if name in phases.first_seen and naming.job_name(name, 1, 1, 1) in watch.added
        ]
        api_before, api_after = api_requests(before_api), api_requests(after_api)
        api_by_verb = {v: (api_after[v] - api_before.get(v, 0)) / done_iterations for v in sorted(api_after)}
        op_by_verb: collections.Counter[str] = collections.Counter()
        op_writes_by_resource: dict[str, float] = collections.defaultdict(float)
        for key, value in after_op.items():
            if key.startswith("agentrun_api_requests_total{"):
                verb = key.split('verb="', 1)[1].split('"', 1)[0] if 'verb="' in key else "?"
                resource = key.split('resource="', 1)[1].split('"', 1)[0] if 'resource="' in key else "?"
                op_by_verb[verb] += value - before_op.get(key, 0.0)
                if verb not in ("GET", "LIST", "WATCH"):
                    op_writes_by_resource[f"{verb} {resource}"] += value - before_op.get(key, 0.0)
        op_writes = sum(v for k, v in op_by_verb.items() if k not in ("GET", "LIST", "WATCH"))
        queue_latency = distribution(latency)
        report: dict[str, Any] = {
            "runs": args.runs,
            "iterations_per_run": args.iterations,
            "warm": args.warm,
            "iteration_seconds": args.iteration_seconds,
            # The figures every mode has, by the same names (docs/operator.md#scale).
            "writes_per_iteration": op_writes / done_iterations,
            "turnaround_ms": distribution(sim["turnarounds"]) if args.warm else queue_latency,
            "turnaround_measured": (
                "a result available in the warm pod's supervisor -> the next start it received"
                if args.warm
                else "a pod's terminal status seen -> the next iteration's Job seen"
            ),
            "lost": check["lost"],
            "repeated": check["repeated"],
            "nodes": nodes,
            "unrelated_pods": args.unrelated_pods,
            "unrelated_pods_seconds": unrelated_seconds,
            "operator_workers": args.workers[0] if args.workers else 32,
            "controller_syncs": args.controller_syncs,
            "job_controller_queue_max": max(job_queue, default=None),
            "completed_iterations": check["completed_iterations"],
            "create_seconds": created,
            "wall_seconds": elapsed,
            "iterations_per_second": check["completed_iterations"] / elapsed if elapsed else float("nan"),
            "load_average_start": list(load_start),
            "load_average_end": list(load_end),
            "operator_idle_rss_mb": rss_idle,
            "operator_peak_rss_mb": rss,
            "operator_cpu_seconds": cpu,
            "operator_cpu_ms_per_iteration": 1000 * cpu / done_iterations,
            "queue_latency_ms": queue_latency,
            # A new run seen -> its first Job seen: how long a run created in a burst waits.
            "first_job_latency_ms": distribution(first_job),
            # The operator's own share of it, from its metrics (bucket bounds): a key's wait in the
            # work queue, and one reconcile (its API requests included).
            "operator_queue_wait_ms": histogram_quantiles(
                before_op, after_op, "agentrun_workqueue_queue_duration_seconds", 'lane="front"'
            ),
            "operator_turnaround_wait_ms": histogram_quantiles(
                before_op, after_op, "agentrun_workqueue_queue_duration_seconds", 'lane="turnaround"'
            ),
            "operator_reconcile_ms": histogram_quantiles(
                before_op, after_op, "agentrun_reconcile_duration_seconds"
            ),
            "apiserver_requests_per_iteration_by_verb": api_by_verb,
            "operator_requests_per_iteration_by_verb": {
                k: v / done_iterations for k, v in sorted(op_by_verb.items())
            },
            "operator_writes_per_iteration": op_writes / done_iterations,
            "operator_writes_per_iteration_by_resource": {
                k: v / done_iterations for k, v in sorted(op_writes_by_resource.items()) if v
            },
            # Reconciles whose Events the operator dropped (its writers' backlog full): their writes
            # are missing from the figure above.
            "operator_events_dropped": after_op.get("agentrun_events_dropped_total", 0.0)
            - before_op.get("agentrun_events_dropped_total", 0.0),
            "operator_reconcile_errors": after_op.get("agentrun_reconcile_errors_total", 0.0)
            - before_op.get("agentrun_reconcile_errors_total", 0.0),
            # API Priority and Fairness: where the operator's requests went, what each level did.
            "apf": args.apf,
            "apiserver_inflight": args.apiserver_inflight,
            "priority_level_shares": args.priority_level_shares,
            "operator_classified": classified,
            "flow_control": apf.flow_figures(before_api, after_api) if args.apf else {},
            "competing": competing,
            "status_bytes_mean": status_bytes(runs),
            "plane_cpu_seconds": {k: plane_after.get(k, 0.0) - plane_before.get(k, 0.0) for k in PLANE_PARTS},
            "check": check,
        }
        if simulator is not None:
            # From a pod's first iteration, which the simulator finishes the moment the pod is
            # Running: the operator's channel to the pod is still being set up then.
            report["first_turnaround_ms"] = distribution(sim.pop("first_turnarounds"))
            report["warm_simulator"] = {k: v for k, v in sim.items() if k != "turnarounds"}
            simulator.stop()
            simulator = None
        if args.argo:  # the same N x K on the same plane, the operator stopped (docs/operator.md#scale-argo)
            operator.stop()
            operator = None
            plane_before = plane_cpu(kwok)
            report["argo"] = argo_side.run(
                plane, home / "argo", args.runs, args.iterations, args.timeout, args.argo_qps
            )
            plane_after = plane_cpu(kwok)
            report["argo"]["plane_cpu_seconds"] = {
                k: plane_after.get(k, 0.0) - plane_before.get(k, 0.0) for k in PLANE_PARTS
            }
        return report
    finally:
        if competitors is not None:
            competitors.stop()
        if operator is not None:
            operator.stop()
        if simulator is not None:
            simulator.stop()
        kwok.stop()


def summary(report: dict[str, Any]) -> str:
    c = report["check"]
    plane = ", ".join(f"{k} {v:.0f}s" for k, v in report["plane_cpu_seconds"].items())
    rows = [
        f"runs={report['runs']} x {report['iterations_per_run']} on {report['nodes']} fake nodes, "
        f"unrelated pods {report['unrelated_pods']}: all ended in {report['wall_seconds']:.1f}s, "
        f"{report['iterations_per_second']:.1f} iterations/s",
        f"check: {c['succeeded']}/{c['runs']} Succeeded, {c['unfinished']} unfinished, "
        f"lost={c['lost']} repeated={c['repeated']}",
        f"operator: peak RSS {report['operator_peak_rss_mb']:.0f} MB "
        f"(idle {report['operator_idle_rss_mb']:.0f}), "
        f"CPU {report['operator_cpu_ms_per_iteration']:.1f} ms/iteration, "
        f"writes {report['operator_writes_per_iteration']:.2f}/iteration "
        f"(Events of {report['operator_events_dropped']:.0f} reconciles dropped), "
        f"status {report['status_bytes_mean']:.0f} B/run",
        line("work-queue latency (pod ended -> next Job)", report["queue_latency_ms"]),
        *(
            [
                line("warm turnaround (result -> next start)", report["turnaround_ms"]),
                line("warm, a pod's first result -> next start", report["first_turnaround_ms"]),
                f"warm: writes {report['writes_per_iteration']:.2f}/iteration, "
                f"{c.get('not_warm', 0)} not warm "
                f"beyond each run's first; simulated supervisors: {report['warm_simulator']['pods_served']} "
                f"pods served, {c.get('simulator_iterations', 0)} iterations started, "
                f"{report['warm_simulator']['duplicate_starts']} duplicate starts (no-ops), "
                f"CPU {report['warm_simulator']['cpu_seconds']:.0f}s, "
                f"{report['warm_simulator']['ips_reused']} pods at a reused IP, "
                f"{report['warm_simulator']['ip_changes']} IPs changed while Running, "
                f"{report['warm_simulator']['ip_conflicts']} IPs given twice, 401s by why "
                f"{report['warm_simulator']['refused']}, requests "
                + ", ".join(f"{k} {v}" for k, v in sorted(report["warm_simulator"]["requests"].items())),
            ]
            if report.get("warm")
            else []
        ),
        line("first Job (run seen -> its first Job)", report["first_job_latency_ms"]),
        f"Job controller: {report['controller_syncs'] or 'default'} workers, "
        f"queue at most {report['job_controller_queue_max']} (sampled every 30 s)",
        "operator's own (bucket bounds): queue wait (front) "
        + ", ".join(f"{k} {v:.0f}" for k, v in report["operator_queue_wait_ms"].items())
        + " ms; (turnaround) "
        + ", ".join(f"{k} {v:.0f}" for k, v in report["operator_turnaround_wait_ms"].items())
        + " ms; reconcile "
        + ", ".join(f"{k} {v:.0f}" for k, v in report["operator_reconcile_ms"].items())
        + " ms",
        "API requests/iteration (all clients): "
        + ", ".join(f"{k} {v:.2f}" for k, v in report["apiserver_requests_per_iteration_by_verb"].items()),
        "API requests/iteration (operator): "
        + ", ".join(f"{k} {v:.2f}" for k, v in report["operator_requests_per_iteration_by_verb"].items()),
        "the operator's writes/iteration by resource: "
        + ", ".join(f"{k} {v:.2f}" for k, v in report["operator_writes_per_iteration_by_resource"].items()),
        f"plane CPU: {plane}; load average {report['load_average_start'][0]:.1f} -> "
        f"{report['load_average_end'][0]:.1f}",
    ]
    if report.get("apf") or report.get("competing"):
        rows.append(
            f"the operator's requests: {report['operator_classified']}; "
            f"API server concurrency limit {report['apiserver_inflight'] or 'default (600)'}; "
            f"operator reconcile errors {report['operator_reconcile_errors']:.0f}"
        )
    if report.get("flow_control"):
        rows.append(apf.summary(report["flow_control"]))
    if report.get("competing"):
        c = report["competing"]
        rows.append(
            f"competing clients: {c['clients']} ServiceAccounts LISTing {c['objects']} ConfigMaps: "
            f"{c['requests']} requests ({c['requests_per_second']:.1f}/s), by status {c['by_status']}"
        )
        rows.append(line("competing LIST latency (200s)", c["list_latency_ms"]))
    if "argo" in report:
        rows += [argo_side.summary(report["argo"]), argo_side.side_by_side(report)]
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100, help="AgentRuns created at once")
    ap.add_argument("--iterations", type=int, default=3, help="loop iterations per run")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    ap.add_argument("--unrelated-pods", type=int, default=0, help="pods not the operator's, Running first")
    ap.add_argument("--nodes", type=int, default=0, help="fake nodes (default: one per 1,000 pods, +1)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds to wait for all runs")
    ap.add_argument("--workers", type=int, action="append", default=[], help="the operator's --workers")
    ap.add_argument("--keep", action="store_true", help="keep the plane's directory (logs)")
    ap.add_argument(
        "--profiling",
        action="store_true",
        help="serve /debug/pprof on the API server too (the controller manager always does)",
    )
    ap.add_argument(
        "--controller-syncs",
        type=int,
        default=None,
        help="kube-controller-manager's Job, GC and TTL workers (default: the plane's 10/10/5); "
        "50 lets 5,000 runs and more finish (docs/operator.md#scale)",
    )
    ap.add_argument(
        "--apf",
        action="store_true",
        help="kube-apiserver with API Priority and Fairness on, the operator as the chart's ServiceAccount",
    )
    ap.add_argument(
        "--flow-schema",
        action="store_true",
        help="also the chart's FlowSchema and PriorityLevelConfiguration (implies --apf)",
    )
    ap.add_argument(
        "--priority-level-shares",
        type=int,
        default=None,
        help="with --flow-schema: the level's nominalConcurrencyShares (default: the chart's, 20)",
    )
    ap.add_argument(
        "--competing-clients",
        type=int,
        default=0,
        help="other ServiceAccounts LISTing ConfigMaps back to back while the runs go",
    )
    ap.add_argument("--competing-objects", type=int, default=1000, help="ConfigMaps (1 KiB) they LIST")
    ap.add_argument(
        "--apiserver-inflight",
        type=int,
        default=None,
        help="kube-apiserver's concurrency limit, split 2:1 into --max-requests-inflight and "
        "--max-mutating-requests-inflight (default 400 + 200)",
    )
    ap.add_argument(
        "--warm",
        action="store_true",
        help="warm loops (loop.warm), their pods' supervisor simulated (tests/bench/warm_sim.py)",
    )
    ap.add_argument(
        "--iteration-seconds",
        type=float,
        default=0.0,
        help="with --warm: each iteration runs this long in the simulated supervisor (default: at once, "
        "so every run always waits on the operator); an offered load below its capacity",
    )
    ap.add_argument(
        "--argo", action="store_true", help="then the same N x K as Argo Workflows on the same plane"
    )
    ap.add_argument(
        "--argo-qps", type=float, default=None, help="Argo's --qps and --burst (default: its own)"
    )
    args = ap.parse_args()
    args.apf = args.apf or args.flow_schema
    if args.iteration_seconds and not args.warm:
        ap.error("--iteration-seconds needs --warm (KWOK ends a cold iteration's pod at once)")
    home = Path(tempfile.mkdtemp(prefix="agentrun-scale-"))
    try:
        report = measure(args, home)
    finally:
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
        else:
            print(f"state and logs kept in {home}")
    print()
    print(summary(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if report["check"]["lost"] == 0 and report["check"]["repeated"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
