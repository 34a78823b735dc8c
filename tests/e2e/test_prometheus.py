"""A real Prometheus (built from upstream by the toolchain) scrapes the operator on loopback while
examples run through the local pod runner, and evaluates the chart's alerts and dashboard:

- every metric of docs/operator.md#metrics is there, with exactly its documented labels;
- every query of the chart's Grafana dashboard returns series;
- the chart's alerts, rendered with short thresholds through values, fire for a run that makes no
  progress and for an approval gate that waits (docs/operations.md#monitoring).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_devcluster.controlplane import ControlPlane
from tests.e2e.conftest import LocalDefault, start_local_default
from tests.integration.helm import Helm
from tests.support.manifests import workflow_run
from tests.support.metrics import documented_metrics
from tests.support.polling import eventually
from tests.support.prometheus import JOB, PrometheusProcess

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "e2e-prometheus"
SELECTOR = f"job='{JOB}', namespace='{NAMESPACE}'"
# Short thresholds, as a user sets them through the chart's values.
VALUES = {
    "metrics": {
        "seriesSelector": SELECTOR,
        "prometheusRule": {
            "enabled": True,
            "alerts": {
                "noProgress": {"seconds": 15, "for": "0s"},
                "approvalWait": {"seconds": 5, "for": "0s"},
            },
        },
        "dashboard": {"enabled": True},
    }
}
INTERNAL_LABELS = {"__name__", "job", "instance", "namespace", "le"}


@dataclass
class Monitored:
    local: LocalDefault
    prometheus: PrometheusProcess
    dashboard: dict[str, Any]


@pytest.fixture(scope="module")
def monitored(
    control_plane: ControlPlane, prometheus_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Monitored]:
    helm = Helm(Path(control_plane.bin_dir) / "helm", tmp_path_factory.mktemp("helm"))
    docs = helm.render(VALUES, release="agentrun-operator")
    rules = next(d for d in docs if d["kind"] == "PrometheusRule")["spec"]
    config_map = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
    )
    board = json.loads(config_map["data"]["agentrun-operator.json"])
    stack = start_local_default(
        control_plane,
        tmp_path_factory,
        namespace=NAMESPACE,
        node="agentrun-e2e-prometheus",
        operator_env={"AGENTS_CONTROLLER_RESYNC_SECONDS": "2"},
    )
    local = next(stack)
    try:
        target = f"127.0.0.1:{local.metrics_port}"
        prometheus = PrometheusProcess(
            prometheus_bin, tmp_path_factory.mktemp("prometheus"), target, NAMESPACE, rules
        )
        prometheus.start()
        try:
            eventually(
                lambda: prometheus.query(f"up{{{SELECTOR}}} == 1"), 60, "Prometheus to scrape the operator"
            )
            yield Monitored(local, prometheus, board)
        finally:
            prometheus.stop()
    finally:
        stack.close()  # the local default's own teardown


def _series(prometheus: PrometheusProcess, name: str) -> list[dict[str, str]]:
    return [s["metric"] for s in prometheus.query(f"{{__name__='{name}', {SELECTOR}}}")]


def test_examples_scraped_by_prometheus_show_every_documented_metric_and_dashboard_query(
    monitored: Monitored,
) -> None:
    local, prometheus = monitored.local, monitored.prometheus
    local.apply_example("fixed-loop.yaml")
    local.apply_example("retries.yaml")
    local.apply_example("switch-triage.yaml")
    local.apply_example("approval-loop.yaml")

    def gate_waits() -> bool:
        conditions = (local.run("approval-loop").get("status") or {}).get("conditions") or []
        return any(c["type"] == "AwaitingApproval" and c["status"] == "True" for c in conditions)

    eventually(gate_waits, 180, "the approval-loop's gate to wait")
    # The approval alert, with its threshold at 5 s through the chart's values, fires while it waits.
    alert = eventually(
        lambda: prometheus.firing("AgentRunApprovalWaiting"), 120, "AgentRunApprovalWaiting to fire"
    )
    print("firing:", alert["labels"]["alertname"], "-", alert["annotations"]["description"])
    approved = local.cli("approve", "approval-loop", "--step", "develop/sign-off", "--input", "verdict=final")
    assert approved.returncode == 0, approved.stderr
    for name in ("fixed-loop", "retries", "switch-triage", "approval-loop"):
        assert local.wait_for_end(name)["status"]["phase"] == "Succeeded", name

    documented = documented_metrics((REPO / "docs" / "operator.md").read_text())
    assert len(documented) >= 25

    def scraped() -> dict[str, set[str]] | None:
        """Label names of each documented metric's series in Prometheus; None until all are there with
        every labelled child the runs above produce (an approval decision is the last one counted)."""
        found: dict[str, set[str]] = {}
        for name, (kind, _) in documented.items():
            stored = f"{name}_count" if kind == "histogram" else name
            series = _series(prometheus, stored)
            if not series:
                return None
            found[name] = {label for s in series for label in s} - INTERNAL_LABELS
        return found if prometheus.query(f"agentrun_approval_decisions_total{{{SELECTOR}}}") else None

    found = eventually(scraped, 120, "Prometheus to have scraped every documented metric")
    print(f"{len(found)} documented metrics scraped by Prometheus (name: labels):")
    for name in sorted(found):
        print(f"  {name}: {','.join(sorted(found[name])) or '-'}")
    wrong = {
        name: (sorted(labels), sorted(found[name]))
        for name, (_, labels) in documented.items()
        if found[name] != labels
    }
    assert wrong == {}, "documented labels (left) differ from the scraped ones (right)"

    queries = [(p["title"], t["expr"]) for p in monitored.dashboard["panels"] for t in p.get("targets", [])]

    def every_query_answers() -> list[tuple[str, str, int]] | None:
        counted = [(title, expr, len(prometheus.query(expr))) for title, expr in queries]
        return counted if all(n > 0 for _, _, n in counted) else None

    try:
        counted = eventually(every_query_answers, 120, "every dashboard query to return series")
    except AssertionError:
        empty = [(title, expr) for title, expr in queries if not prometheus.query(expr)]
        raise AssertionError(f"dashboard queries without series: {empty}") from None
    print(f"{len(counted)} dashboard queries, series each:")
    for title, expr, n in counted:
        print(f"  {n:3d}  {title}: {expr}")


def test_the_no_progress_alert_fires_for_a_stuck_run(monitored: Monitored) -> None:
    """A run whose pod never ends makes no progress: with the threshold at 15 s through the chart's
    values, AgentRunNoProgress fires; it resolves once the run is gone."""
    local, prometheus = monitored.local, monitored.prometheus
    local.create_claim("ws")
    manifest = workflow_run("stuck", {})
    manifest["spec"]["workload"]["command"] = ["sh", "-c", "sleep 3600"]
    local.apply(yaml.safe_dump(manifest))
    try:
        alert = eventually(lambda: prometheus.firing("AgentRunNoProgress"), 180, "AgentRunNoProgress to fire")
        print("firing:", json.dumps({k: alert[k] for k in ("labels", "annotations", "value")}, indent=1))
        assert alert["labels"]["severity"] == "warning"
        assert float(alert["value"]) > 15
        assert local.run("stuck")["status"]["phase"] == "Running"
    finally:
        local.plane.kubectl("delete", "agentrun", "stuck", "-n", NAMESPACE, "--wait=false", check=False)
    eventually(lambda: prometheus.firing("AgentRunNoProgress") is None, 120, "AgentRunNoProgress to resolve")
