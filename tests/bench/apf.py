"""API Priority and Fairness in the scale benchmark (`bench_scale --apf`, docs/operator.md#scale-apf).

The dev plane runs kube-apiserver with APF off, and the benchmark's operator as the admin, whose group
(`system:masters`) APF exempts: neither says anything about APF. With `--apf` the API server runs
with it on, and the operator runs as the chart's ServiceAccount, with the chart's RBAC (rendered by
`helm template`, applied for real) and a TokenRequest token, as in a pod: its requests then go
where any ServiceAccount's go, `service-accounts` / `workload-low`. With `--flow-schema` the chart's
FlowSchema and PriorityLevelConfiguration (`apiPriorityAndFairness.enabled`) are applied too, and
its requests go to the chart's level. Either way the benchmark checks where they go (the API
server's answer headers) before the runs start, and reports what APF did per priority level.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from agentrun_devcluster import toolchain
from agentrun_devcluster.controlplane import ControlPlane
from tests.integration.helm import Helm
from tests.support.polling import eventually
from tests.support.tokens import get_as, service_account_token, token_kubeconfig

APF_ON = "--enable-priority-and-fairness=true"  # after the dev plane's `=false`: the last one wins
RELEASE = "agentrun"
RELEASE_NS = "agentrun-system"
NAME = "agentrun-agentrun-operator"  # the release's full name: its ServiceAccount, FlowSchema, level
FLOWCONTROL = "/apis/flowcontrol.apiserver.k8s.io/v1"
IDENTITY = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
FLOW = {"FlowSchema", "PriorityLevelConfiguration"}
PROBE = "/apis/agents.proompteng.ai/v1alpha1/agentruns?limit=1"  # a request the operator makes
KEPT = (
    "apiserver_flowcontrol_dispatched_requests_total{",
    "apiserver_flowcontrol_rejected_requests_total{",
    "apiserver_flowcontrol_request_wait_duration_seconds_sum{",
    "apiserver_flowcontrol_request_wait_duration_seconds_count{",
    "apiserver_flowcontrol_nominal_limit_seats{",
)
"""The API server's APF series the benchmark keeps (`apiserver_metrics`)."""


def apiserver_args(apf: bool, inflight: int | None) -> tuple[str, ...]:
    """kube-apiserver's flags: APF on; `inflight`: its concurrency limit (APF divides
    --max-requests-inflight + --max-mutating-requests-inflight among the levels), split 2:1 as the
    defaults (400 + 200)."""
    args = (APF_ON,) if apf else ()
    if inflight:
        args += (
            f"--max-requests-inflight={inflight - inflight // 3}",
            f"--max-mutating-requests-inflight={inflight // 3}",
        )
    return args


def classification(plane: ControlPlane, token: str) -> tuple[str, str]:
    """The names of the FlowSchema and the priority level the API server gives a request made with
    `token` (from the uids in its answer headers)."""
    _, headers, _ = get_as(plane, token, PROBE)
    uids = (headers.get("X-Kubernetes-PF-FlowSchema-UID"), headers.get("X-Kubernetes-PF-PriorityLevel-UID"))
    names = []
    for kind, uid in zip(("flowschemas", "prioritylevelconfigurations"), uids, strict=True):
        code, body = plane.api_get(f"{FLOWCONTROL}/{kind}", timeout=30)
        items = json.loads(body)["items"] if code == 200 else []
        names.append(next((i["metadata"]["name"] for i in items if i["metadata"]["uid"] == uid), str(uid)))
    return names[0], names[1]


def operator_identity(
    plane: ControlPlane, home: Path, flow_schema: bool, token_seconds: int, shares: int | None = None
) -> tuple[Path, str]:
    """Apply the chart's ServiceAccount and cluster-wide RBAC (and, with `flow_schema`, its
    FlowSchema and level, with `shares` if given instead of the chart's nominalConcurrencyShares);
    wait until the API server classifies the ServiceAccount's requests as expected; return a
    kubeconfig with its token, and `flow schema / priority level`."""
    (home / "helm").mkdir(parents=True, exist_ok=True)
    helm = Helm(toolchain.tool_path("helm"), home / "helm")
    values: dict[str, Any] = {"enabled": flow_schema}
    if shares:
        values["priorityLevel"] = {"nominalConcurrencyShares": shares}
    docs = helm.render({"apiPriorityAndFairness": values}, RELEASE, RELEASE_NS)
    applied = [d for d in docs if d["kind"] in IDENTITY | FLOW]
    plane.kubectl("create", "namespace", RELEASE_NS, check=False)
    plane.kubectl("apply", "-f", "-", input_text="\n---\n".join(yaml.safe_dump(d) for d in applied))
    token = service_account_token(plane, RELEASE_NS, NAME, token_seconds)
    expected = (NAME, NAME) if flow_schema else ("service-accounts", "workload-low")
    # The API server's APF controller reads new FlowSchemas through an informer: a condition to wait for.
    eventually(
        lambda: classification(plane, token) == expected, 120, f"the operator's requests in {expected}"
    )
    return token_kubeconfig(plane, token, home / "operator.kubeconfig"), " / ".join(expected)


_LABELS = re.compile(r'(\w+)="([^"]*)"')


def _series(samples: dict[str, float], prefix: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(_LABELS.findall(k[len(prefix) :])), v) for k, v in samples.items() if k.startswith(prefix)]


def flow_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Per priority level over the measured span: requests dispatched, rejected (429), the mean wait
    in its queues of those dispatched, its nominal seats; and requests dispatched per FlowSchema."""

    def delta(prefix: str, key: str, executed_only: bool = False) -> dict[str, float]:
        out: dict[str, float] = {}
        for samples, sign in ((after, 1.0), (before, -1.0)):
            for labels, value in _series(samples, prefix):
                if not executed_only or labels.get("execute") == "true":
                    out[labels.get(key, "?")] = out.get(labels.get(key, "?"), 0.0) + sign * value
        return out

    dispatched = delta("apiserver_flowcontrol_dispatched_requests_total{", "priority_level")
    rejected = delta("apiserver_flowcontrol_rejected_requests_total{", "priority_level")
    wait_sum = delta(KEPT[2], "priority_level", executed_only=True)
    wait_count = delta(KEPT[3], "priority_level", executed_only=True)
    seats = {labels.get("priority_level", "?"): v for labels, v in _series(after, KEPT[4])}
    levels = sorted(set(dispatched) | set(rejected))
    return {
        "levels": {
            level: {
                "dispatched": dispatched.get(level, 0.0),
                "rejected": rejected.get(level, 0.0),
                "mean_wait_ms": 1000 * wait_sum.get(level, 0.0) / wait_count[level]
                if wait_count.get(level)
                else 0.0,
                "nominal_seats": seats.get(level, float("nan")),
            }
            for level in levels
            if dispatched.get(level, 0.0) or rejected.get(level, 0.0)
        },
        "dispatched_by_flow_schema": {k: v for k, v in sorted(delta(KEPT[0], "flow_schema").items()) if v},
    }


def summary(figures: dict[str, Any]) -> str:
    rows = [
        f"  {level}: {f['dispatched']:.0f} dispatched, {f['rejected']:.0f} rejected, "
        f"mean wait {f['mean_wait_ms']:.1f} ms, {f['nominal_seats']:.0f} nominal seats"
        for level, f in figures["levels"].items()
    ]
    return "\n".join(["API Priority and Fairness, per priority level:", *rows])
