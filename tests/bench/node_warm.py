"""The iteration benchmark's warm runs on the real node (`bench_iterations --runtime kubelet --warm`):
what an iteration costs when it runs in the loop's live pod (`loop.warm`) against a new Job and pod.

The runs come in pairs, one at a time: `bench-cold-<r>` (a loop without `warm`, a Job and a pod per
iteration) then `bench-warm-<r>` (`loop.warm`), the same `main` in both, each on its own claim (the
local provisioner's, mounted at `/workspace`). Every iteration's command writes a line to
`/workspace/bench.log` first and last, each stamped with the wall clock in microseconds by busybox's
`ts '%.s'` (busybox's `date` has no `%N`): `<epoch> start <iteration> <attempt>` and `<epoch> end …`.
The benchmark reads the log from the volume on the host, so every time here is the host's clock.

Per iteration k < K of a run:

- **overhead**: the status recording iteration k (its record `Succeeded`, as a watch on the
  AgentRuns sees it) → iteration k+1's command started (its `start` line). For a warm run the
  operator sends the start after that status write; for a cold run it created the next Job just
  before it, so the same definition slightly favours cold;
- **end to next start**: iteration k's `end` line → iteration k+1's `start` line: all of it, from the
  command's last line to the next command's first;
- for a warm run, where that goes, from the supervisor's log (`kubectl logs POD -c reporter`) and
  `main`'s shell loop's (`agentrun: iteration <id>` on its stderr), as the kubelet's CRI log files
  stamp each line on the host (followed while the pods live: a finished warm loop's pod is deleted):
  `end_to_exit_seen` (the command's last line → the supervisor has read the exit code and the control
  file: `iteration <id> ended`), `exit_seen_to_recorded` (its long-poll answer, the operator's
  reconcile and status write, the watch), `recorded_to_start_handed` (the operator's start request →
  the supervisor wrote the id to `main`'s FIFO: `started iteration <id>`), `handed_to_loop_read`
  (`main`'s loop read it), `loop_read_to_command_start` (the subshell, the env sourced, the command's
  exec and its first line);
- for a cold run, `end_to_recorded` and the stages of node_stages.py (Job → pod → … → `main`).

The check adds to bench_iterations' (every run Succeeded, iterations 1..K recorded once each, attempt
1): a warm run has one Job (iteration 1's) and every later record says `warm` and names the same pod;
every run's log shows each iteration's `start` and `end` once.
"""

from __future__ import annotations

import os
import re
import statistics
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.bench.figures import percentiles

MODES = ("cold", "warm")
LOG_FILE = "bench.log"
IDLE_SECONDS = 60
SCRIPT = (
    'echo "start $AGENTRUN_ITERATION $AGENTRUN_ATTEMPT" | ts %.s >> /workspace/bench.log\n'
    'echo "end $AGENTRUN_ITERATION $AGENTRUN_ATTEMPT" | ts %.s >> /workspace/bench.log\n'
)
"""`main` of every iteration (busybox sh): its first and last line, each with the wall clock."""

WARM_STAGES = (
    "end_to_exit_seen",
    "exit_seen_to_recorded",
    "recorded_to_start_handed",
    "handed_to_loop_read",
    "loop_read_to_command_start",
)
"""A warm iteration's gap in order, from the command's last line to the next one's first."""

ENDED = re.compile(r"agentrun reporter: warm: iteration (\S+) ended")
HANDED = re.compile(r"agentrun reporter: warm: started iteration (\S+)")
LOOP_READ = re.compile(r"agentrun: iteration (\S+)$")


def run_names(runs: int) -> dict[str, list[str]]:
    """The runs of each mode, `bench-cold-<r>` and `bench-warm-<r>`."""
    return {mode: [f"bench-{mode}-{r}" for r in range(runs)] for mode in MODES}


def interleaved(names: dict[str, list[str]]) -> list[str]:
    """The order the runs are made in: a cold run, then its warm pair, and so on."""
    pairs = zip(*(names[mode] for mode in MODES), strict=True)
    return [name for pair in pairs for name in pair]


def agentrun(name: str, namespace: str, iterations: int, warm: bool) -> dict[str, Any]:
    """A looped run of `SCRIPT` on its claim `<name>-workspace`, with `loop.warm` when `warm`."""
    loop: dict[str, Any] = {"maxIterations": iterations}
    if warm:
        loop["warm"] = {"idleSeconds": IDLE_SECONDS}
    return {
        "apiVersion": "agents.proompteng.ai/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "workload": {
                "image": "busybox:1.36",
                "command": ["sh", "-c"],
                "args": [SCRIPT],
                "volumes": [
                    {
                        "name": "workspace",
                        "type": "pvc",
                        "claimName": f"{name}-workspace",
                        "mountPath": "/workspace",
                    }
                ],
            },
            "workflow": {"steps": [{"name": "loop", "loop": loop}]},
        },
    }


def parse_log(text: str) -> dict[tuple[str, int, int], list[float]]:
    """`bench.log`'s lines by (`start`|`end`, iteration, attempt): the epoch seconds of each. Pure."""
    lines: dict[tuple[str, int, int], list[float]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 4 or parts[1] not in ("start", "end"):
            continue
        try:
            at, k, a = float(parts[0]), int(parts[2]), int(parts[3])
        except ValueError:
            continue
        lines.setdefault((parts[1], k, a), []).append(at)
    return lines


def log_check(text: str, iterations: int) -> tuple[list[str], list[str]]:
    """(lost, repeated) of one run's log: an iteration whose command never started or ended, one
    that started or ended more than once, or an attempt other than 1. Pure."""
    lines = parse_log(text)
    count: Counter[tuple[str, int]] = Counter()
    for (word, k, _a), times in lines.items():
        count[word, k] += len(times)
    lost = [
        f"iteration {k}: no {word} line"
        for k in range(1, iterations + 1)
        for word in ("start", "end")
        if not count[word, k]
    ]
    repeated = [f"iteration {k}: {n} {word} lines" for (word, k), n in sorted(count.items()) if n > 1]
    repeated += [f"iteration {k}: attempt {a} ran" for (_w, k, a) in sorted(lines) if a != 1]
    repeated += [
        f"iteration {k} ran (the loop has {iterations})"
        for k in sorted({k for _w, k in count})
        if k > iterations
    ]
    return lost, repeated


def cri_time(stamp: str) -> float:
    """An RFC 3339 time with nanoseconds (`2026-12-05T11:04:47.318300123Z`, the CRI log's) as epoch
    seconds. Pure."""
    whole, _, frac = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{whole}+00:00").timestamp() + float(f"0.{frac or 0}")


class PodLogs:
    """Follows the kubelet's container log files of the namespace's pods while they live (a finished
    warm loop's pod is deleted with its logs): every line of `containers`, with the CRI log's own
    time of it, by pod."""

    def __init__(self, pod_logs_dir: Path, namespace: str, containers: tuple[str, ...], poll: float) -> None:
        self.root = pod_logs_dir
        self.namespace = namespace
        self.containers = containers
        self.poll = poll
        self.lines: list[tuple[float, str, str, str]] = []
        """(epoch seconds, pod, container, text)."""
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pod-logs")

    def start(self) -> PodLogs:
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, str, str, str]]:
        self._stop.set()
        self._thread.join(timeout=10)
        self._read_all()
        return self.lines

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            self._read_all()

    def _read_all(self) -> None:
        for container in self.containers:
            for path in self.root.glob(f"{self.namespace}_*/{container}/*.log"):
                self._read(path, path.parent.parent.name.split("_")[1], container)

    def _read(self, path: Path, pod: str, container: str) -> None:
        try:
            with path.open("rb") as handle:
                handle.seek(self._offsets.get(path, 0))
                data = handle.read()
        except OSError:
            return  # gone with its pod
        if not data:
            return
        self._offsets[path] = self._offsets.get(path, 0) + len(data)
        data = self._partial.pop(path, b"") + data
        *complete, rest = data.split(b"\n")
        if rest:
            self._partial[path] = rest
        for raw in complete:
            stamp, _, tail = raw.decode(errors="replace").partition(" ")
            _stream, _, tail = tail.partition(" ")
            _tag, _, text = tail.partition(" ")
            try:
                self.lines.append((cri_time(stamp), pod, container, text))
            except ValueError:
                continue


def clock_offset(samples: int = 5) -> float:
    """The wall clock minus the monotonic one (what turns the watches' monotonic times into the
    host's wall clock, which the logs use): the median of a few readings."""
    readings = []
    for _ in range(samples):
        readings.append(time.time() - time.monotonic())
    return statistics.median(readings)


def supervisor_marks(lines: list[tuple[float, str, str, str]], job: str) -> dict[str, dict[str, float]]:
    """Per iteration id of a warm Job's pods: when the supervisor saw it end (`exit_seen`), handed it
    to `main` (`handed`) and `main`'s loop read it (`loop_read`), epoch seconds (first seen). Pure."""
    marks: dict[str, dict[str, float]] = {}
    for at, pod, container, text in lines:
        if not pod.startswith(f"{job}-"):
            continue
        for key, pattern in (("exit_seen", ENDED), ("handed", HANDED), ("loop_read", LOOP_READ)):
            found = pattern.search(text)
            if found and (key != "loop_read" or container == "main"):
                marks.setdefault(found.group(1), {}).setdefault(key, at)
    return marks


def iteration_rows(
    log: dict[tuple[str, int, int], list[float]],
    recorded: dict[int, float],
    iterations: int,
    marks: dict[str, dict[str, float]] | None,
) -> list[dict[str, float]]:
    """Per iteration k < K of one run (seconds, epoch times in): `overhead` (k recorded → k+1's command
    started), `end_to_next_start`, and either `end_to_recorded` (cold: `marks` None) or the warm
    stages (`WARM_STAGES`) where the supervisor's marks are known. Pure."""
    rows: list[dict[str, float]] = []
    for k in range(1, iterations):
        end, start, at = log.get(("end", k, 1)), log.get(("start", k + 1, 1)), recorded.get(k)
        if not end or not start or at is None:
            continue
        row = {
            "overhead": start[0] - at,
            "end_to_next_start": start[0] - end[0],
            "end_to_recorded": at - end[0],
        }
        if marks is not None:
            ended, nxt = marks.get(f"{k}-1", {}), marks.get(f"{k + 1}-1", {})
            chain = [
                ("end_to_exit_seen", end[0], ended.get("exit_seen")),
                ("exit_seen_to_recorded", ended.get("exit_seen"), at),
                ("recorded_to_start_handed", at, nxt.get("handed")),
                ("handed_to_loop_read", nxt.get("handed"), nxt.get("loop_read")),
                ("loop_read_to_command_start", nxt.get("loop_read"), start[0]),
            ]
            for stage, a, b in chain:
                if a is not None and b is not None:
                    row[stage] = b - a
        rows.append(row)
    return rows


def ms(rows: list[dict[str, float]], key: str) -> dict[str, float]:
    """One figure of the rows as n/p50/p95/p99 in milliseconds."""
    return percentiles([1000 * r[key] for r in rows if key in r])


def summarize(cold: list[dict[str, float]], warm: list[dict[str, float]]) -> dict[str, Any]:
    """Both modes' figures: the overhead (the JSON's `overhead_ms` is the warm one) and where it goes."""
    return {
        "overhead_ms": ms(warm, "overhead"),
        "cold_overhead_ms": ms(cold, "overhead"),
        "warm_ms": {key: ms(warm, key) for key in ("end_to_next_start", "end_to_recorded", *WARM_STAGES)},
        "cold_ms": {key: ms(cold, key) for key in ("end_to_next_start", "end_to_recorded")},
    }


def write_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The operator's API writes between two scrapes, by the labels of `agentrun_api_requests_total`
    (every verb but GET and WATCH). Pure."""
    prefix = "agentrun_api_requests_total{"
    return {
        key.removeprefix(prefix).rstrip("}"): value - before.get(key, 0.0)
        for key, value in after.items()
        if key.startswith(prefix)
        and 'verb="GET"' not in key
        and 'verb="WATCH"' not in key
        and value - before.get(key, 0.0)
    }


def per_mode_costs(
    marks: list[tuple[str, dict[str, float], float]],
    end: tuple[dict[str, float], float],
    warm: frozenset[str],
    iterations: int,
) -> dict[str, dict[str, Any]]:
    """The operator's CPU and API writes per iteration of each mode. The runs went one at a time:
    `marks` holds each run's name with the metrics and CPU seconds when it was created, `end` those
    after the last; a run's share is up to the next run's creation, so what it writes after the
    next run was made counts for that one (a warm loop's Job, collected once its stopped pod ended,
    gets its TTL during the next cold run). Pure."""
    totals: dict[str, dict[str, Any]] = {
        mode: {"iterations": 0, "cpu": 0.0, "writes": Counter(), "sums": Counter()} for mode in MODES
    }
    bounds = [*((m[1], m[2]) for m in marks[1:]), end]
    for (name, scraped, cpu), (next_scraped, next_cpu) in zip(marks, bounds, strict=True):
        share = totals["warm" if name in warm else "cold"]
        share["iterations"] += iterations
        share["cpu"] += next_cpu - cpu
        share["writes"].update(write_deltas(scraped, next_scraped))
        for key in SUMS:
            share["sums"][key] += next_scraped.get(key, 0.0) - scraped.get(key, 0.0)
    out: dict[str, dict[str, Any]] = {}
    for mode, total in totals.items():
        n = max(1, total["iterations"])
        writes: Counter[str] = total["writes"]
        sums: Counter[str] = total["sums"]
        reconciles = sums["agentrun_reconcile_duration_seconds_count"]
        out[mode] = {
            "cpu_ms_per_iteration": 1000 * total["cpu"] / n,
            "writes_per_iteration": sum(writes.values()) / n,
            "writes_per_iteration_by_resource": {k: v / n for k, v in sorted(writes.items())},
            "reconciles_per_iteration": reconciles / n,
            "reconcile_ms_mean": 1000 * sums["agentrun_reconcile_duration_seconds_sum"] / max(1, reconciles),
            "planner_ms_per_iteration": 1000 * sums["agentrun_plan_duration_seconds_sum"] / n,
        }
    return out


SUMS = (
    "agentrun_reconcile_duration_seconds_count",
    "agentrun_reconcile_duration_seconds_sum",
    "agentrun_plan_duration_seconds_sum",
)
"""The operator's own timings (unlabelled series) that `per_mode_costs` splits by mode."""


def print_figures(figures: dict[str, Any]) -> None:
    def row(title: str, d: dict[str, float]) -> str:
        return (
            f"{title:<44} n={d['n']:<4.0f} p50={d['p50']:8.1f}ms p95={d['p95']:8.1f}ms p99={d['p99']:8.1f}ms"
        )

    print("warm against cold, the same runs' own clock (iteration k recorded -> k+1's command started):")
    print(row("WARM overhead (recorded -> next command)", figures["overhead_ms"]))
    print(row("cold overhead (recorded -> next command)", figures["cold_overhead_ms"]))
    print(row("warm: command end -> next command start", figures["warm_ms"]["end_to_next_start"]))
    print(row("cold: command end -> next command start", figures["cold_ms"]["end_to_next_start"]))
    print(row("warm: command end -> recorded", figures["warm_ms"]["end_to_recorded"]))
    print(row("cold: command end -> recorded", figures["cold_ms"]["end_to_recorded"]))
    print("a warm iteration's gap, stage by stage:")
    for stage in WARM_STAGES:
        print(row(f"    {stage}", figures["warm_ms"][stage]))
    for mode, costs in figures.get("per_mode", {}).items():
        print(
            f"{mode}: operator CPU {costs['cpu_ms_per_iteration']:.2f} ms, "
            f"{costs['writes_per_iteration']:.2f} API writes, {costs['reconciles_per_iteration']:.2f} "
            f"reconciles (mean {costs['reconcile_ms_mean']:.1f} ms) and "
            f"{costs['planner_ms_per_iteration']:.2f} ms of planning per iteration"
        )
        for key, value in costs["writes_per_iteration_by_resource"].items():
            print(f"    {key}: {value:.2f}/iteration")


def workspace_dir(plane: Any, namespace: str, name: str) -> Path | None:
    """The host directory of the volume bound to `<name>-workspace` (None until bound)."""
    from agentrun_devcluster.dev import claim_directory

    return claim_directory(plane, namespace, f"{name}-workspace")


def read_log(plane: Any, namespace: str, name: str) -> str:
    """A run's `bench.log` from its volume on the host ("" when there is none)."""
    root = workspace_dir(plane, namespace, name)
    path = root / LOG_FILE if root is not None else None
    return path.read_text() if path is not None and os.path.exists(path) else ""
