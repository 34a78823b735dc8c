"""One reconcile of one AgentRun: observe, call the planner, apply its actions. Wiring, not rules.

Order of application is chosen for restart safety (the operator may die between any two lines):
Jobs are created (or adopted) before the status that mentions them is written, so a lost status
write only means the same plan is made again and the existing Job is adopted; Job TTLs are set and
Events posted only after the status recording the result is committed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import ValidationError

from agentrun_operator import naming
from agentrun_operator.api import (
    AgentRun,
    AgentRunStatus,
    parse_agentrun,
)
from agentrun_operator.config import OperatorConfig
from agentrun_operator.jobs import vcs
from agentrun_operator.jobs.builder import ANNOTATION_RUN_NAME, owner_reference
from agentrun_operator.jobs.claim_lease import idempotency_claim_lease
from agentrun_operator.planner.actions import (
    Action,
    ClaimIdempotencyKey,
    CreateJob,
    DeleteJob,
    DeleteRun,
    EmitEvent,
    Requeue,
    SetJobTTL,
    WarmCommand,
    Where,
)
from agentrun_operator.planner.admission import unparseable_status
from agentrun_operator.planner.context import TERMINAL_RUN_PHASES, Plan
from agentrun_operator.planner.observed import IdempotencyClaim, Observed, Refusal, permanent_refusal
from agentrun_operator.planner.plan import plan
from agentrun_operator.resolution import implementation_spec_refs
from agentrun_operator.shell import metrics
from agentrun_operator.shell.cache import RunCache
from agentrun_operator.shell.codec import canonical_json
from agentrun_operator.shell.events import EventRecorder
from agentrun_operator.shell.kube import Kube, KubeError
from agentrun_operator.shell.observe import claim_names, claim_phase
from agentrun_operator.shell.warm_channels import WarmChannels
from agentrun_operator.shell.writes import Writes

log = logging.getLogger("agentrun.reconciler")


MAX_PLANS_PER_RECONCILE: Final = 4
"""Plans in one reconcile: the first, and one more after each write the API server refuses for good
(docs/design.md#refused-writes). A re-plan knows every refusal so far and never asks for a refused
write again (a refused Job fails its step, a refused status ends the run on its persisted status),
so each re-plan either applies or is refused on a write not refused before; a refusal repeated
stops the reconcile at once. The cap bounds the longest chain: a Job refused, then the Job of an
`alwaysRun` step refused, then the status recording both refused, then the last plan."""


@dataclass
class ReconcileResult:
    requeue_after: float | None = None
    wrote_status: bool = False
    actions: list[Action] = field(default_factory=list)


def status_dict_of(status: AgentRunStatus | None) -> dict[str, Any]:
    """A status as the API server stores it (JSON-ready, camelCase, no nulls)."""
    if status is None:
        return {}
    return status.model_dump(by_alias=True, exclude_none=True, mode="json")


def status_dict(run: AgentRun) -> dict[str, Any]:
    return status_dict_of(run.status)


def _where(where: Where | None) -> dict[str, Any]:
    """The log fields of a decision: its step, path, iteration and attempt (null for the whole run)."""
    if where is None:
        return {"step": None, "path": None, "iteration": None, "attempt": None}
    path = where.path or where.step
    return {"step": where.step, "path": path, "iteration": where.iteration, "attempt": where.attempt}


class Reconciler:
    """Holds the client and the configuration; `reconcile(ns, name)` is safe to call at any time."""

    def __init__(
        self,
        kube: Kube,
        config: OperatorConfig,
        cache: RunCache,
        instance: str = "agentrun-operator",
        events: EventRecorder | None = None,
        warm: WarmChannels | None = None,
    ) -> None:
        self.kube = kube
        self.warm = warm  # the channels to warm pods (shell/warm_channels.py); None: not served
        self.config = config
        self.cache = cache
        self.instance = instance
        self.events = events or EventRecorder(kube, instance)
        self.writes = Writes(kube, cache)  # every write the cache must know of goes through it
        # The last parse of each unfinished run, by (uid, resourceVersion), with its persisted status
        # as canonical JSON: between two writes a run is reconciled several times unchanged, and
        # validating it was the costliest step of a reconcile. A finished run is parsed when it is
        # reconciled (rarely: its TTL): holding its model was memory for nothing at 10,000 runs.
        self._parsed: dict[tuple[str, str], tuple[tuple[str, str], AgentRun, bytes]] = {}

    def _parse(self, raw: dict[str, Any]) -> tuple[AgentRun, bytes]:
        """The run as the planner's model (the planner never mutates it: it is pure, and copies what
        it changes) and its status as persisted, as canonical JSON."""
        meta = raw["metadata"]
        key = (str(meta["namespace"]), str(meta["name"]))
        stamp = (str(meta.get("uid")), str(meta.get("resourceVersion")))
        hit = self._parsed.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1], hit[2]
        run = parse_agentrun(raw)
        persisted = canonical_json(status_dict(run))
        self._hold(key, stamp, run, persisted)
        return run, persisted

    def _hold(self, key: tuple[str, str], stamp: tuple[str, str], run: AgentRun, persisted: bytes) -> None:
        if run.status is not None and run.status.phase in TERMINAL_RUN_PHASES:
            self._parsed.pop(key, None)
        else:
            self._parsed[key] = (stamp, run, persisted)

    def _remember(
        self,
        before: dict[str, Any],
        run: AgentRun,
        answer: dict[str, Any],
        status: AgentRunStatus,
        persisted: bytes,
    ) -> None:
        """Our status write's answer as the next reconcile will parse it, without validating the whole
        run again: its spec is the one we planned with (a status write cannot change it, and a spec
        changed since our read would have failed the write with 409) and its status is the one we
        wrote, when the API server stored it unchanged (otherwise the next reconcile parses it)."""
        meta = answer.get("metadata") or {}
        same_spec = meta.get("generation") == before["metadata"].get("generation")
        if not same_spec or canonical_json(answer.get("status") or {}) != persisted:
            return
        stamp = (str(meta.get("uid")), str(meta.get("resourceVersion")))
        copy = run.model_copy(update={"metadata": meta, "status": status})
        self._hold((str(meta.get("namespace")), str(meta.get("name"))), stamp, copy, persisted)

    async def _observe(self, raw: dict[str, Any], run: AgentRun) -> Observed:
        """The run's Jobs and Pods from the watch cache (docs/operator.md#cache), already converted."""
        meta = raw["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        key = (ns, name)
        jobs = tuple(
            job for _, (job, owners) in self.cache.jobs.entries(key) if job is not None and uid in owners
        )
        job_names = {j.name for j in jobs}
        pods = tuple(
            pod for _, pod in self.cache.pods.entries(key) if pod is not None and pod.job_name in job_names
        )
        observed = Observed(jobs=jobs, pods=pods)
        terminal = run.status is not None and run.status.phase in TERMINAL_RUN_PHASES
        if self.warm is not None:
            # A finished run's warm pod is heard until it has ended (it was told to: planner/warm.py).
            live = any(p.warm_ip and not p.terminal and not p.deleting for p in pods)
            if not live:
                self.warm.forget(key)
            else:
                heard = await self.warm.observe(key, naming.warm_secret_name(name), pods)
                observed = dataclasses.replace(observed, warm=heard)
        if terminal:
            return observed
        return await self._observe_references(ns, uid, run, observed)

    async def _reference(self, ns: str, plural: str, name: str) -> dict[str, Any] | None:
        """The spec of a referenced Agent, AgentProvider or ImplementationSpec from the watch cache.

        A name the cache does not hold is read from the API server (None: it does not exist), so a
        lagging watch can never make a run wait for, or fail on, an object that exists; and when the
        operator may not watch the kind (older RBAC) every read is a GET, as before the cache."""
        found, spec = self.cache.reference(plural, ns, name)
        if found:
            return spec
        obj = await self.kube.get_custom(ns, plural, name)
        return dict(obj.get("spec") or {}) if obj is not None else None

    async def _holder(self, ns: str, name: str) -> dict[str, Any] | None:
        """The AgentRun holding an idempotency claim: from the cache, else (not seen yet, or gone)
        from the API server, so a claim is never taken for free because of a lagging watch."""
        return self.cache.run(ns, name) or await self.kube.get_custom(ns, "agentruns", name)

    async def _observe_references(self, ns: str, uid: str, run: AgentRun, observed: Observed) -> Observed:
        spec = run.spec
        agents: dict[str, dict[str, Any] | None] = {}
        providers: dict[str, dict[str, Any] | None] = {}
        impls: dict[str, dict[str, Any] | None] = {}
        if spec.agent_ref is not None:
            agent = await self._reference(ns, "agents", spec.agent_ref.name)
            agents[spec.agent_ref.name] = agent
            provider_ref = (agent or {}).get("providerRef") or {}
            if provider_ref.get("name"):
                provider = await self._reference(ns, "agentproviders", provider_ref["name"])
                providers[provider_ref["name"]] = provider
        impl_names = {name for _, name in implementation_spec_refs(run)}  # nested steps' too
        for impl_name in sorted(impl_names):
            impls[impl_name] = await self._reference(ns, "implementationspecs", impl_name)
        # The idempotency claim and the PersistentVolumeClaims matter only before the first Job (the
        # planner reads them in admission alone): a started run reads neither. Before it, they are
        # read with a GET, not from a watch (docs/operator.md#cache): a run does that once or twice,
        # and the claim's create-or-conflict must be confirmed by the API server, never by a cache
        # that may not have seen the create yet.
        starting = run.status is None or run.status.started_at is None
        claim: IdempotencyClaim | None = None
        claim_checked = False
        if spec.idempotency_key and starting:
            agent_name = spec.agent_ref.name if spec.agent_ref else ""
            lease_name = naming.idempotency_claim_name(ns, agent_name, spec.idempotency_key)
            lease = await self.kube.get_lease(ns, lease_name)
            claim_checked = True
            if lease is not None:
                holder_uid = (lease.get("spec") or {}).get("holderIdentity", "")
                holder_name = ((lease.get("metadata") or {}).get("annotations") or {}).get(
                    ANNOTATION_RUN_NAME, ""
                )
                holder_phase: str | None = None
                holder_gone = False
                if holder_uid != uid:
                    holder = await self._holder(ns, holder_name) if holder_name else None
                    holder_gone = holder is None or holder["metadata"].get("uid") != holder_uid
                    holder_phase = ((holder or {}).get("status") or {}).get("phase")
                claim = IdempotencyClaim(
                    name=lease_name,
                    holder_uid=holder_uid,
                    holder_name=holder_name,
                    holder_phase=holder_phase,
                    holder_gone=holder_gone,
                )
        pvc_names: frozenset[str] | None = None
        pvc_unbound: dict[str, str] = {}
        if starting:
            # Missing: InvalidSpec; unbound: wait. Afterwards every iteration mounts the same claims.
            names = claim_names(run)
            try:
                claims = await asyncio.gather(*(self.kube.get_pvc(ns, n) for n in names))
            except KubeError as exc:
                if exc.status != 403:
                    raise
                # An installation whose RBAC predates the check: run without it, as before.
                log.warning("cannot read PersistentVolumeClaims (grant get on them): %s", exc)
            else:
                found = {n: claim_phase(c) for n, c in zip(names, claims, strict=True) if c is not None}
                pvc_names = frozenset(found)
                pvc_unbound = {n: str(phase) for n, phase in found.items() if phase != "Bound"}
        object_keys = await self._object_keys(ns, agents) if starting else {}
        vcs_providers, secret_keys = await self._observe_vcs(ns, run, agents, impls, starting)
        return Observed(
            jobs=observed.jobs,
            pods=observed.pods,
            claim=claim,
            claim_checked=claim_checked,
            agents=agents,
            providers=providers,
            implementation_specs=impls,
            pvc_names=pvc_names,
            pvc_unbound=pvc_unbound,
            vcs_providers=vcs_providers,
            secret_keys=secret_keys,
            object_keys=object_keys,
            warm=observed.warm,
        )

    async def _observe_vcs(
        self,
        ns: str,
        run: AgentRun,
        agents: dict[str, dict[str, Any] | None],
        impls: dict[str, dict[str, Any] | None],
        starting: bool,
    ) -> tuple[dict[str, dict[str, Any] | None], dict[str, frozenset[str] | None] | None]:
        """The VersionControlProviders the run may use (read with a GET: docs/api.md#version-control),
        and, before the first Job, the keys of their credential Secrets (never the values)."""
        spec = run.spec.to_dict()
        inline = [(spec.get("implementation") or {}).get("inline") or {}]
        agent = next(iter(agents.values()), None)
        names = vcs.referenced_names(spec, [*inline, *(i for i in impls.values() if i)], agent)
        providers: dict[str, dict[str, Any] | None] = {}
        for vcs_name in names:
            obj = await self.kube.get_custom(ns, "versioncontrolproviders", vcs_name)
            providers[vcs_name] = dict(obj.get("spec") or {}) if obj is not None else None
        secrets = sorted({s for p in providers.values() if p for s in [vcs.credential_secret(p)] if s})
        if not starting or not secrets:
            return providers, None
        try:
            keys = await asyncio.gather(*(self.kube.get_data_keys(ns, "Secret", s) for s in secrets))
        except KubeError as exc:
            if exc.status != 403:
                raise
            log.warning("cannot read Secrets (grant get on them): %s", exc)
            return providers, None
        return providers, dict(zip(secrets, keys, strict=True))

    async def _object_keys(
        self, ns: str, agents: dict[str, dict[str, Any] | None]
    ) -> dict[str, frozenset[str] | None]:
        """The keys of the ConfigMap or Secret an Agent's systemPromptRef names, before the first Job
        (a missing object or key is InvalidSpec, docs/api.md#system-prompt); unchecked without RBAC."""
        found: dict[str, frozenset[str] | None] = {}
        for agent in agents.values():
            ref = ((agent or {}).get("defaults") or {}).get("systemPromptRef") or {}
            kind, name = ref.get("kind"), ref.get("name")
            if kind not in ("Secret", "ConfigMap") or not name or f"{kind}/{name}" in found:
                continue
            try:
                found[f"{kind}/{name}"] = await self.kube.get_data_keys(ns, kind, name)
            except KubeError as exc:
                if exc.status != 403:
                    raise
                log.warning("cannot read %s %s (grant get on them): %s", kind, name, exc)
        return found

    async def reconcile(self, namespace: str, name: str) -> ReconcileResult:
        """One reconcile, timed whichever way it ends (agentrun_reconcile_duration_seconds)."""
        started = time.perf_counter()
        try:
            return await self._reconcile(namespace, name)
        finally:
            metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)

    async def _reconcile(self, namespace: str, name: str) -> ReconcileResult:
        raw = self.cache.run(namespace, name)
        if raw is None:
            self._parsed.pop((namespace, name), None)
            return ReconcileResult()
        try:
            run, _ = self._parse(raw)
        except ValidationError as err:
            # The CRD admitted something our models refuse: fail the run clearly instead of crashing.
            await self._write_unparseable(raw, err)
            return ReconcileResult()
        observed = await self._observe(raw, run)
        corr = {"correlation_id": raw["metadata"].get("uid"), "run": f"{namespace}/{name}"}
        for _ in range(MAX_PLANS_PER_RECONCILE):
            planned_at = time.perf_counter()
            decision = plan(run, observed, datetime.now(UTC), self.config)
            metrics.PLAN_SECONDS.observe(time.perf_counter() - planned_at)
            outcome = await self._apply(raw, run, decision, corr)
            if isinstance(outcome, ReconcileResult):
                return outcome
            # Sending it again would get the same answer: the planner decides what follows.
            again = outcome in observed.refusals
            log.warning(
                "write refused by the API server",
                extra={
                    **corr,
                    "refused": f"{outcome.what} {outcome.name}",
                    "http_status": outcome.code,
                    "api_message": outcome.message,
                    "decision": "give-up" if again else "re-plan",
                },
            )
            if again:
                break
            observed = dataclasses.replace(observed, refusals=(*observed.refusals, outcome))
        # Not even the status that records the refusals was accepted (or a refused write was asked
        # for again): stop here; the next watch event or resync tries again (never a hot loop).
        log.error("writes refused after re-planning; giving up this reconcile", extra=corr)
        return ReconcileResult()

    async def _apply(
        self, raw: dict[str, Any], run: AgentRun, decision: Plan, corr: dict[str, Any]
    ) -> ReconcileResult | Refusal:
        """Apply one plan in restart-safe order. A write refused for good (`permanent_refusal`) ends
        it there, before anything that must follow that write: the refusal, for the re-plan."""
        meta = raw["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        result = ReconcileResult(actions=list(decision.actions))
        after_status: list[Action] = []
        job_uids: dict[str, str] = {}
        jobs_created: dict[str, datetime] = {}
        for action in decision.actions:
            if isinstance(action, CreateJob):
                try:
                    for companion in action.companions:
                        await self.kube.create_config_map(companion)
                    if action.warm_secret is not None and self.warm is not None:
                        await self.warm.ensure_key(namespace, action.warm_secret, owner_reference(run))
                    created, job, ours = await self.writes.create_job(
                        namespace, action.name, action.manifest, meta["uid"]
                    )
                except KubeError as exc:
                    if permanent_refusal(exc.status):
                        return Refusal("Job", action.name, exc.status, exc.reason)
                    raise
                if not ours:
                    # Left by an earlier AgentRun of the same name (its owner is gone): never adopt it.
                    await self.kube.delete_job(namespace, action.name)
                    log.info(
                        "stale job of an earlier run deleted",
                        extra={
                            **corr,
                            **_where(action.where),
                            "job": action.name,
                            "decision": "delete-foreign-job",
                        },
                    )
                    result.requeue_after = 1.0
                    continue
                job_uids[action.name] = str(job.get("metadata", {}).get("uid", ""))
                if created:
                    jobs_created[action.name] = datetime.now(UTC)
                log.info(
                    "job created" if created else "job adopted",
                    extra={
                        **corr,
                        **_where(action.where),
                        "job": action.name,
                        "decision": "create-job" if created else "adopt-job",
                    },
                )
            elif isinstance(action, DeleteJob):
                # The pods first, with the short grace: once the Job is gone the garbage collector
                # deletes them with their own (docs/design.md#grace-period).
                if (
                    action.grace_seconds is not None
                    and action.uid
                    and not await self.kube.delete_job_pods(namespace, action.uid, action.grace_seconds)
                ):
                    log.warning(
                        "pods of the job not deleted (no deletecollection grant on pods): they stop "
                        "with their own grace period",
                        extra={**corr, **_where(action.where), "job": action.name},
                    )
                await self.kube.delete_job(namespace, action.name, action.foreground)
                log.info(
                    f"job deleted: {action.reason}",
                    extra={**corr, **_where(action.where), "job": action.name, "decision": "delete-job"},
                )
            elif isinstance(action, ClaimIdempotencyKey):
                await self._claim(raw, action)
                log.info(
                    "idempotency claim requested",
                    extra={**corr, **_where(None), "claim": action.name, "decision": "claim-idempotency-key"},
                )
                result.requeue_after = 0.0
            elif isinstance(action, Requeue):
                result.requeue_after = (
                    action.after_seconds
                    if result.requeue_after is None
                    else min(result.requeue_after, action.after_seconds)
                )
            else:
                after_status.append(action)

        # The uids of the Jobs just created go into the planner's rule for the status to write
        # (planner/job_uids.py). Most reconciles change nothing: comparing the models is far cheaper
        # than serializing the whole status (its history grows with every iteration) to compare.
        status_model = decision.status_after(job_uids)
        unchanged = status_model == run.status
        new_status = {} if unchanged else status_dict_of(status_model)
        new_json = b"" if unchanged else canonical_json(new_status)
        if not unchanged and new_json != self._parse(raw)[1]:  # the persisted status, parsed once
            body = dict(raw)
            body["status"] = new_status
            try:
                answer = await self.writes.replace_run_status(body)
                self._remember(raw, run, answer, status_model, new_json)
                result.wrote_status = True
                metrics.STATUS_BYTES.observe(len(new_json))
            except KubeError as exc:
                if exc.status == 409:  # the cached run is stale: fetch it, re-plan from the fresh one
                    await self.writes.refresh_run(namespace, name)
                    result.requeue_after = 0.0
                    return result
                if exc.status == 404:  # the run is gone
                    return result
                if permanent_refusal(exc.status):
                    return Refusal("Status", name, exc.status, exc.reason)
                raise

        events: list[EmitEvent] = []
        for action in after_status:
            if isinstance(action, SetJobTTL):
                await self.writes.set_job_ttl(namespace, action.name, action.seconds)
                log.info(
                    f"job ttl set to {action.seconds}s (its result is recorded)",
                    extra={**corr, **_where(action.where), "job": action.name, "decision": "set-job-ttl"},
                )
            elif isinstance(action, EmitEvent):
                events.append(action)
                log.info(action.message, extra={**corr, **_where(action.where), "decision": action.reason})
            elif isinstance(action, WarmCommand):
                if self.warm is not None:
                    await self.warm.send((namespace, name), action)
                log.info(
                    f"warm pod told to {action.verb} {action.id}",
                    extra={
                        **corr,
                        **_where(action.where),
                        "pod": action.pod,
                        "decision": f"warm-{action.verb}",
                    },
                )
            elif isinstance(action, DeleteRun):
                await self.kube.delete_run(namespace, name, action.uid)
                log.info(
                    "run deleted (spec.ttlSecondsAfterFinished passed)",
                    extra={**corr, **_where(None), "decision": "delete-run"},
                )
        finished = decision.status.phase in TERMINAL_RUN_PHASES
        await self.events.submit(raw, events, finished=finished)
        for fact in decision.facts:
            metrics.observe_fact(fact, jobs_created)
        return result

    async def _claim(self, raw: dict[str, Any], action: ClaimIdempotencyKey) -> None:
        meta = raw["metadata"]
        lease = idempotency_claim_lease(
            action.name, meta["namespace"], meta["name"], meta["uid"], action.key, action.agent_ref
        )
        await self.kube.create_lease(meta["namespace"], lease)

    async def _write_unparseable(self, raw: dict[str, Any], err: ValidationError) -> None:
        prior = (raw.get("status") or {}).get("phase")
        status = unparseable_status(prior, raw["metadata"].get("generation"), err, datetime.now(UTC))
        if status is None:
            return
        body = dict(raw)
        body["status"] = status.model_dump(by_alias=True, exclude_none=True, mode="json")
        try:
            await self.writes.replace_run_status(body)
        except KubeError as exc:
            log.warning("could not record invalid spec: %s", exc)
