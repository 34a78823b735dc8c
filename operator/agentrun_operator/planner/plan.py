"""The planner: a pure function from (AgentRun, observed Jobs/Pods, clock, config) to (status, actions).

Every execution rule (docs/concepts.md) lives in this package: validation before the first Job,
fixed / conditional / forEach loops, `when`, retries with backoff, per-attempt timeouts,
cancellation, the workflow timeout, idempotency claims, history compaction and restart safety.

How restart safety works (why the code is shaped like this):

- All progress is in `run.status`, which must be the status *as persisted* (the shell never feeds an
  unsaved status back). Observations only ever move a step forward from there.
- Job names are deterministic per (step, iteration, attempt). Before creating one the planner looks
  for it: an existing Job is adopted, so a plan replayed after a lost status write never duplicates
  an attempt, and a completed iteration is never run again (its Job keeps its result until the
  status that records it is persisted: only then does the planner give the Job a TTL).
- One Job at a time: a new attempt/iteration/step Job is created only once every other Job of the
  run is finished (or being deleted) and every other pod is terminal or gone, so two pods never
  share a ReadWriteOnce volume. Any live Job that is not the expected one is deleted.
- `plan` is idempotent: re-planning its own output against the same observation yields the same
  status, no events, and only convergent actions (Requeue, a DeleteJob of a Job still alive).
"""

from __future__ import annotations

from datetime import UTC, datetime

from agentrun_operator.api import AgentRun, AgentRunStatus
from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner import claims, conditions
from agentrun_operator.planner.admission import admit
from agentrun_operator.planner.approval import judge_rest
from agentrun_operator.planner.compaction import compact, compact_history, fit_to_budget
from agentrun_operator.planner.context import TERMINAL_RUN_PHASES, Plan, PlanContext, working_copy
from agentrun_operator.planner.gating import active_job_name, delete_strays, result_recorded, set_job_ttls
from agentrun_operator.planner.observed import Observed
from agentrun_operator.planner.reported import note_vcs
from agentrun_operator.planner.run import (
    align_step_statuses,
    conclude,
    fail_refused_status,
    plan_finished_run,
    start_run,
    stop_request,
)
from agentrun_operator.planner.state import all_views, step_views
from agentrun_operator.planner.validate import resolve_references
from agentrun_operator.planner.walk import plan_top
from agentrun_operator.planner.warm import acknowledge_recorded, expected_warm_job, stop_finished_warm_pods
from agentrun_operator.resolution import effective_steps

__all__ = ["Plan", "compact_history", "plan", "result_recorded"]


def plan(run: AgentRun, observed: Observed, now: datetime, config: OperatorConfig) -> Plan:
    """Decide the next status of `run` and the actions that bring the cluster there.

    `run.status` must be the persisted status; `now` must be timezone-aware. Pure: no I/O, and the
    same inputs always give the same plan.
    """
    prior = run.status
    ctx = PlanContext(
        run=run,
        observed=observed,
        now=now if now.tzinfo is not None else now.replace(tzinfo=UTC),
        config=config,
        prior=prior,
        status=working_copy(prior) if prior is not None else AgentRunStatus(),
        steps=effective_steps(run),
    )
    _plan_run(ctx)
    bound: int | None = conditions.size_upper_bound(ctx.status)  # one walk serves both below
    if fit_to_budget(ctx.status, ctx.config.status_budget_bytes, bound):
        bound = None  # compacted: measured again
    conditions.conclude(ctx, bound)
    claims.conclude(ctx)
    return ctx.result()


def _plan_run(ctx: PlanContext) -> None:
    status = ctx.status
    generation = ctx.run.metadata.get("generation")
    if isinstance(generation, int):
        status.observed_generation = generation
    if status.phase in TERMINAL_RUN_PHASES:
        plan_finished_run(ctx, stop_finished_warm_pods(ctx, None))
        return
    refused = ctx.observed.refusal("Status", ctx.name)
    if refused is not None:
        fail_refused_status(ctx, refused)
        return
    if status.started_at is None:
        if not admit(ctx):
            delete_strays(ctx, expected=None)
            return
        start_run(ctx)
    _execute(ctx)


def _execute(ctx: PlanContext) -> None:
    align_step_statuses(ctx)
    resolution = resolve_references(ctx.run, ctx.observed)
    ctx.refs, ctx.ref_problems = resolution.refs, resolution.problems
    note_vcs(ctx)
    ctx.stopping = stop_request(ctx)
    plan_top(ctx, step_views(ctx))
    judge_rest(ctx)
    views = list(all_views(ctx))  # the tree no longer changes shape in this plan: walk it once
    for view in views:
        if view.st.loop is not None:
            compact(view.st.loop, ctx.config.loop_status_history_limit)
    conclude(ctx, views)
    expected = active_job_name(ctx, views) or expected_warm_job(ctx, views)
    delete_strays(ctx, expected, stop_finished_warm_pods(ctx, expected))
    acknowledge_recorded(ctx, views)
    set_job_ttls(ctx)
