"""What an iteration's pod reported besides its control file: the commit its Git checkout moved to
(`iterations[].commit`, `status.vcs.commit`) and its output artifacts (`status.artifacts`).
See docs/api.md#version-control and docs/api.md#output-artifacts.

The status is a working copy that shares lists with the persisted one (`context.working_copy`), so
everything here is replaced, never changed in place.
"""

from __future__ import annotations

from typing import Final

from agentrun_operator.api.status import ArtifactStatus, VcsStatus
from agentrun_operator.control.envelope import ControlEnvelope
from agentrun_operator.jobs.pod_compat import provider_contract, run_vcs
from agentrun_operator.planner.context import PlanContext
from agentrun_operator.planner.state import StepView

MAX_ARTIFACTS: Final = 50
"""status.artifacts keeps the newest entry per (step, name), at most this many (the original's cap)."""


def record_reported(ctx: PlanContext, step: StepView, envelope: ControlEnvelope) -> None:
    """Record the commit and the artifacts of a succeeded attempt."""
    if envelope.commit:
        record = step.record()
        if record is not None:
            record.commit = envelope.commit
        vcs = ctx.status.vcs
        ctx.status.vcs = (
            vcs.model_copy(update={"commit": envelope.commit}) if vcs else VcsStatus(commit=envelope.commit)
        )
    if envelope.artifacts:
        contract = provider_contract(ctx.refs)
        declared = {a.name: a for a in (contract.output_artifacts if contract else ())}
        iteration = step.iteration if step.loop is not None else None
        fresh: list[ArtifactStatus] = []
        for fact in envelope.artifacts:
            name = str(fact.get("name") or "")
            if not name:
                continue
            spec = declared.get(name)
            size = fact.get("size")
            digest = fact.get("digest")
            fresh.append(
                ArtifactStatus(
                    name=name,
                    path=str(fact.get("path") or "") or None,
                    key=spec.key if spec else None,
                    url=spec.url if spec else None,
                    size=size if isinstance(size, int) and size >= 0 else None,
                    digest=digest if isinstance(digest, str) else None,
                    step=step.label,
                    iteration=iteration,
                )
            )
        replaced = {(a.step, a.name) for a in fresh}
        kept = [a for a in ctx.status.artifacts or [] if (a.step, a.name) not in replaced]
        ctx.status.artifacts = (kept + fresh)[-MAX_ARTIFACTS:]


def note_vcs(ctx: PlanContext) -> None:
    """`status.vcs` once: the provider, repository, branches and mode of the first workload step."""
    if not ctx.refs.vcs_providers or (ctx.status.vcs is not None and ctx.status.vcs.provider is not None):
        return  # no VersionControlProvider named anywhere (the shell looks up every one named), or done
    step = next((s for s in ctx.steps if s.kind == "workload"), None)
    if step is None:
        return
    resolved = run_vcs(ctx.run, step, ctx.refs)
    if resolved.status is None or resolved.problems:
        return
    status = resolved.status
    commit = ctx.status.vcs.commit if ctx.status.vcs is not None else None
    ctx.status.vcs = VcsStatus(
        provider=status.get("provider"),
        repository=status.get("repository"),
        base_branch=status.get("baseBranch") or None,
        head_branch=status.get("headBranch") or None,
        mode=status.get("mode"),
        commit=commit,
    )
