"""Watch caches: the AgentRuns, Jobs and Pods (our informers), indexed by run.

A reconcile reads its run, the run's Jobs and their Pods from here instead of listing them from the
API server (docs/operator.md#cache). Why it is correct:

- **Restart.** Every kind is fed by its informer (shell/informer.py), starting with its first LIST.
  The work queue starts reconciling only once every informer has opened its gate (`ready`), so no
  reconcile ever sees a half-filled cache.
- **Stale cache.** Our own writes are written through (the created Job, the status PUT's answer, the
  Job with its TTL).
  Anything else that is stale makes a write fail safely: the status PUT carries the cached
  resourceVersion (409 -> the run is fetched fresh and re-planned), and Job names are deterministic
  (AlreadyExists -> the existing Job is adopted).
- **Missed watch event.** The periodic resync relists all three kinds and merges the lists in
  (`relist`), so whatever a watch dropped is seen at the latest one resync period later.

Objects are compared by resourceVersion, which kube-apiserver takes from etcd's revision: an integer
that only grows. An older object never replaces a newer one, whichever path delivered it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from agentrun_operator import naming
from agentrun_operator.api import GROUP, VERSION
from agentrun_operator.jobs.builder import ANNOTATION_RUN_NAME
from agentrun_operator.planner.observed import ObservedJob
from agentrun_operator.planner.waiting import VOLUME_REASONS
from agentrun_operator.shell.kube import Kube
from agentrun_operator.shell.observe import job_from_k8s, resource_version
from agentrun_operator.shell.relevance import job_change, job_settled, pod_arrival, pod_change
from agentrun_operator.shell.volume_waits import VolumeEventStore, VolumeWaits

Key = tuple[str, str]  # (namespace, run name)
Obj = dict[str, Any]


def is_older(candidate: Obj, stored: Obj) -> bool:
    """True when `candidate` is an older version than `stored` (then it must not replace it)."""
    a, b = resource_version(candidate), resource_version(stored)
    return a is not None and b is not None and a < b


def _same_version(candidate: Obj, stored: Obj) -> bool:
    """The same object at the same resourceVersion: nothing in it can differ (no view to rebuild)."""
    a, b = candidate.get("metadata") or {}, stored.get("metadata") or {}
    version = a.get("resourceVersion")
    return bool(version) and version == b.get("resourceVersion") and a.get("uid") == b.get("uid")


def run_of_job(job: Obj) -> str | None:
    """The AgentRun that owns a Job (by owner reference; the label may be a hashed value)."""
    for ref in (job.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "AgentRun" and str(ref.get("apiVersion", "")).startswith(GROUP + "/"):
            return str(ref.get("name"))
    return None


def run_of_pod(pod: Obj) -> str | None:
    meta = pod.get("metadata") or {}
    run = (meta.get("annotations") or {}).get(ANNOTATION_RUN_NAME) or (meta.get("labels") or {}).get(
        naming.LABEL_RUN
    )
    return str(run) if run else None


def run_of_run(run: Obj) -> str | None:
    name = (run.get("metadata") or {}).get("name")
    return str(name) if name else None


def owner_uids(obj: Obj) -> tuple[str, ...]:
    return tuple(str(r.get("uid", "")) for r in (obj.get("metadata") or {}).get("ownerReferences") or [])


def job_view(job: Obj) -> tuple[ObservedJob | None, tuple[str, ...]]:
    """The Job as the planner sees it, and its owners (the reconciler reads both from here)."""
    return (job_from_k8s(job), owner_uids(job))


def run_view(run: Obj) -> tuple[Any, ...]:
    """Spec (via generation), deletion, labels, annotations and status: everything a plan reads.
    Compared by value (the API server may answer with the keys of our own write in another order)."""
    meta = run.get("metadata") or {}
    return (
        meta.get("uid"),
        meta.get("generation"),
        meta.get("deletionTimestamp"),
        meta.get("labels"),
        meta.get("annotations"),
        run.get("status"),
    )


def _identity(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "resourceVersion")}}


_CREATING = object()
_NOT_WRITING = object()


class Store:
    """Objects of one kind, by run and by name, each with its `view` (what the reconciler reads of
    it); `change` picks from a view what decides whether the run must be re-planned; `settled` says
    of a view that it is no news while a reconcile is settling that object (`settling`)."""

    def __init__(
        self,
        run_of: Callable[[Obj], str | None],
        view: Callable[[Obj], Any],
        change: Callable[[Any], Any] = lambda view: view,
        keep_body: bool = True,
        arrival: Callable[[Any, list[Any]], bool] = lambda view, others: True,
        settled: Callable[[Any], bool] | None = None,
        forget: Callable[[str, str], None] | None = None,
    ) -> None:
        self._run_of = run_of
        self._view = view
        self._change = change
        self._arrival = arrival  # whether a new object (its view, its run's others) is worth a re-plan
        self._settled = settled
        self._forget = forget  # told (namespace, name) of each object the store drops
        # Jobs and Pods are read only through their views: keeping just their identity (not the
        # whole object, kilobytes per pod) is what keeps 500 concurrent runs in little memory.
        self._keep_body = keep_body
        self._by_run: dict[Key, dict[str, tuple[Obj, Any]]] = {}
        self._where: dict[tuple[str, str], Key] = {}  # (namespace, object name) -> run key
        # (namespace, object name) -> `change` of its stored view, computed when it is stored: each
        # update then picks its plan-relevant part from the new view only, not from both again.
        self._changes: dict[tuple[str, str], Any] = {}
        # (namespace, name) -> what of it we are writing right now (`writing`)
        self._writing: dict[tuple[str, str], Any] = {}
        # (namespace, name) -> how many reconciles are settling it right now (`settling`)
        self._settling: dict[tuple[str, str], int] = {}

    def __len__(self) -> int:
        return len(self._where)

    def upsert(self, obj: Obj) -> Key | None:
        """Store `obj`; the run key when what the planner sees changed, else None."""
        meta = obj.get("metadata") or {}
        ns, name, run = str(meta.get("namespace") or ""), str(meta.get("name") or ""), self._run_of(obj)
        old_key = self._where.get((ns, name))
        if not run:  # no longer any run's (e.g. orphaned): forget it
            if old_key is not None:
                self._drop(old_key, name)
            return old_key
        key: Key = (ns, run)
        if old_key is not None and old_key != key:  # relabelled to another run: move it
            self._by_run.get(old_key, {}).pop(name, None)
        entries = self._by_run.setdefault(key, {})
        current = entries.get(name)
        if current is not None and (is_older(obj, current[0]) or _same_version(obj, current[0])):
            return None  # older, or unchanged: the echo of our own write, a relist of the same object
        where = (ns, name)
        view = self._view(obj)
        now = self._change(view)
        entries[name] = (obj if self._keep_body else _identity(obj), view)
        self._where[where] = key
        moved = old_key is not None and old_key != key
        echo = self._writing.get(where, _NOT_WRITING)
        if current is None:
            others = [v for n, (_, v) in entries.items() if n != name]
            changed = moved or (echo is not _CREATING and self._arrival(view, others))
        else:
            before = self._changes[where] if where in self._changes else self._change(current[1])
            changed = moved or (now != before and now != echo)
            if changed and not moved and where in self._settling and self._settled is not None:
                changed = not self._settled(view)
        self._changes[where] = now
        return key if changed else None

    @contextlib.contextmanager
    def writing(self, namespace: str, name: str, written: Obj | None = None) -> Iterator[None]:
        """While we write this object, the watch event echoing our write -- which may come before
        the API server's answer -- re-plans nothing: the reconcile writing it planned with it, and
        writes the answer through. `written` is the object as we send it (an event whose view is the
        same is the echo); None for a create (the object's first event is the echo). Any other
        change of it re-plans as usual."""
        where = (namespace, name)
        self._writing[where] = _CREATING if written is None else self._change(self._view(written))
        try:
            yield
        finally:
            self._writing.pop(where, None)

    @contextlib.contextmanager
    def settling(self, namespace: str, names: Iterable[str]) -> Iterator[None]:
        """While a reconcile settles these objects, an update of one of them to a view `settled`
        accepts re-plans nothing (it is stored all the same).

        The reconcile that records an iteration's result writes the status, then sets the ended Job's
        TTL; meanwhile the Job controller marks that Job Complete or Failed, which would re-plan the
        run a second time for nothing (the plan used the pod's result already). Safe because that
        reconcile re-plans the run itself whenever its writes fail (a 409 requeues it at once, an
        exception retries it), and anything else -- a view not settled, e.g. a deletion, an object
        first seen or moved to another run, any other name -- re-plans as usual. Counted, not a set:
        several reconciles may settle at once, and each one's exit must leave the others' names."""
        wheres = [(namespace, name) for name in names]
        for where in wheres:
            self._settling[where] = self._settling.get(where, 0) + 1
        try:
            yield
        finally:
            for where in wheres:
                left = self._settling.get(where, 0) - 1
                if left > 0:
                    self._settling[where] = left
                else:
                    self._settling.pop(where, None)

    def holds(self, namespace: str, name: str, uid: str, version: int | str) -> bool:
        """Whether the store holds this object (same uid) at `version` or newer: then its watch event
        is the echo of what we wrote through (the status PUT's answer, the created Job), and the
        informer need not even decode it. False for a `version` that is not a number."""
        key = self._where.get((namespace, name))
        entry = self._by_run.get(key, {}).get(name) if key is not None else None
        if entry is None or not uid or (entry[0].get("metadata") or {}).get("uid") != uid:
            return False
        try:
            wanted = int(version)
        except ValueError:
            return False
        stored = resource_version(entry[0])
        return stored is not None and stored >= wanted

    def delete(self, obj: Obj) -> Key | None:
        """Forget `obj` (a DELETED event); the run key when something was removed."""
        meta = obj.get("metadata") or {}
        ns, name = str(meta.get("namespace")), str(meta.get("name"))
        key = self._where.get((ns, name))
        if key is None:
            return None
        current = self._by_run.get(key, {}).get(name)
        if current is None:
            return None
        same_object = (current[0].get("metadata") or {}).get("uid") == meta.get("uid")
        if not same_object or is_older(obj, current[0]):
            return None  # a namesake created since, or a stale delete: keep what we have
        self._drop(key, name)
        return key

    def _drop(self, key: Key, name: str) -> None:
        entries = self._by_run.get(key, {})
        entries.pop(name, None)
        if not entries:
            self._by_run.pop(key, None)
        self._where.pop((key[0], name), None)
        self._changes.pop((key[0], name), None)
        if self._forget is not None:
            self._forget(key[0], name)

    def review(self, namespace: str, name: str, view: Callable[[Any, str], Any]) -> Key | None:
        """Make an object's view anew from its stored view and uid (`view(old, uid)`), for what the
        view holds from elsewhere (a pod's volume wait, from Events: shell/volume_waits.py); the run
        key when what decides a re-plan (`change`) changed. None for an object not held."""
        where = (namespace, name)
        key = self._where.get(where)
        entry = self._by_run.get(key, {}).get(name) if key is not None else None
        if key is None or entry is None:
            return None
        obj, old = entry
        new = view(old, str((obj.get("metadata") or {}).get("uid") or ""))
        if new is old:
            return None
        self._by_run[key][name] = (obj, new)
        before = self._changes[where] if where in self._changes else self._change(old)
        now = self._change(new)
        self._changes[where] = now
        return key if now != before else None

    def get(self, key: Key) -> list[Obj]:
        return [obj for obj, _ in self._by_run.get(key, {}).values()]

    def entries(self, key: Key) -> list[tuple[Obj, Any]]:
        """(object, view) pairs: the view is what `view` made of it when it was stored."""
        return list(self._by_run.get(key, {}).values())

    def one(self, key: Key, name: str) -> Obj | None:
        found = self._by_run.get(key, {}).get(name)
        return found[0] if found else None

    def view_of(self, key: Key, name: str) -> tuple[bool, Any]:
        """(found, view) of one object."""
        found = self._by_run.get(key, {}).get(name)
        return (True, found[1]) if found else (False, None)

    def run_keys(self) -> list[Key]:
        return list(self._by_run)

    def relist(self, items: Iterable[Obj], list_version: int | None, namespaces: set[str] | None) -> set[Key]:
        """Merge a fresh LIST in: newer objects win; one missing from the list is gone, unless it is
        newer than the list itself (it arrived by watch after the list was taken). Returns the runs
        whose view changed."""
        changed: set[Key] = set()
        seen: set[tuple[str, str]] = set()
        for obj in items:
            meta = obj.get("metadata") or {}
            seen.add((str(meta.get("namespace")), str(meta.get("name"))))
            key = self.upsert(obj)
            if key is not None:
                changed.add(key)
        return changed | self._drop_unlisted(seen, list_version, namespaces)

    def compare(
        self, items: Iterable[Obj], list_version: int | None, namespaces: set[str] | None
    ) -> tuple[list[tuple[str, str]], set[Key]]:
        """Merge a metadata-only LIST in: (namespace, name) of each listed object the cache does not
        hold at that version or newer (to be read in full), and the runs whose view changed because an
        object missing from the list was dropped (as in `relist`)."""
        seen: set[tuple[str, str]] = set()
        fetch: list[tuple[str, str]] = []
        for obj in items:
            meta = obj.get("metadata") or {}
            where = (str(meta.get("namespace")), str(meta.get("name")))
            seen.add(where)
            key = self._where.get(where)
            entry = self._by_run.get(key, {}).get(where[1]) if key is not None else None
            if entry is None or not (_same_version(obj, entry[0]) or is_older(obj, entry[0])):
                fetch.append(where)
        return fetch, self._drop_unlisted(seen, list_version, namespaces)

    def _drop_unlisted(
        self, seen: set[tuple[str, str]], list_version: int | None, namespaces: set[str] | None
    ) -> set[Key]:
        changed: set[Key] = set()
        for (ns, name), key in list(self._where.items()):
            if (ns, name) in seen or (namespaces is not None and ns not in namespaces):
                continue
            entry = self._by_run.get(key, {}).get(name)
            rv = resource_version(entry[0]) if entry else None
            if entry is None or rv is None or list_version is None or rv <= list_version:
                self._drop(key, name)
                changed.add(key)
        return changed


NAMESPACE_WIDE = "*"
"""The run key's name part for objects that belong to no one run (what runs refer to): a change to one
concerns every run of its namespace."""


def namespace_wide(_obj: Obj) -> str:
    return NAMESPACE_WIDE


def spec_view(obj: Obj) -> dict[str, Any]:
    """What the planner reads of a referenced object: its spec."""
    return dict(obj.get("spec") or {})


REFERENCE_KINDS = ("agents", "agentproviders", "implementationspecs")
"""The kinds a run refers to by name, cached by namespace and name (docs/operator.md#cache)."""


class RunCache:
    """The three stores and the readiness gate the work queue waits on: `ready` is set once every
    informer has opened its gate, i.e. delivered its initial list."""

    def __init__(self, gates: Iterable[str] = ()) -> None:
        self.runs = Store(run_of_run, run_view)
        self.jobs = Store(run_of_job, job_view, job_change, keep_body=False, settled=job_settled)
        # A pod's view holds its volume wait, from the Events informers' stores (shell/volume_waits.py).
        self.volume_waits = VolumeWaits()
        self.pods = Store(
            run_of_pod,
            self.volume_waits.pod_view,
            pod_change,
            keep_body=False,
            arrival=pod_arrival,
            forget=self.volume_waits.forget_pod,
        )
        self.volume_waits.pods = self.pods
        self.volume_events = {
            reason: VolumeEventStore(reason, self.volume_waits) for reason in VOLUME_REASONS
        }
        self.references = {
            plural: Store(namespace_wide, spec_view, keep_body=False) for plural in REFERENCE_KINDS
        }
        self.ready = asyncio.Event()
        self._closed_gates = set(gates)

    def add_gate(self, name: str) -> None:
        if not self.ready.is_set():
            self._closed_gates.add(name)

    def open_gate(self, name: str) -> None:
        self._closed_gates.discard(name)
        if not self._closed_gates:
            self.ready.set()

    def run(self, namespace: str, name: str) -> Obj | None:
        return self.runs.one((namespace, name), name)

    def reference(self, plural: str, namespace: str, name: str) -> tuple[bool, dict[str, Any] | None]:
        """(found, spec) of an Agent, AgentProvider or ImplementationSpec, as last seen."""
        found, view = self.references[plural].view_of((namespace, NAMESPACE_WIDE), name)
        return found, view

    def run_namespaces_by_uid(self) -> dict[str, str]:
        """uid -> namespace of every cached AgentRun (the Event series are kept by uid)."""
        out: dict[str, str] = {}
        for key in self.runs.run_keys():
            run = self.run(*key)
            if run is not None:
                out[str(run["metadata"].get("uid"))] = key[0]
        return out

    def sizes(self) -> dict[str, int]:
        sizes = {"agentruns": len(self.runs), "jobs": len(self.jobs), "pods": len(self.pods)}
        sizes["volume_events"] = len(self.volume_waits)
        return sizes | {plural: len(store) for plural, store in self.references.items()}


KINDS = (
    # (store attribute, API prefix, plural, label selector)
    ("runs", f"/apis/{GROUP}/{VERSION}", "agentruns", None),
    ("jobs", "/apis/batch/v1", "jobs", naming.LABEL_RUN),
    ("pods", "/api/v1", "pods", naming.LABEL_RUN),
)


FULL_LIST_AFTER = 50
"""A resync that finds more objects than this out of date lists them whole instead of one GET each."""


async def relist(kube: Kube, cache: RunCache, namespaces: tuple[str, ...]) -> set[Key]:
    """The resync's half of the cache: compare every kind with the API server and merge it in.

    Each kind is listed as metadata only (`Store.compare`), and only the objects the cache does not
    hold at their current version are read in full: a resync of an up-to-date cache decodes names
    and versions, not every pod's spec and status. Many out of date at once: one full LIST
    (`Store.relist`). Returns the runs whose view changed, i.e. those a watch event had been missed for."""
    changed: set[Key] = set()
    scopes: list[str | None] = list(namespaces) or [None]
    for attr, prefix, plural, selector in KINDS:
        store: Store = getattr(cache, attr)
        for ns in scopes:
            within = {ns} if ns else None
            metas, version = await kube.list_with_version(prefix, plural, ns, selector, metadata_only=True)
            fetch, dropped = store.compare(metas, version, within)
            changed |= dropped
            if len(fetch) > FULL_LIST_AFTER:
                items, version = await kube.list_with_version(prefix, plural, ns, selector)
                changed |= store.relist(items, version, within)
                continue
            for obj_ns, name in fetch:
                obj = await kube.get_object(prefix, plural, obj_ns, name)
                key = store.upsert(obj) if obj is not None else None  # gone since: its DELETED, or next round
                if key is not None:
                    changed.add(key)
    return changed
