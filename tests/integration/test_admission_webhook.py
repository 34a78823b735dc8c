"""The admission webhook against the real API server (docs/operations.md#admission-webhook), with the
operator as a process serving it on loopback and applying its ValidatingWebhookConfiguration.

- every manifest the CRD admits but the operator refuses (fixtures: OPERATOR_ONLY_AGENTRUNS) is
  refused at `kubectl apply` with exactly the lines `agentrun validate` prints for it;
- the fixtures the CRD refuses never reach the webhook (the API server checks the schema first);
- a valid run is admitted, and an admitted run's later writes always pass;
- `agentrun validate` and the API server give every name the same verdict, and the offline fuzz
  generator's documents get from the webhook exactly validate's lines (never its internal-error
  warning; docs/development.md#fuzz);
- with the operator killed, or listening but silent, or serving a manifest over kopf's request size
  limit, applies pass under failurePolicy Ignore within the timeout; under Fail they are refused.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import os
import random
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_devcluster import webhookcert
from agentrun_devcluster.controlplane import ControlPlane
from agentrun_devcluster.processes import free_port
from agentrun_operator.api import API_VERSION
from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner.validate import validate_manifest
from agentrun_operator.validation_cli import check_file
from agentrun_operator.webhook import object_label, refusal_message
from tests.fixtures.invalid_agentruns import INVALID_AGENTRUNS, OPERATOR_ONLY_AGENTRUNS, base_manifest
from tests.fixtures.object_names import NAMES
from tests.fuzz.mutate import mutant_file
from tests.integration.helm import Helm
from tests.integration.test_chart import _can_i
from tests.support.api import kubectl_in
from tests.support.polling import eventually
from tests.support.processes import OperatorProcess
from tests.support.tokens import service_account_token, token_kubeconfig

NAMESPACE = "webhook"
CONFIGURATION = "agentrun-webhook-test"
TIMEOUT_SECONDS = 2
DENIED = "denied the request: "
WEBHOOK = "agentruns.agents.proompteng.ai"
FUZZ_WEBHOOK = int(os.environ.get("AGENTRUN_FUZZ_WEBHOOK", "40"))
FUZZ_SEED = int(os.environ.get("AGENTRUN_FUZZ_SEED", "0"))


@functools.cache
def _certs() -> Path:
    """The dev cluster's self-signed certificate for 127.0.0.1, as `agentrun dev up` makes it."""
    return webhookcert.ensure(Path(tempfile.mkdtemp(prefix="webhook-test-")) / "webhook")


def _env(
    port: int, policy: str = "Ignore", configuration: str = CONFIGURATION, certs: Path | None = None
) -> dict[str, str]:
    return {
        "AGENTS_WEBHOOK_CERT_DIR": str(certs or _certs()),
        "AGENTS_CONTROLLER_NAMESPACES": NAMESPACE,
        "AGENTS_WEBHOOK_PORT": str(port),
        "AGENTS_WEBHOOK_ADDRESS": "127.0.0.1",
        "AGENTS_WEBHOOK_HOST": "127.0.0.1",
        "AGENTS_WEBHOOK_CONFIGURATION_NAME": configuration,
        "AGENTS_WEBHOOK_FAILURE_POLICY": policy,
        "AGENTS_WEBHOOK_TIMEOUT_SECONDS": str(TIMEOUT_SECONDS),
    }


def kubectl(plane: ControlPlane, *args: str, manifest: Any = None) -> subprocess.CompletedProcess[str]:
    return kubectl_in(plane, NAMESPACE, *args, manifest=manifest)


def _named(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    manifest = copy.deepcopy(manifest)
    manifest["metadata"]["name"] = name
    return manifest


def _configured(plane: ControlPlane, port: int, policy: str, configuration: str = CONFIGURATION) -> bool:
    out = plane.kubectl("get", "validatingwebhookconfiguration", configuration, "-o", "json", check=False)
    if not out.strip():
        return False
    # The chart creates it empty (no `webhooks` yet); the operator fills it in once it serves.
    webhooks = json.loads(out).get("webhooks") or []
    return bool(webhooks) and all(
        f":{port}/" in w["clientConfig"]["url"] and w["failurePolicy"] == policy for w in webhooks
    )


def _start(plane: ControlPlane, log_dir: Path, port: int, policy: str = "Ignore") -> OperatorProcess:
    operator = OperatorProcess(plane, log_dir, env=_env(port, policy)).start()
    eventually(lambda: _configured(plane, port, policy), 60, "the webhook configuration")
    # The API server picks up a changed configuration within a second or so: wait for a refusal.
    probe = OPERATOR_ONLY_AGENTRUNS[0][1]
    eventually(
        lambda: DENIED in kubectl(plane, "create", "--dry-run=server", "-f", "-", manifest=probe).stderr,
        30,
        "the webhook to answer",
        every=0.5,
    )
    return operator


@pytest.fixture(scope="module")
def plane(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not control_plane.kubectl("get", "ns", NAMESPACE, "--ignore-not-found", "-o", "name").strip():
        control_plane.kubectl("create", "namespace", NAMESPACE)
    port = free_port()
    operator = _start(control_plane, tmp_path_factory.mktemp("operator"), port)
    try:
        yield control_plane, operator, port
    finally:
        operator.stop()
        control_plane.kubectl("delete", "validatingwebhookconfiguration", CONFIGURATION, "--ignore-not-found")


def _validate_lines(manifest: dict[str, Any], tmp_path: Path) -> list[str]:
    """What `agentrun validate FILE` prints for the manifest (as the operator is configured: loops on,
    cap 20), without the `FILE: ` prefix."""
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    out = tmp_path / "out.txt"
    with out.open("w") as stream:
        check_file(str(path), OperatorConfig(loops_enabled=True), stream)
    return [line.removeprefix(f"{path}: ") for line in out.read_text().splitlines()]


@pytest.mark.parametrize(
    ("case", "manifest", "field"), OPERATOR_ONLY_AGENTRUNS, ids=[c for c, _, _ in OPERATOR_ONLY_AGENTRUNS]
)
def test_apply_is_refused_with_the_lines_agentrun_validate_prints(
    plane: Any, tmp_path: Path, case: str, manifest: dict[str, Any], field: str
) -> None:
    cluster, _, _ = plane
    expected = _validate_lines(manifest, tmp_path)
    assert expected and any(f": {field}: " in line for line in expected), expected
    proc = kubectl(cluster, "apply", "-f", "-", manifest=manifest)
    assert proc.returncode != 0, f"{case}: admitted:\n{proc.stdout}"
    assert f'admission webhook "agentruns.agents.proompteng.ai" {DENIED}' in proc.stderr, proc.stderr
    message = proc.stderr.split(DENIED, 1)[1].strip()
    assert message == "\n".join(expected)
    assert kubectl(cluster, "get", "agentrun", manifest["metadata"]["name"]).returncode != 0


@pytest.mark.parametrize(
    ("case", "manifest", "field"), INVALID_AGENTRUNS, ids=[c for c, _, _ in INVALID_AGENTRUNS]
)
def test_what_the_crd_refuses_is_refused_before_the_webhook(
    plane: Any, case: str, manifest: dict[str, Any], field: str
) -> None:
    cluster, _, _ = plane
    proc = kubectl(cluster, "apply", "--dry-run=server", "-f", "-", manifest=manifest)
    assert proc.returncode != 0 and field in proc.stderr, proc.stderr
    assert DENIED not in proc.stderr, f"{case}: the schema should refuse it first:\n{proc.stderr}"


def test_a_valid_run_is_admitted_and_its_later_writes_pass(plane: Any) -> None:
    cluster, _, _ = plane
    manifest = base_manifest("webhook-valid")
    created = kubectl(cluster, "apply", "-f", "-", manifest=manifest)
    assert created.returncode == 0, created.stderr
    labelled = kubectl(cluster, "label", "agentrun", "webhook-valid", "team=a")
    assert labelled.returncode == 0, labelled.stderr
    cancelled = kubectl(
        cluster, "patch", "agentrun", "webhook-valid", "--type=merge", "-p", '{"spec":{"cancel":"Immediate"}}'
    )
    assert cancelled.returncode == 0, cancelled.stderr


def test_other_kinds_are_checked_and_admitted_when_valid(plane: Any) -> None:
    cluster, _, _ = plane
    agent = {
        "apiVersion": "agents.proompteng.ai/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "webhook-agent"},
        "spec": {"providerRef": {"name": "codex"}, "defaults": {"retries": 2}},
    }
    created = kubectl(cluster, "apply", "-f", "-", manifest=agent)
    assert created.returncode == 0, created.stderr
    labelled = kubectl(cluster, "label", "agent", "webhook-agent", "team=a")
    assert labelled.returncode == 0, labelled.stderr


def _huge_run(name: str) -> dict[str, Any]:
    """About 1.2 MB: more than kopf's webhook server reads (1 MiB), less than etcd stores."""
    manifest = base_manifest(name)
    text = "x" * 120_000
    manifest["spec"]["workflow"]["steps"] += [
        {"name": f"part-{i}", "implementation": {"inline": {"text": text}}} for i in range(10)
    ]
    return manifest


def test_a_huge_manifest_is_admitted_under_ignore_and_the_webhook_keeps_serving(plane: Any) -> None:
    cluster, operator, _ = plane
    manifest = _huge_run("webhook-huge")
    assert len(json.dumps(manifest)) > 1_100_000
    proc = kubectl(cluster, "create", "-f", "-", manifest=manifest)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert operator.proc is not None and operator.proc.poll() is None
    probe = _named(OPERATOR_ONLY_AGENTRUNS[0][1], "webhook-after-huge")
    assert DENIED in kubectl(cluster, "create", "--dry-run=server", "-f", "-", manifest=probe).stderr


def _failed_open(
    cluster: ControlPlane, manifest: dict[str, Any]
) -> tuple[subprocess.CompletedProcess[str], str]:
    """A server-side dry-run create, and what the API server logged meanwhile of calls to this
    webhook it failed open on (`Failed calling webhook, failing open <name>: <why>`): the call's URL
    (with the `?timeout=` it was made with) and why it failed, instead of how long the apply took."""
    log = cluster.log_dir / "kube-apiserver.log"
    seen = log.stat().st_size
    started = time.monotonic()
    proc = kubectl(cluster, "create", "--dry-run=server", "-f", "-", manifest=manifest)
    print(f"dry-run create answered after {time.monotonic() - started:.1f}s")
    with log.open("rb") as lines:
        lines.seek(seen)
        logged = lines.read().decode(errors="replace").splitlines()
    return proc, "\n".join(line for line in logged if f"failing open {WEBHOOK}" in line)


def test_applies_pass_with_the_operator_down_or_silent_under_ignore(
    plane: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cluster, operator, port = plane
    invalid = _named(OPERATOR_ONLY_AGENTRUNS[0][1], "webhook-while-down")
    operator.kill()  # no clean-up: the configuration stays, pointing at a closed port
    try:
        proc, failed = _failed_open(cluster, invalid)
        assert proc.returncode == 0, proc.stderr
        # Refused at once: nothing to wait for.
        assert f"?timeout={TIMEOUT_SECONDS}s" in failed and "connection refused" in failed, failed
        # Listening but never answering (a stuck operator): the API server gives up after the timeout.
        with socket.socket() as silent:
            silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            silent.bind(("127.0.0.1", port))
            silent.listen(16)
            proc, failed = _failed_open(cluster, invalid)
        assert proc.returncode == 0, proc.stderr
        # The call was made with the configured timeout, and its deadline ended it.
        assert f"?timeout={TIMEOUT_SECONDS}s" in failed and "deadline exceeded" in failed, failed
    finally:
        operator.start()
        eventually(lambda: _configured(cluster, port, "Ignore"), 60, "the webhook configuration")


def test_under_fail_a_down_operator_refuses_applies(
    plane: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cluster, operator, port = plane
    operator.stop()
    failing = _start(cluster, tmp_path_factory.mktemp("failing"), port, policy="Fail")
    try:
        failing.kill()
        valid = base_manifest("webhook-fail-policy")
        proc = kubectl(cluster, "create", "--dry-run=server", "-f", "-", manifest=valid)
        assert proc.returncode != 0
        assert 'failed calling webhook "agentruns.agents.proompteng.ai"' in proc.stderr, proc.stderr
    finally:
        failing.stop()
        operator.start()
        eventually(lambda: _configured(cluster, port, "Ignore"), 60, "the webhook configuration")


def test_an_expired_certificate_lets_applies_through_under_ignore_and_is_logged(
    plane: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A mounted certificate cert-manager failed to renew: the API server cannot call the webhook
    (the handshake fails), `Ignore` admits, the operator says so and keeps serving its runs."""
    cluster, operator, port = plane
    tls = tmp_path_factory.mktemp("expired-tls")
    now = datetime.now(UTC)
    cert, key = webhookcert.self_signed(["127.0.0.1"], now - timedelta(days=3), validity=timedelta(days=1))
    (tls / "tls.crt").write_bytes(cert)
    (tls / "tls.key").write_bytes(key)
    operator.stop()
    expired = OperatorProcess(cluster, tmp_path_factory.mktemp("expired"), env=_env(port, certs=tls)).start()
    try:

        def configured_with_it() -> bool:
            out = cluster.kubectl("get", "validatingwebhookconfiguration", CONFIGURATION, "-o", "json")
            bundles = [base64.b64decode(w["clientConfig"]["caBundle"]) for w in json.loads(out)["webhooks"]]
            return all(b.startswith(cert) for b in bundles)  # the earlier operator's follow

        eventually(configured_with_it, 60, "the expired certificate in the configuration")
        invalid = _named(OPERATOR_ONLY_AGENTRUNS[0][1], "webhook-expired-cert")
        log = cluster.log_dir / "kube-apiserver.log"
        seen = log.stat().st_size

        def refused_handshake() -> bool:
            """The API server's copy of the configuration follows the change a moment later: until
            it calls with the expired certificate, the handshake fails on the earlier CA instead.
            Each dry-run is admitted either way (Ignore)."""
            proc = kubectl(cluster, "create", "--dry-run=server", "-f", "-", manifest=invalid)
            assert proc.returncode == 0, proc.stderr
            with log.open("rb") as lines:
                lines.seek(seen)
                return b"certificate has expired" in lines.read()

        eventually(refused_handshake, 30, "the API server to call the webhook with the expired certificate")
        proc, failed = _failed_open(cluster, invalid)
        assert proc.returncode == 0, proc.stderr
        assert "certificate has expired" in failed, failed  # failed open on the handshake
        eventually(
            lambda: "has expired" in expired.logs(), 30, "the operator to report the expired certificate"
        )
        assert expired.proc is not None and expired.proc.poll() is None
    finally:
        expired.stop()
        operator.start()
        eventually(lambda: _configured(cluster, port, "Ignore"), 60, "the webhook configuration")


def test_the_chart_grants_the_operator_its_own_configuration_only(
    plane: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The chart's ServiceAccount token (namespaced install): the operator patches the configuration
    the chart created, and may touch no other."""
    cluster, _, _ = plane
    tmp = tmp_path_factory.mktemp("chart-webhook")
    helm = Helm(Path(cluster.bin_dir) / "helm", tmp)
    release_ns = "webhook-system"
    if not cluster.kubectl("get", "ns", release_ns, "--ignore-not-found", "-o", "name").strip():
        cluster.kubectl("create", "namespace", release_ns)
    values = {"watchNamespaces": [NAMESPACE], "loops": {"enabled": True}, "webhook": {"host": "127.0.0.1"}}
    kinds = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    rendered = helm.render(values, "hook", release_ns)
    docs = [d for d in rendered if d["kind"] in kinds or d["kind"] == "ValidatingWebhookConfiguration"]
    # The chart's self-signed Secret, as the kubelet would mount it.
    secret = next(d for d in rendered if d["kind"] == "Secret")
    certs = tmp / "webhook-tls"
    certs.mkdir()
    for key, value in secret["data"].items():
        (certs / key).write_bytes(base64.b64decode(value))
    manifests = "\n---\n".join(json.dumps(d) for d in docs)
    cluster.kubectl("apply", "-f", "-", input_text=manifests)
    name = next(d for d in docs if d["kind"] == "ValidatingWebhookConfiguration")["metadata"]["name"]
    account = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
    kubeconfig = token_kubeconfig(
        cluster, service_account_token(cluster, release_ns, account), tmp / "token.kubeconfig"
    )
    vwc = "validatingwebhookconfigurations.admissionregistration.k8s.io"
    assert _can_i(cluster, kubeconfig, "patch", f"{vwc}/{name}")
    assert not _can_i(cluster, kubeconfig, "patch", f"{vwc}/{CONFIGURATION}")
    assert not _can_i(cluster, kubeconfig, "create", vwc)
    assert not _can_i(cluster, kubeconfig, "delete", f"{vwc}/{name}")
    port = free_port()
    operator = OperatorProcess(
        cluster,
        tmp / "operator",
        env=_env(port, configuration=name, certs=certs),
        args=(f"--kubeconfig={kubeconfig}",),  # the last --kubeconfig wins
    ).start()
    try:
        eventually(lambda: _configured(cluster, port, "Ignore", name), 60, "the chart's configuration")
        assert "cannot apply" not in operator.logs()
        # The API server trusts the chart's CA: a refusal comes back (the test's own configuration
        # points at another port and answers the same).
        probe = _named(OPERATOR_ONLY_AGENTRUNS[0][1], "webhook-chart-tls")
        eventually(  # the API server's copy of the configuration follows the change a moment later
            lambda: (
                DENIED in kubectl(cluster, "create", "--dry-run=server", "-f", "-", manifest=probe).stderr
            ),
            30,
            "the chart's webhook to answer",
            every=0.5,
        )
        assert "cannot trust" not in operator.logs()
    finally:
        operator.stop()
        cluster.kubectl("delete", "--ignore-not-found", "-f", "-", input_text=manifests, check=False)


def test_the_chart_renders_the_webhook_by_service_or_by_address(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    helm = Helm(Path(control_plane.bin_dir) / "helm", tmp_path)
    docs = helm.render({}, "op", "ops")
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {
        ("ValidatingWebhookConfiguration", "op-agentrun-operator"),
        ("Service", "op-agentrun-operator-webhook"),
    } <= kinds
    role = next(
        d
        for d in docs
        if (d["kind"], d["metadata"]["name"]) == ("ClusterRole", "op-agentrun-operator-webhook")
    )
    assert role["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "resourceNames": ["op-agentrun-operator"],
            "verbs": ["get", "patch"],
        }
    ]
    container = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][
        0
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["AGENTS_WEBHOOK_SERVICE"] == "ops/op-agentrun-operator-webhook"
    assert env["AGENTS_WEBHOOK_FAILURE_POLICY"] == "Ignore" and env["AGENTS_WEBHOOK_TIMEOUT_SECONDS"] == "5"
    assert env["AGENTS_WEBHOOK_CERT_DIR"] == "/etc/agentrun/webhook-tls"
    secret = next(d for d in docs if d["kind"] == "Secret")
    assert secret["metadata"]["name"] == "op-agentrun-operator-webhook-tls"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in container["ports"]

    local = helm.render(
        {
            "hostNetwork": True,
            "webhook": {"host": "127.0.0.1", "failurePolicy": "Fail", "tls": {"mode": "certManager"}},
        },
        "op",
        "ops",
    )
    assert not [d for d in local if d["kind"] == "Service"]
    pod = next(d for d in local if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["AGENTS_WEBHOOK_HOST"] == env["AGENTS_WEBHOOK_ADDRESS"] == "127.0.0.1"
    assert env["AGENTS_WEBHOOK_FAILURE_POLICY"] == "Fail"
    assert env["AGENTS_WEBHOOK_CERT_DIR"] == "/etc/agentrun/webhook-tls"
    assert {"name": "webhook-tls", "secret": {"secretName": "op-agentrun-operator-webhook-tls"}} in pod[
        "volumes"
    ]
    certificate = next(d for d in local if d["kind"] == "Certificate")
    assert certificate["spec"]["ipAddresses"] == ["127.0.0.1"]
    assert certificate["spec"]["issuerRef"]["name"] == "op-agentrun-operator-webhook-selfsigned"

    off = helm.render({"webhook": {"enabled": False}}, "op", "ops")
    assert not [d for d in off if "webhook" in d["metadata"]["name"] or d["kind"].startswith("Validating")]


# ------------------------------------------------------- validate and the API server give one verdict

VALID = Path(__file__).resolve().parents[1] / "fixtures" / "compat" / "valid"
ONE_OF_EACH_KIND = (
    "agentrun-job.yaml",
    "agent.yaml",
    "agentprovider-minimal.yaml",
    "implementationspec.yaml",
    "versioncontrolprovider.yaml",
)
UNCHECKED_TEXT = "not checked by the agentrun-operator webhook (an internal error"


def _validate_offline(document: Any, tmp_path: Path) -> tuple[int, list[str]]:
    """(problems, lines) of `agentrun validate` on a file holding `document` alone."""
    path = tmp_path / "document.json"
    path.write_text(json.dumps(document))
    out = tmp_path / "out.txt"
    with out.open("w") as stream:
        _, problems = check_file(str(path), OperatorConfig(loops_enabled=True), stream)
    return problems, [line.removeprefix(f"{path}: ") for line in out.read_text().splitlines()]


@pytest.mark.parametrize("example", ONE_OF_EACH_KIND)
def test_names_get_the_same_verdict_from_validate_and_the_api_server(
    plane: Any, tmp_path: Path, example: str
) -> None:
    """tests/fixtures/object_names.py, on a valid object of each kind: the API server's verdict (a
    server-side dry run) is validate's, and the fixture's."""
    cluster, _, _ = plane
    base = yaml.safe_load((VALID / example).read_text(encoding="utf-8"))
    disagreements = []
    for name, valid in NAMES:
        manifest = _named(base, name)
        problems, lines = _validate_offline(manifest, tmp_path)
        proc = kubectl(cluster, "create", "--dry-run=server", "-f", "-", manifest=manifest)
        server = proc.returncode == 0
        if server != (problems == 0) or server != valid:
            disagreements.append(f"{name[:40]!r}: server {server}, validate {lines}, expected {valid}")
        if not server:
            assert "metadata.name" in proc.stderr and DENIED not in proc.stderr, proc.stderr
    assert not disagreements, "\n".join(disagreements)


def test_mutated_files_get_the_same_verdict_from_the_webhook_as_from_validate(
    plane: Any, tmp_path: Path
) -> None:
    """The offline fuzz generator's documents, each created with a server-side dry run: the webhook
    never fails on one (its internal-error warning never appears), refuses exactly with the lines
    `validate_manifest` gives it, and admits only what validate passes; whatever the API server
    refuses by itself (schema, names), validate refuses too."""
    cluster, _, _ = plane
    checked = refused_by_webhook = refused_by_server = 0
    disagreements: list[str] = []
    for seed in range(FUZZ_SEED, FUZZ_SEED + FUZZ_WEBHOOK):
        case = mutant_file(random.Random(seed))
        for index, document in enumerate(case.documents):
            if not (isinstance(document, dict) and document.get("apiVersion") == API_VERSION):
                continue  # kubectl cannot send it, or it is not ours
            if isinstance(document.get("metadata"), dict):
                document = {**document, "metadata": {**document["metadata"], "namespace": NAMESPACE}}
            checked += 1
            where = f"seed {seed} document {index + 1}: {case.describe()}"
            proc = kubectl(cluster, "create", "--dry-run=server", "-f", "-", manifest=document)
            assert UNCHECKED_TEXT not in proc.stderr, f"{where}: the webhook failed:\n{proc.stderr}"
            problems, _ = _validate_offline(document, tmp_path)
            expected = [p for p in validate_manifest(document, OperatorConfig(loops_enabled=True))]
            if DENIED in proc.stderr:
                refused_by_webhook += 1
                message = proc.stderr.split(DENIED, 1)[1].strip()
                if message != refusal_message(object_label(document), expected):
                    disagreements.append(f"{where}: webhook said\n{message}\nvalidate says {expected}")
            elif proc.returncode != 0:
                refused_by_server += 1
                if not problems:
                    disagreements.append(
                        f"{where}: the API server refused what validate passes:\n{proc.stderr}"
                    )
            elif expected:
                disagreements.append(f"{where}: admitted, but validate says {[p.render() for p in expected]}")
    print(
        f"webhook fuzz: {checked} documents, {refused_by_webhook} refused by the webhook, "
        f"{refused_by_server} by the API server itself"
    )
    assert checked >= FUZZ_WEBHOOK and refused_by_webhook + refused_by_server > 0
    assert not disagreements, "\n\n".join(disagreements[:10])
