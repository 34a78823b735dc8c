"""The Helm chart against the real local control plane (docs/operations.md, docs/operator.md).

- `helm lint --strict` passes for the defaults and for every value set below;
- each value set renders and applies cleanly with `kubectl apply --dry-run=server`, in namespaces
  that enforce the `restricted` Pod Security Standard (so the pod template is proven compliant);
- values.schema.json rejects wrong types and unknown keys with a message that names the key;
- the chart's RBAC is sufficient AND minimal, for real: its ServiceAccount and Role(s) are created,
  a token is minted for that ServiceAccount (TokenRequest), and the operator runs with nothing but
  that token through a conditional loop, an Agent/ImplementationSpec/idempotency run, a cancel and a
  TTL deletion; the same token is refused Secrets, pods/exec and everything else it does not need.
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_operator import naming
from tests.integration.helm import CHART, RELEASE_NS, Helm
from tests.integration.kubelet_driver import KubeletDriver, PodOutcome, ScriptedOutcomes
from tests.support.claims import bound_claim
from tests.support.manifests import workflow_run
from tests.support.polling import eventually
from tests.support.processes import OperatorProcess
from tests.support.tokens import service_account_token, token_kubeconfig

WATCHED = ["chart-team-a", "chart-team-b"]

# Value sets that must lint, render and apply: the defaults and the shapes operators deploy.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced": {
        "watchNamespaces": WATCHED,
        "loops": {"enabled": True, "maxIterations": 50, "statusHistoryLimit": 20},
        "jobTTLSecondsAfterRecorded": 600,
        "logFormat": "text",
        "image": {"digest": "sha256:" + "a" * 64},
    },
    "cluster-wide": {
        "watchNamespaces": [],
        "loops": {"enabled": True},
        "reporter": {"image": "registry.example.com/agentrun-operator:0.1.0"},
        "runner": {"image": "busybox:1.36"},
        "metrics": {"service": {"enabled": True}},
        "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
    },
    "ha": {"replicas": 2, "loops": {"enabled": True}},
    "ha-namespaced": {"replicas": 3, "watchNamespaces": WATCHED, "rbac": {"extraRules": []}},
    "no-metrics": {"metrics": {"enabled": False}, "serviceAccount": {"name": "custom-operator-sa"}},
    "priority-and-fairness": {"apiPriorityAndFairness": {"enabled": True}},
    "priority-and-fairness-existing-level": {
        "watchNamespaces": WATCHED,
        "serviceAccount": {"name": "custom-operator-sa"},
        "apiPriorityAndFairness": {
            "enabled": True,
            "existingPriorityLevel": "workload-high",
            "matchingPrecedence": 850,
        },
    },
}

Kinds = set[str]
IDENTITY_KINDS: Kinds = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


@pytest.fixture(scope="module")
def helm(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    binary = Path(control_plane.bin_dir) / "helm"
    assert binary.exists(), f"helm is not built in {control_plane.bin_dir}"
    return Helm(binary, tmp_path_factory.mktemp("helm"))


def _kubectl_as(
    plane: ControlPlane, kubeconfig: Path, *args: str, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(plane.bin_dir) / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
        input=input_text,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def _ensure_namespace(plane: ControlPlane, name: str, restricted: bool = True) -> None:
    labels: dict[str, str] = {}
    manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    if restricted:
        # The pod template must meet the restricted Pod Security Standard: warn and enforce.
        for mode in ("enforce", "warn"):
            labels[f"pod-security.kubernetes.io/{mode}"] = "restricted"
    plane.kubectl("apply", "-f", "-", input_text=json.dumps(manifest))


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane) -> ControlPlane:
    """The control plane as `helm install` would leave it before templates: namespaces + crds/."""
    for ns in (RELEASE_NS, *WATCHED):
        _ensure_namespace(control_plane, ns)
    # Helm installs everything in crds/ before the templates. Ours are already in (the fixture
    # installs crds/, which the drift test keeps identical); kopf's peering CRDs are added here.
    control_plane.install_crds(CHART / "crds")
    return control_plane


# -- lint, render, apply --------------------------------------------------------------------------
def test_plain_helm_template_and_lint_work_without_a_kube_version(helm: Helm) -> None:
    """What a user types first: no --kube-version. helm is built with the Kubernetes version it links
    (as helm's own Makefile does), so the chart's `kubeVersion: >=1.33` is satisfied offline."""
    rendered = helm.run("template", str(CHART), check=False)
    assert rendered.returncode == 0, rendered.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered.stdout) if d}
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"} <= kinds
    lint = helm.run("lint", str(CHART), check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    version = helm.run("version", "--template", "{{.Version}}").stdout.strip()
    assert version.startswith("v3."), version


def test_helm_lint_strict_defaults(helm: Helm) -> None:
    proc = helm.run("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_lint_strict_value_sets(helm: Helm, name: str) -> None:
    proc = helm.run("lint", "--strict", str(CHART), "--values", str(helm.values_file(VALUE_SETS[name])))
    assert "0 chart(s) failed" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_template_applies_with_server_dry_run(plane: ControlPlane, helm: Helm, name: str) -> None:
    docs = helm.render(VALUE_SETS[name])
    kinds = sorted({d["kind"] for d in docs})
    assert {"ServiceAccount", "Deployment"} <= set(kinds), kinds
    proc = _kubectl_as(
        plane,
        plane.kubeconfig,
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        input_text="\n---\n".join(yaml.safe_dump(d) for d in docs),
    )
    assert proc.returncode == 0, proc.stderr
    # No Pod Security warning (the namespaces warn on `restricted`), nor any other warning.
    assert "Warning" not in proc.stderr, proc.stderr
    assert len([line for line in proc.stdout.splitlines() if "(server dry run)" in line]) == len(docs)


def test_the_termination_grace_is_left_to_kubernetes_unless_set(helm: Helm) -> None:
    """docs/operations.md#grace-period: by default the operator gets no grace setting (pods keep
    Kubernetes' 30 s); a set value, 0 included, reaches it."""

    def grace_env(values: dict[str, Any]) -> list[str | None]:
        deployment = next(d for d in helm.render(values) if d["kind"] == "Deployment")
        env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        return [e.get("value") for e in env if e["name"] == "AGENTS_CONTROLLER_TERMINATION_GRACE_SECONDS"]

    assert grace_env({}) == []
    assert grace_env({"terminationGraceSeconds": 0}) == ["0"]
    assert grace_env({"terminationGraceSeconds": 10}) == ["10"]


def test_values_set_the_environment_and_flags(helm: Helm) -> None:
    docs = helm.render(
        {
            "watchNamespaces": WATCHED,
            "loops": {"enabled": True, "maxIterations": 100, "statusHistoryLimit": 7},
            "jobTTLSecondsAfterRecorded": 42,
            "referenceGraceSeconds": 7,
            "podFsGroup": 0,
            "runner": {"image": "busybox:1.36"},
            "image": {"repository": "example.com/op", "tag": "1.2.3"},
            "replicas": 2,
            "logFormat": "text",
        }
    )
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["AGENTS_CONTROLLER_WORKFLOW_LOOPS_ENABLED"] == "true"
    assert env["AGENTS_CONTROLLER_WORKFLOW_LOOP_MAX_ITERATIONS"] == "100"
    assert env["AGENTS_CONTROLLER_WORKFLOW_LOOP_STATUS_HISTORY_LIMIT"] == "7"
    assert env["AGENTS_CONTROLLER_NAMESPACES"] == ",".join(WATCHED)
    assert env["AGENTS_CONTROLLER_JOB_TTL_SECONDS"] == "42"
    assert env["AGENTS_CONTROLLER_REFERENCE_GRACE_SECONDS"] == "7"
    assert env["AGENTS_CONTROLLER_POD_FS_GROUP"] == "0"
    assert env["AGENTS_AGENT_RUNNER_IMAGE"] == "busybox:1.36"
    assert env["AGENTS_REPORTER_IMAGE"] == "example.com/op:1.2.3" == container["image"]
    assert container["args"][0] == "operator"
    assert {"--log-format=text", "--peering", "--liveness-port=8080", "--metrics-port=9102"} <= set(
        container["args"]
    )
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    peerings = [d for d in docs if d["kind"] == "KopfPeering"]
    assert sorted(p["metadata"]["namespace"] for p in peerings) == sorted(WATCHED)
    # The peering object is named for the release (never kopf's shared `default`), and the operator
    # is told that name.
    assert {p["metadata"]["name"] for p in peerings} == {deployment["metadata"]["name"]}
    assert f"--peering-name={deployment['metadata']['name']}" in container["args"]
    named = {"replicas": 2, "peering": {"name": "ours"}}
    named_docs = helm.render(named)
    assert {d["metadata"]["name"] for d in named_docs if d["kind"].endswith("KopfPeering")} == {"ours"}
    # Namespaced: nothing cluster-wide but the admission webhook's own configuration and its grant.
    cluster_scoped = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"].startswith("Cluster")}
    assert cluster_scoped == {
        ("ClusterRole", "agentrun-agentrun-operator-webhook"),
        ("ClusterRoleBinding", "agentrun-agentrun-operator-webhook"),
    }, "namespaced install is not namespaced"
    # A single replica without peering must never run beside its successor.
    single = next(d for d in helm.render({}) if d["kind"] == "Deployment")
    assert single["spec"]["strategy"]["type"] == "Recreate"
    assert "--peering" not in single["spec"]["template"]["spec"]["containers"][0]["args"]


def test_service_monitor_renders_when_asked(helm: Helm) -> None:
    docs = helm.render({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}})
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    service = next(d for d in docs if d["kind"] == "Service")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    assert all(
        service["metadata"]["labels"].get(k) == v
        for k, v in monitor["spec"]["selector"]["matchLabels"].items()
    )


def test_warm_network_policy_lets_only_the_operators_pods_reach_warm_pods(helm: Helm) -> None:
    """docs/operations.md#warm-network-policy: one NetworkPolicy per namespace, selecting warm pods,
    admitting the release's own pods (by namespace and selector labels) on the warm port only."""
    docs = helm.render({}, release="agentrun", namespace="ops")
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policy["metadata"]["namespace"] == "ops"
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {naming.LABEL_WARM: "true"}}
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    (peer,) = rule["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    operator_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert peer["podSelector"]["matchLabels"]
    assert all(operator_labels.get(k) == v for k, v in peer["podSelector"]["matchLabels"].items())
    assert rule["ports"] == [{"protocol": "TCP", "port": 8471}]

    docs = helm.render({"watchNamespaces": ["team-a", "team-b"], "warm": {"port": 9000}})
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["team-a", "team-b"]
    assert all(p["spec"]["ingress"][0]["ports"][0]["port"] == 9000 for p in policies)
    container = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][
        0
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["AGENTS_CONTROLLER_WARM_PORT"] == "9000"

    docs = helm.render({"warm": {"networkPolicy": {"enabled": False}}})
    assert not [d for d in docs if d["kind"] == "NetworkPolicy"]


def test_priority_and_fairness_objects_render_only_when_asked(helm: Helm) -> None:
    """docs/operations.md#priority-and-fairness: off by default; on, a FlowSchema that matches the
    release's ServiceAccount (every verb, resource and URL) and sends it to the chart's own priority
    level, or to an existing one."""
    flow_kinds = {"FlowSchema", "PriorityLevelConfiguration"}
    assert not flow_kinds & {d["kind"] for d in helm.render({})}

    docs = helm.render({"apiPriorityAndFairness": {"enabled": True}}, release="agentrun", namespace="ops")
    account = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]
    flow = next(d for d in docs if d["kind"] == "FlowSchema")
    level = next(d for d in docs if d["kind"] == "PriorityLevelConfiguration")
    assert flow["apiVersion"] == level["apiVersion"] == "flowcontrol.apiserver.k8s.io/v1"
    assert flow["metadata"]["name"] == level["metadata"]["name"] == "agentrun-agentrun-operator"
    assert flow["spec"]["priorityLevelConfiguration"] == {"name": level["metadata"]["name"]}
    assert flow["spec"]["matchingPrecedence"] == 1000
    assert flow["spec"]["distinguisherMethod"] == {"type": "ByUser"}
    [rule] = flow["spec"]["rules"]
    assert rule["subjects"] == [
        {"kind": "ServiceAccount", "serviceAccount": {"name": account["name"], "namespace": "ops"}}
    ]
    assert rule["resourceRules"] == [
        {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True, "namespaces": ["*"]}
    ]
    assert rule["nonResourceRules"] == [{"verbs": ["*"], "nonResourceURLs": ["*"]}]
    assert level["spec"] == {
        "type": "Limited",
        "limited": {
            "nominalConcurrencyShares": 20,
            "lendablePercent": 50,
            "limitResponse": {
                "type": "Queue",
                "queuing": {"queues": 16, "handSize": 4, "queueLengthLimit": 50},
            },
        },
    }

    tuned = helm.render(
        {
            "apiPriorityAndFairness": {
                "enabled": True,
                "priorityLevel": {
                    "nominalConcurrencyShares": 40,
                    "lendablePercent": 0,
                    "borrowingLimitPercent": 0,
                    "queues": 8,
                    "handSize": 2,
                    "queueLengthLimit": 100,
                },
            }
        }
    )
    limited = next(d for d in tuned if d["kind"] == "PriorityLevelConfiguration")["spec"]["limited"]
    assert limited == {
        "nominalConcurrencyShares": 40,
        "lendablePercent": 0,
        "borrowingLimitPercent": 0,
        "limitResponse": {"type": "Queue", "queuing": {"queues": 8, "handSize": 2, "queueLengthLimit": 100}},
    }

    existing = helm.render(VALUE_SETS["priority-and-fairness-existing-level"])
    assert not [d for d in existing if d["kind"] == "PriorityLevelConfiguration"]
    flow = next(d for d in existing if d["kind"] == "FlowSchema")
    assert flow["spec"]["priorityLevelConfiguration"] == {"name": "workload-high"}
    assert flow["spec"]["matchingPrecedence"] == 850
    assert flow["spec"]["rules"][0]["subjects"][0]["serviceAccount"]["name"] == "custom-operator-sa"


def test_priority_level_hand_larger_than_its_queues_is_refused(helm: Helm) -> None:
    proc = helm.template({"apiPriorityAndFairness": {"enabled": True, "priorityLevel": {"handSize": 20}}})
    assert proc.returncode != 0
    assert "apiPriorityAndFairness.priorityLevel.handSize (20) must not exceed queues (16)" in proc.stderr


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"replicas": "two"}, ["/replicas", "got string, want integer"]),
        ({"loops": {"enabled": "yes"}}, ["/loops/enabled", "got string, want boolean"]),
        ({"loops": {"maxIterations": 5000}}, ["/loops/maxIterations", "maximum"]),
        ({"loop": {"enabled": True}}, ["additional properties 'loop' not allowed"]),
        ({"watchNamespaces": "team-a"}, ["/watchNamespaces", "got string, want array"]),
        ({"watchNamespaces": ["Team_A"]}, ["/watchNamespaces/0"]),
        ({"logFormat": "xml"}, ["/logFormat"]),
        ({"image": {"tag": 1.2}}, ["/image/tag", "want string"]),
        ({"apiPriorityAndFairness": {"enabled": "yes"}}, ["/apiPriorityAndFairness/enabled", "want boolean"]),
        ({"apiPriorityAndFairness": {"matchingPrecedence": 0}}, ["/apiPriorityAndFairness/matchingPre"]),
        (
            {"apiPriorityAndFairness": {"priorityLevel": {"lendablePercent": 150}}},
            ["/apiPriorityAndFairness/priorityLevel/lendablePercent", "maximum"],
        ),
        ({"apiPriorityAndFairness": {"priority": 1}}, ["additional properties 'priority' not allowed"]),
    ],
)
def test_schema_rejects_bad_values_clearly(helm: Helm, values: dict[str, Any], expected: list[str]) -> None:
    proc = helm.template(values)
    assert proc.returncode != 0, proc.stdout[:500]
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    for fragment in expected:
        assert fragment in proc.stderr, proc.stderr


# -- RBAC, for real -------------------------------------------------------------------------------
def _can_i(plane: ControlPlane, kubeconfig: Path, *args: str) -> bool:
    proc = _kubectl_as(plane, kubeconfig, "auth", "can-i", *args)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), (args, proc.stdout, proc.stderr)
    return answer == "yes"


@dataclass
class Installed:
    """The chart's identity (ServiceAccount + RBAC) created for real, and a token kubeconfig for it."""

    plane: ControlPlane
    kubeconfig: Path
    run_namespace: str
    cluster_wide: bool
    docs: list[dict[str, Any]]

    def can_i(self, *args: str) -> bool:
        return _can_i(self.plane, self.kubeconfig, *args)


def _install_identity(
    plane: ControlPlane, helm: Helm, tmp: Path, release: str, release_ns: str, values: dict[str, Any]
) -> list[dict[str, Any]]:
    docs = [d for d in helm.render(values, release, release_ns) if d["kind"] in IDENTITY_KINDS]
    plane.kubectl("apply", "-f", "-", input_text="\n---\n".join(yaml.safe_dump(d) for d in docs))
    return docs


def _delete(plane: ControlPlane, docs: list[dict[str, Any]]) -> None:
    plane.kubectl(
        "delete",
        "--ignore-not-found",
        "--wait=false",
        "-f",
        "-",
        input_text="\n---\n".join(yaml.safe_dump(d) for d in docs),
        check=False,
    )


@pytest.fixture(scope="module", params=["namespaced", "cluster-wide"])
def installed(
    request: pytest.FixtureRequest, plane: ControlPlane, helm: Helm, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    variant = str(request.param)
    tmp = tmp_path_factory.mktemp(f"rbac-{variant}")
    release_ns = f"rbac-{variant}-system"
    run_ns = f"rbac-{variant}-runs"
    for ns in (release_ns, run_ns):
        _ensure_namespace(plane, ns, restricted=False)
    values: dict[str, Any] = {"loops": {"enabled": True}}
    if variant == "namespaced":
        values["watchNamespaces"] = [run_ns]
    release = f"rbac-{variant}"
    docs = _install_identity(plane, helm, tmp, release, release_ns, values)
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
    kubeconfig = token_kubeconfig(
        plane, service_account_token(plane, release_ns, sa), tmp / "operator.kubeconfig"
    )
    # The Job controller's pods need the namespace's default ServiceAccount to exist.
    eventually(
        lambda: plane.api_get(f"/api/v1/namespaces/{run_ns}/serviceaccounts/default")[0] == 200,
        60,
        f"the default ServiceAccount in {run_ns}",
    )
    try:
        yield Installed(plane, kubeconfig, run_ns, variant == "cluster-wide", docs)
    finally:
        _delete(plane, docs)


def _expected_rules() -> dict[tuple[str, str], set[str]]:
    return {
        ("agents.proompteng.ai", "agentruns"): {"get", "list", "watch", "delete"},
        ("agents.proompteng.ai", "agentruns/status"): {"update"},
        ("agents.proompteng.ai", "agentruns/finalizers"): {"update"},
        ("agents.proompteng.ai", "agents"): {"get", "list", "watch"},
        ("agents.proompteng.ai", "agentproviders"): {"get", "list", "watch"},
        ("agents.proompteng.ai", "implementationspecs"): {"get", "list", "watch"},
        ("batch", "jobs"): {"create", "get", "list", "watch", "delete", "patch"},
        ("", "pods"): {"list", "watch", "deletecollection"},
        ("", "events"): {"create", "patch", "list", "watch"},
        ("coordination.k8s.io", "leases"): {"get", "create"},
        ("", "persistentvolumeclaims"): {"get"},
        ("agents.proompteng.ai", "versioncontrolproviders"): {"get"},
        ("", "secrets"): {"get", "create"},
        ("", "configmaps"): {"get", "create"},
    }


def _webhook_role(installed: Installed) -> dict[str, Any]:
    return next(
        d for d in installed.docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-webhook")
    )


def test_rbac_rules_are_exactly_the_documented_set(installed: Installed) -> None:
    webhook = _webhook_role(installed)
    roles = [d for d in installed.docs if d["kind"] in ("Role", "ClusterRole") and d is not webhook]
    assert len(roles) == 1
    assert roles[0]["kind"] == ("ClusterRole" if installed.cluster_wide else "Role")
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in roles[0]["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert "*" not in (group, resource) and "*" not in rule["verbs"], rule
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == _expected_rules()


def test_token_is_granted_what_the_operator_uses(installed: Installed) -> None:
    ns = installed.run_namespace
    for (group, resource), verbs in _expected_rules().items():
        qualified = f"{resource.split('/')[0]}.{group}" if group else resource.split("/")[0]
        sub = ["--subresource", resource.split("/")[1]] if "/" in resource else []
        for verb in sorted(verbs):
            assert installed.can_i(verb, qualified, "-n", ns, *sub), (verb, qualified, sub)


@pytest.mark.parametrize(
    "request_args",
    [
        ("list", "secrets"),
        ("watch", "secrets"),
        ("create", "pods", "--subresource=exec"),
        ("get", "pods", "--subresource=exec"),
        ("create", "pods"),
        ("delete", "pods"),
        ("get", "pods", "--subresource=log"),
        ("list", "configmaps"),
        ("create", "serviceaccounts", "--subresource=token"),
        ("create", "persistentvolumeclaims"),
        ("list", "persistentvolumeclaims"),
        ("delete", "persistentvolumeclaims"),
        ("update", "agentruns.agents.proompteng.ai"),
        ("patch", "agentruns.agents.proompteng.ai"),
        ("create", "agentruns.agents.proompteng.ai"),
        ("create", "agents.agents.proompteng.ai"),
        ("update", "jobs.batch"),
        ("update", "leases.coordination.k8s.io"),
        ("delete", "leases.coordination.k8s.io"),
        ("update", "events"),
        ("create", "roles.rbac.authorization.k8s.io"),
        ("create", "rolebindings.rbac.authorization.k8s.io"),
        ("list", "namespaces"),
        ("list", "customresourcedefinitions.apiextensions.k8s.io"),
        ("list", "nodes"),
        ("impersonate", "serviceaccounts"),
    ],
    ids=lambda a: "-".join(a).replace("--subresource=", ""),
)
def test_token_is_refused_what_the_operator_does_not_use(
    installed: Installed, request_args: tuple[str, ...]
) -> None:
    assert not installed.can_i(*request_args, "-n", installed.run_namespace), request_args
    if not installed.cluster_wide:
        # Namespaced: nothing at all outside the watched namespaces, nor cluster-wide.
        assert not installed.can_i("list", "agentruns.agents.proompteng.ai", "-A")
        assert not installed.can_i("create", "jobs.batch", "-n", "default")


def test_token_is_refused_secrets_by_the_api_server(installed: Installed) -> None:
    """Not only `can-i`: the API server itself answers 403 to that token."""
    proc = _kubectl_as(installed.plane, installed.kubeconfig, "get", "secrets", "-n", installed.run_namespace)
    assert proc.returncode != 0 and "Forbidden" in proc.stderr, proc.stderr
    proc = _kubectl_as(
        installed.plane,
        installed.kubeconfig,
        "create",
        "--raw",
        f"/api/v1/namespaces/{installed.run_namespace}/pods/any/exec?command=true&stdout=true",
        "-f",
        "/dev/null",
    )
    assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), proc.stderr


@dataclass
class Running:
    installed: Installed
    operator: OperatorProcess
    outcomes: ScriptedOutcomes
    first_served_after: float = 0.0

    @property
    def plane(self) -> ControlPlane:
        return self.installed.plane

    @property
    def ns(self) -> str:
        return self.installed.run_namespace

    def create(self, manifest: dict[str, Any]) -> None:
        manifest["metadata"]["namespace"] = self.ns
        self.plane.kubectl("create", "-f", "-", input_text=json.dumps(manifest))

    def get(self, name: str) -> dict[str, Any] | None:
        code, data = self.plane.api_get(
            f"/apis/agents.proompteng.ai/v1alpha1/namespaces/{self.ns}/agentruns/{name}"
        )
        return dict(json.loads(data)) if code == 200 else None

    def wait_finished(self, name: str, timeout: float = 90) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        def done() -> bool:
            run = self.get(name) or {}
            seen.update(run)
            return (run.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Cancelled")

        try:
            eventually(done, timeout, f"agentrun {name} to finish")
        except AssertionError:
            print(json.dumps(seen.get("status"), indent=1))
            print(self.operator.logs()[-6000:])
            raise
        return seen

    def jobs(self, run: str) -> list[dict[str, Any]]:
        out = self.plane.kubectl(
            "get", "jobs", "-n", self.ns, "-l", f"{naming.LABEL_RUN}={run}", "-o", "json"
        )
        return list(json.loads(out)["items"])


@pytest.fixture(scope="module")
def running(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """The operator as a process whose only credential is the chart ServiceAccount's token."""
    outcomes = ScriptedOutcomes()
    bound_claim(installed.plane, installed.run_namespace, "ws")
    driver = KubeletDriver(installed.plane, installed.run_namespace, outcomes.outcome).start()
    env = {
        "AGENTS_CONTROLLER_NAMESPACES": "" if installed.cluster_wide else installed.run_namespace,
        # No periodic resync: every step below must be driven by the watches this token allows.
        "AGENTS_CONTROLLER_RESYNC_SECONDS": "3600",
    }
    operator = OperatorProcess(
        installed.plane,
        tmp_path_factory.mktemp("rbac-operator"),
        env=env,
        args=(f"--kubeconfig={installed.kubeconfig}",),  # the last --kubeconfig wins
    ).start()
    started = time.monotonic()
    running = Running(installed, operator, outcomes)
    try:
        # Warm-up: the first run served shows the watches are live (see test_first_run_served_promptly).
        running.create(workflow_run("rbac-warmup", {"loop": {"maxIterations": 1}}))
        running.wait_finished("rbac-warmup", timeout=150)
        running.first_served_after = time.monotonic() - started
        print(f"first run served {running.first_served_after:.1f}s after the operator started")
        yield running
    finally:
        operator.stop()
        driver.stop()
        assert not driver.errors, driver.errors[:5]


def _job_refs(run: dict[str, Any]) -> list[str]:
    """The Jobs a run's status names, iteration by iteration (Jobs themselves may already be gone)."""
    return [
        str(it["jobRef"]["name"])
        for step in run["status"]["workflow"]["steps"]
        for it in (step.get("loop") or {}).get("iterations", [])
    ]


def test_operator_with_chart_rbac_runs_the_conditional_loop(running: Running) -> None:
    name = "rbac-conditional"
    running.outcomes.runs[name] = lambda i, _a: PodOutcome(control={"continue": i < 2})
    loop = {
        "maxIterations": 5,
        "condition": {
            "type": "cel",
            "expression": "iteration.last.control.continue == true",
            "source": {"type": "file", "onMissing": "stop", "onInvalid": "fail"},
        },
    }
    running.create(workflow_run(name, {"loop": loop}))
    run = running.wait_finished(name)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    step = run["status"]["workflow"]["steps"][0]
    assert step["loop"]["stopReason"] == "LoopConditionFalse"
    assert step["loop"]["completedIterations"] == 2
    assert step["loop"]["lastControl"] == {"continue": False}
    assert _job_refs(run) == [f"{name}-step-1-iter-1-attempt-1", f"{name}-step-1-iter-2-attempt-1"]
    # Its Events were posted (events: create) and the Jobs still there got their TTL (jobs: patch).
    events = running.plane.kubectl(
        "get", "events", "-n", running.ns, "--field-selector", f"involvedObject.name={name}", "-o", "json"
    )
    # Aggregated (docs/operator.md#events): a reason is an Event's own or a part of its message.
    told = " ".join(f"{e['reason']} {e['message']}" for e in json.loads(events)["items"])
    assert all(r in told for r in ("LoopStarted", "ConditionEvaluated", "LoopCompleted")), told
    eventually(
        lambda: all(j["spec"].get("ttlSecondsAfterFinished") is not None for j in running.jobs(name)),
        30,
        "the Jobs' TTL to be set",
    )


def test_operator_with_chart_rbac_reads_references_and_claims_idempotency(running: Running) -> None:
    for kind, obj, spec in (
        ("AgentProvider", "rbac-provider", {"image": "busybox:1.36", "command": ["sh", "-c", "true"]}),
        ("Agent", "rbac-agent", {"providerRef": {"name": "rbac-provider"}}),
        ("ImplementationSpec", "rbac-impl", {"text": "Do the thing.", "summary": "thing"}),
    ):
        running.create(
            {
                "apiVersion": "agents.proompteng.ai/v1alpha1",
                "kind": kind,
                "metadata": {"name": obj},
                "spec": spec,
            }
        )
    base = {
        "agentRef": {"name": "rbac-agent"},
        "implementationSpecRef": {"name": "rbac-impl"},
        "idempotencyKey": "rbac-key",
    }
    first = workflow_run("rbac-agent-first", {"loop": {"maxIterations": 1}}, **base)
    del first["spec"]["workload"]["image"], first["spec"]["workload"]["command"]
    running.create(first)
    run = running.wait_finished("rbac-agent-first")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    duplicate = workflow_run("rbac-agent-second", {"loop": {"maxIterations": 1}}, **base)
    running.create(duplicate)
    run = running.wait_finished("rbac-agent-second")
    assert run["status"]["phase"] == "Failed"
    assert any(c["type"] == "Duplicate" for c in run["status"]["conditions"]), run["status"]
    assert running.jobs("rbac-agent-second") == []


def test_operator_with_chart_rbac_cancels_and_deletes_finished_runs(running: Running) -> None:
    name = "rbac-cancel"
    running.outcomes.runs[name] = lambda _i, _a: PodOutcome(hang=True)
    running.create(workflow_run(name, {"loop": {"maxIterations": 3}}, ttlSecondsAfterFinished=1))
    eventually(lambda: len(running.jobs(name)) == 1, 30, "the first Job")
    running.plane.kubectl(
        "patch", "agentrun", name, "-n", running.ns, "--type=merge", "-p", '{"spec":{"cancel":"Immediate"}}'
    )
    # Cancelled (jobs: delete), then removed after its TTL (agentruns: delete).
    eventually(lambda: running.get(name) is None, 60, f"agentrun {name} to be cancelled and deleted")
    assert "HTTP 403" not in running.operator.logs()


def test_operator_logs_show_no_forbidden_request_of_its_own(running: Running) -> None:
    logs = running.operator.logs()
    assert "HTTP 403" not in logs
    # kopf's scanning of namespaces and CRDs is off (docs/operations.md#rbac): nothing is refused.
    for raw in logs.splitlines():
        line = re.sub(r'"ts":"[^"]*"', "", raw)  # a timestamp's milliseconds may read 403
        assert not re.search(r"APIForbiddenError|\bforbidden\b|\b403\b(?!\d)", line, re.IGNORECASE), line


KOPF_REFUSED_LISTING_RETRIES = sum((1, 1, 2, 3, 5, 8, 13, 21))
"""kopf's default `networking.error_backoffs`: how long it retries a listing the RBAC refuses before
it falls back (54 s) -- the delay before serving that switching its scanning off avoids."""


def test_operator_serves_promptly_with_least_privilege(running: Running) -> None:
    """Served without kopf retrying a request the RBAC refused: a refused namespace or CRD listing
    would be retried for KOPF_REFUSED_LISTING_RETRIES seconds before kopf fell back, each attempt
    logged by kopf's client ("Request attempt N failed; will retry: ... APIForbiddenError"). Other
    retries (a 429 while the API server initializes) are kopf's normal way. The fact, not a latency:
    how long the first run took is printed by the fixture (a loaded machine takes longer)."""
    logs = running.operator.logs().splitlines()
    retried = [line for line in logs if "Request attempt" in line and "APIForbiddenError" in line]
    assert retried == [], retried[:3]


# -- RBAC that refuses the reference watches --------------------------------------------------------
REFERENCE_PLURALS = ("agents", "agentproviders", "implementationspecs")
PROVIDER_IMAGE = "example.com/refused-provider:1"


@pytest.fixture(scope="module")
def refused_watches(
    plane: ControlPlane, helm: Helm, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    """The chart's identity with an older grant: Agents, AgentProviders and ImplementationSpecs may
    be read with get, not listed or watched (docs/operator.md#cache)."""
    tmp = tmp_path_factory.mktemp("rbac-refused")
    release_ns, run_ns = "rbac-refused-system", "rbac-refused-runs"
    for ns in (release_ns, run_ns):
        _ensure_namespace(plane, ns, restricted=False)
    values: dict[str, Any] = {"watchNamespaces": [run_ns], "loops": {"enabled": True}}
    docs = [d for d in helm.render(values, "rbac-refused", release_ns) if d["kind"] in IDENTITY_KINDS]
    (role,) = [d for d in docs if d["kind"] == "Role"]
    for rule in role["rules"]:
        if set(rule["resources"]) & set(REFERENCE_PLURALS):
            assert set(rule["resources"]) <= set(REFERENCE_PLURALS), rule
            rule["verbs"] = ["get"]
    plane.kubectl("apply", "-f", "-", input_text="\n---\n".join(yaml.safe_dump(d) for d in docs))
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
    kubeconfig = token_kubeconfig(
        plane, service_account_token(plane, release_ns, sa), tmp / "operator.kubeconfig"
    )
    installed = Installed(plane, kubeconfig, run_ns, False, docs)
    eventually(
        lambda: plane.api_get(f"/api/v1/namespaces/{run_ns}/serviceaccounts/default")[0] == 200,
        60,
        f"the default ServiceAccount in {run_ns}",
    )
    assert not installed.can_i("list", "agents.agents.proompteng.ai", "-n", run_ns)
    assert installed.can_i("get", "agents.agents.proompteng.ai", "-n", run_ns)
    outcomes = ScriptedOutcomes()
    bound_claim(plane, run_ns, "ws")
    driver = KubeletDriver(plane, run_ns, outcomes.outcome).start()
    operator = OperatorProcess(
        plane,
        tmp / "operator",
        env={"AGENTS_CONTROLLER_NAMESPACES": run_ns, "AGENTS_CONTROLLER_RESYNC_SECONDS": "3600"},
        args=(f"--kubeconfig={kubeconfig}",),
    ).start()
    try:
        yield Running(installed, operator, outcomes)
    finally:
        operator.stop()
        driver.stop()
        _delete(plane, docs)
        assert not driver.errors, driver.errors[:5]


def test_without_list_and_watch_on_references_runs_still_succeed_reading_them_with_get(
    refused_watches: Running,
) -> None:
    running = refused_watches
    for kind, obj, spec in (
        ("AgentProvider", "refused-provider", {"image": PROVIDER_IMAGE, "command": ["sh", "-c", "true"]}),
        ("Agent", "refused-agent", {"providerRef": {"name": "refused-provider"}}),
        ("ImplementationSpec", "refused-impl", {"text": "Do the thing.", "summary": "thing"}),
    ):
        running.create(
            {
                "apiVersion": "agents.proompteng.ai/v1alpha1",
                "kind": kind,
                "metadata": {"name": obj},
                "spec": spec,
            }
        )
    run = workflow_run(
        "refused-refs",
        {"loop": {"maxIterations": 2}},
        agentRef={"name": "refused-agent"},
        implementationSpecRef={"name": "refused-impl"},
    )
    del run["spec"]["workload"]["image"], run["spec"]["workload"]["command"]
    running.create(run)
    done = running.wait_finished("refused-refs")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["status"]["workflow"]["steps"][0]["loop"]["completedIterations"] == 2
    # The image came from the AgentProvider, read with GET although it could not be watched.
    (job, _) = sorted(running.jobs("refused-refs"), key=lambda j: j["metadata"]["name"])
    containers = job["spec"]["template"]["spec"]["containers"]
    assert [c["image"] for c in containers if c["name"] == "main"] == [PROVIDER_IMAGE], containers
    logs = running.operator.logs()
    for plural in REFERENCE_PLURALS:
        assert f"cannot list {plural} (grant list and watch on them); reading them per reconcile" in logs


# -- HA: replicas > 1 with kopf peering ------------------------------------------------------------
PEERING_NAME = "rbac-peering-agentrun-operator"  # the chart's default: the release's full name


@dataclass
class Peered:
    running: Running
    operators: list[OperatorProcess]


@pytest.fixture(scope="module")
def peered(plane: ControlPlane, helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peered]:
    """Two operator processes with `--peering`, each with the chart's token, as replicas: 2 deploys them."""
    tmp = tmp_path_factory.mktemp("rbac-peering")
    release_ns, run_ns = "rbac-peering-system", "rbac-peering-runs"
    for ns in (release_ns, run_ns):
        _ensure_namespace(plane, ns, restricted=False)
    values: dict[str, Any] = {"watchNamespaces": [run_ns], "replicas": 2, "loops": {"enabled": True}}
    docs = _install_identity(plane, helm, tmp, "rbac-peering", release_ns, values)
    peering = [d for d in helm.render(values, "rbac-peering", release_ns) if d["kind"] == "KopfPeering"]
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in peering] == [(run_ns, PEERING_NAME)]
    plane.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(peering[0]))
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
    kubeconfig = token_kubeconfig(
        plane, service_account_token(plane, release_ns, sa), tmp / "operator.kubeconfig"
    )
    eventually(
        lambda: plane.api_get(f"/api/v1/namespaces/{run_ns}/serviceaccounts/default")[0] == 200,
        60,
        f"the default ServiceAccount in {run_ns}",
    )
    installed = Installed(plane, kubeconfig, run_ns, False, docs)
    bound_claim(plane, run_ns, "ws")  # workflow_run's claim: the operator starts runs once it is Bound
    outcomes = ScriptedOutcomes()
    driver = KubeletDriver(plane, run_ns, outcomes.outcome).start()
    operators = [
        OperatorProcess(
            plane,
            tmp / f"operator-{pod}",
            env={
                "AGENTS_CONTROLLER_NAMESPACES": run_ns,
                "AGENTS_CONTROLLER_RESYNC_SECONDS": "3600",
                "POD_ID": f"agentrun-operator-{pod}",  # what the Deployment sets from metadata.name
            },
            args=(f"--kubeconfig={kubeconfig}", "--peering", f"--peering-name={PEERING_NAME}"),
        ).start()
        for pod in ("a", "b")
    ]
    try:
        yield Peered(Running(installed, operators[0], outcomes), operators)
    finally:
        for operator in operators:
            operator.stop()
        driver.stop()
        _delete(plane, docs + peering)


def _peering_path(namespace: str) -> str:
    return f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings/{PEERING_NAME}"


def _peers(plane: ControlPlane, namespace: str) -> set[str]:
    code, data = plane.api_get(_peering_path(namespace))
    return set((json.loads(data).get("status") or {}) if code == 200 else {})


def _gate(op: OperatorProcess) -> str:
    """Whether a replica serves or stands by, as kopf's peering last decided (its current log); a
    replica that logged neither has not served; "stopped" once its process has exited."""
    if op.proc is None or op.proc.poll() is not None:
        return "stopped"
    last = "standby"
    for line in op.log_text().splitlines():
        if "serving: kopf's peering lets this replica serve" in line:
            last = "serving"
        elif "standing by: a live peer has a priority as high" in line:
            last = "standby"
    return last


def _patch_peering_status(plane: ControlPlane, namespace: str, status: dict[str, Any]) -> None:
    patch = json.dumps({"status": status})
    plane.kubectl("patch", "kopfpeering", PEERING_NAME, "-n", namespace, "--type=merge", "-p", patch)


def _one_serves(peered: Peered) -> bool:
    return sorted(_gate(op) for op in peered.operators) == ["serving", "standby"]


def test_ha_a_foreign_peer_of_higher_priority_pauses_both(peered: Peered) -> None:
    plane, ns = peered.running.plane, peered.running.ns
    eventually(lambda: _one_serves(peered), 120, "one replica serving and the other standing by")
    # A live peer of higher priority under our name (what `kopf freeze` writes): both stand by.
    seen = datetime.datetime.now(datetime.UTC).isoformat()
    _patch_peering_status(plane, ns, {"someone-else": {"priority": 2**31, "lifetime": 60, "lastseen": seen}})
    eventually(
        lambda: [_gate(op) for op in peered.operators] == ["standby", "standby"],
        60,
        "both replicas standing by for the foreign peer",
    )
    _patch_peering_status(plane, ns, {"someone-else": None})
    eventually(lambda: _one_serves(peered), 90, "one replica serving again once the foreign peer left")


def test_ha_an_unparseable_peer_entry_stops_every_replica_never_lets_both_serve(peered: Peered) -> None:
    plane, ns = peered.running.plane, peered.running.ns
    eventually(lambda: _one_serves(peered), 120, "one replica serving and the other standing by")
    # kopf cannot read the entry: it stops the operator "to prevent damage" (in a cluster the pod
    # restarts and stops again until the entry is removed; docs/operations.md#ha). Neither serves.
    _patch_peering_status(plane, ns, {"odd": {"priority": "high", "lifetime": "long"}})
    eventually(
        lambda: [_gate(op) for op in peered.operators] == ["stopped", "stopped"],
        60,
        "both replicas stopped by kopf",
    )
    assert all("unrecoverable error" in op.log_text() for op in peered.operators)
    _patch_peering_status(plane, ns, {"odd": None})
    for op in peered.operators:
        op.start()
    eventually(lambda: _one_serves(peered), 120, "one replica serving once the entry is gone")


def test_ha_replicas_with_peering_serve_runs_and_fail_over(peered: Peered) -> None:
    running = peered.running
    # Both replicas have announced themselves in the peering object and seen each other.
    eventually(
        lambda: _peers(running.plane, running.ns) >= {"agentrun-operator-a", "agentrun-operator-b"},
        90,
        "both replicas in the KopfPeering",
    )
    # Exactly one serves, the other stands by (each logs kopf's decision when it changes).
    eventually(lambda: _one_serves(peered), 90, "one replica serving and the other standing by")
    serving = next(op for op in peered.operators if _gate(op) == "serving")
    standby = next(op for op in peered.operators if _gate(op) == "standby")
    running.create(workflow_run("ha-first", {"loop": {"maxIterations": 2}}))
    first = running.wait_finished("ha-first", timeout=60)
    assert first["status"]["phase"] == "Succeeded"
    # The standby reconciled nothing of it (every reconcile's decisions are logged with the run).
    assert f'"run":"{running.ns}/ha-first"' in serving.logs()
    assert f'"run":"{running.ns}/ha-first"' not in standby.logs()
    # They did not freeze each other (kopf pauses every operator of equal priority it sees).
    frozen = [op.log_path.parent.name for op in peered.operators if "Possibly conflicting" in op.logs()]
    assert not frozen, f"replicas that saw an equal-priority peer and paused: {frozen}"
    # The serving replica goes (a rolling update, a lost node): the other one takes over.
    serving.stop()
    eventually(lambda: _gate(standby) == "serving", 90, "the standby to take over")
    running.create(workflow_run("ha-second", {"loop": {"maxIterations": 2}}))
    second = running.wait_finished("ha-second", timeout=90)
    assert second["status"]["phase"] == "Succeeded"
    names = _job_refs(first) + _job_refs(second)
    assert len(names) == len(set(names)) == 4
