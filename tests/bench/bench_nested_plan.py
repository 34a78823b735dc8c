"""Planner time per plan: a 5-deep nested workflow versus a single loop step (prints p50/p95, asserts
nothing), and the status bytes of a 1000-iteration body of 3 children.

Run: .venv/bin/python tests/bench/bench_nested_plan.py

Both workflows are planned at the same point: 20 iterations of the innermost loop done, its next Job
running (steady re-plan) and just succeeded (the transition that records it and starts the next Job).
The nested one is a loop body (depth 1) holding a group (2) holding a loop body (3) holding a switch
(4) whose case runs the looped workload step (5); every level has its status, and the plan walks all
of them. Parsing the AgentRun is the shell's job and is excluded.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner.conditions import exact_size
from agentrun_operator.planner.plan import plan
from tests.unit.planner.world import PlannerWorld, manifest

CONFIG = OperatorConfig(loops_enabled=True, loop_max_iterations=1000, loop_status_history_limit=50)
CONTINUE = "iteration.last.control.continue == true"
INNER = {
    "name": "refine",
    "loop": {
        "maxIterations": 500,
        "condition": {"type": "cel", "expression": CONTINUE, "source": {"onMissing": "stop"}},
    },
}


def single() -> dict[str, Any]:
    return manifest([{"name": "prep"}, INNER])


def nested() -> dict[str, Any]:
    switch = {
        "name": "route",
        "switch": {
            "expression": "steps.plan.control.kind",
            "cases": [{"value": "code", "steps": [INNER]}],
            "default": {"steps": [{"name": "ask"}]},
        },
    }
    level3 = {"name": "modules", "loop": {"maxIterations": 10}, "steps": [{"name": "plan"}, switch]}
    level2 = {"name": "stage", "steps": [level3]}
    level1 = {"name": "outer", "loop": {"maxIterations": 10}, "steps": [level2]}
    return manifest([{"name": "prep"}, level1])


def _world_at(spec: dict[str, Any], iterations_done: int) -> PlannerWorld:
    world = PlannerWorld(spec, config=CONFIG)
    control = {"continue": True, "kind": "code", "outputs": {"summary": "did a thing"}}
    world.plan()
    while True:
        job = world.active()
        if "iter-" in job and job.endswith("attempt-1") and _inner_iteration(world, job) > iterations_done:
            return world
        world.succeed(job, control=control)
        world.plan()
        world.ttl_sweep()
        world.plan()


def _inner_iteration(world: PlannerWorld, job: str) -> int:
    labels = world.manifests[job]["metadata"]["labels"]
    return (
        int(labels["agents.proompteng.ai/iteration"])
        if labels["agents.proompteng.ai/step"] == "refine"
        else 0
    )


def _measure(world: PlannerWorld, rounds: int = 1000) -> tuple[float, float]:
    call = functools.partial(plan, world.agentrun(), world.observed(), world.now, CONFIG)
    for _ in range(30):
        call()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1e6)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.95)]


def _body_status_bytes(iterations: int) -> int:
    spec = manifest(
        [
            {
                "name": "develop",
                "loop": {"maxIterations": iterations},
                "steps": [{"name": "implement"}, {"name": "test"}, {"name": "review"}],
            }
        ],
        name="a-run-name-of-forty-characters-abcdefghi",
    )
    world = PlannerWorld(spec, config=CONFIG)

    def outcome(w: PlannerWorld, job: str) -> None:
        w.succeed(job, control={"continue": True, "summary": "s" * 100})
        w.ttl_sweep()

    world.drive(outcome, max_plans=20 * iterations)
    assert world.status is not None and world.phase == "Succeeded"
    return exact_size(world.status)


def main() -> None:
    results: dict[str, tuple[float, float]] = {}
    for label, spec in (("single loop step", single()), ("5-deep nested", nested())):
        world = _world_at(spec, 20)
        results[f"{label}: steady re-plan"] = _measure(world)
        world.succeed(world.active(), control={"continue": True, "kind": "code"})
        results[f"{label}: iteration done -> next Job"] = _measure(world)
    for label, (p50, p95) in results.items():
        print(f"{label:<48} p50 {p50:7.0f} µs   p95 {p95:7.0f} µs")
    for case in ("steady re-plan", "iteration done -> next Job"):
        flat = results[f"single loop step: {case}"][0]
        deep = results[f"5-deep nested: {case}"][0]
        ratio = deep / flat
        print(f"{case}: nested/single p50 = {ratio:.2f} ({(ratio - 1) / 4 * 100:+.1f} % per extra level)")
    print(f"status bytes after 1000 iterations of a 3-child body (history 50): {_body_status_bytes(1000)}")


if __name__ == "__main__":
    main()
