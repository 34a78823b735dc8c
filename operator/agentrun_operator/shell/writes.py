"""The reconciler's writes, each made and its answer written through into the watch cache, in one
place (docs/design.md#data-direction).

The reconciler reads the cache and writes through this. Each answer is stored at once
(`Store.answer`), so the next reconcile sees it whatever the watch's latency; the watch event
echoing it carries the same resourceVersion and changes nothing. A window is open around each
request (`Store.window`): a version of the object the watch delivers meanwhile is as new as the
answer or newer, so the answer does not overwrite it (docs/design.md#watch-path).
"""

from __future__ import annotations

from typing import Any

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

    async def create_job(
        self, namespace: str, name: str, manifest: Obj, owner_uid: str
    ) -> tuple[bool, Obj, bool]:
        """(created, job, ours): the Job `name` created from `manifest`, or the existing one of its
        name; `ours` when it was created or is owned by `owner_uid` (then it is adoptable and written
        through; a Job left by an earlier run of the same name is not)."""
        with self.cache.jobs.window(namespace, name) as window:
            created, job = await self.kube.create_job(manifest)
        ours = created or _owned_by(job, owner_uid)
        if ours:  # an existing Job adopted was read (a GET), not written
            self.cache.jobs.answer(job, window, read=not created)
        return created, job, ours

    async def replace_run_status(self, body: Obj) -> Obj:
        """PUT the run's status (its resourceVersion makes it optimistic); the answer, written through."""
        meta = body["metadata"]
        with self.cache.runs.window(meta["namespace"], meta["name"]) as window:
            answer = await self.kube.replace_run_status(body)
        self.cache.runs.answer(answer, window)
        return answer

    async def refresh_run(self, namespace: str, name: str) -> None:
        """The cached run is stale (a write of it got 409): read it fresh into the cache."""
        with self.cache.runs.window(namespace, name) as window:
            fresh = await self.kube.get_custom(namespace, "agentruns", name)
        if fresh is not None:
            self.cache.runs.answer(fresh, window, read=True)

    async def set_job_ttl(self, namespace: str, name: str, seconds: int | None) -> None:
        with self.cache.jobs.window(namespace, name) as window:
            patched = await self.kube.set_job_ttl(namespace, name, seconds)
        if patched is not None:
            self.cache.jobs.answer(patched, window)
