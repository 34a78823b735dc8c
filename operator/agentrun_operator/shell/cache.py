"""Watch caches: the AgentRuns, Jobs and Pods (our informers), indexed by run.

A reconcile reads its run, the run's Jobs and their Pods from here instead of listing them from the
API server (docs/operator.md#cache). Why it is correct:

- **Restart.** Every kind is fed by its informer (shell/informer.py), starting with its first LIST.
  The work queue starts reconciling only once every informer has opened its gate (`ready`), so no
  reconcile ever sees a half-filled cache.
- **Stale cache.** Our own writes are written through (the created Job, the status PUT's answer, the
  Job with its TTL: `answer`). Anything else that is stale makes a write fail safely: the status PUT
  carries the cached resourceVersion (409 -> the run is fetched fresh and re-planned), and Job names
  are deterministic (AlreadyExists -> the existing Job is adopted).
- **Missed watch event.** The periodic resync (shell/resync.py) compares every kind with the API
  server and merges what differs in, so whatever a watch dropped is seen one resync period later.

A resourceVersion is opaque (the API's contract): it is only ever compared for equality. Which of
two versions of an object is newer is answered by the watch's own order instead -- it delivers every
version of an object, oldest first -- and by this store's clock, which orders what the store itself
did (docs/design.md#watch-path):

- a write's answer held ahead of the watch (`answer`) stays until the watch delivers that same
  version; what the watch delivers before it is older and is skipped;
- a version the watch delivered while a request was in flight (`window`) is not overwritten by the
  request's answer, which may be older;
- a LIST drops an object it lacks only when the store had it before the LIST was sent (`clock`);
- a LIST sent after an answer was held ahead lists that version or a newer one: the resync
  (`compare`) then lets go of it, so an echo a watch missed holds nothing up for longer than that.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from agentrun_operator import naming
from agentrun_operator.api import GROUP
from agentrun_operator.jobs.builder import ANNOTATION_RUN_NAME
from agentrun_operator.planner.observed import ObservedJob
from agentrun_operator.planner.waiting import VOLUME_REASONS
from agentrun_operator.shell.observe import job_from_k8s, resource_version
from agentrun_operator.shell.relevance import job_change, job_ended, pod_arrival, pod_change, pod_ended
from agentrun_operator.shell.volume_waits import VolumeEventStore, VolumeWaits

Key = tuple[str, str]  # (namespace, run name)
Obj = dict[str, Any]
Where = tuple[str, str]  # (namespace, object name)


def where_of(obj: Obj) -> Where:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


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


def _kept(obj: Obj) -> Obj:
    """The body as the cache keeps it: without `metadata.managedFields`, which no reader reads and
    which was a third of a cached AgentRun (docs/operator.md#scale). A status write sends no
    managedFields, and the API server then keeps the stored ones."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def _identity(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta.get(k) for k in ("name", "namespace", "uid", "resourceVersion")}}


class Window:
    """One request about one object: the versions of it the watch delivered meanwhile (`seen`), and
    the answer held ahead of the watch when it was sent (`ahead`)."""

    __slots__ = ("ahead", "seen")

    def __init__(self, ahead: str | None) -> None:
        self.ahead = ahead
        self.seen: set[str] = set()


class Store:
    """Objects of one kind, by run and by name, each with its `view` (what the reconciler reads of
    it); `change` picks from a view what decides whether the run must be re-planned."""

    def __init__(
        self,
        run_of: Callable[[Obj], str | None],
        view: Callable[[Obj], Any],
        change: Callable[[Any], Any] = lambda view: view,
        keep_body: bool = True,
        arrival: Callable[[Any, list[Any]], bool] = lambda view, others: True,
        forget: Callable[[str, str], None] | None = None,
        ended: Callable[[Any], bool] = lambda view: False,
    ) -> None:
        self._run_of = run_of
        self._view = view
        self._change = change
        self._arrival = arrival  # whether a new object (its view, its run's others) is worth a re-plan
        self._forget = forget  # told (namespace, name) of each object the store drops
        self._ended = ended  # whether a view ends an iteration's work (`ending`)
        # Jobs and Pods are read only through their views: keeping just their identity (not the
        # whole object, kilobytes per pod) is what keeps 500 concurrent runs in little memory.
        self._keep_body = keep_body
        self._by_run: dict[Key, dict[str, tuple[Obj, Any]]] = {}
        self._where: dict[Where, Key] = {}  # (namespace, object name) -> run key
        # (namespace, object name) -> `change` of its stored view, computed when it is stored: each
        # update then picks its plan-relevant part from the new view only, not from both again.
        self._changes: dict[Where, Any] = {}
        self._clock = 0  # counts what the store took in: orders its own past, never versions
        self._stored_at: dict[Where, int] = {}  # when each object was last taken in
        self._ahead: dict[Where, tuple[str, int]] = {}  # a write's answer the watch has not delivered
        self._windows: dict[Where, list[Window]] = {}  # requests in flight, per object

    def __len__(self) -> int:
        return len(self._where)

    def clock(self) -> int:
        """The store's clock now: take it before sending a LIST (`relist`, `compare`)."""
        return self._clock

    def upsert(self, obj: Obj) -> Key | None:
        """A watch event's object (ADDED, MODIFIED); the run key when its run must be re-planned.

        The watch delivers every version of an object in order, so while an answer is held ahead of
        it (`answer`), what it delivers before that version is older and is skipped."""
        where, version = where_of(obj), _version(obj)
        for window in self._windows.get(where, ()):
            window.seen.add(version)
        ahead = self._ahead.get(where)
        if ahead is not None:
            if version != ahead[0]:
                return None
            del self._ahead[where]
        return self._put(obj)

    def ending(self, obj: Obj) -> bool:
        """Whether the change just taken in (`upsert` answered its run's key) ends an attempt: its pod
        stopped, or its Job failed. The reconcile it asks for is a turnaround (the next Job), which
        the work queue takes before other work (shell/workqueue.py)."""
        entry = self._entry(where_of(obj))
        return entry is not None and self._ended(entry[1])

    def listed(self, obj: Obj) -> Key | None:
        """One object of a LIST that a watch resumes from (kopf's, before its watch): its version is
        the watch's from now on, whatever was held ahead."""
        self._ahead.pop(where_of(obj), None)
        return self._put(obj)

    @contextlib.contextmanager
    def window(self, namespace: str, name: str) -> Iterator[Window]:
        """While a request about this object is in flight: what `answer` needs to know of it."""
        where = (namespace, name)
        held = self._ahead.get(where)
        window = Window(held[0] if held else None)
        self._windows.setdefault(where, []).append(window)
        try:
            yield window
        finally:
            open_ = self._windows.get(where, [])
            open_.remove(window)
            if not open_:
                self._windows.pop(where, None)

    def answer(self, obj: Obj, window: Window, read: bool = False) -> Key | None:
        """The API server's answer about an object (`window` open around the request), written
        through; the run key when its run must be re-planned.

        A write's answer is a version the watch delivers later, unless it did during the request
        (`seen`): it is held ahead of the watch until then. A read's answer (a GET) is taken only
        when the watch delivered nothing of the object meanwhile and no write was answered
        meanwhile; it is then at least as new as anything held (else the watch brings the object
        up to date itself), and it is not held ahead: a read may be of a version the watch missed."""
        where, version = where_of(obj), _version(obj)
        held = self._ahead.get(where)
        if version in window.seen or (read and (window.seen or (held[0] if held else None) != window.ahead)):
            return None
        found = self._entry(where)
        if found is not None and _same_version(obj, found[0]):
            return None
        key = self._put(obj)
        if read:
            self._ahead.pop(where, None)
        elif where in self._where:
            self._ahead[where] = (version, self._clock)
        return key

    def _put(self, obj: Obj) -> Key | None:
        ns, name = where_of(obj)
        run = self._run_of(obj)
        where = (ns, name)
        old_key = self._where.get(where)
        if not run:  # no longer any run's (e.g. orphaned): forget it
            if old_key is not None:
                self._drop(old_key, name)
            return old_key
        self._clock += 1
        self._stored_at[where] = self._clock
        key: Key = (ns, run)
        if old_key is not None and old_key != key:  # relabelled to another run: move it
            self._by_run.get(old_key, {}).pop(name, None)
        entries = self._by_run.setdefault(key, {})
        current = entries.get(name)
        if current is not None and _same_version(obj, current[0]):
            return None  # unchanged: the echo of an answer written through, a relist of the same
        view = self._view(obj)
        now = self._change(view)
        entries[name] = (_kept(obj) if self._keep_body else _identity(obj), view)
        self._where[where] = key
        moved = old_key is not None and old_key != key
        if current is None:
            others = [v for n, (_, v) in entries.items() if n != name]
            changed = moved or self._arrival(view, others)
        else:
            before = self._changes[where] if where in self._changes else self._change(current[1])
            changed = moved or now != before
        self._changes[where] = now
        return key if changed else None

    def _entry(self, where: Where) -> tuple[Obj, Any] | None:
        key = self._where.get(where)
        return self._by_run.get(key, {}).get(where[1]) if key is not None else None

    def delete(self, obj: Obj) -> Key | None:
        """Forget `obj` (a DELETED event); the run key when something was removed."""
        where = where_of(obj)
        for window in self._windows.get(where, ()):
            window.seen.add(_version(obj))
        key, current = self._where.get(where), self._entry(where)
        if key is None or current is None:
            return None
        if (current[0].get("metadata") or {}).get("uid") != (obj.get("metadata") or {}).get("uid"):
            return None  # a namesake created since: keep what we have
        self._drop(key, where[1])
        return key

    def _drop(self, key: Key, name: str) -> None:
        entries = self._by_run.get(key, {})
        entries.pop(name, None)
        if not entries:
            self._by_run.pop(key, None)
        where = (key[0], name)
        self._where.pop(where, None)
        self._changes.pop(where, None)
        self._stored_at.pop(where, None)
        self._ahead.pop(where, None)
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

    def relist(self, items: Iterable[Obj], since: int, namespaces: set[str] | None) -> set[Key]:
        """Merge in a LIST sent at `since` (`clock`) that a watch resumes from: each listed object as
        listed (`listed`); one missing from it is gone, unless the store took it in after the LIST
        was sent (an answer written through meanwhile). Returns the runs whose view changed."""
        changed: set[Key] = set()
        seen: set[Where] = set()
        for obj in items:
            seen.add(where_of(obj))
            key = self.listed(obj)
            if key is not None:
                changed.add(key)
        return changed | self._drop_unlisted(seen, since, namespaces)

    def compare(
        self, items: Iterable[Obj], since: int, namespaces: set[str] | None
    ) -> tuple[list[Where], set[Key]]:
        """Merge in a metadata-only LIST sent at `since` while the watch runs: (namespace, name) of
        each listed object the store does not hold at that version (to be read in full, `answer`
        with `read`), and the runs whose view changed because an object missing from the list was
        dropped (as in `relist`). An answer held ahead of the watch since before the LIST was sent
        is let go of: the list has that version or a newer one."""
        seen: set[Where] = set()
        fetch: list[Where] = []
        for obj in items:
            where = where_of(obj)
            seen.add(where)
            held = self._ahead.get(where)
            if held is not None and held[1] <= since:
                del self._ahead[where]
            entry = self._entry(where)
            if entry is None or not _same_version(obj, entry[0]):
                fetch.append(where)
        return fetch, self._drop_unlisted(seen, since, namespaces)

    def _drop_unlisted(self, seen: set[Where], since: int, namespaces: set[str] | None) -> set[Key]:
        changed: set[Key] = set()
        for (ns, name), key in list(self._where.items()):
            if (ns, name) in seen or (namespaces is not None and ns not in namespaces):
                continue
            if self._stored_at.get((ns, name), 0) <= since:
                self._drop(key, name)
                changed.add(key)
        return changed


def _version(obj: Obj) -> str:
    return resource_version(obj) or ""


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
        self.jobs = Store(run_of_job, job_view, job_change, keep_body=False, ended=job_ended)
        # A pod's view holds its volume wait, from the Events informers' stores (shell/volume_waits.py).
        self.volume_waits = VolumeWaits()
        self.pods = Store(
            run_of_pod,
            self.volume_waits.pod_view,
            pod_change,
            keep_body=False,
            arrival=pod_arrival,
            forget=self.volume_waits.forget_pod,
            ended=pod_ended,
        )
        self.volume_waits.review = self.pods.review
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
