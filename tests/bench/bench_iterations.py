"""Benchmark: iteration turnaround, API writes, reconciles, CPU and memory of the operator per iteration.

Runs N looped AgentRuns of K iterations each, all at once, on the real local control plane, with the
operator as its own process and the kubelet driver completing each pod at once. It prints, and with
`--json FILE` writes, from that one run:

- iteration turnaround (a pod finished -> the next iteration's Job seen by a watch) p50/p95/p99,
- the raw API GET and POST round trip measured in the same run (the physical floor, for scale),
- operator CPU (utime + stime) per completed iteration, and its peak RSS (VmHWM),
- the operator's API writes per iteration by verb and resource, reconciles per iteration,
- iterations per second over the whole run,
- the machine's load average when the runs started and when they ended (the machine may be shared:
  latency figures move with it; CPU per iteration much less),
- the lost/repeated check: every run Succeeded with iterations 1..K recorded once each and exactly
  one Job (attempt 1) created per iteration.

It asserts nothing about time (a slow shared machine is not a failure); the exit code is 1 only when
the lost/repeated check fails. `--profile FILE` runs the operator under a CPU-time sampling profiler
(tests/bench/cpu_profile.py), writes its stacks to FILE.1 and prints the top of the profile
(docs/operator.md#performance). `--runtime kubelet` runs on the real node (tests/bench/node_stages.py);
with `--checkpoint` too, its runs are pairs on a seeded workspace, mode None then mode Files, and
it adds what the checkpoint costs inside the pod (tests/bench/node_checkpoints.py,
docs/operator.md#performance-checkpoints).

    .venv/bin/python -m tests.bench.bench_iterations --runs 5 --iterations 20 --json /tmp/bench.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrun_devcluster import imagebuild, toolchain
from agentrun_devcluster.controlplane import ControlPlane
from agentrun_operator import naming
from tests.bench.cpu_profile import top as profile_top
from tests.bench.figures import cpu_seconds, cpu_times, distribution, line, peak_rss_mb, scrape
from tests.bench.harness import start_operator
from tests.bench.watch import ResumableWatch
from tests.integration.kubelet_driver import KubeletDriver, PodOutcome
from tests.support.processes import OperatorProcess

NS = "bench"
FINAL = ("Succeeded", "Failed", "Cancelled")


class JobWatch(ResumableWatch):
    """When each Job of the namespace was first added (monotonic) and how often it was added.

    Its stream is resumed from the last resourceVersion (tests/bench/watch.py), so no ADDED event is
    missed; after a gap (410) the lost/repeated check cannot vouch for the Jobs created meanwhile."""

    def __init__(self, plane: ControlPlane) -> None:
        super().__init__(plane, f"/apis/batch/v1/namespaces/{NS}/jobs")
        self.added: dict[str, float] = {}
        self.adds: collections.Counter[str] = collections.Counter()

    def on_event(self, kind: str, obj: dict[str, Any], now: float) -> None:
        if kind == "ADDED":
            name = obj["metadata"]["name"]
            self.added.setdefault(name, now)
            self.adds[name] += 1


def raw_round_trips(plane: ControlPlane, n: int = 200) -> tuple[list[float], list[float]]:
    gets, writes = [], []
    for i in range(n):
        t = time.perf_counter()
        plane.api_get(f"/api/v1/namespaces/{NS}/configmaps/rt-0")
        gets.append(time.perf_counter() - t)
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"rt-{i}"}, "data": {"a": "b"}}
        t = time.perf_counter()
        plane.api_request("POST", f"/api/v1/namespaces/{NS}/configmaps", body)
        writes.append(time.perf_counter() - t)
    return gets, writes


def agentrun(name: str, iterations: int) -> dict[str, Any]:
    return {
        "apiVersion": "agents.proompteng.ai/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "workload": {"image": "busybox:1.36", "command": ["true"]},
            "workflow": {"steps": [{"name": "loop", "loop": {"maxIterations": iterations}}]},
        },
    }


def list_runs(plane: ControlPlane) -> list[dict[str, Any]]:
    code, body = plane.api_request(
        "GET", f"/apis/agents.proompteng.ai/v1alpha1/namespaces/{NS}/agentruns", timeout=60
    )
    return list(json.loads(body).get("items", [])) if code == 200 else []


def create_runs(
    plane: ControlPlane,
    names: list[str],
    iterations: int,
    make: Callable[[str], dict[str, Any]] | None = None,
) -> None:
    """Create one looped AgentRun of `iterations` per name (`make(name)`'s if given), one after another."""
    for name in names:
        code, body = plane.api_request(
            "POST",
            f"/apis/agents.proompteng.ai/v1alpha1/namespaces/{NS}/agentruns",
            make(name) if make is not None else agentrun(name, iterations),
        )
        if code != 201:
            raise RuntimeError(f"create {name}: {code} {body[:300]!r}")


def lost_and_repeated(
    runs: list[dict[str, Any]],
    names: list[str],
    iterations: int,
    watch: JobWatch,
    retried: frozenset[int] = frozenset(),
    job_per_iteration: bool = True,
) -> dict[str, Any]:
    """What a correct operator never does: lose an iteration or run one twice (the iterations
    `retried` have exactly two attempts: a first that failed on purpose and its retry).
    `job_per_iteration=False` (a warm loop: its iterations run in the pod of its first Job): exactly
    one Job for iteration 1, and any other Job of the run counted in `other_jobs`, not checked."""
    by_name = {r["metadata"]["name"]: r for r in runs}
    not_succeeded, unfinished, lost, repeated = [], [], [], []
    completed = other_jobs = 0
    for name in names:
        status = (by_name.get(name) or {}).get("status") or {}
        steps_now = (status.get("workflow") or {}).get("steps") or [{}]
        completed += int((steps_now[0].get("loop") or {}).get("completedIterations") or 0)
        if status.get("phase") not in FINAL:
            unfinished.append(name)  # neither lost nor repeated yet: it ran out of time
            continue
        if status.get("phase") != "Succeeded":
            not_succeeded.append(f"{name}: {status.get('phase')}")
        steps = (status.get("workflow") or {}).get("steps") or [{}]
        loop = steps[0].get("loop") or {}
        records = [(i.get("index"), i.get("attempts"), i.get("phase")) for i in loop.get("iterations") or []]
        indexes = [r[0] for r in records]
        if loop.get("completedIterations") != iterations or sorted(set(indexes)) != list(
            range(1, iterations + 1)
        ):
            lost.append(f"{name}: completed={loop.get('completedIterations')} recorded={indexes}")
        if len(indexes) != len(set(indexes)) or any(r[1] != (2 if r[0] in retried else 1) for r in records):
            repeated.append(f"{name}: records={records}")
        for k in range(1, iterations + 1):
            first = naming.job_name(name, 1, k, 1)
            if not job_per_iteration and k > 1:
                other_jobs += sum(naming.job_name(name, 1, k, a) in watch.added for a in (1, 2))
                continue
            if first not in watch.added:
                lost.append(f"{name}: no Job for iteration {k}")
            elif watch.adds[first] != 1:
                repeated.append(f"{name}: Job {first} added {watch.adds[first]} times")
            last = 2 if k in retried else 1
            if naming.job_name(name, 1, k, last + 1) in watch.added:
                repeated.append(f"{name}: attempt {last + 1} of iteration {k}")
        extra = naming.job_name(name, 1, iterations + 1, 1)
        if extra in watch.added:
            repeated.append(f"{name}: a Job for iteration {iterations + 1}")
    return {
        "job_watch_resumes": watch.resumes,
        "job_watch_gaps": watch.gaps,
        "runs": len(names),
        "succeeded": len(names) - len(not_succeeded) - len(unfinished),
        "unfinished": len(unfinished),
        "completed_iterations": completed,
        "not_succeeded": not_succeeded[:20],
        "lost": len(lost),
        "repeated": len(repeated),
        "examples": (lost + repeated)[:20],
        **({} if job_per_iteration else {"other_jobs": other_jobs}),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="AgentRuns created at once")
    ap.add_argument("--iterations", type=int, default=20, help="loop iterations per run")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    ap.add_argument(
        "--profile", type=Path, default=None, help="profile the operator's CPU (stacks to FILE.1)"
    )
    ap.add_argument("--timeout", type=float, default=1800, help="seconds to wait for all runs")
    ap.add_argument("--keep", action="store_true", help="keep the control plane's directory (logs)")
    ap.add_argument(
        "--workers", type=int, default=None, help="the operator's --workers (its default if unset)"
    )
    ap.add_argument(
        "--runtime",
        choices=("process", "kubelet"),
        default="process",
        help="process: a driver plays the kubelet; kubelet: the real node (tests/bench/node_stages.py)",
    )
    ap.add_argument("--parallel", type=int, default=1, help="kubelet: runs at once (default 1)")
    ap.add_argument("--bare-pods", type=int, default=10, help="kubelet: bare pods for the baseline")
    ap.add_argument(
        "--checkpoint",
        action="store_true",
        help="kubelet: N pairs of runs on a seeded workspace, mode None then mode Files "
        "(tests/bench/node_checkpoints.py)",
    )
    ap.add_argument("--workspace-files", type=int, default=10000, help="checkpoint: files seeded")
    ap.add_argument("--workspace-megabytes", type=int, default=200, help="checkpoint: MiB seeded")
    ap.add_argument("--changed", type=int, default=10, help="checkpoint: files each iteration changes")
    ap.add_argument(
        "--restore-at",
        type=int,
        default=0,
        help="checkpoint: this iteration's first attempt fails, its retry restores (0: none)",
    )
    args = ap.parse_args()
    if args.checkpoint and (args.runtime != "kubelet" or args.parallel != 1 or args.iterations < 3):
        ap.error("--checkpoint needs --runtime kubelet, --parallel 1 and --iterations 3 or more")
    if args.restore_at and not 3 <= args.restore_at <= args.iterations:
        ap.error("--restore-at names an iteration from 3 to --iterations (1 seeds, 2 copies it all)")
    if args.runtime == "kubelet":
        return main_kubelet(args)

    home = Path(tempfile.mkdtemp(prefix="agentrun-bench-"))
    plane = ControlPlane(home, toolchain.ensure_tools(print))
    plane.start(crds_dir=Path(__file__).resolve().parents[2] / "crds")
    driver: KubeletDriver | None = None
    operator: OperatorProcess | None = None
    if args.profile is not None:
        os.environ["AGENTRUN_OPERATOR_PROFILE"] = str(args.profile)
    try:
        plane.kubectl("create", "namespace", NS)
        while plane.api_get(f"/api/v1/namespaces/{NS}/serviceaccounts/default")[0] != 200:
            time.sleep(0.1)
        gets, posts = raw_round_trips(plane)
        driver = KubeletDriver(
            plane, NS, lambda _pod: PodOutcome(), poll=0.01, field_selector=KubeletDriver.UNFINISHED
        ).start()
        watch = JobWatch(plane).start()
        workers = (args.workers,) if args.workers else ()
        operator, pid, port = start_operator(plane, home, args.iterations, 30, workers=workers)
        before = scrape(port)
        user_before, system_before = cpu_times(pid)
        names = [f"bench-{r}" for r in range(args.runs)]
        load_start = os.getloadavg()
        started = time.monotonic()
        create_runs(plane, names, args.iterations)
        deadline = time.monotonic() + args.timeout
        runs: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            runs = list_runs(plane)
            done = [r for r in runs if (r.get("status") or {}).get("phase") in FINAL]
            if len(runs) == len(names) and len(done) == len(names):
                break
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        load_end = os.getloadavg()
        time.sleep(1.0)  # let trailing TTL patches and Events land
        after = scrape(port)
        user_after, system_after = cpu_times(pid)
        user, system = user_after - user_before, system_after - system_before
        cpu = user + system
        rss = peak_rss_mb(pid)
        runs = list_runs(plane)

        iterations = args.runs * args.iterations
        finished_by_job: dict[str, float] = {}
        for pod, t in driver.finished_at.items():
            job = pod.rsplit("-", 1)[0]
            finished_by_job[job] = min(t, finished_by_job.get(job, t))
        turnaround = []
        for name in names:
            for k in range(1, args.iterations):
                prev_job = naming.job_name(name, 1, k, 1)
                nxt = naming.job_name(name, 1, k + 1, 1)
                if prev_job in finished_by_job and nxt in watch.added:
                    turnaround.append(watch.added[nxt] - finished_by_job[prev_job])

        def delta(prefix: str) -> float:
            return sum(v - before.get(k, 0.0) for k, v in after.items() if k.startswith(prefix))

        writes = {
            k.split("{", 1)[1].rstrip("}"): v - before.get(k, 0.0)
            for k, v in after.items()
            if k.startswith("agentrun_api_requests_total{")
            and 'verb="GET"' not in k
            and 'verb="WATCH"' not in k
            and v - before.get(k, 0.0)
        }
        reads = sum(
            v - before.get(k, 0.0)
            for k, v in after.items()
            if k.startswith("agentrun_api_requests_total{") and 'verb="GET"' in k
        )
        total_writes = sum(writes.values())
        check = lost_and_repeated(runs, names, args.iterations, watch)
        # Per *completed* iteration: when runs time out unfinished, the planned count would flatter.
        iterations = max(1, check["completed_iterations"])
        reconciles = delta("agentrun_reconcile_duration_seconds_count")
        plan_seconds = delta("agentrun_plan_duration_seconds_sum")
        report: dict[str, Any] = {
            "runs": args.runs,
            "iterations_per_run": args.iterations,
            "operator_workers": args.workers,
            "iterations": args.runs * args.iterations,
            "completed_iterations": check["completed_iterations"],
            "wall_seconds": elapsed,
            "load_average_start": list(load_start),
            "load_average_end": list(load_end),
            "iterations_per_second": check["completed_iterations"] / elapsed if elapsed else float("nan"),
            "turnaround_ms": distribution(turnaround),
            "raw_get_ms": distribution(gets),
            "raw_post_ms": distribution(posts),
            "cpu_ms_per_iteration": 1000 * cpu / iterations,
            "cpu_seconds": cpu,
            "cpu_user_seconds": user,
            "cpu_system_seconds": system,
            "operator_peak_rss_mb": rss,
            "writes_per_iteration": total_writes / iterations,
            "writes_per_iteration_by_resource": {k: v / iterations for k, v in sorted(writes.items())},
            "reads_per_iteration": reads / iterations,
            "reconciles_per_iteration": reconciles / iterations,
            "planner_ms_per_iteration": 1000 * plan_seconds / iterations,
            "check": check,
            "driver_errors": driver.errors[:10],
        }
        print()
        print(
            f"runs={args.runs} iterations/run={args.iterations} iterations={iterations} "
            f"wall={elapsed:.1f}s  iterations/s={report['iterations_per_second']:.1f}"
        )
        print(
            "load average (1/5/15 min) at start {:.2f} {:.2f} {:.2f}, at end {:.2f} {:.2f} {:.2f}".format(
                *load_start, *load_end
            )
        )
        print(
            f"check: {check['succeeded']}/{check['runs']} Succeeded, {check['unfinished']} unfinished "
            f"after {args.timeout:.0f}s, lost={check['lost']} repeated={check['repeated']} "
            f"(the Job watch resumed {check['job_watch_resumes']} times, gaps {check['job_watch_gaps']})"
        )
        for example in check["examples"]:
            print("   ", example)
        print(line("baseline: raw API GET round trip", report["raw_get_ms"]))
        print(line("baseline: raw API POST round trip", report["raw_post_ms"]))
        print(line("iteration turnaround (pod done -> next Job)", report["turnaround_ms"]))
        print(f"API writes per iteration: {total_writes / iterations:.2f} (total {total_writes:.0f})")
        for key, value in report["writes_per_iteration_by_resource"].items():
            print(f"    {key}: {value:.2f}/iteration")
        print(f"API reads per iteration: {reads / iterations:.2f}")
        print(f"reconciles per iteration: {reconciles / iterations:.2f} (total {reconciles:.0f})")
        print(f"planner time: {report['planner_ms_per_iteration']:.3f} ms per iteration")
        print(
            f"operator CPU: {report['cpu_ms_per_iteration']:.2f} ms per iteration (total {cpu:.2f}s: "
            f"user {user:.2f}s, system {system:.2f}s)"
        )
        print(f"operator peak RSS: {rss:.1f} MB")
        print(f"driver errors: {len(driver.errors)}")
        ok = check["lost"] == 0 and check["repeated"] == 0 and check["succeeded"] == check["runs"]
    finally:
        if operator is not None:
            operator.stop()
        if driver is not None:
            driver.stop()
        plane.stop()
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)  # a control plane's data: hundreds of MB at 500 runs
    if args.profile is not None and operator is not None:
        dump = Path(f"{args.profile}.{operator.starts}")
        if dump.exists():
            top = profile_top(dump, within="asyncio/runners.py")  # the event loop, not start-up
            report["profile_top"] = top
            print(top)
        else:
            print(f"no profile written at {dump}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        print(f"wrote {args.json}")
    return 0 if ok else 1


def main_kubelet(args: argparse.Namespace) -> int:
    """The benchmark on the real node: the stage split of every iteration, and the bare pod
    baseline from the same run (tests/bench/node_stages.py)."""
    from tests.bench import node_checkpoints, node_stages

    home = Path(tempfile.mkdtemp(prefix="agentrun-bench-node-"))
    crds = Path(__file__).resolve().parents[2] / "crds"
    plane, node = node_stages.start_node(home, toolchain.ensure_tools(print), crds)
    events = node_stages.ContainerdEvents(node.paths.containerd_socket, home / "containerd-events.txt")
    in_pod: dict[str, list[float]] = {}
    by_mode = node_checkpoints.run_names(args.runs)
    retried = frozenset({args.restore_at} if args.checkpoint and args.restore_at else set())
    main_script = node_checkpoints.script(
        args.workspace_files, args.workspace_megabytes, args.changed, args.restore_at
    )

    def make(name: str) -> dict[str, Any]:
        code, body = plane.api_request(
            "POST",
            f"/api/v1/namespaces/{NS}/persistentvolumeclaims",
            node_checkpoints.claim(name, NS, args.workspace_megabytes),
        )
        if code != 201:
            raise RuntimeError(f"create the claim of {name}: {code} {body[:300]!r}")
        mode = "Files" if name in by_mode["Files"] else "None"
        return node_checkpoints.agentrun(name, NS, args.iterations, mode, main_script, args.restore_at)

    operator: OperatorProcess | None = None
    report: dict[str, Any] = {}
    ok = False
    try:
        plane.kubectl("create", "namespace", NS)
        while plane.api_get(f"/api/v1/namespaces/{NS}/serviceaccounts/default")[0] != 200:
            time.sleep(0.1)
        jobs = node_stages.Watch(plane, f"/apis/batch/v1/namespaces/{NS}/jobs").start()
        pods = node_stages.Watch(plane, f"/api/v1/namespaces/{NS}/pods").start()
        run_watch = node_stages.Watch(plane, f"/apis/agents.proompteng.ai/v1alpha1/namespaces/{NS}/agentruns")
        run_watch.start()
        env = {"AGENTS_CONTROLLER_NAMESPACES": NS}
        operator, pid, port = start_operator(plane, home, args.iterations, 30, env=env)
        before = scrape(port)
        cpu_before = cpu_seconds(pid)
        if args.checkpoint:
            names = node_checkpoints.interleaved(by_mode)
        else:
            names = [f"bench-{r}" for r in range(args.runs)]
        load_start = os.getloadavg()
        started = time.monotonic()
        deadline = started + args.timeout
        for at in range(0, len(names), max(1, args.parallel)):
            batch = names[at : at + max(1, args.parallel)]
            create_runs(plane, batch, args.iterations, make if args.checkpoint else None)
            while time.monotonic() < deadline:
                phases = {
                    r["metadata"]["name"]: (r.get("status") or {}).get("phase") for r in list_runs(plane)
                }
                if all(phases.get(name) in FINAL for name in batch):
                    break
                time.sleep(0.5)
            print(f"runs {at + len(batch)}/{len(names)} ended after {time.monotonic() - started:.1f}s")
        elapsed = time.monotonic() - started
        load_end = os.getloadavg()
        time.sleep(1.0)
        after = scrape(port)
        cpu = cpu_seconds(pid) - cpu_before
        bare = node_stages.bare_pod_seconds(plane, pods, args.bare_pods, "busybox:1.36")
        by_job: dict[str, dict[str, float]] = {}
        if args.parallel == 1:
            ctr_events = events.stop()
            in_pod = node_stages.in_pod_stages(ctr_events, imagebuild.DEFAULT_TAG)
            by_job = node_stages.in_pod_stages_by_job(ctr_events, imagebuild.DEFAULT_TAG)
        runs = list_runs(plane)
        added, adds = jobs.first_added()
        seen = JobWatch(plane)
        seen.added, seen.adds = added, collections.Counter(adds)
        check = lost_and_repeated(runs, names, args.iterations, seen, retried)
        rows = node_stages.iteration_figures(
            names, args.iterations, added, node_stages.pods_by_job(pods.events), run_watch.events
        )
        figures = node_stages.summarize(rows, bare, in_pod)
        completed = max(1, check["completed_iterations"])
        writes = sum(
            v - before.get(k, 0.0)
            for k, v in after.items()
            if k.startswith("agentrun_api_requests_total{")
            and 'verb="GET"' not in k
            and 'verb="WATCH"' not in k
        )
        report = {
            "runtime": "kubelet",
            "runs": args.runs,
            "iterations_per_run": args.iterations,
            "parallel": args.parallel,
            "wall_seconds": elapsed,
            "load_average_start": list(load_start),
            "load_average_end": list(load_end),
            **figures,
            "lost": check["lost"],
            "repeated": check["repeated"],
            "cpu_ms_per_iteration": 1000 * cpu / completed,
            "writes_per_iteration": writes / completed,
            "check": check,
        }
        if args.checkpoint:
            report["checkpoint"] = {
                "workspace_files": args.workspace_files,
                "workspace_megabytes": args.workspace_megabytes,
                "changed": args.changed,
                "restore_at": args.restore_at,
                "modes": node_checkpoints.checkpoint_figures(
                    by_mode, args.iterations, args.restore_at, by_job, runs
                ),
            }
        print()
        print(
            f"runtime=kubelet runs={args.runs} iterations/run={args.iterations} parallel={args.parallel} "
            f"wall={elapsed:.1f}s; load average at start {load_start[0]:.2f}, at end {load_end[0]:.2f}"
        )
        print(
            f"check: {check['succeeded']}/{check['runs']} Succeeded, {check['unfinished']} unfinished, "
            f"lost={check['lost']} repeated={check['repeated']}"
        )
        for example in check["examples"]:
            print("   ", example)
        node_stages.print_summary(figures)
        if args.checkpoint:
            node_checkpoints.print_figures(report["checkpoint"]["modes"])
        print(
            f"operator CPU {report['cpu_ms_per_iteration']:.2f} ms and "
            f"{report['writes_per_iteration']:.2f} API writes per iteration"
        )
        ok = check["lost"] == 0 and check["repeated"] == 0 and check["succeeded"] == check["runs"]
    finally:
        if operator is not None:
            operator.stop()
        events.stop()
        node.stop()
        plane.stop()
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
