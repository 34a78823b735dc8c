"""Argo Workflows side by side: the same N x K on the same control plane, its controller measured.

Each of N Workflows is a sequential loop of K steps (a `steps` template of K groups of one step, each
a pod), the shape of an AgentRun loop of K iterations. The pods are completed by whatever plays the
nodes (KWOK on the scale benchmark's plane: its pod Stages match Workflow-owned pods as they match
Job-owned ones, which is KWOK's own Argo recipe). Argo's `workflow-controller` (built from its Go
module by agentrun_devcluster.argo) runs as a process of the benchmark, at its default QPS, burst
and worker counts, so its figures are taken the way the operator's are: peak RSS (VmHWM), CPU
(utime + stime) per completed step, steps per second, the time until every Workflow ended, step
turnaround (a step's pod seen Succeeded -> the next step's pod created) and its API requests by
verb from its own metrics. Lost and repeated steps are checked as for AgentRuns: every Workflow
Succeeded, K pod nodes Succeeded, exactly one pod created per step.

    .venv/bin/python -m tests.bench.argo_side --runs 100 --iterations 3   # this plane only
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from agentrun_devcluster import argo, processes
from agentrun_devcluster.controlplane import ControlPlane
from agentrun_devcluster.kwok_stages import owned_by, pod_completed_stage
from tests.bench.figures import cpu_seconds, peak_rss_mb, percentiles, scrape
from tests.bench.watch import ResumableWatch

NS = "argo-bench"
WORKFLOWS = f"/apis/argoproj.io/v1alpha1/namespaces/{NS}/workflows"
FINAL = ("Succeeded", "Failed", "Error")
NODE_NAME = "workflows.argoproj.io/node-name"
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"


def workflow(name: str, steps: int, image: str = "busybox:1.36") -> dict[str, Any]:
    """A Workflow whose entrypoint runs `steps` one-pod steps one after another."""
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "entrypoint": "loop",
            "templates": [
                {
                    "name": "loop",
                    "steps": [[{"name": f"s{k}", "template": "step"}] for k in range(1, steps + 1)],
                },
                {"name": "step", "container": {"image": image, "command": ["true"]}},
            ],
        },
    }


def step_of(node_name: str) -> int | None:
    """The step number of a pod from its node name (`wf[2].s3` -> 3); None for anything else."""
    tail = node_name.rsplit(".", 1)[-1]
    return int(tail[1:]) if tail.startswith("s") and tail[1:].isdigit() else None


STAGES = pod_completed_stage("argo-step-ended", (owned_by("Workflow"),))
"""KWOK's own Argo recipe (its pod-complete Stage with `Job` read as `Workflow`): a Running pod that
a Workflow owns ends Succeeded, every container terminated with exit code 0. Loaded beside the
plane's own Stages (`KwokPlane(extra_stages=...)`), which start every pod; the operator's pods (a
Job's) never match it."""


def stages_file(home: Path) -> Path:
    """The Stage above as a file for `kwok --config`."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "argo-stages.yaml"
    path.write_text(STAGES)
    return path


def controller_config(metrics_port: int) -> dict[str, Any]:
    """The controller's ConfigMap: its defaults, but metrics on a free port over plain HTTP (the
    default :9090 may be taken on a shared machine) so the benchmark can read its API requests."""
    metrics = {"enabled": True, "port": metrics_port, "path": "/metrics", "secure": False}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "workflow-controller-configmap", "namespace": NS},
        "data": {"metricsConfig": yaml.safe_dump(metrics)},
    }


def install_crds(plane: ControlPlane, home: Path) -> None:
    """Argo's CRDs from its module's manifests (a copy without the kustomization file)."""
    crds = home / "argo-crds"
    crds.mkdir(parents=True, exist_ok=True)
    for path in argo.crd_files():
        shutil.copyfile(path, crds / path.name)
    plane.install_crds(crds)


class PodWatch(ResumableWatch):
    """The namespace's pods: when each was first added and first seen Succeeded (monotonic), how
    often each was added, and its Workflow and node name (its step)."""

    def __init__(self, plane: ControlPlane) -> None:
        super().__init__(plane, f"/api/v1/namespaces/{NS}/pods", thread_name="argo-pod-watch")
        self.added: dict[str, float] = {}
        self.succeeded: dict[str, float] = {}
        self.adds: collections.Counter[str] = collections.Counter()
        self.node_names: dict[str, str] = {}
        self.workflows: dict[str, str] = {}

    def on_event(self, kind: str, obj: dict[str, Any], now: float) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        if kind == "ADDED" and name not in self.added:
            self.added[name] = now
            self.adds[name] += 1
            self.node_names[name] = (meta.get("annotations") or {}).get(NODE_NAME, "")
            self.workflows[name] = (meta.get("labels") or {}).get(WORKFLOW_LABEL, "")
        if (obj.get("status") or {}).get("phase") == "Succeeded":
            self.succeeded.setdefault(name, now)


class ArgoController:
    """Argo's workflow-controller as a process of the benchmark, watching NS only, no leader election."""

    def __init__(self, plane: ControlPlane, home: Path, qps: float | None = None) -> None:
        self.plane = plane
        self.home = home
        self.qps = qps  # None: Argo's default client rate limit (20 requests/s, burst 30)
        self.metrics_port = processes.free_port()
        self.proc: Any = None

    def start(self) -> ArgoController:
        binary = argo.ensure_argo(print)
        code, body = self.plane.api_request(
            "POST", f"/api/v1/namespaces/{NS}/configmaps", controller_config(self.metrics_port)
        )
        if code not in (201, 409):
            raise RuntimeError(f"create the Argo controller's ConfigMap: {code} {body[:300]!r}")
        env = dict(os.environ, LEADER_ELECTION_DISABLE="true")
        argv = [
            str(binary),
            f"--kubeconfig={self.plane.kubeconfig}",
            f"--namespace={NS}",
            "--namespaced",
            f"--managed-namespace={NS}",
            f"--executor-image=quay.io/argoproj/argoexec:v{argo.ARGO_WORKFLOWS_VERSION}",
            "--loglevel=warn",
            *((f"--qps={self.qps:g}", f"--burst={self.qps:g}") if self.qps else ()),
        ]
        self.proc = processes.start_process(
            self.home, "workflow-controller", argv, self.home / "workflow-controller.log", env=env
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"workflow-controller exited ({self.proc.returncode}); "
                    f"see {self.home}/workflow-controller.log"
                )
            with contextlib.suppress(OSError):
                if self.metrics():
                    return self
            time.sleep(0.2)
        raise RuntimeError(
            f"workflow-controller never served its metrics; see {self.home}/workflow-controller.log"
        )

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def metrics(self) -> dict[str, float]:
        return scrape(self.metrics_port)

    def stop(self) -> None:
        processes.stop_process(self.home, "workflow-controller")


def requests_by_verb(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Argo's own count of its API requests (`k8s_request_total`), by verb, over the run."""
    verbs: collections.Counter[str] = collections.Counter()
    for key, value in after.items():
        if "k8s_request_total{" not in key:
            continue
        labels = dict(
            part.split("=", 1) for part in key.split("{", 1)[1].rstrip("}").split(",") if "=" in part
        )
        verb = labels.get("verb", "?").strip('"')  # Get, List, Watch, Create, Update, Patch, Delete
        verbs[verb] += value - before.get(key, 0.0)
    return dict(verbs)


def create_all(plane: ControlPlane, bodies: list[dict[str, Any]], threads: int = 8) -> None:
    """Create the Workflows at once, as the scale benchmark creates its AgentRuns (8 at a time)."""

    def post(body: dict[str, Any]) -> None:
        code, data = plane.api_request("POST", WORKFLOWS, body, timeout=60)
        if code != 201:
            raise RuntimeError(f"create Workflow {body['metadata']['name']}: {code} {data[:300]!r}")

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(post, bodies))


def list_workflows(plane: ControlPlane) -> list[dict[str, Any]]:
    code, body = plane.api_request("GET", WORKFLOWS, timeout=120)
    return list(json.loads(body).get("items", [])) if code == 200 else []


def check(workflows: list[dict[str, Any]], names: list[str], steps: int, pods: PodWatch) -> dict[str, Any]:
    """Lost and repeated steps, as for AgentRuns: each Workflow Succeeded with K Succeeded pod nodes
    and exactly one pod created per step."""
    by_name = {w["metadata"]["name"]: w for w in workflows}
    created: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for pod, wf in pods.workflows.items():
        k = step_of(pods.node_names.get(pod, ""))
        if k is not None:
            created[wf][k] += pods.adds[pod]
    unfinished, not_succeeded, lost, repeated = [], [], [], []
    completed = 0
    for name in names:
        status = (by_name.get(name) or {}).get("status") or {}
        nodes = (status.get("nodes") or {}).values()
        done = [n for n in nodes if n.get("type") == "Pod" and n.get("phase") == "Succeeded"]
        completed += len(done)
        if status.get("phase") not in FINAL:
            unfinished.append(name)
            continue
        if status.get("phase") != "Succeeded":
            not_succeeded.append(f"{name}: {status.get('phase')} {status.get('message', '')}")
        if len(done) != steps:
            lost.append(f"{name}: {len(done)} of {steps} steps Succeeded")
        for k in range(1, steps + 1):
            if created[name][k] == 0:
                lost.append(f"{name}: no pod for step {k}")
            elif created[name][k] > 1:
                repeated.append(f"{name}: step {k} had {created[name][k]} pods")
    return {
        "runs": len(names),
        "succeeded": len(names) - len(unfinished) - len(not_succeeded),
        "unfinished": len(unfinished),
        "completed_steps": completed,
        "not_succeeded": not_succeeded[:20],
        "lost": len(lost),
        "repeated": len(repeated),
        "examples": (lost + repeated)[:20],
        "pod_watch_gaps": pods.gaps,
    }


def turnaround_ms(pods: PodWatch) -> dict[str, float]:
    """A step's pod seen Succeeded -> the next step's pod seen created, per Workflow, p50/p95/p99."""
    by_step: dict[tuple[str, int], str] = {}
    for pod, wf in pods.workflows.items():
        k = step_of(pods.node_names.get(pod, ""))
        if k is not None:
            by_step[(wf, k)] = pod
    values = []
    for (wf, k), pod in by_step.items():
        nxt = by_step.get((wf, k + 1))
        if nxt is not None and pod in pods.succeeded:
            values.append(1000 * (pods.added[nxt] - pods.succeeded[pod]))
    return percentiles(values)


def run(
    plane: ControlPlane, home: Path, runs: int, steps: int, timeout: float, qps: float | None = None
) -> dict[str, Any]:
    """N Workflows of K steps created at once on `plane`; the controller's figures until all ended.

    The plane must complete pods (KWOK). Argo's CRDs are installed and its controller started and
    stopped here, so the AgentRun figures of the same run are taken without it running."""
    install_crds(plane, home)
    if plane.api_get(f"/api/v1/namespaces/{NS}")[0] != 200:
        plane.kubectl("create", "namespace", NS)
    deadline = time.monotonic() + 60
    while plane.api_get(f"/api/v1/namespaces/{NS}/serviceaccounts/default")[0] != 200:
        if time.monotonic() > deadline:
            raise RuntimeError(f"namespace {NS} has no default ServiceAccount after 60s")
        time.sleep(0.1)
    pods = PodWatch(plane).start()
    controller = ArgoController(plane, home / "controller", qps).start()
    try:
        before = controller.metrics()
        cpu_before = cpu_seconds(controller.pid)
        names = [f"wf-{r}" for r in range(runs)]
        load_start = os.getloadavg()
        started = time.monotonic()
        create_all(plane, [workflow(name, steps) for name in names])
        end = started + timeout
        workflows: list[dict[str, Any]] = []
        last_print = started
        while time.monotonic() < end:
            workflows = list_workflows(plane)
            ended = [w for w in workflows if (w.get("status") or {}).get("phase") in FINAL]
            if len(ended) == len(names):
                break
            if time.monotonic() - last_print > 30:
                last_print = time.monotonic()
                print(
                    f"  argo {last_print - started:6.0f}s: {len(ended)}/{len(names)} Workflows ended, "
                    f"{len(pods.added)} pods, controller RSS {peak_rss_mb(controller.pid):.0f} MB"
                )
            time.sleep(2.0 + runs / 1000)  # a list of thousands of Workflows is work for the API server
        elapsed = time.monotonic() - started
        load_end = os.getloadavg()
        cpu = cpu_seconds(controller.pid) - cpu_before
        rss = peak_rss_mb(controller.pid)
        after = controller.metrics()
        workflows = list_workflows(plane)
    finally:
        controller.stop()
    result = check(workflows, names, steps, pods)
    completed = max(1, result["completed_steps"])
    verbs = requests_by_verb(before, after)
    writes = sum(v for verb, v in verbs.items() if verb.upper() not in ("GET", "LIST", "WATCH"))
    return {
        "controller": f"argo-workflows v{argo.ARGO_WORKFLOWS_VERSION} workflow-controller",
        "runs": runs,
        "steps_per_run": steps,
        "client_qps": qps or "default (20, burst 30)",
        "wall_seconds": elapsed,
        "steps_per_second": result["completed_steps"] / elapsed if elapsed else float("nan"),
        "cpu_seconds": cpu,
        "cpu_ms_per_step": 1000 * cpu / completed,
        "peak_rss_mb": rss,
        "turnaround_ms": turnaround_ms(pods),
        "requests_by_verb": verbs,
        "writes_per_step": writes / completed,
        "load_average_start": list(load_start),
        "load_average_end": list(load_end),
        "check": result,
    }


def summary(report: dict[str, Any]) -> str:
    t, c = report["turnaround_ms"], report["check"]
    return (
        f"argo: runs={report['runs']} steps/run={report['steps_per_run']} wall={report['wall_seconds']:.1f}s "
        f"steps/s={report['steps_per_second']:.1f} CPU={report['cpu_ms_per_step']:.2f} ms/step "
        f"peak RSS={report['peak_rss_mb']:.1f} MB writes/step={report['writes_per_step']:.2f} "
        f"turnaround p50/p95/p99={t['p50']:.0f}/{t['p95']:.0f}/{t['p99']:.0f} ms; "
        f"{c['succeeded']}/{c['runs']} Succeeded, {c['unfinished']} unfinished, lost={c['lost']} "
        f"repeated={c['repeated']}"
    )


def side_by_side(report: dict[str, Any]) -> str:
    """The operator's and Argo's figures of one bench_scale run as a Markdown table (the docs' shape).
    With warm loops the operator's turnaround is a result in the warm pod -> the next start there."""
    a, q, t = (
        report["argo"],
        report.get("turnaround_ms", report["queue_latency_ms"]),
        report["argo"]["turnaround_ms"],
    )
    turnaround = (
        "result -> next start in the warm pod (operator) / pod done -> next pod (Argo), p50 / p95 / p99"
        if report.get("warm")
        else "pod done -> next pod's owner / pod, p50 / p95 / p99"
    )
    rows = [
        ("", "AgentRun operator", f"Argo Workflows v{argo.ARGO_WORKFLOWS_VERSION}"),
        ("peak RSS", f"{report['operator_peak_rss_mb']:.0f} MB", f"{a['peak_rss_mb']:.0f} MB"),
        (
            "CPU per iteration / step",
            f"{report['operator_cpu_ms_per_iteration']:.1f} ms",
            f"{a['cpu_ms_per_step']:.1f} ms",
        ),
        (
            "iterations / steps per second",
            f"{report['iterations_per_second']:.1f}",
            f"{a['steps_per_second']:.1f}",
        ),
        ("all ended after", f"{report['wall_seconds']:.0f} s", f"{a['wall_seconds']:.0f} s"),
        (
            turnaround,
            f"{q['p50']:.0f} / {q['p95']:.0f} / {q['p99']:.0f} ms",
            f"{t['p50']:.0f} / {t['p95']:.0f} / {t['p99']:.0f} ms",
        ),
        (
            "its own API writes per iteration / step",
            f"{report['operator_writes_per_iteration']:.2f}",
            f"{a['writes_per_step']:.2f}",
        ),
        (
            "lost / repeated",
            f"{report['check']['lost']} / {report['check']['repeated']}",
            f"{a['check']['lost']} / {a['check']['repeated']}",
        ),
    ]
    head = f"| {report['runs']} x {report['iterations_per_run']} | {rows[0][1]} | {rows[0][2]} |"
    return "\n".join([head, "| --- | --- | --- |", *(f"| {r[0]} | {r[1]} | {r[2]} |" for r in rows[1:])])


def main() -> int:
    """Argo alone on a KWOK plane of its own (to try the harness; the comparison is bench_scale --argo)."""
    import argparse

    from agentrun_devcluster.kwok import KwokPlane

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="Workflows created at once")
    ap.add_argument("--iterations", type=int, default=3, help="sequential steps per Workflow")
    ap.add_argument("--timeout", type=float, default=600, help="seconds to wait for all Workflows")
    ap.add_argument("--qps", type=float, default=None, help="Argo's --qps and --burst (default: its own)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    ap.add_argument("--keep", action="store_true", help="keep the plane's directory (logs)")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="agentrun-bench-argo-"))
    nodes = max(2, args.runs * args.iterations // 1000 + 2)
    kwok = KwokPlane(home / "plane", nodes, progress=print, extra_stages=(stages_file(home),)).start()
    try:
        report = run(kwok.plane, home, args.runs, args.iterations, args.timeout, args.qps)
    finally:
        kwok.stop()
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
    print(summary(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    c = report["check"]
    return 0 if c["lost"] == 0 and c["repeated"] == 0 and c["succeeded"] == c["runs"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
