"""Prometheus metrics (docs/design.md#observability), counted from the planner's facts."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from agentrun_operator.planner.context import TERMINAL_RUN_PHASES
from agentrun_operator.planner.facts import (
    ApprovalDecided,
    ApprovalRequested,
    Fact,
    IterationFinished,
    LoopStopped,
    NextIterationRequested,
    RunPhaseChanged,
    StepEnded,
    SwitchCaseTaken,
    UsageReported,
)
from agentrun_operator.planner.switch import REASON_SWITCH_NO_MATCH

ITERATIONS = Counter("agentrun_iterations_total", "Finished iteration attempts by result.", ["result"])
LOOP_STOPS = Counter("agentrun_loop_stops_total", "Loops stopped, by stop reason.", ["reason"])
TOKENS = Counter(
    "agentrun_tokens_total", "Tokens (input + output) reported in control files (usage), summed."
)
COST_USD = Counter("agentrun_cost_usd_total", "Cost in USD reported in control files (usage), summed.")
STEPS = Counter(
    "agentrun_steps_total",
    "Steps (at any depth) that reached a final phase, by construct, whether they loop, and phase.",
    ["construct", "loop", "phase"],
)
SWITCH_CASES = Counter(
    "agentrun_switch_cases_total",
    "Switches by the branch taken: cases[<i>], default, or none (SwitchNoMatch).",
    ["case"],
)
APPROVAL_WAITS = Counter("agentrun_approval_waits_total", "Approval gates that started waiting.")
APPROVAL_DECISIONS = Counter(
    "agentrun_approval_decisions_total",
    "Ends of approval waits (Approved, Rejected, TimedOut) and spec.approvals entries Refused.",
    ["decision"],
)
NESTING_DEPTH = Gauge(
    "agentrun_nesting_depth_reached",
    "The deepest nesting depth at which a step reached a final phase since the operator started "
    "(1: top-level steps only).",
)
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
    "From a succeeded iteration's pod finishing (kubelet time, whole seconds) to the next iteration's "
    "Job being created.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 30, 60),
)
ITERATION_SECONDS = Histogram(
    "agentrun_iteration_duration_seconds",
    "From an attempt's Job starting (its pod created) to its pod's main container ending, by result.",
    ["result"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400),
)
RECONCILE_ERRORS = Counter(
    "agentrun_reconcile_errors_total",
    "Reconciles that raised (API server down, slow or 5xx) and were retried with backoff.",
)
EVENTS_DROPPED = Counter(
    "agentrun_events_dropped_total",
    "Reconciles whose Events were dropped because the Event writers' backlog was full.",
)
QUEUE_DEPTH = Gauge(
    "agentrun_workqueue_depth", "Runs waiting in the work queue for a worker, by lane.", ["lane"]
)
QUEUE_SECONDS = Histogram(
    "agentrun_workqueue_queue_duration_seconds",
    "From a run entering the work queue to a worker starting its reconcile, by lane.",
    ["lane"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
QUEUE_WORKERS = Gauge("agentrun_workqueue_workers", "Workers of the work queue (`--workers`).")
QUEUE_BUSY = Gauge("agentrun_workqueue_busy_workers", "Workers reconciling a run right now.")
LONGEST_NO_PROGRESS = Gauge(
    "agentrun_run_no_progress_seconds_max",
    "Over the unfinished runs not waiting for an approval or a scheduled retry or iteration: the longest "
    "time since one's status last changed, at the last resync.",
)
LONGEST_APPROVAL_WAIT = Gauge(
    "agentrun_approval_wait_seconds_max",
    "The longest time an approval gate of a run has been waiting, at the last resync (0: none waits).",
)
STATUS_NEAR_BUDGET = Gauge(
    "agentrun_runs_status_near_budget",
    "Runs whose status is over 80 % of the status budget (StatusSizeWarning True), at the last resync.",
)
API_REQUESTS = Counter(
    "agentrun_api_requests_total", "Requests the operator made to the API server.", ["verb", "resource"]
)
_API_REQUEST_CHILDREN: dict[tuple[str, str], Any] = {}


def api_request(verb: str, resource: str) -> None:
    """Count one request (`labels()` takes a lock and builds a key: done once per pair, not per call)."""
    child = _API_REQUEST_CHILDREN.get((verb, resource))
    if child is None:
        child = _API_REQUEST_CHILDREN[(verb, resource)] = API_REQUESTS.labels(verb=verb, resource=resource)
    child.inc()


RUNS = Gauge(
    "agentrun_runs", "AgentRuns in the watched namespaces by phase, counted at every resync.", ["phase"]
)


def count_runs(phases: Iterable[str]) -> None:
    """Set `agentrun_runs` from the phases of every run in the cache (each resync): every phase a
    run can have gets a value, 0 included, so a phase whose last run left drops to 0."""
    counts = Tally(phases)
    for phase in ("Pending", "Running", *sorted(TERMINAL_RUN_PHASES)):
        RUNS.labels(phase=phase).set(counts.get(phase, 0))


SERVING = Gauge(
    "agentrun_serving",
    "1 while this replica serves (always without --peering), 0 while it stands by for a peer.",
)
RUN_PHASE_TRANSITIONS = Counter(
    "agentrun_run_phase_transitions_total",
    "AgentRuns that entered a phase, with the run's reason then (empty when none).",
    ["phase", "reason"],
)
STATUS_BYTES = Histogram(
    "agentrun_status_size_bytes",
    "Size of the status written (compact JSON).",
    buckets=(512, 1024, 2048, 4096, 8192, 16384, 32768, 65536),
)


def observe_fact(fact: Fact, jobs_created: Mapping[str, datetime] | None = None) -> None:
    """Count what the planner reports as having happened (its facts, not its Event texts).

    `jobs_created` holds when this reconcile created each Job (the operator's clock, right after the
    API server answered); a turnaround is observed only for a Job created now, never for one adopted.
    """
    if isinstance(fact, IterationFinished):
        ITERATIONS.labels(result=fact.result).inc()
        if fact.duration_seconds is not None:
            ITERATION_SECONDS.labels(result=fact.result).observe(fact.duration_seconds)
    elif isinstance(fact, LoopStopped):
        LOOP_STOPS.labels(reason=fact.reason).inc()
    elif isinstance(fact, UsageReported):
        TOKENS.inc(fact.tokens)
        COST_USD.inc(fact.cost_usd)
    elif isinstance(fact, StepEnded):
        _observe_step_ended(fact)
    elif isinstance(fact, SwitchCaseTaken):
        SWITCH_CASES.labels(case=fact.case).inc()
    elif isinstance(fact, ApprovalRequested):
        APPROVAL_WAITS.inc()
    elif isinstance(fact, ApprovalDecided):
        APPROVAL_DECISIONS.labels(decision=fact.decision).inc()
    elif isinstance(fact, RunPhaseChanged):
        RUN_PHASE_TRANSITIONS.labels(phase=fact.phase, reason=fact.reason or "").inc()
    elif isinstance(fact, NextIterationRequested):
        created = (jobs_created or {}).get(fact.job)
        if created is not None:
            # Clocks of the node and the operator may differ a little: never a negative sample.
            ITERATION_TURNAROUND.observe(max(0.0, (created - fact.previous_finished_at).total_seconds()))


_deepest = 0


def _observe_step_ended(fact: StepEnded) -> None:
    global _deepest
    STEPS.labels(
        construct=fact.kind, loop="true" if fact.iterations is not None else "false", phase=fact.phase
    ).inc()
    if fact.kind == "switch" and fact.reason == REASON_SWITCH_NO_MATCH:
        SWITCH_CASES.labels(case="none").inc()
    if fact.depth > _deepest:
        _deepest = fact.depth
        NESTING_DEPTH.set(fact.depth)
