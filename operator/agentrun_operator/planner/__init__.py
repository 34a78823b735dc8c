"""The functional core: pure planning of AgentRun reconciliation. No I/O lives here.

`plan.plan` is the entry point. The rules live by concern: `admission` (before the first Job),
`run` (the run's phase, stop requests, conclusion, TTL), `state` (a step's state machine and its
transition table), `loops` (`when`, loop set-up, the next-iteration decision), `attempts` (Jobs
started, observed, succeeded, failed, retried, timed out), `gating` (one Job at a time, strays, Job
TTLs), `compaction` (the iteration history), `validate` (spec problems); `context` holds what one
`plan` call shares, `actions` and `observed` the planner's inputs and outputs.
"""
