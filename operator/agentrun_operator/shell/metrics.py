"""Prometheus metrics (docs/design.md#observability), counted from the planner's facts."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from agentrun_operator.planner.facts import Fact, IterationFinished, LoopStopped, UsageReported

ITERATIONS = Counter("agentrun_iterations_total", "Finished iteration attempts by result.", ["result"])
LOOP_STOPS = Counter("agentrun_loop_stops_total", "Loops stopped, by stop reason.", ["reason"])
TOKENS = Counter("agentrun_tokens", "Tokens reported in control files (usage), summed.")
COST_USD = Counter("agentrun_cost_usd", "Cost in USD reported in control files (usage), summed.")
RECONCILE_SECONDS = Histogram(
    "agentrun_reconcile_duration_seconds",
    "Wall time of one reconcile (observe, plan, apply).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
PLAN_SECONDS = Histogram(
    "agentrun_plan_duration_seconds",
    "CPU-bound time of the pure planner per reconcile.",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025),
)
ITERATION_TURNAROUND = Histogram(
    "agentrun_iteration_turnaround_seconds",
    "From an iteration's pod finishing to the next iteration's Job being created.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
API_REQUESTS = Counter(
    "agentrun_api_requests_total", "Requests the operator made to the API server.", ["verb", "resource"]
)
RUNS = Gauge("agentrun_runs", "AgentRuns seen by phase.", ["phase"])
STATUS_BYTES = Histogram(
    "agentrun_status_size_bytes",
    "Size of the status written (compact JSON).",
    buckets=(512, 1024, 2048, 4096, 8192, 16384, 32768, 65536),
)


def observe_fact(fact: Fact) -> None:
    """Count what the planner reports as having happened (its facts, not its Event texts)."""
    if isinstance(fact, IterationFinished):
        ITERATIONS.labels(result=fact.result).inc()
    elif isinstance(fact, LoopStopped):
        LOOP_STOPS.labels(reason=fact.reason).inc()
    elif isinstance(fact, UsageReported):
        TOKENS.inc(fact.tokens)
        COST_USD.inc(fact.cost_usd)
