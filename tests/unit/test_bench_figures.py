"""The benchmarks' shared parts: nearest-rank percentiles in the shapes their JSON keeps, the
resumable watch every benchmark times its events with (against a local HTTP stream), and the scale
benchmark's API Priority and Fairness figures."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agentrun_operator import naming
from tests.bench import apf, figures, node_checkpoints, node_stages
from tests.bench.watch import ResumableWatch
from tests.support.polling import eventually


def test_percentiles_are_nearest_rank_and_nan_without_samples() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert (figures.pct(values, 50), figures.pct(values, 95), figures.pct(values, 99)) == (51.0, 95.0, 99.0)
    assert figures.pct([3.0, 1.0, 2.0], 50) == 2.0  # unsorted input
    assert math.isnan(figures.pct([], 50))


def test_a_distribution_is_in_ms_with_its_mean_and_percentiles_keep_their_unit() -> None:
    d = figures.distribution([0.001, 0.002, 0.003])
    assert list(d) == ["n", "p50", "p95", "p99", "mean"]  # the keys and order the JSON files keep
    assert d["n"] == 3 and d["p50"] == 2.0 and d["mean"] == pytest.approx(2.0)
    assert figures.percentiles([5.0, 7.0]) == {
        "n": 2,
        "p50": 5.0,
        "p95": 7.0,
        "p99": 7.0,
    }  # round half to even
    empty = figures.distribution([])
    assert empty["n"] == 0 and all(math.isnan(empty[k]) for k in ("p50", "mean"))


def _event(kind: str, name: str, version: str) -> bytes:
    return json.dumps(
        {"type": kind, "object": {"metadata": {"name": name, "resourceVersion": version}}}
    ).encode()


class _Streams(BaseHTTPRequestHandler):
    """Answers each watch request with the next scripted stream, then ends it; the last one is empty."""

    script: list[list[bytes]] = []
    paths: list[str] = []

    def do_GET(self) -> None:
        self.paths.append(self.path)
        events = self.script.pop(0) if self.script else []
        self.send_response(200)
        self.send_header("Connection", "close")
        self.end_headers()
        for event in events:
            self.wfile.write(event + b"\n")

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    _Streams.paths = []
    _Streams.script = [
        [_event("ADDED", "a", "1"), _event("MODIFIED", "a", "2")],  # then the stream ends: resume at 2
        [json.dumps({"type": "ERROR", "object": {"code": 410}}).encode()],  # 410: start over
        [_event("ADDED", "b", "3")],
    ]
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Streams)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


class _Plane:
    """What a watch reads of a ControlPlane: its server URL and TLS context (none over plain HTTP)."""

    def __init__(self, server: str) -> None:
        self.server = server

    def _client_ssl(self) -> None:
        return None


class _Recorder(ResumableWatch):
    def __init__(self, plane: Any) -> None:
        super().__init__(plane, "/api/v1/namespaces/x/pods", "&labelSelector=app")
        self.seen: list[tuple[str, str]] = []

    def on_event(self, kind: str, obj: dict[str, Any], now: float) -> None:
        self.seen.append((kind, obj["metadata"]["name"]))


def test_a_watch_resumes_from_the_last_version_and_starts_over_after_a_gap(
    server: ThreadingHTTPServer,
) -> None:
    watch = _Recorder(_Plane(f"http://127.0.0.1:{server.server_address[1]}")).start()
    eventually(lambda: len(_Streams.paths) >= 4, timeout=30, what="four watch requests")
    assert watch.seen[:3] == [("ADDED", "a"), ("MODIFIED", "a"), ("ADDED", "b")]
    base = "/api/v1/namespaces/x/pods?watch=1&timeoutSeconds=3600&labelSelector=app"
    assert _Streams.paths[:4] == [base, f"{base}&resourceVersion=2", base, f"{base}&resourceVersion=3"]
    assert watch.gaps == 1 and watch.resumes >= 3


JOB = {"batch.kubernetes.io/job-name": "r-1"}
CTR_EVENTS = [  # (clock, topic, payload): one pod, then a second that never finished
    ("49.411785595", "/containers/create", {"id": "sb1", "image": "pause:1"}),
    ("49.415242589", "/containers/update", {"id": "sb1", "labels": JOB}),
    ("49.552820904", "/tasks/start", {"container_id": "sb1", "pid": 1}),
    ("49.591603501", "/containers/create", {"id": "rep1", "image": "op:1"}),
    ("49.682982874", "/tasks/start", {"container_id": "rep1", "pid": 2}),
    ("49.771542772", "/tasks/exit", {"container_id": "rep1", "id": "hook1", "pid": 3}),
    ("49.802001949", "/containers/create", {"id": "main1", "image": "busybox:1.36"}),
    ("49.937138747", "/tasks/start", {"container_id": "main1", "pid": 4}),
    ("49.94880072", "/tasks/exit", {"container_id": "main1", "id": "main1", "pid": 4}),
    ("50.089172131", "/tasks/exit", {"container_id": "rep1", "id": "rep1", "pid": 2}),
    ("51.000000000", "/containers/update", {"id": "sb2", "labels": JOB}),
    ("51.100000000", "/containers/create", {"id": "rep2", "image": "op:1"}),
]


def _ctr_lines() -> str:
    """The events as `ctr events` prints them, with a line that is not one among them."""
    lines = [
        f"2026-11-28 18:31:{t} +0000 UTC k8s.io {topic} {json.dumps(body)}" for t, topic, body in CTR_EVENTS
    ]
    return "\n".join([*lines[:9], "not an event line", *lines[9:]]) + "\n"


def test_the_in_pod_stages_come_from_containerds_own_times_and_skip_an_unfinished_pod() -> None:
    events = node_stages.parse_ctr_events(_ctr_lines())
    assert len(events) == len(CTR_EVENTS)
    assert events[0][:2] == (pytest.approx(1795890709.411785595, abs=1e-6), "/containers/create")
    stages = node_stages.in_pod_stages(events, "op:1")
    ms = {stage: [round(1000 * v, 1) for v in values] for stage, values in stages.items()}
    assert ms == {
        "reporter_start_to_hook_done": [88.6],
        "hook_done_to_main_start": [165.6],
        "main_exit_to_reporter_exit": [140.4],
    }


def test_flow_control_figures_are_per_level_deltas_of_the_api_servers_series() -> None:
    """tests/bench/apf.py: dispatched and rejected requests and the mean queue wait of the executed
    ones, per priority level, over the measured span; levels without a request left out."""

    def sample(name: str, **labels: str) -> str:
        return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"

    d = "apiserver_flowcontrol_dispatched_requests_total"
    r = "apiserver_flowcontrol_rejected_requests_total"
    w = "apiserver_flowcontrol_request_wait_duration_seconds"
    before = {
        sample(d, flow_schema="ours", priority_level="ours"): 10.0,
        sample(d, flow_schema="service-accounts", priority_level="workload-low"): 100.0,
        sample(w + "_sum", execute="true", flow_schema="ours", priority_level="ours"): 1.0,
        sample(w + "_count", execute="true", flow_schema="ours", priority_level="ours"): 10.0,
        sample(d, flow_schema="idle", priority_level="idle"): 5.0,
    }
    after = {
        sample(d, flow_schema="ours", priority_level="ours"): 30.0,
        sample(d, flow_schema="service-accounts", priority_level="workload-low"): 400.0,
        sample(d, flow_schema="global-default", priority_level="workload-low"): 50.0,
        sample(r, flow_schema="service-accounts", priority_level="workload-low", reason="queue-full"): 7.0,
        sample(w + "_sum", execute="true", flow_schema="ours", priority_level="ours"): 3.0,
        sample(w + "_count", execute="true", flow_schema="ours", priority_level="ours"): 30.0,
        sample(w + "_sum", execute="false", flow_schema="ours", priority_level="ours"): 60.0,
        sample(w + "_count", execute="false", flow_schema="ours", priority_level="ours"): 1.0,
        sample("apiserver_flowcontrol_nominal_limit_seats", priority_level="ours"): 46.0,
        sample(d, flow_schema="idle", priority_level="idle"): 5.0,
    }
    figures_ = apf.flow_figures(before, after)
    assert figures_["levels"]["ours"] == {
        "dispatched": 20.0,
        "rejected": 0.0,
        "mean_wait_ms": pytest.approx(100.0),  # (3 - 1) s over 20 executed; the rejected one not
        "nominal_seats": 46.0,
    }
    low = figures_["levels"]["workload-low"]
    assert (low["dispatched"], low["rejected"], math.isnan(low["nominal_seats"])) == (350.0, 7.0, True)
    assert "idle" not in figures_["levels"]
    assert figures_["dispatched_by_flow_schema"] == {
        "global-default": 50.0,
        "ours": 20.0,
        "service-accounts": 300.0,
    }
    assert apf.apiserver_args(True, 60) == (
        apf.APF_ON,
        "--max-requests-inflight=40",
        "--max-mutating-requests-inflight=20",
    )
    assert apf.apiserver_args(False, None) == ()


def test_the_in_pod_stages_by_job_name_each_finished_pod_by_its_job() -> None:
    events = node_stages.parse_ctr_events(_ctr_lines())
    by_job = node_stages.in_pod_stages_by_job(events, "op:1")
    assert list(by_job) == ["r-1"]  # the second pod of r-1 never finished
    assert round(1000 * by_job["r-1"]["reporter_start_to_hook_done"], 1) == 88.6


def _run(name: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {"workflow": {"steps": [{"loop": {"iterations": records}}]}},
    }


def test_the_checkpoint_figures_split_seed_first_steady_and_retry_pods_by_mode() -> None:
    names = node_checkpoints.run_names(1)
    assert names == {"None": ["bench-none-0"], "Files": ["bench-files-0"]}
    assert node_checkpoints.interleaved(node_checkpoints.run_names(2)) == [
        "bench-none-0",
        "bench-files-0",
        "bench-none-1",
        "bench-files-1",
    ]
    hook = node_checkpoints.HOOK
    by_job = {
        naming.job_name("bench-files-0", 1, 1, 1): {hook: 0.05},
        naming.job_name("bench-files-0", 1, 2, 1): {hook: 2.0},
        naming.job_name("bench-files-0", 1, 3, 1): {hook: 0.2},
        naming.job_name("bench-files-0", 1, 4, 1): {hook: 0.3},
        naming.job_name("bench-files-0", 1, 4, 2): {hook: 0.15},
        naming.job_name("bench-none-0", 1, 3, 1): {hook: 0.06},
    }
    runs = [
        _run(
            "bench-files-0",
            [
                {"index": 1, "checkpoint": {"addedBytes": 700}},
                {"index": 2, "checkpoint": {"addedBytes": 210_000_000}},
                {"index": 3, "checkpoint": {"addedBytes": 900_000}},
                {"index": 4, "checkpoint": {"addedBytes": 800_000, "restored": "c4"}},
            ],
        ),
        _run("bench-none-0", [{"index": k} for k in range(1, 5)]),
    ]
    figures = node_checkpoints.checkpoint_figures(names, 4, 4, by_job, runs)
    files, none = figures["Files"], figures["None"]
    assert {kind: d["n"] for kind, d in files["hook_ms"].items()} == {
        "seed": 1,
        "first": 1,
        "steady": 2,
        "retry": 1,
    }
    assert files["hook_ms"]["first"]["p50"] == 2000.0
    assert files["hook_ms"]["steady"]["p95"] == 300.0
    assert files["hook_ms"]["retry"]["p50"] == 150.0
    assert files["added_bytes"]["first"]["max"] == 210_000_000
    assert files["added_bytes"]["steady"] == {
        "n": 2,
        "p50": 800_000,  # nearest rank
        "p95": 900_000,
        "p99": 900_000,
        "max": 900_000,
    }
    assert files["restored"] == 1
    assert none["hook_ms"]["steady"]["n"] == 1 and none["hook_ms"]["retry"]["n"] == 0
    assert none["added_bytes"]["steady"]["n"] == 0 and math.isnan(none["added_bytes"]["steady"]["max"])


def test_the_checkpoint_runs_seed_once_then_change_a_few_files_and_fail_once() -> None:
    main = node_checkpoints.script(10000, 200, 10, 4)
    assert "n=10000; else n=10; fi" in main
    assert "head -c 20971 /dev/urandom" in main  # 200 MiB / 10,000
    assert '[ "$AGENTRUN_ITERATION" = 4 ] && [ "$AGENTRUN_ATTEMPT" = 1 ]; then exit 1' in main
    run = node_checkpoints.agentrun("r", "ns", 6, "Files", main, 4)
    step = run["spec"]["workflow"]["steps"][0]
    assert step["loop"]["checkpoint"] == {"mode": "Files", "onFailedAttempt": "Restore"}
    assert step["retries"] == 1
    baseline = node_checkpoints.agentrun("r", "ns", 6, "None", main, 0)["spec"]["workflow"]["steps"][0]
    assert baseline["loop"]["checkpoint"] == {"mode": "None"} and "retries" not in baseline
    claim = node_checkpoints.claim("r", "ns", 200)
    assert claim["metadata"]["name"] == "r-workspace"
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
