"""The Argo side-by-side benchmark's pure parts: the Workflow it submits, how it reads steps from pods,
the lost/repeated check and the request count, and the controller's build recipe."""

from __future__ import annotations

import collections

import yaml

from agentrun_devcluster import argo, toolchain
from tests.bench import argo_side
from tests.bench.argo_side import PodWatch


def test_a_workflow_is_a_sequential_loop_of_k_one_pod_steps() -> None:
    wf = argo_side.workflow("wf-1", 3)
    loop, step = wf["spec"]["templates"]
    assert wf["spec"]["entrypoint"] == "loop" == loop["name"]
    # One group per step, one step per group: each waits for the one before it.
    assert loop["steps"] == [[{"name": f"s{k}", "template": "step"}] for k in (1, 2, 3)]
    assert set(step) == {"name", "container"}


def test_the_step_of_a_pod_comes_from_its_node_name() -> None:
    assert argo_side.step_of("wf-7[2].s3") == 3
    assert argo_side.step_of("wf-7[0].s12") == 12
    assert argo_side.step_of("wf-7") is None
    assert argo_side.step_of("") is None


def _watch(pods: dict[str, tuple[str, str, int]]) -> PodWatch:
    watch = PodWatch(plane=None)  # type: ignore[arg-type]  # never started: only its records are read
    for pod, (wf, node, adds) in pods.items():
        watch.workflows[pod], watch.node_names[pod], watch.adds[pod] = wf, node, adds
        watch.added[pod] = 0.0
    return watch


def _wf(name: str, phase: str, succeeded_pods: int) -> dict[str, object]:
    nodes = {f"{name}-{k}": {"type": "Pod", "phase": "Succeeded"} for k in range(succeeded_pods)}
    nodes[name] = {"type": "Steps", "phase": phase}
    return {"metadata": {"name": name}, "status": {"phase": phase, "nodes": nodes}}


def test_the_check_counts_lost_and_repeated_steps() -> None:
    pods = _watch(
        {
            "a-1": ("a", "a[0].s1", 1),
            "a-2": ("a", "a[1].s2", 1),
            "b-1": ("b", "b[0].s1", 2),  # the same step's pod added twice: repeated
            "b-2": ("b", "b[1].s2", 1),
            "c-1": ("c", "c[0].s1", 1),  # c never made a pod for step 2: lost
        }
    )
    workflows = [
        _wf("a", "Succeeded", 2),
        _wf("b", "Succeeded", 2),
        _wf("c", "Failed", 1),
        _wf("d", "Running", 0),
    ]
    result = argo_side.check(workflows, ["a", "b", "c", "d"], 2, pods)
    assert result["succeeded"] == 2 and result["unfinished"] == 1
    assert result["completed_steps"] == 5
    assert result["repeated"] == 1 and result["lost"] == 2  # c: 1 of 2 Succeeded, and no pod for step 2
    assert any("b: step 1 had 2 pods" in e for e in result["examples"])


def test_turnaround_is_a_pod_succeeded_to_the_next_steps_pod_created() -> None:
    pods = _watch({"a-1": ("a", "a[0].s1", 1), "a-2": ("a", "a[1].s2", 1), "a-3": ("a", "a[2].s3", 1)})
    pods.succeeded.update({"a-1": 1.0, "a-2": 3.0})
    pods.added.update({"a-2": 1.25, "a-3": 3.5})
    t = argo_side.turnaround_ms(pods)
    assert t["n"] == 2 and t["p50"] == 250.0 and t["p99"] == 500.0


def test_requests_are_counted_by_verb_over_the_run() -> None:
    before = {'argo_workflows_k8s_request_total{kind="pods",verb="Create",status_code="201"}': 2.0}
    update = 'argo_workflows_k8s_request_total{kind="workflows",verb="Update",status_code="200"}'
    after = {
        'argo_workflows_k8s_request_total{kind="pods",verb="Create",status_code="201"}': 7.0,
        update: 4.0,
        "argo_workflows_queue_depth_count": 3.0,
    }
    assert argo_side.requests_by_verb(before, after) == {"Create": 5.0, "Update": 4.0}


def test_the_controller_config_moves_its_metrics_off_the_default_port() -> None:
    config = argo_side.controller_config(12345)
    metrics = yaml.safe_load(config["data"]["metricsConfig"])
    assert metrics == {"enabled": True, "port": 12345, "path": "/metrics", "secure": False}


def test_argo_is_a_benchmark_tool_built_from_its_go_module_not_a_control_plane_tool() -> None:
    assert argo.ARGO not in toolchain.TOOLS  # `make test` and `agentrun dev up` never build it
    assert argo.ARGO.packages == ("github.com/argoproj/argo-workflows/v4/cmd/workflow-controller",)
    assert (
        f"require github.com/argoproj/argo-workflows/v4 v{argo.ARGO_WORKFLOWS_VERSION}" in argo.ARGO.go_mod()
    )
    assert "replace" not in argo.ARGO.go_mod()
    assert f"v4.version=v{argo.ARGO_WORKFLOWS_VERSION}" in argo.ARGO.ldflags
    assert collections.Counter(argo.ARGO.binaries) == {"workflow-controller": 1}


def test_kwok_completes_the_pods_a_workflow_owns_and_no_others() -> None:
    stage = yaml.safe_load(argo_side.STAGES)
    assert stage["kind"] == "Stage" and stage["spec"]["resourceRef"]["kind"] == "Pod"
    owner = [e for e in stage["spec"]["selector"]["matchExpressions"] if "ownerReferences" in e["key"]]
    assert owner == [{"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Workflow"]}]
    assert "phase: Succeeded" in stage["spec"]["next"]["statusTemplate"]
    assert "exitCode: 0" in stage["spec"]["next"]["statusTemplate"]


def test_side_by_side_puts_both_controllers_of_one_run_in_one_table() -> None:
    figures = {"p50": 10.0, "p95": 20.0, "p99": 30.0}
    check = {"lost": 0, "repeated": 0}
    report = {
        "runs": 100,
        "iterations_per_run": 3,
        "operator_peak_rss_mb": 120.0,
        "operator_cpu_ms_per_iteration": 9.0,
        "iterations_per_second": 40.0,
        "wall_seconds": 7.5,
        "queue_latency_ms": figures,
        "operator_writes_per_iteration": 3.0,
        "check": check,
        "argo": {
            "peak_rss_mb": 80.0,
            "cpu_ms_per_step": 12.0,
            "steps_per_second": 5.0,
            "wall_seconds": 60.0,
            "turnaround_ms": figures,
            "writes_per_step": 4.0,
            "check": check,
        },
    }
    table = argo_side.side_by_side(report).splitlines()
    assert table[0].startswith("| 100 x 3 | AgentRun operator | Argo Workflows v")
    assert "| peak RSS | 120 MB | 80 MB |" in table
    assert "| CPU per iteration / step | 9.0 ms | 12.0 ms |" in table
