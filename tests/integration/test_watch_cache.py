"""The watch cache is correct (docs/operator.md#cache): after a restart, with a stale entry, with a
missed or a lagging watch event, no iteration is ever lost or repeated.

The operator runs as a process behind `WatchProxy`, which can drop or delay one kind's watch events;
the API server, the Job controller and the garbage collector are real. Nothing here is timed.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_operator import naming
from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner.actions import EmitEvent
from agentrun_operator.shell import informer
from agentrun_operator.shell.cache import RunCache
from agentrun_operator.shell.events import EventRecorder
from agentrun_operator.shell.kube import Kube
from agentrun_operator.shell.reconciler import Reconciler
from agentrun_operator.shell.resync import relist
from tests.integration.kubelet_driver import KubeletDriver, PodOutcome
from tests.integration.watch_proxy import Call, StreamPolicy, WatchProxy
from tests.support import api
from tests.support.api import ready_namespace
from tests.support.claims import bound_claim
from tests.support.informers import configmap_informer
from tests.support.manifests import workflow_run
from tests.support.polling import eventually, until
from tests.support.processes import OperatorProcess

NAMESPACE = "cache"
AR = f"/apis/agents.proompteng.ai/v1alpha1/namespaces/{NAMESPACE}/agentruns"


class Outcomes:
    """What each run's pods do, by run name (the kubelet driver asks)."""

    def __init__(self) -> None:
        self.by_run: dict[str, PodOutcome] = {}
        self.control: dict[str, dict[int, dict[str, Any]]] = {}

    def __call__(self, pod: dict[str, Any]) -> PodOutcome:
        meta = pod["metadata"]
        run = (meta.get("annotations") or {}).get(f"{naming.GROUP}/agent-run-name", "")
        iteration = int(meta["labels"].get(naming.LABEL_ITERATION, 1))
        base = self.by_run.get(run, PodOutcome())
        control = self.control.get(run, {}).get(iteration)
        return PodOutcome(run_seconds=base.run_seconds, control=control) if control else base


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    plane = control_plane
    ready_namespace(plane, NAMESPACE)
    bound_claim(plane, NAMESPACE)
    outcomes = Outcomes()
    driver = KubeletDriver(plane, NAMESPACE, outcomes).start()
    proxy = WatchProxy(plane, tmp_path_factory.mktemp("proxy")).start()
    try:
        yield plane, driver, proxy, outcomes, tmp_path_factory
    finally:
        proxy.stop()
        driver.stop()


def _operator(env: Any, resync_seconds: int = 300) -> OperatorProcess:
    plane, _, proxy, _, tmp = env
    return OperatorProcess(
        plane,
        tmp.mktemp("operator"),
        env={
            "AGENTS_CONTROLLER_NAMESPACES": NAMESPACE,
            "AGENTS_CONTROLLER_RESYNC_SECONDS": str(resync_seconds),
        },
        kubeconfig=proxy.kubeconfig,
    )


def _create(plane: ControlPlane, manifest: dict[str, Any]) -> None:
    manifest = copy.deepcopy(manifest)
    manifest["metadata"]["namespace"] = NAMESPACE
    plane.kubectl("create", "-f", "-", input_text=json.dumps(manifest))


def _run(plane: ControlPlane, name: str) -> dict[str, Any]:
    return api.agentrun(plane, NAMESPACE, name)


def _jobs(plane: ControlPlane, run: str) -> list[dict[str, Any]]:
    return api.jobs_of_run(plane, NAMESPACE, run)


def _finished(
    plane: ControlPlane, name: str, operator: OperatorProcess, timeout: float = 120
) -> dict[str, Any]:
    return api.finished_run(plane, NAMESPACE, name, operator.logs, timeout)


def _assert_each_iteration_once(plane: ControlPlane, run: dict[str, Any], iterations: int) -> None:
    """Neither lost nor repeated: one Job per iteration (attempt 1), each recorded once."""
    name = run["metadata"]["name"]
    names = sorted(j["metadata"]["name"] for j in _jobs(plane, name))
    assert names == sorted(naming.job_name(name, 1, k, 1) for k in range(1, iterations + 1))
    loop = run["status"]["workflow"]["steps"][0]["loop"]
    assert loop["completedIterations"] == iterations
    assert [(i["index"], i["attempts"], i["phase"]) for i in loop["iterations"]] == [
        (k, 1, "Succeeded") for k in range(1, iterations + 1)
    ]


def _loop(name: str, iterations: int, **loop: Any) -> dict[str, Any]:
    return workflow_run(name, {"loop": {"maxIterations": iterations, **loop}})


def _owned_by_run(name: str) -> Any:
    def match(event: dict[str, Any]) -> bool:
        meta = event.get("object", {}).get("metadata", {})
        owners = [r.get("name") for r in meta.get("ownerReferences") or []]
        return name in owners or (meta.get("annotations") or {}).get(f"{naming.GROUP}/agent-run-name") == name

    return match


@pytest.mark.parametrize(
    "finished_while_down", [True, False], ids=["jobs-finished-while-down", "cold-mid-iteration"]
)
def test_restart_with_a_cold_cache_neither_loses_nor_repeats(env: Any, finished_while_down: bool) -> None:
    """Killed mid-iteration; the new process starts with an empty cache and reconciles nothing before
    its initial lists are in, whether the running Job finished meanwhile or is still running."""
    plane, driver, _, outcomes, _ = env
    name = "restart-done" if finished_while_down else "restart-cold"
    outcomes.by_run[name] = PodOutcome(run_seconds=2.0 if finished_while_down else 0.5)
    operator = _operator(env).start()
    try:
        _create(plane, _loop(name, 3))
        job2 = naming.job_name(name, 1, 2, 1)
        eventually(lambda: any(j["metadata"]["name"] == job2 for j in _jobs(plane, name)), 60, "iteration 2")
        operator.kill()
        if finished_while_down:
            eventually(
                lambda: any(p.startswith(job2 + "-") for p in driver.finished_at), 60, "its pod to end"
            )
        operator.start()
        run = _finished(plane, name, operator)
        assert run["status"]["phase"] == "Succeeded"
        _assert_each_iteration_once(plane, run, 3)
        assert "watch cache filled" in operator.logs()
    finally:
        operator.stop()


def test_missed_watch_events_are_recovered_by_the_resync(env: Any) -> None:
    """Every Job and Pod event of this run is lost on the way: only the resync's relist sees them."""
    plane, _, proxy, _, _ = env
    name = "missed"
    drop = _owned_by_run(name)
    proxy.policies["jobs"] = StreamPolicy(drop=drop)
    proxy.policies["pods"] = StreamPolicy(drop=drop)
    operator = _operator(env, resync_seconds=2).start()
    try:
        _create(plane, _loop(name, 2))
        run = _finished(plane, name, operator)
        assert run["status"]["phase"] == "Succeeded"
        _assert_each_iteration_once(plane, run, 2)
        assert proxy.policies["pods"].dropped > 0 and proxy.policies["jobs"].dropped > 0
        assert "resync found changes the watches had missed" in operator.logs()
    finally:
        proxy.policies.clear()
        operator.stop()


@pytest.mark.parametrize("plural", ["pods", "jobs", "agentruns"])
def test_a_lagging_watch_stream_neither_loses_nor_repeats(env: Any, plural: str) -> None:
    """One kind's events arrive 1.5 s late: the conditional loop still reads each iteration's control
    file once and stops where the file says."""
    plane, _, proxy, outcomes, _ = env
    name = f"lagging-{plural}"
    outcomes.control[name] = {1: {"continue": True}, 2: {"continue": True}, 3: {"continue": False}}
    proxy.policies[plural] = StreamPolicy(delay_seconds=1.5)
    operator = _operator(env).start()
    try:
        condition = {
            "type": "cel",
            "expression": "iteration.last.control.continue == true",
            "source": {"type": "file", "onMissing": "fail", "onInvalid": "fail"},
        }
        _create(plane, _loop(name, 6, condition=condition))
        run = _finished(plane, name, operator)
        assert run["status"]["phase"] == "Succeeded", run["status"]
        assert run["status"]["workflow"]["steps"][0]["loop"]["stopReason"] == "LoopConditionFalse"
        _assert_each_iteration_once(plane, run, 3)
        assert proxy.policies[plural].streams > 0  # the operator watched this kind through the lag
    finally:
        proxy.policies.clear()
        operator.stop()


def _in_process(plane: ControlPlane, body: Any, kubeconfig: Path | None = None) -> Any:
    """`body(kube)` in an event loop of its own, with a client of the API server (or of `kubeconfig`'s,
    e.g. the watch proxy's)."""

    async def main() -> Any:
        kube = await Kube.connect(str(kubeconfig or plane.kubeconfig))
        try:
            return await body(kube)
        finally:
            await kube.close()

    return asyncio.run(main())


def test_a_stale_cached_run_gets_409_and_is_replanned_from_a_fresh_read(env: Any) -> None:
    """The status PUT carries the cached resourceVersion: stale -> 409 -> fetched fresh -> re-planned."""
    plane = env[0]
    name = "stale"
    _create(plane, workflow_run(name, {}))

    async def body(kube: Kube) -> None:
        cache = RunCache()
        await relist(kube, cache, (NAMESPACE,))
        stale = cache.run(NAMESPACE, name)
        assert stale is not None
        # Someone else changes the run; this cache never hears of it.
        plane.kubectl("label", "agentrun", name, "-n", NAMESPACE, "touched=yes")
        reconciler = Reconciler(kube, OperatorConfig(), cache)
        first = await reconciler.reconcile(NAMESPACE, name)
        assert not first.wrote_status and first.requeue_after == 0.0
        fresh = cache.run(NAMESPACE, name)
        assert fresh is not None and fresh["metadata"]["labels"]["touched"] == "yes"
        second = await reconciler.reconcile(NAMESPACE, name)
        assert second.wrote_status
        # The Job the first attempt created is in the cache (written through): not created twice.
        assert len(cache.jobs.get((NAMESPACE, name))) == 1

    _in_process(plane, body)
    assert len(_jobs(plane, name)) == 1
    assert _run(plane, name)["status"]["phase"] == "Running"


def test_the_cache_keeps_no_managed_fields_and_the_status_write_keeps_the_servers(env: Any) -> None:
    """managedFields were a third of a cached run and nothing reads them: the cache drops them; the
    status PUT then sends none, and the API server keeps the stored ones (its field manager takes
    the live object's when a request has none) and records the operator's status fields."""
    plane = env[0]
    name = "unmanaged"
    _create(plane, workflow_run(name, {}))
    assert _run_with_managed_fields(plane, name)["metadata"]["managedFields"]

    async def body(kube: Kube) -> None:
        cache = RunCache()
        await relist(kube, cache, (NAMESPACE,))
        cached = cache.run(NAMESPACE, name)
        assert cached is not None and "managedFields" not in cached["metadata"]
        assert (await Reconciler(kube, OperatorConfig(), cache).reconcile(NAMESPACE, name)).wrote_status
        written = cache.run(NAMESPACE, name)
        assert written is not None and "managedFields" not in written["metadata"]
        assert written["status"]["phase"] == "Running"

    _in_process(plane, body)
    managed = _run_with_managed_fields(plane, name)["metadata"]["managedFields"]
    assert any(m.get("operation") == "Update" and m.get("subresource") != "status" for m in managed)
    assert any(m.get("subresource") == "status" and "f:status" in (m.get("fieldsV1") or {}) for m in managed)


def _run_with_managed_fields(plane: ControlPlane, name: str) -> dict[str, Any]:
    out = plane.kubectl("get", "agentrun", name, "-n", NAMESPACE, "-o", "json", "--show-managed-fields")
    return dict(json.loads(out))


def test_relist_finds_what_the_cache_missed_and_forgets_what_is_gone(env: Any) -> None:
    plane = env[0]
    name = "relisted"
    _create(plane, workflow_run(name, {}))

    async def body(kube: Kube) -> None:
        cache = RunCache()
        assert (NAMESPACE, name) in await relist(kube, cache, (NAMESPACE,))
        assert cache.run(NAMESPACE, name) is not None
        assert (NAMESPACE, name) not in await relist(kube, cache, (NAMESPACE,))  # nothing new
        plane.kubectl("delete", "agentrun", name, "-n", NAMESPACE, "--wait=true")
        assert (NAMESPACE, name) in await relist(kube, cache, (NAMESPACE,))
        assert cache.run(NAMESPACE, name) is None

    _in_process(plane, body)


@pytest.mark.parametrize("writers", [False, True], ids=["in-reconcile", "by-writer-tasks"])
def test_event_series_fold_repeats_into_one_object(env: Any, writers: bool) -> None:
    """One Event per reconcile; a repeated reason bumps the series count, written when the run ends.
    Started (as the operator starts it), the recorder writes nothing while a reconcile submits: its
    writer tasks post afterwards, the same objects in the same order."""
    plane = env[0]
    name = f"events-{int(writers)}"
    _create(plane, workflow_run(name, {}))
    run = _run(plane, name)

    async def body(kube: Kube) -> int:
        recorder = EventRecorder(kube, "test", flush_seconds=3600)
        if writers:
            recorder.start()
        before = kube.counters.writes
        for k in range(1, 4):
            await recorder.submit(
                run,
                [
                    EmitEvent("Normal", "IterationSucceeded", f"iteration {k} succeeded"),
                    EmitEvent("Normal", "IterationStarted", f"iteration {k + 1} started"),
                ],
                finished=False,
            )
        await recorder.submit(run, [EmitEvent("Normal", "RunSucceeded", "run succeeded")], finished=True)
        if writers:
            assert kube.counters.writes == before  # nothing written on the reconcile's path
            await recorder.stop()
        return kube.counters.writes - before

    writes = _in_process(plane, body)
    out = plane.kubectl(
        "get",
        "events",
        "-n",
        NAMESPACE,
        "--field-selector",
        f"involvedObject.uid={run['metadata']['uid']}",
        "-o",
        "json",
    )
    events = {e["reason"]: e for e in json.loads(out)["items"]}
    assert set(events) == {"IterationStarted", "RunSucceeded"}
    assert events["IterationStarted"]["count"] == 3
    assert (
        events["IterationStarted"]["message"]
        == "IterationSucceeded: iteration 3 succeeded; IterationStarted: iteration 4 started"
    )
    assert writes == 3  # two POSTs and one PATCH for four reconciles' worth of Events


@pytest.mark.parametrize("ends", [False, True], ids=["posted-when-stopping", "in-the-runs-end"])
def test_a_held_series_is_written_once_with_its_count(env: Any, ends: bool) -> None:
    """A warm loop's routine hand-overs (`fold`) are held: no write for them. Posted (the operator
    stopping), they are one Event the API server takes with its count; when the run ends first,
    they are the last part of the run's final Event."""
    plane = env[0]
    name = f"held-{int(ends)}"
    _create(plane, workflow_run(name, {}))
    run = _run(plane, name)
    uid = run["metadata"]["uid"]

    async def body(kube: Kube) -> int:
        recorder = EventRecorder(kube, "test")
        before = kube.counters.writes
        for k in range(1, 4):
            hand_over = [
                EmitEvent("Normal", "IterationSucceeded", f"iteration {k} succeeded", fold=True),
                EmitEvent("Normal", "IterationStarted", f"iteration {k + 1} started", fold=True),
            ]
            await recorder.submit(run, hand_over, finished=False)
        assert kube.counters.writes == before
        if ends:
            await recorder.submit(run, [EmitEvent("Normal", "RunSucceeded", "run succeeded")], finished=True)
        else:
            await recorder.flush_all({uid: NAMESPACE})
        return kube.counters.writes - before

    writes = _in_process(plane, body)
    out = plane.kubectl(
        "get", "events", "-n", NAMESPACE, "--field-selector", f"involvedObject.uid={uid}", "-o", "json"
    )
    events = {e["reason"]: e for e in json.loads(out)["items"]}
    assert writes == 1
    newest = "IterationSucceeded: iteration 3 succeeded; IterationStarted: iteration 4 started"
    if ends:
        assert set(events) == {"RunSucceeded"}
        message = events["RunSucceeded"]["message"]
        assert message.startswith("RunSucceeded: run succeeded; IterationStarted (x3 over "), message
        assert message.endswith(f"): {newest}"), message
    else:
        assert set(events) == {"IterationStarted"}
        held = events["IterationStarted"]
        assert (held["count"], held["message"]) == (3, newest)
        assert held["firstTimestamp"] <= held["lastTimestamp"]


def _references(plane: ControlPlane, prefix: str) -> dict[str, Any]:
    """An AgentProvider, an Agent using it and an ImplementationSpec; the spec fields of a run naming them."""
    for kind, name, spec in (
        ("AgentProvider", f"{prefix}-provider", {"image": "busybox:1.36", "command": ["sh", "-c", "true"]}),
        ("Agent", f"{prefix}-agent", {"providerRef": {"name": f"{prefix}-provider"}}),
        ("ImplementationSpec", f"{prefix}-impl", {"text": "Do the thing.", "summary": "thing"}),
    ):
        manifest = {
            "apiVersion": "agents.proompteng.ai/v1alpha1",
            "kind": kind,
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": spec,
        }
        plane.kubectl("create", "-f", "-", input_text=json.dumps(manifest))
    return {"agentRef": {"name": f"{prefix}-agent"}, "implementationSpecRef": {"name": f"{prefix}-impl"}}


def _run_with(name: str, iterations: int, refs: dict[str, Any]) -> dict[str, Any]:
    manifest = workflow_run(name, {"loop": {"maxIterations": iterations}}, **refs)
    del manifest["spec"]["workload"]["image"], manifest["spec"]["workload"]["command"]  # the provider's
    return manifest


def _reference_reads(proxy: WatchProxy) -> list[str]:
    """The GETs of one Agent, AgentProvider or ImplementationSpec by name (not the informers' LISTs)."""
    return [
        path
        for method, path in proxy.requests
        if method == "GET"
        and path.rstrip("/").split("/")[-2] in ("agents", "agentproviders", "implementationspecs")
    ]


def test_referenced_objects_are_served_from_the_watch_cache(env: Any) -> None:
    """Agent, AgentProvider and ImplementationSpec that exist when the operator starts are in its
    initial lists: a run naming them reads none of them from the API server, iteration after iteration."""
    plane, _, proxy, _, _ = env
    refs = _references(plane, "cached")
    proxy.requests.clear()
    operator = _operator(env).start()
    try:
        _create(plane, _run_with("refs-cached", 3, refs))
        run = _finished(plane, "refs-cached", operator)
        assert run["status"]["phase"] == "Succeeded", run["status"]
        _assert_each_iteration_once(plane, run, 3)
        assert _reference_reads(proxy) == []
    finally:
        operator.stop()


def test_a_reference_the_watch_has_not_delivered_is_read_from_the_api_server(env: Any) -> None:
    """Every watch event of the referenced kinds is lost: the cache never sees the objects created after
    the operator started, so each read misses and is answered by a GET -- the run neither waits for nor
    fails on an object that exists."""
    plane, _, proxy, _, _ = env
    for plural in ("agents", "agentproviders", "implementationspecs"):
        proxy.policies[plural] = StreamPolicy(drop=lambda _event: True)
    proxy.requests.clear()
    operator = _operator(env).start()
    try:
        eventually(lambda: proxy.policies["agents"].streams > 0, 30, "the Agent watch (after its list)")
        refs = _references(plane, "unseen")
        _create(plane, _run_with("refs-unseen", 2, refs))
        run = _finished(plane, "refs-unseen", operator)
        assert run["status"]["phase"] == "Succeeded", run["status"]
        _assert_each_iteration_once(plane, run, 2)
        assert proxy.policies["agents"].dropped > 0
        assert _reference_reads(proxy)  # each read missed the cache and asked the API server
    finally:
        proxy.policies.clear()
        operator.stop()


def test_an_informer_resumes_each_watch_where_it_ended_without_listing_again(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Watches that end every second (the API server closes them at `timeoutSeconds`) are resumed
    from the last resourceVersion they delivered: an object created after a watch ended and before
    the next one reached the API server (the proxy holds it meanwhile) arrives, every object arrives
    once (nothing is replayed), and the kind is listed once, at start."""
    plane, _, proxy, _, _ = env
    monkeypatch.setattr(informer, "WATCH_SECONDS", 1)
    policy = proxy.policies["configmaps"] = StreamPolicy()
    names = [f"resumed-{k}" for k in range(4)]

    def resumed_watch(call: Call) -> bool:
        return call.watch and call.path == f"/api/v1/namespaces/{NAMESPACE}/configmaps"

    async def body(kube: Kube) -> tuple[int, int, list[str], list[Call]]:
        cache, store, watcher = configmap_informer(kube, "perf-resume=yes", NAMESPACE)
        watcher.start()
        held: list[Call] = []
        try:
            await asyncio.wait_for(cache.ready.wait(), 30)
            await until(lambda: policy.streams == 1, 30, "the first watch to reach the API server")
            listed = kube.counters.reads
            for name in names:
                ended = policy.ended
                # The open watch ends; the informer's next one is held before it reaches the API
                # server, so the object below is created while this kind has no watch open at all.
                resume = proxy.hold(resumed_watch)
                await until(resume.arrived.is_set, 30, "the watch to end and the informer to watch again")
                assert policy.ended == ended + 1, "the watch did not end at the API server's timeout"
                assert resume.call is not None
                held.append(resume.call)
                manifest = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"perf-resume": "yes"}},
                    "data": {"k": name},
                }
                await kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps", body=manifest)
                resume.release()
            await until(
                lambda: all(store.one((NAMESPACE, "all"), n) is not None for n in names),
                30,
                "every object created between two watches in the store",
            )
            return listed, kube.counters.reads, [n for n in names if store.one((NAMESPACE, "all"), n)], held
        finally:
            await watcher.stop()

    try:
        listed, reads, seen, held = _in_process(plane, body, proxy.kubeconfig)
    finally:
        proxy.policies.clear()
    assert seen == names  # every object created across the watches' ends arrived
    assert listed == 1 and reads == 1  # and the kind was listed once, at start
    assert all("resourceVersion" in call.query for call in held)  # each watch resumed from a version
    assert [n for kind, n in policy.delivered if kind == "ADDED"] == names  # each object once
