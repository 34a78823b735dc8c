"""Micro-benchmark of `plan()` (not a test: prints p50/p95, asserts nothing).

Run: .venv/bin/python tests/unit/planner/bench_plan.py

Cases: a steady-state re-plan of a running iteration (the common reconcile), and the transition
"iteration succeeded → evaluate CEL → create the next Job", each with a short history and with a full
history of 50 records. Parsing the AgentRun is the shell's job and is excluded.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner.plan import plan
from tests.unit.planner.world import PlannerWorld, loop_step, manifest

CONFIG = OperatorConfig(loops_enabled=True, loop_max_iterations=1000, loop_status_history_limit=50)
CONTINUE = "iteration.last.control.continue == true"


OUTPUT_AND_BUDGET = {
    "output": {"name": "notes", "expression": "iteration.index"},
    "budget": {"maxTokens": 10_000_000, "maxCostUSD": 1000.0},
}
USAGE: dict[str, object] = {"inputTokens": 1200, "outputTokens": 300, "costUSD": 0.02}


def _world_at(
    iterations_done: int, expression: str | None, loop: dict[str, object] | None = None
) -> PlannerWorld:
    work = loop_step("impl", 500, expression=expression, retries=2, loop=loop or {})
    world = PlannerWorld(manifest([{"name": "prep"}, work]), config=CONFIG)
    world.plan()
    world.succeed(control={"ready": True})
    world.plan()
    for _ in range(iterations_done):
        world.succeed(
            control={"continue": True, "outputs": {"summary": "did a thing", "left": 3}, "usage": USAGE}
        )
        world.plan()
        world.ttl_sweep()
    world.plan()
    return world


def _measure(label: str, world: PlannerWorld, rounds: int = 2000) -> None:
    call = functools.partial(plan, world.agentrun(), world.observed(), world.now, CONFIG)
    for _ in range(50):
        call()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1e6)
    samples.sort()
    p50 = statistics.median(samples)
    p95 = samples[int(len(samples) * 0.95)]
    print(f"{label:<52} p50 {p50:7.0f} µs   p95 {p95:7.0f} µs")


def main() -> None:
    cases = (
        ("conditional", CONTINUE, None),
        ("fixed", None, None),
        ("cond+output+budget", CONTINUE, OUTPUT_AND_BUDGET),
    )
    for kind, expression, loop in cases:
        for done in (3, 60):
            world = _world_at(done, expression, loop)
            _measure(f"{kind}: steady re-plan, {done} iterations done", world)
            world.succeed(control={"continue": True, "usage": USAGE})
            _measure(f"{kind}: iteration done -> next Job, {done} done", world)


if __name__ == "__main__":
    main()
