"""The chart's alerts and dashboard, checked by promtool (built from upstream, like the control
plane): the rendered PrometheusRule passes `promtool check rules` and the unit tests in
tests/fixtures/alerts/rules_test.yaml (`promtool test rules`), and every dashboard query parses as
PromQL. Live evaluation against a real Prometheus is tests/e2e/test_prometheus.py.
docs/operations.md#monitoring
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_devcluster import toolchain
from tests.integration.helm import Helm

REPO = Path(__file__).resolve().parents[2]
UNIT_TESTS = REPO / "tests" / "fixtures" / "alerts" / "rules_test.yaml"
ENABLED = {"metrics": {"prometheusRule": {"enabled": True}, "dashboard": {"enabled": True}}}
ALERTS = {
    "AgentRunOperatorDown",
    "AgentRunOperatorNotServing",
    "AgentRunReconcileErrors",
    "AgentRunNoProgress",
    "AgentRunApprovalWaiting",
    "AgentRunIterationFailureRatioHigh",
    "AgentRunStatusNearBudget",
    "AgentRunEventsDropped",
}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    if not toolchain.is_built(toolchain.TOOLS[0]) and shutil.which("go") is None:
        pytest.skip("helm is not built and Go is not on PATH to build it; run `agentrun dev tools`")
    return Helm(toolchain.ensure_tools(print) / "helm", tmp_path_factory.mktemp("helm"))


def rendered(helm: Helm, values: dict[str, Any] = ENABLED) -> list[dict[str, Any]]:
    """The chart as `helm template` renders it, release agentrun-operator in agentrun-system."""
    return helm.render(values, release="agentrun-operator")


def rule_groups(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The PrometheusRule's spec: a Prometheus rule file (`groups:`)."""
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    return dict(rule["spec"])


def dashboard(docs: list[dict[str, Any]]) -> dict[str, Any]:
    config_map = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
    )
    return dict(json.loads(config_map["data"]["agentrun-operator.json"]))


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, query) of every target of every panel."""
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])]


def promtool(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "promtool"), *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=300
    )


def test_nothing_of_monitoring_renders_unless_asked(helm: Helm) -> None:
    kinds = {d["kind"] for d in rendered(helm, {})}
    assert "PrometheusRule" not in kinds and "ConfigMap" not in kinds


def test_rule_and_dashboard_carry_the_labels_kube_prometheus_stack_selects(helm: Helm) -> None:
    docs = rendered(
        helm,
        {
            "metrics": {
                "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
                "dashboard": {"enabled": True, "annotations": {"grafana_folder": "AgentRun"}},
            }
        },
    )
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "AgentRun"}


def test_rules_pass_promtool_check(helm: Helm, prometheus_bin: Path, tmp_path: Path) -> None:
    groups = rule_groups(rendered(helm))
    assert {r["alert"] for g in groups["groups"] for r in g["rules"]} == ALERTS
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(groups))
    checked = promtool(prometheus_bin, "check", "rules", "rules.yaml", cwd=tmp_path)
    print(checked.stdout, checked.stderr)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in checked.stdout


def test_rules_pass_their_unit_tests(helm: Helm, prometheus_bin: Path, tmp_path: Path) -> None:
    """Each alert stays quiet on healthy series and fires, with its annotations, once its condition
    has held for its `for:` (tests/fixtures/alerts/rules_test.yaml)."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups(rendered(helm))))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    tested = promtool(prometheus_bin, "test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    print(tested.stdout, tested.stderr)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    tested_alerts = {
        t["alertname"]
        for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
        for t in case["alert_rule_test"]
    }
    assert tested_alerts == ALERTS


def test_every_alert_links_its_runbook_section(helm: Helm) -> None:
    """Each alert's runbook_url is its own section of docs/operations.md#monitoring, which exists,
    and the alert table there lists it."""
    operations = (REPO / "docs" / "operations.md").read_text()
    page = "https://github.com/proompteng/agentrun-operator/blob/main/docs/operations.md"
    for group in rule_groups(rendered(helm))["groups"]:
        for rule in group["rules"]:
            name = rule["alert"]
            anchor = f"alert-{name.lower()}"
            assert rule["annotations"]["runbook_url"] == f"{page}#{anchor}", name
            assert f"### `{name}` {{#{anchor}}}" in operations, f"no runbook section for {name}"
            assert f"| `{name}` |" in operations, f"{name} is not in the alert table"


def test_values_set_the_thresholds(helm: Helm) -> None:
    alerts = {"noProgress": {"seconds": 120, "for": "1m"}, "approvalWait": {"seconds": 30}}
    groups = rule_groups(
        rendered(
            helm,
            {"metrics": {"prometheusRule": {"enabled": True, "alerts": alerts}, "seriesSelector": "job='x'"}},
        )
    )
    rules = {r["alert"]: r for g in groups["groups"] for r in g["rules"]}
    assert rules["AgentRunNoProgress"]["expr"] == "max(agentrun_run_no_progress_seconds_max{job='x'}) > 120"
    assert rules["AgentRunNoProgress"]["for"] == "1m"
    assert rules["AgentRunApprovalWaiting"]["expr"] == "max(agentrun_approval_wait_seconds_max{job='x'}) > 30"


def test_every_dashboard_query_parses_and_selects_this_operator(
    helm: Helm, prometheus_bin: Path, tmp_path: Path
) -> None:
    """promtool has no offline query check, so each panel query becomes a recording rule that
    `promtool check rules` parses."""
    queries = panel_queries(dashboard(rendered(helm)))
    assert len(queries) >= 20
    selector = "job='agentrun-operator-metrics', namespace='agentrun-system'"
    assert all(selector in q for _, q in queries), [q for _, q in queries if selector not in q]
    records = [{"record": f"dashboard:panel_{i}", "expr": q} for i, (_, q) in enumerate(queries)]
    (tmp_path / "queries.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]})
    )
    checked = promtool(prometheus_bin, "check", "rules", "queries.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
