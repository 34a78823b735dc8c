"""Bad input on a real watch (docs/design.md#watch-path): the API server is real, and `WatchProxy`
between it and an informer garbles a line, sends an event of another shape, strips a field a
reader reads, or keeps a stream silent (a 410 Gone: tests/unit/shell/test_watch_bad_input.py through
the decode, tests/integration/test_watch_gone.py from a real API server).
Each time the informer goes on -- resumes, or skips with a warning -- and the object it was sent
still arrives: never a crash, never a lost change. Nothing here is timed but a hung task's
timeout."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_operator.shell import informer
from agentrun_operator.shell.cache import Store
from agentrun_operator.shell.kube import Kube
from tests.integration.watch_proxy import StreamPolicy, WatchProxy
from tests.support.api import ready_namespace
from tests.support.informers import configmap_informer
from tests.support.polling import until

NAMESPACE = "badwatch"
HUNG = 120.0  # seconds: only a hung task takes this long


@pytest.fixture(scope="module")
def proxy(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WatchProxy]:
    ready_namespace(control_plane, NAMESPACE)
    proxy = WatchProxy(control_plane, tmp_path_factory.mktemp("proxy")).start()
    try:
        yield proxy
    finally:
        proxy.stop()


Body = Callable[[Kube, Store, informer.Informer], Awaitable[None]]


def _through(kubeconfig: str, label: str, body: Body) -> None:
    """Run `body` with an informer of the ConfigMaps labelled `label` (their `data` is the view)."""

    async def main() -> None:
        kube = await Kube.connect(kubeconfig)
        cache, store, watcher = configmap_informer(kube, f"{label}=yes", NAMESPACE)
        watcher.start()
        try:
            await asyncio.wait_for(cache.ready.wait(), HUNG)
            await body(kube, store, watcher)
        finally:
            await watcher.stop()
            await kube.close()

    asyncio.run(main())


async def _create(kube: Kube, name: str, label: str, data: dict[str, str]) -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {label: "yes"}},
        "data": data,
    }
    status, body = await kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps", body=manifest)
    assert status == 201, body


def _data(store: Store, name: str) -> Any:
    return store.view_of((NAMESPACE, "all"), name)[1]


def _once(match: bytes, instead: Callable[[bytes], list[bytes]]) -> Callable[[bytes], list[bytes] | None]:
    """A rewrite of the first line that contains `match`; every later line goes as it is."""
    done: list[bool] = []

    def rewrite(line: bytes) -> list[bytes] | None:
        if done or match not in line:
            return None
        done.append(True)
        return instead(line)

    return rewrite


def test_a_garbled_line_resumes_the_watch_and_the_event_comes_again(proxy: WatchProxy) -> None:
    policy = proxy.policies["configmaps"] = StreamPolicy(
        rewrite=_once(b"garbled-1", lambda line: [line[:40] + b"\n"])
    )

    async def body(kube: Kube, store: Store, _w: informer.Informer) -> None:
        listed = kube.counters.reads
        await _create(kube, "garbled-1", "garbled", {"k": "v"})
        await until(lambda: _data(store, "garbled-1") == {"k": "v"}, HUNG, "the garbled event, sent again")
        assert kube.counters.reads == listed  # resumed from where it was, not listed again

    try:
        _through(str(proxy.kubeconfig), "garbled", body)
    finally:
        proxy.policies.clear()
    assert policy.rewritten == 1 and policy.streams >= 2


def test_an_event_of_another_shape_is_skipped_and_the_watch_goes_on(proxy: WatchProxy) -> None:
    odd = b'{"type":"MODIFIED","object":["not","an","object"]}\n'
    policy = proxy.policies["configmaps"] = StreamPolicy(rewrite=_once(b"shaped-1", lambda line: [odd, line]))

    async def body(kube: Kube, store: Store, _w: informer.Informer) -> None:
        await _create(kube, "shaped-1", "shaped", {"k": "v"})
        await until(lambda: _data(store, "shaped-1") == {"k": "v"}, HUNG, "the event after the odd one")

    try:
        _through(str(proxy.kubeconfig), "shaped", body)
    finally:
        proxy.policies.clear()
    assert policy.rewritten == 1


def test_an_object_lacking_a_field_a_reader_reads_is_stored_and_its_next_change_arrives(
    proxy: WatchProxy,
) -> None:
    def strip(line: bytes) -> list[bytes]:
        event = json.loads(line)
        del event["object"]["data"]
        return [json.dumps(event).encode() + b"\n"]

    policy = proxy.policies["configmaps"] = StreamPolicy(rewrite=_once(b"stripped-1", strip))

    async def body(kube: Kube, store: Store, _w: informer.Informer) -> None:
        await _create(kube, "stripped-1", "stripped", {"k": "v"})
        await until(lambda: store.view_of((NAMESPACE, "all"), "stripped-1")[0], HUNG, "the stripped object")
        assert _data(store, "stripped-1") is None  # read as having none
        patch = {"data": {"k": "w"}}
        path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/stripped-1"
        status, _ = await kube.request("PATCH", path, body=patch, content_type="application/merge-patch+json")
        assert status == 200
        await until(lambda: _data(store, "stripped-1") == {"k": "w"}, HUNG, "its next change")

    try:
        _through(str(proxy.kubeconfig), "stripped", body)
    finally:
        proxy.policies.clear()
    assert policy.rewritten == 1


def test_a_silent_stream_is_given_up_and_resumed(proxy: WatchProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(informer, "SILENT_SECONDS", 2)
    policy = proxy.policies["configmaps"] = StreamPolicy(silent_streams=1)

    async def body(kube: Kube, store: Store, _w: informer.Informer) -> None:
        await _create(kube, "silent-1", "silent", {"k": "v"})
        await until(lambda: _data(store, "silent-1") == {"k": "v"}, HUNG, "the event the silent stream held")

    try:
        _through(str(proxy.kubeconfig), "silent", body)
    finally:
        proxy.policies.clear()
    assert policy.streams >= 2
