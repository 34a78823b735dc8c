"""`decode_object_json`: an object or watch event decoded without its managedFields, everything else
exactly as `decode_json` gives it -- whatever the strings in it spell. `decode_status_json` (and the
Pod and Job decoders on it): the same without the spec's text, of which only the asked-for scalar
fields are kept; every text of another shape decodes as `decode_object_json` would."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import event as event_label
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun_operator.shell.codec import (
    decode_job_event,
    decode_json,
    decode_object_json,
    decode_pod_event,
    decode_status_json,
)

MANAGED = [
    {
        "manager": "kube-controller-manager",
        "operation": "Update",
        "apiVersion": "batch/v1",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:status": {"f:conditions": {'k:{"type":"Complete"}': {".": {}}}, "f:ready": {}}},
        "subresource": "status",
    }
]


def job(annotations: dict[str, str], managed: list[dict[str, Any]] | None = MANAGED) -> dict[str, Any]:
    """A Job as the API server writes it: metadata's fields in its order, managedFields last."""
    meta: dict[str, Any] = {
        "name": "run-step-1-iter-1-attempt-1",
        "namespace": "ns",
        "uid": "u-1",
        "resourceVersion": "42",
        "labels": {"agents.proompteng.ai/agent-run": "run"},
        "annotations": annotations,
    }
    if managed is not None:
        meta["managedFields"] = managed
    return {
        "kind": "Job",
        "apiVersion": "batch/v1",
        "metadata": meta,
        "spec": {"template": {"metadata": {"annotations": annotations}}},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }


def without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    found = json.loads(json.dumps(obj))
    found["object"]["metadata"].pop("managedFields", None)
    return dict(found)


def event_text(obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": "MODIFIED", "object": obj}, separators=(",", ":")).encode()


def test_a_watch_event_loses_its_managed_fields_and_nothing_else() -> None:
    text = event_text(job({"a": "b"}))
    assert decode_object_json(text) == without_managed_fields(decode_json(text))
    assert "managedFields" not in decode_object_json(text)["object"]["metadata"]


def test_strings_that_spell_the_markers_change_nothing() -> None:
    tricky = {
        "x": ',"managedFields":[',
        "y": ']},"spec":{',
        "z": '"metadata":{]}',
    }
    text = event_text(job(tricky, managed=[{"manager": ']},"spec":', "fieldsV1": {'v:"]},"spec":"': {}}}]))
    assert decode_object_json(text) == without_managed_fields(decode_json(text))


def test_an_object_without_managed_fields_or_spec_is_decoded_whole() -> None:
    for obj in (job({}, managed=None), {"metadata": {"name": "x", "managedFields": MANAGED}}):
        text = json.dumps(obj, separators=(",", ":")).encode()
        assert decode_object_json(text) == decode_json(text)


@given(st.dictionaries(st.text(max_size=12), st.text(max_size=24), max_size=4), st.text(max_size=24))
def test_any_annotations_and_manager_names(annotations: dict[str, str], manager: str) -> None:
    text = event_text(job(annotations, managed=[{"manager": manager, "fieldsV1": {f"f:{manager}": {}}}]))
    assert decode_object_json(text) == without_managed_fields(decode_json(text))


# -- decode_status_json ----------------------------------------------------------------------------

TTL = "ttlSecondsAfterFinished"
MARKERS = [',"spec":{', '},"status":{', ',"managedFields":[', ']},"spec":', '"ttlSecondsAfterFinished":5,']
"""Texts that, unescaped, would be what the decoders look for; in a string their quotes are escaped."""

MANAGED_SPEC = [
    {
        "manager": "agentrun-operator",
        "operation": "Apply",
        "apiVersion": "batch/v1",
        "time": "2026-01-01T00:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {
            "f:spec": {
                "f:template": {"f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}, "f:image": {}}}}},
                "f:ttlSecondsAfterFinished": {},
            }
        },
    },
    *MANAGED,
]


def compact(value: Any) -> bytes:
    """JSON text as kube-apiserver writes it: no spaces, non-ASCII as itself."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def api_metadata(name: str, owner_kind: str) -> dict[str, Any]:
    """Metadata in the API server's order, managedFields last; annotations spell every marker, one
    of them is a whole object's JSON (as `kubectl apply` leaves it)."""
    applied = {"kind": "Job", "metadata": {"name": name}, "spec": {TTL: 7}, "status": {"x": {}}}
    return {
        "name": name,
        "namespace": "ns",
        "uid": f"{name}-uid",
        "resourceVersion": "42",
        "generation": 1,
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "labels": {"agents.proompteng.ai/agent-run": "run", "spec": "status"},
        "annotations": {
            **{f"m{i}": marker for i, marker in enumerate(MARKERS)},
            "kubectl.kubernetes.io/last-applied-configuration": compact(applied).decode(),
            "quote": 'a "b" \\"c\\" \\',
            "ünï": "cödé ☃",
        },
        "ownerReferences": [
            {
                "apiVersion": "agents.proompteng.ai/v1alpha1",
                "kind": owner_kind,
                "name": "run",
                "uid": "run-uid",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
        "managedFields": MANAGED_SPEC,
    }


def pod_spec() -> dict[str, Any]:
    """A Pod's spec; its env and annotations spell the TTL's name and the markers, as values."""
    return {
        "volumes": [{"name": "work", "emptyDir": {}}],
        "containers": [
            {
                "name": "main",
                "image": "ghcr.io/proompteng/agent:1.2.3",
                "command": ["/bin/sh", "-c", 'echo \'{"spec":{},"status":{}}\''],
                "env": [{"name": TTL, "value": "5"}, {"name": "M", "value": MARKERS[1]}],
                "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "securityContext": {},
        "schedulerName": "default-scheduler",
        "enableServiceLinks": True,
    }


def api_pod() -> dict[str, Any]:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": api_metadata("run-step-1-iter-1-attempt-1-x7k2p", "Job"),
        "spec": pod_spec(),
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True", "lastProbeTime": None},
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None},
            ],
            "containerStatuses": [
                {"name": "main", "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}, "ready": True}
            ],
        },
    }


def api_job(ttl: int | None = 30, nested_ttl: bool = True) -> dict[str, Any]:
    """A Job in the Go struct's field order: the TTL after the template, which may hold keys of the
    TTL's name deeper (an annotation here; a number in a made-up nested object)."""
    template: dict[str, Any] = {"metadata": {"labels": {"a": "b"}}, "spec": pod_spec()}
    if nested_ttl:
        template["metadata"]["annotations"] = {TTL: "99"}
        template["spec"]["containers"][-1]["extra"] = {TTL: 99, "inner": {TTL: 98}}
    spec: dict[str, Any] = {
        "parallelism": 1,
        "completions": 1,
        "backoffLimit": 0,
        "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "u"}},
        "manualSelector": False,
        "template": template,
    }
    if ttl is not None:
        spec[TTL] = ttl
    spec |= {"completionMode": "NonIndexed", "suspend": False, "podReplacementPolicy": "TerminatingOrFailed"}
    return {
        "kind": "Job",
        "apiVersion": "batch/v1",
        "metadata": api_metadata("run-step-1-iter-1-attempt-1", "AgentRun"),
        "spec": spec,
        "status": {
            "conditions": [
                {"type": "Complete", "status": "True", "lastTransitionTime": "2026-01-01T00:01:00Z"}
            ],
            "startTime": "2026-01-01T00:00:00Z",
            "succeeded": 1,
            "uncountedTerminatedPods": {},
        },
    }


def reduced(obj: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The object as the decoders should give it: no managedFields, `spec` as given."""
    found = json.loads(json.dumps(obj))
    found["metadata"].pop("managedFields", None)
    found["spec"] = spec
    return dict(found)


def as_text(obj: dict[str, Any], event: str | None) -> bytes:
    """The object alone (a GET's answer) or as one watch event line."""
    return compact(obj if event is None else {"type": event, "object": obj})


def wrapped(obj: dict[str, Any], event: str | None) -> Any:
    return obj if event is None else {"type": event, "object": obj}


EVENTS = [None, "ADDED", "MODIFIED", "DELETED"]


def test_markers_in_strings_are_escaped_text() -> None:
    """Why a marker is found only where it is JSON structure: inside a string its quotes are `\\"`."""
    text = as_text(api_pod(), "MODIFIED")
    for marker in MARKERS:
        assert marker.encode() not in compact(marker)
        assert marker.replace('"', '\\"').encode() in text
    assert text.count(b',"spec":{') == 1
    assert text.count(b'},"status":{') == 1


@pytest.mark.parametrize("event", EVENTS)
def test_a_pod_keeps_metadata_and_status_and_an_empty_spec(event: str | None) -> None:
    pod = api_pod()
    assert decode_pod_event(as_text(pod, event)) == wrapped(reduced(pod, {}), event)


@pytest.mark.parametrize("event", EVENTS)
def test_a_job_keeps_its_top_level_ttl_only(event: str | None) -> None:
    job_ = api_job(ttl=30)
    assert decode_job_event(as_text(job_, event)) == wrapped(reduced(job_, {TTL: 30}), event)


@pytest.mark.parametrize("event", EVENTS)
def test_a_job_without_a_ttl_gets_an_empty_spec_though_its_template_spells_one(event: str | None) -> None:
    job_ = api_job(ttl=None)
    assert decode_job_event(as_text(job_, event)) == wrapped(reduced(job_, {}), event)


def test_a_key_that_ends_in_the_ttls_name_is_another_key() -> None:
    """`x"ttlSecondsAfterFinished` is written `"x\\"ttlSecondsAfterFinished":`: its end spells the
    TTL's key, but not after `{` or `,`."""
    job_ = api_job(ttl=None)
    job_["spec"] = {'x"' + TTL: 5, **job_["spec"], '"' + TTL: 6}
    for event in EVENTS:
        assert decode_job_event(as_text(job_, event)) == wrapped(reduced(job_, {}), event)


def test_the_ttl_is_found_wherever_it_is_among_the_specs_fields() -> None:
    job_ = api_job(ttl=None)
    job_["spec"] = {TTL: 0, **job_["spec"]}
    assert decode_job_event(as_text(job_, "ADDED")) == wrapped(reduced(job_, {TTL: 0}), "ADDED")


@pytest.mark.parametrize(
    "value", [0, -3, 1.5, -2.5e-3, 1e300, 10**30, True, False, None, "", "plain", 'q"u\\o\u00e9\n\u2028te']
)
def test_every_scalar_is_kept_as_decode_json_reads_it(value: Any) -> None:
    job_ = api_job(ttl=None)
    job_["spec"]["a"] = value
    text = as_text(job_, "MODIFIED")
    assert decode_status_json(text, (TTL, "a", "absent")) == wrapped(reduced(job_, {"a": value}), "MODIFIED")
    assert decode_status_json(text, ("a",))["object"]["spec"]["a"] == decode_json(text)["object"]["spec"]["a"]


@pytest.mark.parametrize("value", [{}, {"a": 1}, [], [1, 2], [{TTL: 1}]])
def test_a_field_that_is_not_a_scalar_leaves_the_spec_whole(value: Any) -> None:
    """Fuller, never wrong: the whole spec rather than one without a field that is there."""
    job_ = api_job()
    job_["spec"][TTL] = value
    text = as_text(job_, None)
    assert decode_job_event(text) == decode_object_json(text)
    assert decode_job_event(text)["spec"][TTL] == value


def test_a_field_written_twice_leaves_the_spec_whole() -> None:
    text = (
        b'{"kind":"Job","metadata":{"name":"j"},'
        b'"spec":{"a":{},"ttlSecondsAfterFinished":1,"ttlSecondsAfterFinished":2},"status":{}}'
    )
    assert decode_job_event(text) == decode_object_json(text)


def test_a_status_object_in_the_spec_changes_nothing() -> None:
    job_ = api_job()
    job_["spec"]["template"]["status"] = {"a": {}, "status": {}}
    for event in EVENTS:
        assert decode_job_event(as_text(job_, event)) == wrapped(reduced(job_, {TTL: 30}), event)


def test_a_status_object_in_the_status_leaves_the_spec_whole() -> None:
    """The last `},"status":{` is then not the object's: the cut text's brackets do not pair up, and
    the text decodes as `decode_object_json` would (no Pod or Job status holds one)."""
    job_ = api_job()
    job_["status"]["x"] = {"a": {}, "status": {"b": {}, "status": {}}}
    for event in EVENTS:
        text = as_text(job_, event)
        assert (
            decode_job_event(text) == decode_object_json(text) == wrapped(reduced(job_, job_["spec"]), event)
        )


def shapes() -> list[dict[str, Any]]:
    """Objects that are not of the shape the cut needs; each must decode as `decode_object_json`."""
    no_status = api_job()
    del no_status["status"]
    no_spec = api_job()
    del no_spec["spec"]
    status_first = api_job()
    status_first = {
        "metadata": status_first["metadata"],
        "status": status_first["status"],
        "spec": status_first["spec"],
    }
    string_status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 410}
    spec_in_metadata = api_job()
    spec_in_metadata["metadata"] = {"name": "x", "odd": {"a": 1, "spec": {"b": {}}}}
    cut_inside_metadata = api_job()  # a first spec and a last status that pair up, both too deep
    cut_inside_metadata["metadata"] = {"name": "x", "odd": {"a": 1, "spec": {}}}
    cut_inside_metadata["status"] = {"y": {"x": {}, "status": {}}}
    null_spec = api_job()
    null_spec["spec"] = None
    spec_status_no_object = {"spec": {"a": 1}, "status": {}}
    no_status_spec_holds_one = api_job()
    del no_status_spec_holds_one["status"]
    no_status_spec_holds_one["spec"]["template"]["status"] = {"a": {}, "status": {}}
    return [
        no_status,
        no_spec,
        status_first,
        string_status,
        spec_in_metadata,
        cut_inside_metadata,
        null_spec,
        spec_status_no_object,
        no_status_spec_holds_one,
    ]


@pytest.mark.parametrize("obj", shapes())
@pytest.mark.parametrize("event", [*EVENTS, "ERROR", "BOOKMARK"])
def test_other_shapes_decode_as_decode_object_json(obj: dict[str, Any], event: str | None) -> None:
    text = as_text(obj, event)
    assert decode_job_event(text) == decode_object_json(text)
    assert decode_pod_event(text) == decode_object_json(text)


@pytest.mark.parametrize(
    "text",
    [
        b"",
        b"null",
        b"42",
        b'"x"',
        b"[1,2]",
        b'[{"a":1,"spec":{}},{"b":{},"status":{}}]',
        b"{",
        b"not json",
        b"{}",
    ],
)
def test_text_that_is_no_object_decodes_or_fails_as_decode_json(text: bytes) -> None:
    try:
        expected = decode_json(text)
    except ValueError:
        with pytest.raises(ValueError):
            decode_pod_event(text)
        with pytest.raises(ValueError):
            decode_job_event(text)
    else:
        assert decode_pod_event(text) == expected
        assert decode_job_event(text) == expected


def test_every_truncation_decodes_or_fails_as_decode_object_json() -> None:
    """A watch connection dropped mid-line: no prefix of an event decodes into something else."""
    text = as_text(api_job(), "MODIFIED")
    for end in range(len(text)):
        part = text[:end]
        try:
            expected = decode_object_json(part)
        except ValueError:
            with pytest.raises(ValueError):
                decode_job_event(part)
        else:  # pragma: no cover - no proper prefix of an object is JSON
            assert decode_job_event(part) == expected


def test_a_spec_key_that_is_not_a_plain_field_name_is_refused() -> None:
    """Its text as the API server writes it may differ from ours, so it could be missed and the
    field taken for absent."""
    with pytest.raises(ValueError, match="plain field name"):
        decode_status_json(b"{}", ("a-b",))


TEXT = st.one_of(st.sampled_from(MARKERS), st.text(st.characters(exclude_categories=["Cs"]), max_size=16))
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64),
    st.floats(allow_nan=False, allow_infinity=False),  # NaN and infinities are no JSON
    TEXT,
)
KEYS = st.sampled_from([TTL, "a", "spec", "status", "metadata", "managedFields", "template", 'x"' + TTL])
SPEC_KEYS = st.sampled_from([TTL, "a", "spec", "status", "metadata", "template", 'x"' + TTL])
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.one_of(KEYS, TEXT), inner, max_size=4),
    max_leaves=12,
)
"""Any JSON value, its strings including the markers and its keys often the names looked for."""
SPEC_VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.one_of(SPEC_KEYS, TEXT), inner, max_size=4)
    ),
    max_leaves=12,
)
"""`VALUES` as a Pod's or a Job's spec and status hold them: no `managedFields` key at any depth."""


@st.composite
def api_objects(draw: st.DrawFn) -> dict[str, Any]:
    """Objects in the API server's field order; spec and status may be missing or of any type, and
    the spec's fields looked for are often there (mostly scalars), at its top or deeper."""
    meta: dict[str, Any] = {"name": draw(TEXT), "namespace": "ns", "resourceVersion": "7"}
    meta["labels"] = draw(st.dictionaries(st.one_of(KEYS, TEXT), TEXT, max_size=4))
    meta["annotations"] = draw(st.dictionaries(st.one_of(KEYS, TEXT), TEXT, max_size=4))
    if draw(st.booleans()):
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": draw(TEXT), "uid": "u"}]
    if draw(st.booleans()):
        manager = draw(TEXT)
        fields = {f"f:{manager}": {}, "f:spec": {"f:a": {}}}
        meta["managedFields"] = [{"manager": manager, "fieldsV1": fields}]
    obj: dict[str, Any] = {"kind": "Job", "apiVersion": "batch/v1", "metadata": meta}
    # Only metadata has `managedFields`: a Pod's or a Job's spec and status have no field of that name
    # (their schemas are fixed), and the managedFields cut looks for the key's text.
    specs = st.dictionaries(SPEC_KEYS, SPEC_VALUES, max_size=5)
    spec = draw(st.one_of(specs, specs, specs, SPEC_VALUES, st.just(None)))  # mostly of the shape cut
    if isinstance(spec, dict):
        for key in (TTL, "a"):
            if draw(st.integers(0, 3)):  # there three times in four
                spec[key] = draw(st.one_of(SCALARS, SCALARS, SPEC_VALUES))
        if draw(st.booleans()):  # the spec's own fields in another order
            spec = dict(reversed(spec.items()))
    statuses = st.dictionaries(st.one_of(SPEC_KEYS, TEXT), SPEC_VALUES, max_size=4)
    status = draw(st.one_of(statuses, statuses, statuses, SPEC_VALUES, st.just(None)))
    if spec is not None or draw(st.booleans()):
        obj["spec"] = spec
    if status is not None or draw(st.booleans()):
        obj["status"] = status
    return obj


SCALAR_TYPES = (type(None), bool, int, float, str)


# Deadline deliberately off (also the suite's profile, tests/conftest.py): an example is a few
# decodes of small texts, but generating the nested values varies widely in time on a loaded
# 2-core machine, which says nothing about correctness. More examples than the default: the shapes
# that matter (markers in strings, a nested `status`) are a small share of what is drawn.
@settings(deadline=None, max_examples=200)
@given(
    api_objects(),
    st.sampled_from([None, "ADDED", "MODIFIED", "DELETED"]),
    st.sampled_from([(TTL, "a"), (TTL,), ("spec", "status"), ()]),
    st.booleans(),
)
def test_any_object_decodes_as_the_full_decode_with_its_spec_cut(
    obj: dict[str, Any], event: str | None, keys: tuple[str, ...], ascii_only: bool
) -> None:
    text = json.dumps(wrapped(obj, event), separators=(",", ":"), ensure_ascii=ascii_only).encode()
    found = decode_status_json(text, keys)
    whole = decode_object_json(text)
    found_obj, whole_obj = (found, whole) if event is None else (found["object"], whole["object"])
    assert found_obj["metadata"] == whole_obj["metadata"]
    assert found_obj.get("status", "missing") == whole_obj.get("status", "missing")
    assert found_obj.keys() == whole_obj.keys()
    if event is not None:
        assert found["type"] == event
    spec, status = obj.get("spec"), obj.get("status")
    scalars = all(not isinstance(spec, dict) or type(spec.get(k)) in SCALAR_TYPES for k in keys)
    # A status whose own text holds `},"status":{` (a `status` object after an object) hides the
    # object's: the text is then decoded whole. No Pod or Job status has one.
    hidden = b'},"status":{' in json.dumps(status, separators=(",", ":"), ensure_ascii=ascii_only).encode()
    if isinstance(spec, dict) and isinstance(status, dict) and scalars and not hidden:
        kept = {k: spec[k] for k in keys if k in spec}
        event_label("spec cut, a field kept" if kept else "spec cut to {}")
        assert found == wrapped(reduced(obj, kept), event)
    else:
        event_label("decoded whole")
        assert found == whole
