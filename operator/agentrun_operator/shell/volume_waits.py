"""A pod's volume wait, from the Events that say it (docs/design.md#pod-waits).

A volume the node cannot attach or mount is not in the pod's status: the pod stays
`ContainerCreating`, and the reason is an Event on the pod, `FailedAttachVolume` (the attach/detach
controller) or `FailedMount` (the kubelet). One informer per reason watches core/v1 Events with a
field selector (`involvedObject.kind=Pod,reason=…`), so the API server sends only those; each event's
store (`VolumeEventStore`) hands it to `VolumeWaits`, which keeps per pod only what the pod's wait is
chosen from (`observe.newest_volume_wait`), and merges that wait into the pod's view in the pods'
store (`observe.with_volume_wait`): an arriving, changing or ending volume wait re-plans the run as
any change of a pod's wait does (the store compares `relevance.pod_relevant`).

Entries go when their Event is deleted (the API server's event TTL, an hour by default), when the
pod has started a container (then no volume of it waits), or when the pod leaves the pods' store.
An Event about a pod that is not an iteration's is kept all the same until then (its pod may not
have been listed yet at start-up): a few small tuples per such Event. Events are not part of the
periodic resync (cache.relist): the kubelet and the controller post their error again, as an update
of the same Event, on every retry, so a missed watch event is followed by the next one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from agentrun_operator.planner.observed import ObservedPod, PodWait
from agentrun_operator.shell.observe import (
    event_volume_wait,
    newest_volume_wait,
    pod_from_k8s,
    with_volume_wait,
)

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, run name): the run to re-plan
Where = tuple[str, str]  # (namespace, name)
Review = Callable[[str, str, Callable[[Any, str], Any]], "Key | None"]
"""The pods' store's `review` (shell/cache.py): remake a pod's view; the run to re-plan, if any."""


class VolumeWaits:
    """Per pod, its volume Events (by reason and Event name): the pod's uid, when the Event was last
    taken in (this object's own clock: the newest wins) and its wait. `review` is the pods' store's,
    whose views this merges the wait into."""

    def __init__(self) -> None:
        self.review: Review | None = None
        self._clock = 0
        self._by_pod: dict[Where, dict[tuple[str, str], tuple[str, int, PodWait]]] = {}
        self._event_pod: dict[tuple[str, str, str], Where] = {}  # (reason, ns, Event name) -> pod

    def __len__(self) -> int:
        return len(self._event_pod)

    def wait_for(self, namespace: str, name: str, uid: str) -> PodWait | None:
        """The pod's volume wait (its Events about another pod of the same name do not count)."""
        entries = self._by_pod.get((namespace, name), {})
        return newest_volume_wait((taken, wait) for u, taken, wait in entries.values() if u == uid)

    def clock(self) -> int:
        """The clock now: take it before sending a LIST (`VolumeEventStore.relist`)."""
        return self._clock

    def pod_view(self, pod: Obj) -> ObservedPod | None:
        """The pods' store's view: the pod as observed, with its volume wait. A pod that has started
        a container drops its entries (no volume of it waits)."""
        observed = pod_from_k8s(pod)
        if observed is None:
            return None
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        if not observed.creating:
            if (namespace, name) in self._by_pod:
                self.forget_pod(namespace, name)
            return with_volume_wait(observed, None)
        return with_volume_wait(observed, self.wait_for(namespace, name, str(meta.get("uid") or "")))

    def forget_pod(self, namespace: str, name: str) -> None:
        for reason, event in self._by_pod.pop((namespace, name), {}):
            self._event_pod.pop((reason, namespace, event), None)

    def put(self, reason: str, event: Obj) -> Key | None:
        """An Event added or changed (its watch delivers each version in order, so this one is the
        newest); the run to re-plan when its pod's view changed."""
        meta = event.get("metadata") or {}
        namespace, event_name = str(meta.get("namespace")), str(meta.get("name"))
        decoded = event_volume_wait(event)
        if decoded is None or decoded[3].reason != reason:
            return self.remove(reason, namespace, event_name)
        pod_ns, pod_name, uid, wait = decoded
        where = self._event_pod.get((reason, namespace, event_name))
        if where is not None and where != (pod_ns, pod_name):  # not expected: an Event keeps its object
            self.remove(reason, namespace, event_name)
        entries = self._by_pod.setdefault((pod_ns, pod_name), {})
        self._clock += 1
        entries[(reason, event_name)] = (uid, self._clock, wait)
        self._event_pod[(reason, namespace, event_name)] = (pod_ns, pod_name)
        return self._review(pod_ns, pod_name)

    def remove(self, reason: str, namespace: str, event_name: str) -> Key | None:
        """An Event deleted (or no longer a volume Event); the run to re-plan when its pod's view changed."""
        where = self._event_pod.pop((reason, namespace, event_name), None)
        if where is None:
            return None
        entries = self._by_pod.get(where, {})
        entries.pop((reason, event_name), None)
        if not entries:
            self._by_pod.pop(where, None)
        return self._review(*where)

    def taken_at(self, reason: str, namespace: str, event_name: str) -> int | None:
        """When a kept Event of `reason` was last taken in (`clock`); None for one not kept."""
        where = self._event_pod.get((reason, namespace, event_name))
        if where is None:
            return None
        entry = self._by_pod.get(where, {}).get((reason, event_name))
        return entry[1] if entry else 0

    def kept(self, reason: str, namespaces: set[str] | None) -> dict[tuple[str, str], int]:
        """(namespace, Event name) -> `taken_at` of the kept Events of `reason` (in `namespaces`)."""
        return {
            (ns, event_name): self.taken_at(reason, ns, event_name) or 0
            for (r, ns, event_name) in self._event_pod
            if r == reason and (namespaces is None or ns in namespaces)
        }

    def _review(self, namespace: str, name: str) -> Key | None:
        if self.review is None:
            return None

        def merged(view: Any, uid: str) -> Any:
            if not isinstance(view, ObservedPod):
                return view
            return with_volume_wait(view, self.wait_for(namespace, name, uid))

        return self.review(namespace, name, merged)


class VolumeEventStore:
    """What an Events informer of one reason feeds (the `Store` calls an `Informer` makes)."""

    def __init__(self, reason: str, waits: VolumeWaits) -> None:
        self.reason = reason
        self.waits = waits

    def __len__(self) -> int:
        return len(self.waits.kept(self.reason, None))

    def upsert(self, event: Obj) -> Key | None:
        return self.waits.put(self.reason, event)

    def delete(self, event: Obj) -> Key | None:
        meta = event.get("metadata") or {}
        return self.waits.remove(self.reason, str(meta.get("namespace")), str(meta.get("name")))

    def ending(self, event: Obj) -> bool:
        return False  # a volume's wait starts or ends nothing of an attempt

    def clock(self) -> int:
        return self.waits.clock()

    def relist(self, items: Iterable[Obj], since: int, namespaces: set[str] | None) -> set[Key]:
        """Merge in a LIST sent at `since` (`clock`): an Event missing from it is gone, unless it was
        taken in after the LIST was sent."""
        changed: set[Key] = set()
        seen: set[tuple[str, str]] = set()
        for event in items:
            meta = event.get("metadata") or {}
            seen.add((str(meta.get("namespace")), str(meta.get("name"))))
            key = self.upsert(event)
            if key is not None:
                changed.add(key)
        for where, taken in self.waits.kept(self.reason, namespaces).items():
            if where in seen or taken > since:
                continue
            key = self.waits.remove(self.reason, *where)
            if key is not None:
                changed.add(key)
        return changed
