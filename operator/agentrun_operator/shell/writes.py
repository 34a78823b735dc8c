"""The reconciler's writes, each made, written through into the watch cache, and its echo marked,
in one place (docs/design.md#data-direction).

The reconciler reads the cache and writes through this; it never touches the cache's echo
machinery itself. What each write does for the cache (shell/cache.py):

- the answer is stored at once (write-through), so the next reconcile sees it whatever the watch's
  latency, and the watch event echoing it is recognised by its resourceVersion and skipped;
- while the write is in flight its echo -- which may come before the answer -- re-plans nothing
  (`Store.writing`): the reconcile writing it planned with it;
- while a plan that gives ended Jobs their TTL is applied, the Job controller marking those Jobs
  complete re-plans nothing (`Store.settling`): the plan already used their pods' result.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from agentrun_operator.planner.actions import Action, SetJobTTL
from agentrun_operator.shell.cache import RunCache
from agentrun_operator.shell.kube import Kube

Obj = dict[str, Any]


def _owned_by(obj: Obj, uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid for r in refs)


class Writes:
    """Writes of the reconciler that the watch cache must know of."""

    def __init__(self, kube: Kube, cache: RunCache) -> None:
        self.kube = kube
        self.cache = cache

    @contextlib.contextmanager
    def applying(self, namespace: str, actions: Iterable[Action]) -> Iterator[None]:
        """While one plan's actions are applied: the Jobs it gives a TTL are settling."""
        settle = [a.name for a in actions if isinstance(a, SetJobTTL)]
        if not settle:
            yield
            return
        with self.cache.jobs.settling(namespace, settle):
            yield

    async def create_job(
        self, namespace: str, name: str, manifest: Obj, owner_uid: str
    ) -> tuple[bool, Obj, bool]:
        """(created, job, ours): the Job `name` created from `manifest`, or the existing one of its
        name; `ours` when it was created or is owned by `owner_uid` (then it is adoptable and written
        through; a Job left by an earlier run of the same name is not)."""
        with self.cache.jobs.writing(namespace, name):
            created, job = await self.kube.create_job(manifest)
        ours = created or _owned_by(job, owner_uid)
        if ours:
            self.cache.jobs.upsert(job)  # write-through: the watch may deliver it later
        return created, job, ours

    async def replace_run_status(self, body: Obj) -> Obj:
        """PUT the run's status (its resourceVersion makes it optimistic); the answer, written through."""
        meta = body["metadata"]
        with self.cache.runs.writing(meta["namespace"], meta["name"], body):
            answer = await self.kube.replace_run_status(body)
        self.cache.runs.upsert(answer)
        return answer

    async def refresh_run(self, namespace: str, name: str) -> None:
        """The cached run is stale (a write of it got 409): read it fresh into the cache."""
        fresh = await self.kube.get_custom(namespace, "agentruns", name)
        if fresh is not None:
            self.cache.runs.upsert(fresh)

    async def set_job_ttl(self, namespace: str, name: str, seconds: int) -> None:
        patched = await self.kube.set_job_ttl(namespace, name, seconds)
        if patched is not None:
            self.cache.jobs.upsert(patched)
