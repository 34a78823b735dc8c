"""Bad input on the watch path, through the real decode (docs/design.md#watch-path): an object that
lacks fields a reader reads, text that is not JSON, an event of another shape, a 410 Gone. Each is
handled -- read with defaults, resumed, skipped with a warning, listed afresh -- never a crash, and
the watch resumes from the last version it delivered, so nothing after it is lost."""

from __future__ import annotations

import json
import logging
from typing import Any, cast

import pytest

from agentrun_operator import naming
from agentrun_operator.shell.cache import RunCache
from agentrun_operator.shell.informer import Informer
from agentrun_operator.shell.kube import Kube


def _informer(
    cache: RunCache, changed: list[Any], plural: str = "pods", endings: list[bool] | None = None
) -> Informer:
    """An informer of the runs' pods (or Jobs) into `cache`; each run key it enqueues goes to
    `changed`, and whether the change ends an attempt (a turnaround) to `endings`."""

    def on_change(key: Any, ending: bool) -> None:
        changed.append(key)
        if endings is not None:
            endings.append(ending)

    store, prefix = (cache.pods, "/api/v1") if plural == "pods" else (cache.jobs, "/apis/batch/v1")
    return Informer(cast(Kube, None), cache, store, prefix, plural, naming.LABEL_RUN, (), on_change)


def _line(event: Any) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


def _pod(version: str, **fields: Any) -> dict[str, Any]:
    meta = {
        "name": "p",
        "namespace": "ns",
        "uid": "u",
        "resourceVersion": version,
        "labels": {"job-name": "j", naming.LABEL_RUN: "r"},
    }
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, **fields}


def test_an_object_lacking_what_readers_read_is_stored_as_having_none() -> None:
    """No spec, no status, no containers: the pod is read as pending with nothing known yet, and a
    later whole event of it is news as usual."""
    cache, changed = RunCache(), cast(list[Any], [])
    informer = _informer(cache, changed)
    assert informer._event(None, _line({"type": "ADDED", "object": _pod("7")}))
    ((_obj, view),) = cache.pods.entries(("ns", "r"))
    assert (view.phase, view.node_name, view.main_exit_code) == ("Pending", None, None)
    status = {"phase": "Succeeded", "containerStatuses": [{"name": "main", "state": {}}]}
    assert informer._event(None, _line({"type": "MODIFIED", "object": _pod("8", status=status)}))
    assert changed[-1] == ("ns", "r") and informer._resume[None] == "8"


def test_an_object_without_metadata_is_not_stored_and_the_watch_goes_on() -> None:
    cache, changed = RunCache(), cast(list[Any], [])
    informer = _informer(cache, changed)
    assert informer._event(None, _line({"type": "ADDED", "object": {"kind": "Pod"}}))
    assert informer._event(None, _line({"type": "DELETED", "object": {}}))
    assert len(cache.pods) == 0 and changed == []


@pytest.mark.parametrize(
    "text", [b'{"type":"MODIFIED","object":{"kind":"Pod","meta', b"\xff\xfe", b"not json"]
)
def test_text_that_is_not_json_ends_the_watch_where_it_was(text: bytes) -> None:
    """The decode refuses it (ValueError); the informer's loop then resumes the watch from the last
    version delivered, and the API server sends that event again, whole."""
    cache, changed = RunCache(), cast(list[Any], [])
    informer = _informer(cache, changed)
    assert informer._event(None, _line({"type": "ADDED", "object": _pod("7")}))
    with pytest.raises(ValueError):
        informer._event(None, text)
    assert informer._resume[None] == "7"


@pytest.mark.parametrize(
    "event",
    [
        [],
        "MODIFIED",
        7,
        {"type": "MODIFIED"},
        {"type": "MODIFIED", "object": []},
        {"type": "X", "object": {}},
    ],
)
def test_an_event_of_another_shape_is_skipped_with_a_warning(
    event: Any, caplog: pytest.LogCaptureFixture
) -> None:
    cache, changed = RunCache(), cast(list[Any], [])
    informer = _informer(cache, changed)
    with caplog.at_level(logging.WARNING, logger="agentrun.informer"):
        assert informer._event(None, _line(event))
    assert "skipped an event of unknown shape" in caplog.text
    assert len(cache.pods) == 0 and changed == []


def test_a_410_gone_ends_the_watch_and_lists_afresh() -> None:
    cache, changed = RunCache(), cast(list[Any], [])
    informer = _informer(cache, changed)
    assert informer._event(None, _line({"type": "ADDED", "object": _pod("7")}))
    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version: 7"}
    assert not informer._event(None, _line({"type": "ERROR", "object": gone}))
    assert None not in informer._resume  # the next round LISTs, and the watch resumes from the list


def test_a_bookmark_moves_the_resume_point_and_stores_nothing() -> None:
    cache, changed = RunCache(), cast(list[Any], [])
    informer = _informer(cache, changed)
    bookmark = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "opaque-9"}}
    assert informer._event(None, _line({"type": "BOOKMARK", "object": bookmark}))
    assert informer._resume[None] == "opaque-9" and len(cache.pods) == 0


def _job(version: str, conditions: list[dict[str, str]]) -> dict[str, Any]:
    owner = {"apiVersion": "agents.proompteng.ai/v1alpha1", "kind": "AgentRun", "name": "r", "uid": "ru"}
    meta = {
        "name": "j",
        "namespace": "ns",
        "uid": "ju",
        "resourceVersion": version,
        "labels": {
            naming.LABEL_RUN: "r",
            naming.LABEL_STEP_INDEX: "0",
            naming.LABEL_STEP_ITERATION: "1",
            naming.LABEL_ATTEMPT: "1",
        },
        "ownerReferences": [owner],
    }
    return {"kind": "Job", "apiVersion": "batch/v1", "metadata": meta, "status": {"conditions": conditions}}


def _ended(container: str) -> dict[str, Any]:
    return {"name": container, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}


def test_a_pod_stopping_is_a_turnaround_and_its_creation_start_and_deletion_are_not() -> None:
    """Through the real decode: the change that stops a run's pod asks for its reconcile in the
    turnaround lane (shell/workqueue.py); a second pod of the Job arriving, and the pod's deletion,
    re-plan the run in the front lane."""
    cache, changed, endings = RunCache(), cast(list[Any], []), cast(list[bool], [])
    informer = _informer(cache, changed, endings=endings)
    running = {"phase": "Running", "containerStatuses": [{"name": "main", "state": {"running": {}}}]}
    assert informer._event(None, _line({"type": "ADDED", "object": _pod("1", status={"phase": "Pending"})}))
    assert informer._event(None, _line({"type": "MODIFIED", "object": _pod("2", status=running)}))
    assert changed == []  # pending and running are alike to every plan: nothing to re-plan
    stopped = {"phase": "Running", "containerStatuses": [_ended("main"), _ended("reporter")]}
    assert informer._event(None, _line({"type": "MODIFIED", "object": _pod("3", status=stopped)}))
    assert (changed, endings) == ([("ns", "r")], [True])
    second = _pod("4", status={"phase": "Pending"})
    second["metadata"]["name"], second["metadata"]["uid"] = "p2", "u2"
    assert informer._event(None, _line({"type": "ADDED", "object": second}))
    assert informer._event(None, _line({"type": "DELETED", "object": _pod("5", status=stopped)}))
    assert (changed, endings) == ([("ns", "r")] * 3, [True, False, False])


def test_a_job_failing_is_a_turnaround_and_a_job_completing_is_not() -> None:
    """A Job's failure may be all the operator ever sees of its attempt's end (its pod deleted or
    past its deadline), so it is a turnaround; a Job completing follows its pod's end, which was."""
    cache, changed, endings = RunCache(), cast(list[Any], []), cast(list[bool], [])
    informer = _informer(cache, changed, "jobs", endings)
    assert informer._event(None, _line({"type": "ADDED", "object": _job("1", [])}))
    failed = [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "too long"}]
    assert informer._event(None, _line({"type": "MODIFIED", "object": _job("2", failed)}))
    assert endings == [False, True]
    other = RunCache(), cast(list[Any], []), cast(list[bool], [])
    informer = _informer(other[0], other[1], "jobs", other[2])
    complete = [{"type": "Complete", "status": "True"}]
    assert informer._event(None, _line({"type": "ADDED", "object": _job("1", [])}))
    assert informer._event(None, _line({"type": "MODIFIED", "object": _job("2", complete)}))
    assert other[1] == [("ns", "r")] * 2 and other[2] == [False, False]
