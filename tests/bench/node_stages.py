"""The iteration benchmark on the real node (`bench_iterations --runtime kubelet`): where an
iteration's time goes between the operator, the Job controller, the scheduler and the kubelet.

A real node runs the pods (upstream kubelet and kube-scheduler on containerd, docs/local-dev.md#real-node);
the operator runs as its own process. N looped AgentRuns of K iterations (`main` is busybox's
`true`) run one after another (`--parallel P` at once), then, as the baseline measured in the same
run, bare pods of the same image running `true`, one at a time. Three watches (Jobs, Pods,
AgentRuns) time every change as it arrives (the API's own timestamps have whole seconds, too coarse
for stages of tens of milliseconds); per iteration k of a run (k < K, as the wall time needs the
next Job):

- wall: Job k seen → Job k+1 seen; `main`'s own runtime: `main` seen running → seen terminated
  (a `main` the kubelet reports only once ended counts 0);
- overhead: wall - `main`'s runtime, split into the stages (each a p50 in `stages_ms`):
  Job → pod created → scheduled (`PodScheduled`) → sandbox ready (`PodReadyToStartContainers`) →
  the reporter started (`Initialized` and the reporter seen running: its claim and fingerprint
  done, or once, the sidecar started) → `main` started;
  `main` finished → reported (the reporter terminated: the envelope is in the pod status) → next
  Job; beside them, reported → pod `Succeeded` (the kubelet's teardown) and next Job → the status
  recording iteration k;
- bare pod: created → phase `Succeeded` seen;
- inside the pod, from containerd's own event stream (`ctr events`, nanosecond times the kubelet's
  ~1 s relist does not blur; `--parallel 1` only, as pods are told apart by their order), each a
  distribution in `containerd_ms`: `reporter_start_to_hook_done` (the reporter's start, claim and
  fingerprint, and its postStart hook's polls), `hook_done_to_main_start` (the kubelet and
  containerd making `main`), `main_exit_to_reporter_exit` (the reporter seeing `main` end,
  writing the envelope and exiting).

The machine is host-wide one node: run it under the host lock (docs/operator.md#performance).
"""

from __future__ import annotations

import json
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_operator import naming
from tests.bench.figures import pct, percentiles
from tests.bench.watch import ResumableWatch

NS = "bench"
FINAL = ("Succeeded", "Failed", "Cancelled")

STAGES = (
    "job_to_pod",
    "pod_to_scheduled",
    "scheduled_to_sandbox",
    "sandbox_to_initialized",
    "initialized_to_main_started",
    "main_finished_to_reported",
    "reported_to_next_job",
)
"""The overhead's stages in order: with `main`'s runtime they make up an iteration's wall time."""

ASIDE = ("reported_to_pod_succeeded", "next_job_to_recorded")
"""Stages beside the chain: the kubelet's teardown, and the operator's status write."""


class Watch(ResumableWatch):
    """Every event of one collection as it arrives: (monotonic time, type, object)."""

    def __init__(self, plane: ControlPlane, path: str) -> None:
        super().__init__(plane, path)
        self.events: list[tuple[float, str, dict[str, Any]]] = []

    def on_event(self, kind: str, obj: dict[str, Any], now: float) -> None:
        self.events.append((now, kind, obj))

    def first_added(self) -> tuple[dict[str, float], dict[str, int]]:
        """When each object was first seen, and how many times it was added (a repeat is a bug)."""
        added: dict[str, float] = {}
        adds: dict[str, int] = {}
        for t, kind, obj in list(self.events):
            name = str(obj["metadata"]["name"])
            added.setdefault(name, t)
            if kind == "ADDED":
                adds[name] = adds.get(name, 0) + 1
        return added, adds


class ContainerdEvents:
    """`ctr events` of the node's containerd, to a file, for the in-pod stages (`in_pod_stages`)."""

    def __init__(self, socket: Path, out: Path) -> None:
        self.out = out
        self._file = out.open("w")
        self._proc = subprocess.Popen(
            ["ctr", "--address", str(socket), "events"], stdout=self._file, stderr=subprocess.STDOUT
        )

    def stop(self) -> list[tuple[float, str, dict[str, Any]]]:
        """Stop the stream (again: nothing more); its events as (epoch seconds, topic, payload)."""
        if self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
        self._file.close()
        return parse_ctr_events(self.out.read_text())


def parse_ctr_events(text: str) -> list[tuple[float, str, dict[str, Any]]]:
    """Lines of `ctr events` (`2026-11-28 18:31:49.4117 +0000 UTC k8s.io /tasks/exit {...}`). Pure."""
    events: list[tuple[float, str, dict[str, Any]]] = []
    for line in text.splitlines():
        parts = line.split(" ", 6)
        if len(parts) < 7 or parts[2] != "+0000" or not parts[5].startswith("/"):
            continue
        day, clock = parts[0], parts[1]
        whole, _, frac = clock.partition(".")
        at = datetime.fromisoformat(f"{day}T{whole}+00:00").timestamp() + float(f"0.{frac or 0}")
        try:
            payload = json.loads(parts[6])
        except ValueError:
            continue
        events.append((at, parts[5], payload))
    return events


def in_pod_stages(
    events: list[tuple[float, str, dict[str, Any]]], operator_image: str
) -> dict[str, list[float]]:
    """Per iteration pod, from containerd's events, when pods ran one at a time (seconds). Pure.

    A pod is its sandbox (a `/containers/update` naming a pod of a Job); the reporter and `main`
    are the next containers made of the operator's image and of another image; the hook is the
    reporter's exec. Pods made while another was still running are skipped, not guessed."""
    stages: dict[str, list[float]] = {stage: [] for stage in IN_POD_STAGES}
    for _job, pod in _in_pod_marks(events, operator_image):
        for stage, seconds in pod.items():
            stages[stage].append(seconds)
    return stages


def in_pod_stages_by_job(
    events: list[tuple[float, str, dict[str, Any]]], operator_image: str
) -> dict[str, dict[str, float]]:
    """`in_pod_stages` of each Job's first finished pod, by the Job's name (seconds). Pure."""
    by_job: dict[str, dict[str, float]] = {}
    for job, pod in _in_pod_marks(events, operator_image):
        by_job.setdefault(job, pod)
    return by_job


IN_POD_STAGES = ("reporter_start_to_hook_done", "hook_done_to_main_start", "main_exit_to_reporter_exit")


def _in_pod_marks(
    events: list[tuple[float, str, dict[str, Any]]], operator_image: str
) -> list[tuple[str, dict[str, float]]]:
    """(Job name, its pod's in-pod stages) of every finished pod, in the order the pods were made."""
    sandboxes: set[str] = set()
    pods: list[dict[str, str]] = []
    started: dict[str, float] = {}
    exited: dict[str, float] = {}
    hook_exit: dict[str, float] = {}
    for at, topic, body in events:
        if topic == "/containers/create" and pods and body["id"] not in sandboxes:
            role = "reporter" if body.get("image") == operator_image else "main"
            pods[-1].setdefault(role, body["id"])
        elif topic == "/containers/update":
            labels = body.get("labels") or {}
            if "batch.kubernetes.io/job-name" in labels and body["id"] not in sandboxes:
                sandboxes.add(body["id"])
                pods.append({"job": str(labels["batch.kubernetes.io/job-name"])})
        elif topic == "/tasks/start":
            started[body["container_id"]] = at
        elif topic == "/tasks/exit":
            ended = exited if body.get("id") == body.get("container_id") else hook_exit
            ended.setdefault(body["container_id"], at)
    marked: list[tuple[str, dict[str, float]]] = []
    for pod in pods:
        reporter, main = pod.get("reporter", ""), pod.get("main", "")
        times = [
            started.get(reporter),
            hook_exit.get(reporter),
            started.get(main),
            exited.get(main),
            exited.get(reporter),
        ]
        marks = [t for t in times if t is not None]
        if len(marks) < len(times) or marks != sorted(marks):
            continue  # unfinished, or overlapping pods: not told apart
        r_start, hook_done, m_start, m_exit, r_exit = marks
        stages = {
            "reporter_start_to_hook_done": hook_done - r_start,
            "hook_done_to_main_start": m_start - hook_done,
            "main_exit_to_reporter_exit": r_exit - m_exit,
        }
        marked.append((pod["job"], stages))
    return marked


def _condition(status: dict[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in status.get("conditions") or [])


def _state(status: dict[str, Any], key: str, name: str) -> dict[str, Any]:
    for cs in status.get(key) or []:
        if cs.get("name") == name:
            return dict(cs.get("state") or {})
    return {}


def pod_milestones(events: list[tuple[float, dict[str, Any]]]) -> dict[str, float]:
    """When each milestone of one pod was first seen, from its watch events in order. Pure."""
    seen: dict[str, float] = {}

    def mark(name: str, t: float, happened: bool) -> None:
        if happened:
            seen.setdefault(name, t)

    for t, pod in events:
        status = pod.get("status") or {}
        main = _state(status, "containerStatuses", "main")
        # The reporter: a regular container listed before main (docs/design.md#reporter-first), or
        # the native sidecar of the code before it.
        reporter = _state(status, "containerStatuses", "reporter") or _state(
            status, "initContainerStatuses", "reporter"
        )
        mark("created", t, True)
        mark(
            "scheduled",
            t,
            _condition(status, "PodScheduled") or bool((pod.get("spec") or {}).get("nodeName")),
        )
        mark("sandbox", t, _condition(status, "PodReadyToStartContainers"))
        mark(
            "initialized",
            t,
            _condition(status, "Initialized") and ("running" in reporter or "terminated" in reporter),
        )
        mark("main_started", t, "running" in main or "terminated" in main)
        mark("main_running", t, "running" in main)
        mark("main_finished", t, "terminated" in main)
        mark("reported", t, "terminated" in reporter and "terminated" in main)
        mark("succeeded", t, status.get("phase") == "Succeeded")
    return seen


def recorded_at(events: list[tuple[float, str, dict[str, Any]]], run: str, index: int) -> float | None:
    """When an AgentRun's status first recorded iteration `index` as ended."""
    for t, _kind, obj in events:
        if obj["metadata"]["name"] != run:
            continue
        steps = ((obj.get("status") or {}).get("workflow") or {}).get("steps") or [{}]
        for record in (steps[0].get("loop") or {}).get("iterations") or []:
            if record.get("index") == index and record.get("phase") in ("Succeeded", "Failed"):
                return t
    return None


def iteration_figures(
    names: list[str],
    iterations: int,
    jobs_added: dict[str, float],
    pods: dict[str, dict[str, float]],
    runs_events: list[tuple[float, str, dict[str, Any]]],
) -> list[dict[str, float]]:
    """Per iteration k < K of each run: wall, `main`'s runtime, overhead and every stage (seconds)."""
    pod_of_job = {job: seen for job, seen in pods.items()}
    rows: list[dict[str, float]] = []
    for name in names:
        for k in range(1, iterations):
            job, nxt = naming.job_name(name, 1, k, 1), naming.job_name(name, 1, k + 1, 1)
            seen = pod_of_job.get(job)
            if job not in jobs_added or nxt not in jobs_added or seen is None:
                continue
            start, end = jobs_added[job], jobs_added[nxt]
            runtime = seen["main_finished"] - seen["main_running"] if "main_running" in seen else 0.0
            row = {"wall": end - start, "main": runtime, "overhead": end - start - runtime}
            chain = [
                ("job_to_pod", start, seen.get("created")),
                ("pod_to_scheduled", seen.get("created"), seen.get("scheduled")),
                ("scheduled_to_sandbox", seen.get("scheduled"), seen.get("sandbox")),
                ("sandbox_to_initialized", seen.get("sandbox"), seen.get("initialized")),
                ("initialized_to_main_started", seen.get("initialized"), seen.get("main_started")),
                ("main_finished_to_reported", seen.get("main_finished"), seen.get("reported")),
                ("reported_to_next_job", seen.get("reported"), end),
                ("reported_to_pod_succeeded", seen.get("reported"), seen.get("succeeded")),
                ("next_job_to_recorded", end, recorded_at(runs_events, name, k)),
            ]
            for stage, a, b in chain:
                if a is not None and b is not None:
                    row[stage] = b - a
            rows.append(row)
    return rows


def pods_by_job(events: list[tuple[float, str, dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Each Job's first pod's milestones (an iteration Job has one pod unless something went wrong)."""
    by_pod: dict[str, list[tuple[float, dict[str, Any]]]] = {}
    job_of: dict[str, str] = {}
    for t, _kind, pod in events:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        job = labels.get("job-name") or labels.get("batch.kubernetes.io/job-name")
        if not job:
            continue
        name = str(pod["metadata"]["name"])
        job_of.setdefault(name, str(job))
        by_pod.setdefault(name, []).append((t, pod))
    result: dict[str, dict[str, float]] = {}
    for name, evs in by_pod.items():
        seen = pod_milestones(evs)
        job = job_of[name]
        if job not in result or seen["created"] < result[job]["created"]:
            result[job] = seen
    return result


def bare_pod_seconds(plane: ControlPlane, pods: Watch, count: int, image: str) -> list[float]:
    """Bare pods of the same image running `true`, one at a time: created → `Succeeded` seen."""
    times: list[float] = []
    for i in range(count):
        name = f"bare-{i}"
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "restartPolicy": "Never",
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 3,
                "containers": [{"name": "main", "image": image, "command": ["true"]}],
            },
        }
        start = time.monotonic()
        code, text = plane.api_request("POST", f"/api/v1/namespaces/{NS}/pods", body)
        if code != 201:
            raise RuntimeError(f"create {name}: {code} {text[:300]!r}")
        deadline = start + 120
        done: float | None = None
        while done is None and time.monotonic() < deadline:
            for t, _kind, obj in list(pods.events):
                if obj["metadata"]["name"] == name and (obj.get("status") or {}).get("phase") == "Succeeded":
                    done = t
                    break
            time.sleep(0.02)
        if done is not None:
            times.append(done - start)
        plane.api_request("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}")
    return times


def ms(values: list[float]) -> dict[str, float]:
    """Seconds as n/p50/p95/p99 in milliseconds."""
    return percentiles([1000 * v for v in values])


def summarize(
    rows: list[dict[str, float]], bare: list[float], in_pod: dict[str, list[float]]
) -> dict[str, Any]:
    """The figures of one run: distributions, stage p50s, the in-pod stages, and the bare pod baseline."""
    stages = {stage: 1000 * pct([r[stage] for r in rows if stage in r], 50) for stage in (*STAGES, *ASIDE)}
    return {
        "wall_ms": ms([r["wall"] for r in rows]),
        "main_ms": ms([r["main"] for r in rows]),
        "overhead_ms": ms([r["overhead"] for r in rows]),
        "bare_pod_ms": ms(bare),
        "stages_ms": stages,
        "containerd_ms": {stage: ms(values) for stage, values in in_pod.items()},
    }


def print_summary(figures: dict[str, Any]) -> None:
    def row(title: str, d: dict[str, float]) -> str:
        return (
            f"{title:<44} n={d['n']:<4.0f} p50={d['p50']:8.1f}ms p95={d['p95']:8.1f}ms p99={d['p99']:8.1f}ms"
        )

    print(row("iteration wall (Job -> next Job)", figures["wall_ms"]))
    print(row("main's own runtime", figures["main_ms"]))
    print(row("overhead (wall - main)", figures["overhead_ms"]))
    print(row("baseline: bare pod (created -> Succeeded)", figures["bare_pod_ms"]))
    print("overhead by stage (p50):")
    for stage in STAGES:
        print(f"    {stage:<36} {figures['stages_ms'][stage]:8.1f} ms")
    print("beside the chain (p50):")
    for stage in ASIDE:
        print(f"    {stage:<36} {figures['stages_ms'][stage]:8.1f} ms")
    if figures["containerd_ms"]:
        print("inside the pod (containerd's events):")
        for stage, d in figures["containerd_ms"].items():
            print(row(f"    {stage}", d))


def node_images(tag: str | None = None) -> list[str]:
    """busybox and the operator image (the reporter's) as `tag` (default: the image's own tag), made
    on a Docker engine when missing."""
    from agentrun_devcluster import dockerengine, imagebuild
    from agentrun_devcluster.baseimages import BUSYBOX

    dockerengine.ensure_engine(print)
    built = imagebuild.build_image_with_busybox(tag or imagebuild.DEFAULT_TAG, "auto", print)
    return [BUSYBOX, built.tag]


def start_node(home: Path, tools: Any, crds: Path, image_tag: str | None = None) -> tuple[ControlPlane, Any]:
    """A control plane with the real node on it (as the node tier's fixture starts it); the operator
    image is built as `image_tag` (default: its own tag)."""
    from agentrun_devcluster.node.host import host_problem
    from agentrun_devcluster.node.node import RealNode

    problem = host_problem()
    if problem is not None:
        raise SystemExit(f"no real node here: {problem}")
    images = node_images(image_tag)
    plane = ControlPlane(home, tools, progress=print)
    plane.set_runtime("kubelet")
    node = RealNode(plane, progress=print)
    try:
        plane.start(crds_dir=crds)
        node.start(images)
    except BaseException:
        node.stop()
        plane.stop()
        raise
    return plane, node
