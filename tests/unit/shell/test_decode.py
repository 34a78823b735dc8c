"""`decode_object_json`: an object or watch event decoded without its managedFields, everything else
exactly as `decode_json` gives it -- whatever the strings in it spell."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agentrun_operator.shell.kube import decode_json, decode_object_json

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
