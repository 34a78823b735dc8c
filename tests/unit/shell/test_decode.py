"""Whatever a reader of an observed Job or Pod reads survives the decode of its watch event
(docs/design.md#watch-decode).

For realistic Jobs and Pods -- every field a reader reads (shell/observe.py, the cache's indexes)
drawn, often absent, in the API server's field order or any other, with managedFields and strings
that spell JSON -- the watch cache holds the same views after the informer took the event as after
the standard library's `json.loads` of it was stored, and each reader reads the same of both.
"""

from __future__ import annotations

import json
import random
from typing import Any, cast

from hypothesis import event as event_label
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun_operator import naming
from agentrun_operator.jobs.builder import ANNOTATION_RUN_NAME
from agentrun_operator.jobs.reporter_container import (
    FINGERPRINT_CONTAINER,
    GATE_REFUSAL,
    MAIN_CONTAINER,
    REPORTER_CONTAINER,
)
from agentrun_operator.planner.waiting import CONTAINER_WAIT_REASONS, UNSCHEDULABLE
from agentrun_operator.shell.cache import RunCache, Store, owner_uids, run_of_job, run_of_pod
from agentrun_operator.shell.codec import decode_json
from agentrun_operator.shell.informer import Informer
from agentrun_operator.shell.kube import Kube
from agentrun_operator.shell.observe import job_from_k8s, pod_from_k8s, resource_version

MARKERS = [
    ',"managedFields":[',
    ']},"spec":{',
    '},"status":{',
    '"metadata":{"name":"x",',
    '"nodeName":"node-x"',
    '"ttlSecondsAfterFinished":1',
    "\\",
    '"',
    "<&>",
    "é",
    "\u2028",
]
TEXT = st.one_of(st.sampled_from(MARKERS), st.text(st.characters(exclude_categories=["Cs"]), max_size=12))
NAME = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,14}[a-z0-9])?", fullmatch=True)
TIME = st.one_of(
    st.datetimes().map(lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ")), st.just("2026-11-27T10:00:00Z"), TEXT
)
SMALL = st.integers(-(2**31), 2**31)


def some(draw: st.DrawFn, fields: dict[str, Any]) -> dict[str, Any]:
    """Of `fields` (name -> strategy), each drawn or left out: a reader must not depend on a
    field's presence except where it says so."""
    return {k: draw(v) for k, v in fields.items() if draw(st.integers(0, 4))}  # there four times in five


@st.composite
def metadata(draw: st.DrawFn, pod: bool) -> dict[str, Any]:
    run = draw(NAME)
    labels: dict[str, Any] = draw(st.dictionaries(TEXT, TEXT, max_size=2))
    number = st.one_of(st.integers(0, 99).map(str), st.integers(0, 99).map(str), TEXT)
    ours = {
        naming.LABEL_RUN: st.just(run),
        naming.LABEL_STEP_INDEX: number,
        naming.LABEL_ITERATION: number,
        naming.LABEL_ATTEMPT: number,
        naming.LABEL_STEP_PATH: TEXT,
    }
    annotations = draw(st.dictionaries(TEXT, TEXT, max_size=2))
    ours_too = draw(st.integers(0, 3)) > 0
    if ours_too:  # mostly ours: labelled as the operator labels its Jobs and pods
        digits = st.integers(0, 99).map(str)
        labels |= {k: draw(digits if v is number and draw(st.integers(0, 9)) else v) for k, v in ours.items()}
        labels[naming.LABEL_STEP_PATH] = draw(st.one_of(st.just("2i3-1"), TEXT))
        annotations |= {ANNOTATION_RUN_NAME: run, naming.ANNOTATION_STEP: draw(TEXT)}
        if pod:
            labels["job-name" if draw(st.booleans()) else "batch.kubernetes.io/job-name"] = draw(NAME)
    else:
        labels |= some(draw, ours)
        annotations |= some(draw, {ANNOTATION_RUN_NAME: st.just(run), naming.ANNOTATION_STEP: TEXT})
        if pod:
            labels |= some(draw, {"job-name": NAME, "batch.kubernetes.io/job-name": NAME})
    owner = st.fixed_dictionaries(
        {
            "apiVersion": st.sampled_from(["agents.proompteng.ai/v1alpha1", "batch/v1", "v1"]),
            "kind": st.sampled_from(["AgentRun", "Job", "ReplicaSet"]),
            "name": st.one_of(st.just(run), NAME),
            "uid": TEXT,
            "controller": st.booleans(),
        }
    )
    manager = st.fixed_dictionaries(
        {
            "manager": TEXT,
            "operation": st.sampled_from(["Update", "Apply"]),
            "apiVersion": st.just("v1"),
            "fieldsType": st.just("FieldsV1"),
            "fieldsV1": st.dictionaries(TEXT.map(lambda k: f"f:{k}"), st.just({}), max_size=3),
            "subresource": st.sampled_from(["status", ""]),
        }
    )
    # The API server's order: name, generateName, namespace, uid, resourceVersion, ..., managedFields.
    meta: dict[str, Any] = {"name": draw(NAME)}
    if draw(st.booleans()):
        meta["generateName"] = draw(NAME)
    meta |= {
        "namespace": draw(NAME),
        "uid": draw(st.one_of(st.uuids().map(str), TEXT)),
        "resourceVersion": draw(st.one_of(st.integers(0, 2**40).map(str), TEXT)),
    }
    owners = st.lists(owner, max_size=2)
    if ours_too:  # owned by its AgentRun, as the operator makes its Jobs
        run_owner = {
            "apiVersion": f"{naming.GROUP}/v1alpha1",
            "kind": "AgentRun",
            "name": run,
            "uid": draw(TEXT),
        }
        owners = owners.map(lambda others: [run_owner, *others])
    meta |= some(
        draw,
        {
            "creationTimestamp": TIME,
            "deletionTimestamp": st.one_of(TIME, st.none()),
            "labels": st.just(labels),
            "annotations": st.just(annotations),
            "ownerReferences": owners,
            "finalizers": st.lists(TEXT, max_size=2),
            "managedFields": st.lists(manager, max_size=2),
        },
    )
    if ours_too:
        meta |= {"labels": labels, "annotations": annotations, "ownerReferences": draw(owners)}
    return meta


def envelope(claim: bool) -> st.SearchStrategy[str]:
    body: dict[str, Any] = {"v": st.just(1), "status": st.sampled_from(["found", "missing"]), "path": TEXT}
    if claim:
        body["claim"] = st.fixed_dictionaries({"holder": TEXT, "outcome": TEXT})
    return st.fixed_dictionaries(body).map(lambda d: json.dumps(d, separators=(",", ":")))


MESSAGE = st.one_of(TEXT, envelope(True), envelope(False), st.just(GATE_REFUSAL + " x"), st.none())
REASON = st.one_of(
    st.sampled_from(sorted(CONTAINER_WAIT_REASONS)),
    st.sampled_from(["ContainerCreating", "PodInitializing", "CreateContainerConfigError", "Completed"]),
    TEXT,
)


@st.composite
def container_state(draw: st.DrawFn) -> dict[str, Any]:
    which = draw(st.sampled_from(["running", "waiting", "terminated"]))
    if which == "running":
        return {"running": some(draw, {"startedAt": TIME})}
    if which == "waiting":
        return {"waiting": some(draw, {"reason": REASON, "message": MESSAGE})}
    fields = {"exitCode": SMALL, "signal": SMALL, "reason": REASON, "message": MESSAGE}
    return {"terminated": some(draw, fields | {"startedAt": TIME, "finishedAt": TIME, "containerID": TEXT})}


CONTAINER_NAME = st.sampled_from([MAIN_CONTAINER, REPORTER_CONTAINER, FINGERPRINT_CONTAINER, "sidecar"])


@st.composite
def container_status(draw: st.DrawFn) -> dict[str, Any]:
    fields = {
        "image": TEXT,
        "imageID": TEXT,
        "ready": st.booleans(),
        "restartCount": st.integers(0, 9),
        "started": st.booleans(),
        "state": container_state(),
        "lastState": st.one_of(container_state(), st.just({})),
    }
    return {"name": draw(CONTAINER_NAME)} | some(draw, fields)


CONDITION_STATUS = st.sampled_from(["True", "False", "Unknown"])


@st.composite
def pod_status(draw: st.DrawFn) -> dict[str, Any]:
    condition = st.fixed_dictionaries(
        {
            "type": st.sampled_from(["PodScheduled", "Ready", "Initialized", "ContainersReady"]),
            "status": CONDITION_STATUS,
        },
        optional={
            "reason": st.one_of(st.just(UNSCHEDULABLE), st.just("SchedulingGated"), TEXT),
            "message": TEXT,
            "lastTransitionTime": TIME,
        },
    )
    return some(
        draw,
        {
            "phase": st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"]),
            "reason": TEXT,
            "message": TEXT,
            "conditions": st.lists(condition, max_size=3),
            "hostIP": TEXT,
            "podIP": TEXT,
            "startTime": TIME,
            "initContainerStatuses": st.lists(container_status(), max_size=2),
            "containerStatuses": st.lists(container_status(), max_size=3),
        },
    )


@st.composite
def pod_spec(draw: st.DrawFn) -> dict[str, Any]:
    env = st.fixed_dictionaries({"name": TEXT, "value": TEXT})
    container = st.fixed_dictionaries(
        {"name": CONTAINER_NAME, "image": TEXT}, optional={"env": st.lists(env, max_size=2)}
    )
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [draw(NAME)]}]}
    return some(
        draw,
        {
            "nodeName": st.one_of(NAME, st.just("")),
            "containers": st.lists(container, max_size=2),
            "initContainers": st.lists(container, max_size=1),
            "restartPolicy": st.just("Never"),
            "terminationGracePeriodSeconds": SMALL,
            "affinity": st.just(
                {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}
            ),
            "schedulerName": TEXT,
        },
    )


@st.composite
def job_status(draw: st.DrawFn) -> dict[str, Any]:
    condition = st.fixed_dictionaries(
        {
            "type": st.sampled_from(
                ["Complete", "Failed", "SuccessCriteriaMet", "FailureTarget", "Suspended"]
            ),
            "status": CONDITION_STATUS,
        },
        optional={
            "reason": st.one_of(st.sampled_from(["DeadlineExceeded", "BackoffLimitExceeded"]), TEXT),
            "message": TEXT,
            "lastTransitionTime": TIME,
        },
    )
    return some(
        draw,
        {
            "conditions": st.lists(condition, max_size=3),
            "startTime": TIME,
            "completionTime": TIME,
            "active": st.integers(0, 2),
            "ready": st.integers(0, 2),
            "uncountedTerminatedPods": st.just({}),
        },
    )


@st.composite
def job_spec(draw: st.DrawFn) -> dict[str, Any]:
    template = {
        "metadata": {"labels": draw(st.dictionaries(TEXT, TEXT, max_size=2))},
        "spec": draw(pod_spec()),
    }
    return some(
        draw,
        {
            "parallelism": st.just(1),
            "backoffLimit": st.integers(0, 6),
            "activeDeadlineSeconds": st.integers(1, 10**6),
            "ttlSecondsAfterFinished": st.one_of(st.integers(0, 10**6), st.none()),
            "template": st.just(template),
        },
    )


def shuffled(value: Any, rnd: random.Random) -> Any:
    """`value` with every object's fields in another order (the API server writes its own order;
    nothing may depend on it)."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rnd) for v in value]
    return value


@st.composite
def watch_events(draw: st.DrawFn) -> tuple[str, bytes]:
    """(plural, the text of a watch event of a Pod or Job), as the API server writes it or in any
    other field order, escaped as Go does or as Python does."""
    plural = draw(st.sampled_from(["pods", "jobs"]))
    pod = plural == "pods"
    obj: dict[str, Any] = {"kind": "Pod" if pod else "Job", "apiVersion": "v1" if pod else "batch/v1"}
    obj["metadata"] = draw(metadata(pod))
    obj["spec"] = draw(pod_spec() if pod else job_spec())
    obj["status"] = draw(pod_status() if pod else job_status())
    event: dict[str, Any] = {"type": draw(st.sampled_from(["ADDED", "MODIFIED", "DELETED"])), "object": obj}
    if draw(st.booleans()):
        event = shuffled(event, draw(st.randoms(use_true_random=False)))
        event_label("fields shuffled")
    text = json.dumps(event, separators=(",", ":"), ensure_ascii=draw(st.booleans()))
    if draw(st.booleans()):  # Go's encoder escapes these (they occur only inside strings)
        text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return plural, text.encode()


def observed(plural: str, obj: dict[str, Any]) -> tuple[Any, ...]:
    """What every reader of an observed Job or Pod reads of it."""
    if plural == "pods":
        return pod_from_k8s(obj), run_of_pod(obj), owner_uids(obj), resource_version(obj)
    return job_from_k8s(obj), run_of_job(obj), owner_uids(obj), resource_version(obj)


def store_of(cache: RunCache, plural: str) -> Store:
    return cache.pods if plural == "pods" else cache.jobs


def held(cache: RunCache, plural: str) -> list[Any]:
    store = store_of(cache, plural)
    return sorted(((key, store.entries(key)) for key in store.run_keys()), key=repr)


def through_informer(plural: str, line: bytes, before: dict[str, Any] | None) -> tuple[list[Any], list[Any]]:
    """(what the cache holds, the runs re-planned) after the informer took the event."""
    cache, changed = RunCache(), cast(list[Any], [])
    if before is not None:
        store_of(cache, plural).upsert(before)
    prefix = "/api/v1" if plural == "pods" else "/apis/batch/v1"
    informer = Informer(
        cast(Kube, None),
        cache,
        store_of(cache, plural),
        prefix,
        plural,
        naming.LABEL_RUN,
        (),
        lambda key, _ending: changed.append(key),
    )
    assert informer._event(None, line)
    return held(cache, plural), changed


def through_json_loads(
    plural: str, line: bytes, before: dict[str, Any] | None
) -> tuple[list[Any], list[Any]]:
    """The same with the event decoded whole by the standard library and stored as it is."""
    cache, changed = RunCache(), cast(list[Any], [])
    store = store_of(cache, plural)
    if before is not None:
        store.upsert(before)
    event = json.loads(line)
    key = store.delete(event["object"]) if event["type"] == "DELETED" else store.upsert(event["object"])
    if key is not None:
        changed.append(key)
    return held(cache, plural), changed


# Deadline off (the suite's profile, tests/conftest.py); more examples than the default, for the
# shapes that matter (markers in strings, a field order that differs) are a share of what is drawn.
@settings(max_examples=300)
@given(watch_events())
def test_observing_the_informers_decode_equals_observing_the_full_decode(case: tuple[str, bytes]) -> None:
    plural, line = case
    whole = json.loads(line)
    assert observed(plural, decode_json(line)["object"]) == observed(plural, whole["object"])
    # Through the watch path itself, into the cache: a DELETED event needs the object held first.
    before = json.loads(line)["object"] if whole["type"] == "DELETED" else None
    assert through_informer(plural, line, before) == through_json_loads(plural, line, before)
    view = observed(plural, whole["object"])[0]
    event_label(f"{plural}: {'observed' if view is not None else 'not ours'}")
    if plural == "pods" and view is not None and view.node_name:
        event_label("pods: bound to a node")


def test_a_pods_node_survives_the_decode_of_a_modified_event() -> None:
    """The scheduler's binding reaches the operator as a MODIFIED event with `spec.nodeName`: the
    next iteration's pod prefers that node (docs/design.md#next-pod-placement)."""
    pod = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": "run-iter-1-abc",
            "namespace": "ns",
            "uid": "u-1",
            "resourceVersion": "12",
            "labels": {"job-name": "run-iter-1", naming.LABEL_RUN: "run"},
            "managedFields": [{"manager": "kube-scheduler", "fieldsV1": {"f:spec": {"f:nodeName": {}}}}],
        },
        "spec": {"nodeName": "node-a", "containers": [{"name": "main", "image": "busybox:1.36"}]},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]},
    }
    line = json.dumps({"type": "MODIFIED", "object": pod}, separators=(",", ":")).encode()
    (((key, [(_identity, view)]),), _changed) = through_informer("pods", line, None)
    assert key == ("ns", "run") and view.node_name == "node-a"
