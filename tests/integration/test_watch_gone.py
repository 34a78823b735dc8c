"""A 410 Gone from the real API server (docs/design.md#watch-path): a watch resumed from a
resourceVersion whose history etcd has compacted away is answered with an ERROR event, code 410,
reason Expired. The informer then lists afresh and watches on from the list, so its cache ends
equal to the server's objects, and a run whose Job finished meanwhile is recorded as if nothing had
happened.

How the 410 is made, with public knobs only. This module's own control plane serves ConfigMaps,
Jobs and Pods without the API server's watch cache (`--watch-cache-sizes=...#0`, the flag's one
meaningful size), so their watches are served from etcd; the watch cache cannot be made small
enough to drop a version (every non-zero size is the same), and against its window only time
ages a version out. `WatchProxy` keeps the informer deaf (it passes no event but ERRORs) while
objects change, so the version it would resume from stays old; the test then compacts etcd to its
current revision (etcd's own API, what kube-apiserver's `--etcd-compaction-interval` does every
5 minutes) and closes the stream. Nothing here is timed but a hung task's timeout, and the
operator's resync is pushed out of the test's way (3600 s), so the relist after the 410 is the only
way the missed changes come in.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_operator import naming
from agentrun_operator.shell.kube import Kube
from tests.integration.kubelet_driver import KubeletDriver, PodOutcome
from tests.integration.watch_proxy import StreamPolicy, WatchProxy
from tests.support import api
from tests.support.api import ready_namespace
from tests.support.claims import bound_claim
from tests.support.informers import configmap_informer
from tests.support.manifests import workflow_run
from tests.support.planes import started_control_plane
from tests.support.polling import eventually, until
from tests.support.processes import OperatorProcess

NAMESPACE = "gone"
UNCACHED = "--watch-cache-sizes=configmaps#0,jobs.batch#0,pods#0"
HUNG = 120.0  # seconds: only a hung task takes this long
NO_RESYNC = 3600  # the operator's longest resync period: none happens during a test
GONE = {"code": 410, "reason": "Expired"}
TOO_OLD = "The resourceVersion for the provided watch is too old."  # the API server's message


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, WatchProxy]]:
    with started_control_plane(tmp_path_factory.mktemp("plane"), (UNCACHED,)) as plane:
        ready_namespace(plane, NAMESPACE)
        bound_claim(plane, NAMESPACE)
        driver = KubeletDriver(plane, NAMESPACE, lambda _pod: PodOutcome()).start()
        proxy = WatchProxy(plane, tmp_path_factory.mktemp("proxy")).start()
        try:
            yield plane, proxy
        finally:
            proxy.stop()
            driver.stop()


def _deaf(event: dict[str, Any]) -> bool:
    """Drop every event but an ERROR (bookmarks too: the resume point must not move)."""
    return event.get("type") != "ERROR"


def _compact(plane: ControlPlane) -> int:
    """Compact etcd to its current revision through its own API (the JSON gateway on the client
    port): every watch resuming from an earlier revision is answered 410 from now on."""
    etcd = f"http://127.0.0.1:{plane.ports().etcd_client}"

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(etcd + path, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=30) as answer:
            return dict(json.loads(answer.read()))

    revision = int(post("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
    post("/v3/kv/compaction", {"revision": revision, "physical": True})
    return revision


def _gone(policy: StreamPolicy) -> list[dict[str, Any]]:
    return [e for e in policy.errors if {k: e.get(k) for k in GONE} == GONE]


def _configmap(name: str, label: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {label: "yes"}},
        "data": data,
    }


def test_a_410_gone_lists_afresh_and_the_cache_ends_equal_to_the_servers_objects(
    env: tuple[ControlPlane, WatchProxy],
) -> None:
    """The product's informer (shell/informer.py) through the real decode: a change, a deletion and
    a creation it never saw are all in its cache after the 410, and the deleted object is gone."""
    plane, proxy = env
    label = "gone-cache"
    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    for name in ("kept", "deleted"):  # in the informer's first LIST
        plane.kubectl("create", "-f", "-", input_text=json.dumps(_configmap(name, label, {"v": "1"})))
    policy = proxy.policies["configmaps"] = StreamPolicy(drop=_deaf)

    async def main() -> tuple[int, int]:
        kube = await Kube.connect(str(proxy.kubeconfig))
        cache, store, watcher = configmap_informer(kube, f"{label}=yes", NAMESPACE)

        def cached() -> dict[str, Any]:
            return {obj["metadata"]["name"]: view for obj, view in store.entries((NAMESPACE, "all"))}

        watcher.start()
        try:
            await asyncio.wait_for(cache.ready.wait(), HUNG)
            await until(lambda: policy.streams >= 1, HUNG, "the informer's watch")
            assert cached() == {"kept": {"v": "1"}, "deleted": {"v": "1"}}
            listed = kube.counters.reads
            # Unseen by the (deaf) watch: a change, a deletion, a creation.
            patch = {"data": {"v": "2"}}
            status, _ = await kube.request(
                "PATCH", f"{path}/kept", body=patch, content_type="application/merge-patch+json"
            )
            assert status == 200
            status, _ = await kube.request("DELETE", f"{path}/deleted")
            assert status == 200
            status, _ = await kube.request("POST", path, body=_configmap("created", label, {"v": "1"}))
            assert status == 201
            await asyncio.to_thread(_compact, plane)
            policy.drop = None
            # Closed (none is open only if the informer gave up its silent stream meanwhile and
            # is resuming on its own: from the same old version, into the same 410).
            await asyncio.to_thread(proxy.end_streams, "configmaps")
            items = await asyncio.to_thread(
                api.items, plane, "/api/v1", NAMESPACE, "configmaps", f"{label}=yes"
            )
            truth = {item["metadata"]["name"]: item.get("data") for item in items}
            assert truth == {"kept": {"v": "2"}, "created": {"v": "1"}}
            await until(lambda: cached() == truth, HUNG, "the cache to equal the server's objects")
            return listed, kube.counters.reads
        finally:
            await watcher.stop()
            await kube.close()

    try:
        listed, reads = asyncio.run(main())
    finally:
        proxy.policies.clear()
    assert _gone(policy), policy.errors  # the API server's own 410, through the real decode
    assert reads > listed  # listed afresh after it (the informer's client made no other read)


def test_a_run_whose_job_finished_while_its_watches_were_gone_is_recorded(
    env: tuple[ControlPlane, WatchProxy], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The operator as a process: its Job and Pod watches hear nothing while the run's first Job
    runs and succeeds; their resume is answered 410; the relist brings the finished Job in, the
    iteration is recorded and the run goes on, each iteration once."""
    plane, proxy = env
    name = "gone-run"
    kinds = ("jobs", "pods")
    for plural in kinds:
        proxy.policies[plural] = StreamPolicy(drop=_deaf)
    operator = OperatorProcess(
        plane,
        tmp_path_factory.mktemp("operator"),
        env={"AGENTS_CONTROLLER_NAMESPACES": NAMESPACE, "AGENTS_CONTROLLER_RESYNC_SECONDS": str(NO_RESYNC)},
        kubeconfig=proxy.kubeconfig,
    ).start()
    try:
        eventually(lambda: all(proxy.policies[p].streams for p in kinds), HUNG, "the Job and Pod watches")
        manifest = copy.deepcopy(workflow_run(name, {"loop": {"maxIterations": 2}}))
        manifest["metadata"]["namespace"] = NAMESPACE
        plane.kubectl("create", "-f", "-", input_text=json.dumps(manifest))
        first = naming.job_name(name, 1, 1, 1)

        def first_succeeded() -> bool:
            jobs = api.jobs_of_run(plane, NAMESPACE, name)
            return any(
                j["metadata"]["name"] == first and (j.get("status") or {}).get("succeeded", 0) >= 1
                for j in jobs
            )

        eventually(first_succeeded, HUNG, "the first Job to succeed")
        # The operator heard nothing of it: the iteration is not recorded.
        loop = api.agentrun(plane, NAMESPACE, name)["status"]["workflow"]["steps"][0].get("loop") or {}
        assert loop.get("completedIterations", 0) == 0, loop
        _compact(plane)
        for plural in kinds:
            proxy.policies[plural].drop = None
            proxy.end_streams(plural)
        seen = api.finished_run(plane, NAMESPACE, name, operator.logs, HUNG)
        assert seen["status"]["phase"] == "Succeeded", seen["status"]
        loop = seen["status"]["workflow"]["steps"][0]["loop"]
        assert loop["completedIterations"] == 2
        assert [(i["index"], i["attempts"], i["phase"]) for i in loop["iterations"]] == [
            (1, 1, "Succeeded"),
            (2, 1, "Succeeded"),
        ]
        jobs = sorted(j["metadata"]["name"] for j in api.jobs_of_run(plane, NAMESPACE, name))
        assert jobs == [naming.job_name(name, 1, k, 1) for k in (1, 2)]
        for plural in kinds:
            assert _gone(proxy.policies[plural]), (plural, proxy.policies[plural].errors)
            assert (
                f"{plural} watch ended: The resourceVersion for the provided watch is too old"
                in operator.logs()
            )
    finally:
        proxy.policies.clear()
        operator.stop()
