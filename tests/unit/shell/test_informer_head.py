"""The informer reads an event's identity from the start of its text, and skips decoding the echo
of an object the cache already holds at that version (our own write, written through)."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from agentrun_operator import naming
from agentrun_operator.shell import informer as informer_module
from agentrun_operator.shell.cache import RunCache
from agentrun_operator.shell.codec import builtin_head, decode_json
from agentrun_operator.shell.informer import Informer
from agentrun_operator.shell.kube import Kube


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


def _pod(version: int, generate: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p-1"}
    if generate:
        meta["generateName"] = "p-"
    meta |= {
        "namespace": "ns",
        "uid": "u-1",
        "resourceVersion": str(version),
        "labels": {"name": "decoy", "job-name": "j", naming.LABEL_RUN: "r"},
    }
    # Built-in kinds are written from Go structs: kind, apiVersion, metadata (name, generateName,
    # namespace, uid, resourceVersion, ...), spec, status.
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": {}, "status": {"phase": "Running"}}


@pytest.mark.parametrize("generate", [True, False])
def test_builtin_head_reads_the_identity_of_added_and_modified(generate: bool) -> None:
    for kind in ("ADDED", "MODIFIED"):
        assert builtin_head(_line({"type": kind, "object": _pod(42, generate)})) == ("ns", "p-1", "u-1", 42)
    for kind in ("DELETED", "BOOKMARK", "ERROR"):
        assert builtin_head(_line({"type": kind, "object": _pod(42, generate)})) is None


def test_builtin_head_refuses_text_of_another_shape() -> None:
    sorted_keys = json.dumps({"type": "ADDED", "object": _pod(1)}, separators=(",", ":"), sort_keys=True)
    assert builtin_head(sorted_keys.encode()) is None
    escaped = _pod(1)
    escaped["metadata"]["name"] = 'p-"1'
    assert builtin_head(_line({"type": "ADDED", "object": escaped})) is None
    assert builtin_head(b"not json") is None


class _Decodes:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, data: bytes) -> Any:
        self.calls += 1
        return decode_json(data)


def test_the_echo_of_what_the_cache_holds_is_not_decoded_and_anything_newer_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = RunCache()
    decode = _Decodes()
    monkeypatch.setattr(informer_module, "decode_json", decode)
    changed: list[Any] = []
    informer = Informer(
        cast(Kube, None),
        cache,
        cache.pods,
        "/api/v1",
        "pods",
        naming.LABEL_RUN,
        (),
        changed.append,
        head=builtin_head,
    )
    cache.pods.upsert(_pod(7))  # e.g. what a write's answer put in the cache
    assert informer._event(None, _line({"type": "MODIFIED", "object": _pod(7)}))
    assert decode.calls == 0 and changed == []
    assert informer._resume[None] == 7  # the watch resumes after it all the same
    newer = _pod(8)
    newer["status"] = {"phase": "Succeeded"}
    assert informer._event(None, _line({"type": "MODIFIED", "object": newer}))
    assert decode.calls == 1 and changed == [("ns", "r")]
    # A namesake (another uid) at an old version is decoded: it is another object.
    other = _pod(3)
    other["metadata"]["uid"] = "u-other"
    informer._event(None, _line({"type": "MODIFIED", "object": other}))
    assert decode.calls == 2
