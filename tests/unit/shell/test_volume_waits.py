"""A pod's volume wait from the Events the kubelet and the attach/detach controller post: decoded
(`observe.event_volume_wait`, `newest_volume_wait`, `with_volume_wait`, `pod_creating`) and kept in
the watch cache (shell/volume_waits.py), so that it arriving, changing or ending re-plans the run,
and nothing else of those Events does (docs/design.md#pod-waits)."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun_operator import naming
from agentrun_operator.planner.observed import ObservedPod, PodWait
from agentrun_operator.shell.cache import RunCache
from agentrun_operator.shell.observe import (
    event_volume,
    event_volume_wait,
    newest_volume_wait,
    pod_creating,
    with_volume_wait,
)

NS = "ns"
KEY = (NS, "r")
NEW_MOUNTER = 'MountVolume.NewMounter initialization failed for volume "pv-x" : path "/nope" does not exist'
SETUP = 'MountVolume.SetUp failed for volume "cfg" : configmap "settings" not found'
MULTI_ATTACH = (
    'Multi-Attach error for volume "pvc-1" Volume is already exclusively attached to one node and '
    "can't be attached to another"
)
SUMMARY = (
    "Unable to attach or mount volumes: unmounted volumes=[data cache], unattached volumes=[data "
    "cache kube-api-access-x]: timed out waiting for the condition"
)
CREATING = {
    "phase": "Pending",
    "containerStatuses": [{"name": "main", "state": {"waiting": {"reason": "ContainerCreating"}}}],
}
RUNNING = {"phase": "Pending", "containerStatuses": [{"name": "reporter", "state": {"running": {}}}]}


def event(
    name: str,
    rv: int,
    message: str = NEW_MOUNTER,
    reason: str = "FailedMount",
    pod: str = "p",
    uid: str = "pod-uid",
    kind: str = "Pod",
) -> dict[str, Any]:
    return {
        "kind": "Event",
        "metadata": {"name": name, "namespace": NS, "resourceVersion": str(rv)},
        "involvedObject": {"kind": kind, "namespace": NS, "name": pod, "uid": uid},
        "reason": reason,
        "message": message,
        "type": "Warning",
    }


def pod(rv: int, status: dict[str, Any], name: str = "p", uid: str = "pod-uid") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid,
            "resourceVersion": str(rv),
            "labels": {naming.LABEL_RUN: "r", "job-name": "j"},
        },
        "spec": {},
        "status": status,
    }


def waiting(cache: RunCache, name: str = "p") -> PodWait | None:
    found, view = cache.pods.view_of(KEY, name)
    assert found
    assert isinstance(view, ObservedPod)
    return view.waiting


# -- decoding -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "volume"),
    [
        (NEW_MOUNTER, "pv-x"),
        (SETUP, "cfg"),
        (MULTI_ATTACH, "pvc-1"),
        ('AttachVolume.Attach failed for volume "pvc-2" : rpc error', "pvc-2"),
        (SUMMARY, "data, cache"),
        ("Unable to attach or mount volumes: unmounted volumes=[], x", None),
        ("something else", None),
    ],
)
def test_the_volume_an_event_names(message: str, volume: str | None) -> None:
    assert event_volume(message) == volume


def test_an_event_decodes_into_its_pods_wait() -> None:
    assert event_volume_wait(event("e", 1)) == (
        NS,
        "p",
        "pod-uid",
        PodWait("FailedMount", NEW_MOUNTER, volume="pv-x"),
    )
    attach = event_volume_wait(event("e", 1, MULTI_ATTACH, "FailedAttachVolume"))
    assert attach is not None and attach[3] == PodWait("FailedAttachVolume", MULTI_ATTACH, volume="pvc-1")
    assert event_volume_wait(event("e", 1, kind="PersistentVolumeClaim")) is None
    assert event_volume_wait(event("e", 1, reason="FailedScheduling")) is None


def test_the_newest_event_that_names_its_cause_is_the_wait() -> None:
    mount = PodWait("FailedMount", NEW_MOUNTER, volume="pv-x")
    attach = PodWait("FailedAttachVolume", MULTI_ATTACH, volume="pvc-1")
    summary = PodWait("FailedMount", SUMMARY, volume="data, cache")
    assert newest_volume_wait([]) is None
    assert newest_volume_wait([(1, mount), (2, attach)]) == attach
    assert newest_volume_wait([(3, mount), (2, attach)]) == mount
    assert newest_volume_wait([(1, mount), (9, summary)]) == mount, "the summary does not push the cause out"
    assert newest_volume_wait([(9, summary)]) == summary


def test_a_pod_is_creating_until_a_container_has_started() -> None:
    assert pod_creating({})
    assert pod_creating(CREATING)
    assert not pod_creating(RUNNING)
    assert not pod_creating({"phase": "Running"})
    assert not pod_creating({"phase": "Pending", "initContainerStatuses": [{"state": {"terminated": {}}}]})
    assert not pod_creating(
        {
            "phase": "Pending",
            "containerStatuses": [{"state": {"waiting": {}}, "lastState": {"terminated": {}}}],
        }
    )


def test_a_volume_wait_only_for_a_creating_pod_whose_status_says_nothing_stronger() -> None:
    mount = PodWait("FailedMount", NEW_MOUNTER, volume="pv-x")
    creating = ObservedPod("p", "j", "Pending", creating=True)
    assert with_volume_wait(creating, mount).waiting == mount
    assert with_volume_wait(creating, None) is creating
    started = ObservedPod("p", "j", "Pending")
    assert with_volume_wait(started, mount) is started
    image = PodWait("ErrImageNeverPull", "x", "main", "a:1")
    stronger = ObservedPod("p", "j", "Pending", waiting=image, creating=True)
    assert with_volume_wait(stronger, mount).waiting == image
    merged = with_volume_wait(creating, mount)
    assert with_volume_wait(merged, None).waiting is None, "an ended volume wait is removed"
    assert with_volume_wait(merged, mount) is merged


# -- the watch cache ----------------------------------------------------------------------------


def test_an_event_arriving_changing_and_ending_re_plans_the_pods_run() -> None:
    cache = RunCache()
    failed = cache.volume_events["FailedMount"]
    cache.pods.upsert(pod(1, CREATING))
    assert failed.upsert(event("e", 10)) == KEY
    assert waiting(cache) == PodWait("FailedMount", NEW_MOUNTER, volume="pv-x")
    assert failed.upsert(event("e", 11)) is None, "the same words again (count+1) re-plan nothing"
    assert waiting(cache) is not None and waiting(cache).volume == "pv-x"  # type: ignore[union-attr]
    attach = cache.volume_events["FailedAttachVolume"]
    assert attach.upsert(event("a", 12, MULTI_ATTACH, "FailedAttachVolume")) == KEY
    assert waiting(cache).reason == "FailedAttachVolume"  # type: ignore[union-attr]
    assert attach.delete(event("a", 13, MULTI_ATTACH, "FailedAttachVolume")) == KEY
    assert waiting(cache).reason == "FailedMount"  # type: ignore[union-attr]
    assert failed.delete(event("e", 14)) == KEY
    assert waiting(cache) is None
    assert len(cache.volume_waits) == 0


def test_a_pod_listed_after_its_event_gets_its_wait_and_starting_ends_it() -> None:
    cache = RunCache()
    failed = cache.volume_events["FailedMount"]
    assert failed.upsert(event("e", 10)) is None, "no pod of a run yet"
    assert cache.pods.upsert(pod(1, CREATING)) == KEY, "a pod that waits is news on arrival"
    assert waiting(cache) is not None
    assert cache.pods.upsert(pod(2, RUNNING)) == KEY, "started: the wait is over"
    assert waiting(cache) is None
    assert len(cache.volume_waits) == 0, "a started pod drops its entries"
    assert failed.upsert(event("e", 11)) is None, "a late Event of a started pod is no wait"
    assert waiting(cache) is None


def test_events_of_another_pod_or_a_namesake_do_not_count() -> None:
    cache = RunCache()
    failed = cache.volume_events["FailedMount"]
    cache.pods.upsert(pod(1, CREATING))
    assert failed.upsert(event("e", 10, uid="older-namesake")) is None
    assert waiting(cache) is None
    assert failed.upsert(event("f", 10, pod="other")) is None
    assert waiting(cache) is None


def test_the_pods_own_stronger_wait_wins_and_its_deletion_forgets_the_events() -> None:
    cache = RunCache()
    failed = cache.volume_events["FailedMount"]
    status = {
        "phase": "Pending",
        "containerStatuses": [
            {
                "name": "main",
                "image": "a:1",
                "state": {"waiting": {"reason": "ErrImageNeverPull", "message": "m"}},
            }
        ],
    }
    cache.pods.upsert(pod(1, status))
    assert failed.upsert(event("e", 10)) is None
    assert waiting(cache).reason == "ErrImageNeverPull"  # type: ignore[union-attr]
    assert cache.pods.delete(pod(2, status)) == KEY
    assert len(cache.volume_waits) == 0


def test_a_relist_drops_the_events_it_no_longer_lists_unless_taken_in_after_it_was_sent() -> None:
    cache = RunCache()
    failed = cache.volume_events["FailedMount"]
    cache.pods.upsert(pod(1, CREATING))
    failed.upsert(event("old", 10))
    since = failed.clock()  # the LIST is sent
    failed.upsert(event("new", 30, SETUP))
    assert waiting(cache).volume == "cfg"  # type: ignore[union-attr]
    assert failed.relist([], since, {NS}) == set(), "the newer one stays; the older one was not the wait"
    assert len(failed) == 1
    assert failed.relist([], failed.clock(), {NS}) == {KEY}
    assert waiting(cache) is None
    assert failed.relist([event("e", 50)], failed.clock(), None) == {KEY}
    assert failed.relist([], failed.clock(), {"elsewhere"}) == set()
    assert waiting(cache) is not None
