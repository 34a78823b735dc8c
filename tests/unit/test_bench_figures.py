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

from tests.bench import apf, figures, node_stages
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
