"""The chart's API Priority and Fairness objects on the real kube-apiserver, with APF on
(docs/operations.md#priority-and-fairness). The dev plane turns APF off; this module starts a plane of
its own with it on, as every cluster runs it.

- `helm install --set apiPriorityAndFairness.enabled=true`: the API server accepts the FlowSchema and
  the PriorityLevelConfiguration, and its APF controller reports the schema not dangling;
- a request made as the chart's ServiceAccount (a TokenRequest token, as the operator's pod has) is
  classified by that FlowSchema into that level: the API server's `X-Kubernetes-PF-FlowSchema-UID`
  and `X-Kubernetes-PF-PriorityLevel-UID` answer headers carry their uids, and
  `apiserver_flowcontrol_dispatched_requests_total` counts it under their names; the level has the
  nominal seats the values' comment promises (its share of the server's 600);
- another ServiceAccount's request still falls into `service-accounts` / `workload-low`;
- `helm upgrade` to `existingPriorityLevel: workload-high` sends the operator there and removes the
  chart's level; `helm uninstall` removes the FlowSchema.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentrun_devcluster.controlplane import ControlPlane
from tests.integration.helm import CHART, RELEASE_NS, Helm
from tests.support import metrics as prom
from tests.support.planes import started_control_plane
from tests.support.polling import eventually
from tests.support.tokens import get_as, service_account_token

APF_ON = "--enable-priority-and-fairness=true"  # after the dev plane's `=false`: the last one wins
RELEASE = "agentrun"
NAME = "agentrun-agentrun-operator"  # the release's full name: the ServiceAccount, schema and level
FLOWCONTROL = "/apis/flowcontrol.apiserver.k8s.io/v1"
OPERATOR_REQUEST = "/apis/agents.proompteng.ai/v1alpha1/agentruns?limit=1"  # one the operator makes
SERVER_CONCURRENCY = 400 + 200  # kube-apiserver's --max-requests-inflight + --max-mutating-requests-inflight


@dataclass
class Release:
    plane: ControlPlane
    helm: Helm
    notes: str  # what `helm install` printed

    def get(self, path: str) -> dict[str, Any]:
        code, body = self.plane.api_get(path, timeout=30)
        assert code == 200, (path, code, body[:300])
        return dict(json.loads(body))

    def uid(self, kind: str, name: str) -> str:
        return str(self.get(f"{FLOWCONTROL}/{kind}/{name}")["metadata"]["uid"])

    def classified(self, token: str, path: str) -> tuple[str, str]:
        """(flow schema uid, priority level uid) the API server gave a request made with `token`."""
        code, headers, body = get_as(self.plane, token, path)
        assert code in (200, 403), (code, body[:300])
        return (
            str(headers.get("X-Kubernetes-PF-FlowSchema-UID")),
            str(headers.get("X-Kubernetes-PF-PriorityLevel-UID")),
        )

    def metrics(self) -> prom.Samples:
        code, body = self.plane.api_get("/metrics", timeout=60)
        assert code == 200
        return prom.parse(body.decode())


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    with started_control_plane(tmp_path_factory.mktemp("apf-plane"), (APF_ON,)) as plane:
        helm = Helm(Path(plane.bin_dir) / "helm", tmp_path_factory.mktemp("helm"), plane.kubeconfig)
        values = helm.values_file({"apiPriorityAndFairness": {"enabled": True}})
        installed = helm.run(
            "install",
            RELEASE,
            str(CHART),
            "--namespace",
            RELEASE_NS,
            "--create-namespace",
            "--values",
            str(values),
        )
        yield Release(plane, helm, installed.stdout)


def test_install_says_where_the_operators_requests_go(release: Release) -> None:
    assert f"API priority:  FlowSchema {NAME} -> priority level {NAME}" in release.notes, release.notes


def test_the_flow_schema_is_accepted_and_not_dangling(release: Release) -> None:
    def condition() -> dict[str, Any] | None:
        schema = release.get(f"{FLOWCONTROL}/flowschemas/{NAME}")
        return next(
            (c for c in schema.get("status", {}).get("conditions", []) if c["type"] == "Dangling"), None
        )

    dangling = eventually(condition, 60, "the APF controller to judge the FlowSchema")
    assert dangling["status"] == "False", dangling
    level = release.get(f"{FLOWCONTROL}/prioritylevelconfigurations/{NAME}")
    assert level["spec"]["limited"]["nominalConcurrencyShares"] == 20


def test_the_operators_requests_get_the_operators_level(release: Release) -> None:
    token = service_account_token(release.plane, RELEASE_NS, NAME)
    schema, level = release.uid("flowschemas", NAME), release.uid("prioritylevelconfigurations", NAME)
    # The APF controller reads new objects through an informer: the first requests may precede it.
    eventually(
        lambda: release.classified(token, OPERATOR_REQUEST) == (schema, level),
        60,
        "a request as the operator's ServiceAccount to be classified by the chart's FlowSchema",
    )
    code, _, body = get_as(release.plane, token, OPERATOR_REQUEST)
    assert code == 200, body[:300]  # the chart's RBAC lets it, and APF let it through

    samples = release.metrics()
    dispatched = prom.value(
        samples, "apiserver_flowcontrol_dispatched_requests_total", flow_schema=NAME, priority_level=NAME
    )
    assert dispatched >= 1
    # The seats the values' comment promises: its share of the server's limit, all levels' shares.
    levels = release.get(f"{FLOWCONTROL}/prioritylevelconfigurations")["items"]
    shares = sum(
        (lv["spec"].get("limited") or lv["spec"].get("exempt") or {}).get("nominalConcurrencyShares", 0)
        for lv in levels
    )
    seats = prom.value(samples, "apiserver_flowcontrol_nominal_limit_seats", priority_level=NAME)
    print(f"priority level {NAME}: {seats:.0f} nominal seats of {SERVER_CONCURRENCY}, shares 20 of {shares}")
    assert seats == math.ceil(SERVER_CONCURRENCY * 20 / shares)
    if shares == 265:  # Kubernetes' default configuration plus ours: the figure in values.yaml
        assert seats == 46


def test_another_service_account_still_falls_into_workload_low(release: Release) -> None:
    release.plane.kubectl("create", "serviceaccount", "someone-else", "-n", RELEASE_NS)
    token = service_account_token(release.plane, RELEASE_NS, "someone-else")
    expected = (
        release.uid("flowschemas", "service-accounts"),
        release.uid("prioritylevelconfigurations", "workload-low"),
    )
    assert release.classified(token, OPERATOR_REQUEST) == expected


def test_an_existing_level_instead_then_uninstall(release: Release) -> None:
    values = release.helm.values_file(
        {"apiPriorityAndFairness": {"enabled": True, "existingPriorityLevel": "workload-high"}}
    )
    release.helm.run("upgrade", RELEASE, str(CHART), "--namespace", RELEASE_NS, "--values", str(values))
    assert release.plane.api_get(f"{FLOWCONTROL}/prioritylevelconfigurations/{NAME}")[0] == 404
    token = service_account_token(release.plane, RELEASE_NS, NAME)
    expected = (release.uid("flowschemas", NAME), release.uid("prioritylevelconfigurations", "workload-high"))
    eventually(
        lambda: release.classified(token, OPERATOR_REQUEST) == expected,
        60,
        "the operator's requests to be sent to workload-high",
    )
    release.helm.run("uninstall", RELEASE, "--namespace", RELEASE_NS)
    assert release.plane.api_get(f"{FLOWCONTROL}/flowschemas/{NAME}")[0] == 404
