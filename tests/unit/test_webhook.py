"""The admission webhook's pure part (agentrun_operator.webhook) and its certificate (shell/webhook_tls)."""

from __future__ import annotations

import asyncio
import base64
import copy
import io
import json
import socket
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kopf
import pytest
from cryptography import x509

from agentrun_devcluster import webhookcert
from agentrun_operator.config import ConfigError, OperatorConfig
from agentrun_operator.problem import Problem
from agentrun_operator.shell import admission, webhook_tls
from agentrun_operator.validation_cli import check_file
from agentrun_operator.webhook import (
    KINDS,
    MAX_LINES,
    WebhookSettings,
    object_label,
    refusal_message,
    review,
    webhook_configuration,
)
from tests.fixtures.invalid_agentruns import OPERATOR_ONLY_AGENTRUNS, base_manifest

CONFIG = OperatorConfig(loops_enabled=True)


def _cli_lines(manifest: dict[str, Any], tmp_path: Path) -> list[str]:
    path = tmp_path / "m.json"
    path.write_text(json.dumps(manifest))
    out = io.StringIO()
    check_file(str(path), CONFIG, out)
    return [line.removeprefix(f"{path}: ") for line in out.getvalue().splitlines()]


@pytest.mark.parametrize(
    ("case", "manifest", "field"), OPERATOR_ONLY_AGENTRUNS, ids=[c for c, _, _ in OPERATOR_ONLY_AGENTRUNS]
)
def test_a_refusal_is_what_agentrun_validate_prints(
    tmp_path: Path, case: str, manifest: dict[str, Any], field: str
) -> None:
    verdict = review(manifest, None, "CREATE", CONFIG)
    assert not verdict.allowed
    assert verdict.message == "\n".join(_cli_lines(manifest, tmp_path))
    assert f"AgentRun/{manifest['metadata']['name']}: {field}: " in verdict.message


def test_a_valid_run_is_admitted() -> None:
    assert review(base_manifest(), None, "CREATE", CONFIG).allowed


def test_the_installation_cap_applies() -> None:
    verdict = review(
        base_manifest(), None, "CREATE", OperatorConfig(loops_enabled=True, loop_max_iterations=5)
    )
    assert not verdict.allowed and "#iteration-cap" in verdict.message


def test_the_feature_flag_is_left_to_the_run_status() -> None:
    """With loops off a loop run is admitted; it fails InvalidSpec/WorkflowLoopsDisabled in status."""
    assert review(base_manifest(), None, "CREATE", OperatorConfig(loops_enabled=False)).allowed


def test_an_update_of_an_admitted_run_always_passes() -> None:
    old = base_manifest()
    new = copy.deepcopy(old)
    new["spec"]["cancel"] = "Immediate"
    assert review(new, old, "UPDATE", OperatorConfig(loops_enabled=False)).allowed


def test_an_update_of_another_kind_is_checked_only_when_its_spec_changed() -> None:
    old = {
        "apiVersion": "agents.proompteng.ai/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "a"},
        "spec": {"defaults": {"retries": -1}},  # admitted by an older operator, say
    }
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"team": "a"}
    assert review(relabelled, old, "UPDATE", CONFIG).allowed
    changed = copy.deepcopy(old)
    changed["spec"]["defaults"]["retries"] = -2
    verdict = review(changed, old, "UPDATE", CONFIG)
    assert not verdict.allowed and "Agent/a: spec.defaults.retries: " in verdict.message


def test_an_unknown_version_is_admitted_with_a_warning() -> None:
    manifest = base_manifest()
    manifest["apiVersion"] = "agents.proompteng.ai/v2"
    verdict = review(manifest, None, "CREATE", CONFIG)
    assert verdict.allowed and "v2" in verdict.warnings[0] and "#admission-webhook" in verdict.warnings[0]


def test_a_long_refusal_is_cut_and_counted() -> None:
    problems = [
        Problem(f"spec.x[{i}]", i, "bad", "fix it", "docs/api.md#agentrun") for i in range(MAX_LINES + 5)
    ]
    lines = refusal_message("AgentRun/r", problems).splitlines()
    assert len(lines) == MAX_LINES + 1 and "5 more" in lines[-1]


def test_labels_name_generate_name_objects() -> None:
    assert object_label({"kind": "AgentRun", "metadata": {"generateName": "fix-"}}) == "AgentRun/fix-*"
    assert object_label({"kind": "AgentRun"}) == "AgentRun"


def test_settings_from_env_and_their_bad_values() -> None:
    assert not WebhookSettings.from_env({}).enabled
    settings = WebhookSettings.from_env(
        {
            "AGENTS_WEBHOOK_PORT": "9443",
            "AGENTS_WEBHOOK_SERVICE": "ops/agentrun-webhook",
            "AGENTS_WEBHOOK_FAILURE_POLICY": "Fail",
            "AGENTS_WEBHOOK_TIMEOUT_SECONDS": "10",
            "AGENTS_WEBHOOK_CERT_DIR": "/etc/tls",
        },
        ("a", "b"),
    )
    assert settings.enabled and settings.service == ("ops", "agentrun-webhook")
    assert settings.failure_policy == "Fail" and settings.timeout_seconds == 10
    with pytest.raises(ConfigError, match="AGENTS_WEBHOOK_CERT_DIR"):
        WebhookSettings.from_env({"AGENTS_WEBHOOK_PORT": "9443"})
    for key, value in (
        ("AGENTS_WEBHOOK_FAILURE_POLICY", "Maybe"),
        ("AGENTS_WEBHOOK_TIMEOUT_SECONDS", "31"),
        ("AGENTS_WEBHOOK_PORT", "-1"),
        ("AGENTS_WEBHOOK_SERVICE", "no-namespace"),
    ):
        with pytest.raises(ConfigError, match=key):
            WebhookSettings.from_env({key: value})


def test_the_configuration_by_url_names_each_handler_and_the_policy() -> None:
    settings = WebhookSettings(port=9443, host="127.0.0.1", timeout_seconds=3)
    body = webhook_configuration(settings, b"CA")
    webhooks = body["webhooks"]
    assert [w["rules"][0]["resources"] for w in webhooks] == [[p] for p in KINDS]
    first = webhooks[0]
    assert first["clientConfig"] == {
        "url": "https://127.0.0.1:9443/validate-agentruns",
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    assert first["failurePolicy"] == "Ignore" and first["timeoutSeconds"] == 3
    assert first["matchPolicy"] == "Equivalent" and first["sideEffects"] == "None"
    assert first["namespaceSelector"] == {}


def test_the_configuration_by_service_and_for_watched_namespaces() -> None:
    settings = WebhookSettings(port=9443, service=("ops", "op-webhook"), namespaces=("a",))
    first = webhook_configuration(settings, b"CA")["webhooks"][0]
    assert first["clientConfig"]["service"] == {
        "namespace": "ops",
        "name": "op-webhook",
        "port": 443,
        "path": "/validate-agentruns",
    }
    expression = first["namespaceSelector"]["matchExpressions"][0]
    assert expression["values"] == ["a"]


def test_the_dev_cluster_makes_a_certificate_once_and_renews_an_aged_one(tmp_path: Path) -> None:
    directory = webhookcert.ensure(tmp_path / "webhook")
    cert = (directory / "tls.crt").read_bytes()
    parsed = x509.load_pem_x509_certificate(cert)
    sans = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert (directory / "tls.key").stat().st_mode & 0o077 == 0
    assert webhookcert.ensure(directory) == directory and (directory / "tls.crt").read_bytes() == cert
    aged, key = webhookcert.self_signed(webhookcert.NAMES, datetime.now(UTC) - timedelta(days=250))
    (directory / "tls.crt").write_bytes(aged)
    (directory / "tls.key").write_bytes(key)
    webhookcert.ensure(directory)
    assert (directory / "tls.crt").read_bytes() not in (aged, cert)


def _serve_once(cert: bytes, key: bytes, tmp_path: Path) -> tuple[ssl.SSLContext, socket.socket]:
    (tmp_path / "c.pem").write_bytes(cert)
    (tmp_path / "k.pem").write_bytes(key)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    return context, listener


async def _handshake(cert: bytes, key: bytes, tmp_path: Path) -> str | None:
    context, listener = _serve_once(cert, key, tmp_path)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(serve, sock=listener, ssl=context)
    async with server:
        return await webhook_tls.handshake_problem("127.0.0.1", listener.getsockname()[1], cert)


def test_the_handshake_check_names_an_expired_certificate(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    good = webhookcert.self_signed(["127.0.0.1"], now)
    assert asyncio.run(_handshake(*good, tmp_path)) is None
    expired = webhookcert.self_signed(["127.0.0.1"], now - timedelta(days=3), validity=timedelta(days=1))
    assert asyncio.run(_handshake(*expired, tmp_path)) == "certificate has expired"


def test_the_handshake_check_names_a_closed_port() -> None:
    cert, _ = webhookcert.self_signed(["127.0.0.1"], datetime.now(UTC))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    problem = asyncio.run(webhook_tls.handshake_problem("127.0.0.1", port, cert))
    assert problem is not None and problem.startswith("cannot connect")


def test_a_refusal_reaches_kopf_as_a_422_with_the_verdicts_message() -> None:
    """What each registered validation handler does (`admission.admit`); that kopf serves it at the
    path the configuration names is the integration tier's (test_admission_webhook.py)."""
    manifest = OPERATOR_ONLY_AGENTRUNS[0][1]
    warnings: list[str] = []
    with pytest.raises(kopf.AdmissionError) as refused:
        admission.admit(manifest, None, "CREATE", warnings, CONFIG)
    assert refused.value.code == 422
    assert str(refused.value) == review(manifest, None, "CREATE", CONFIG).message


def test_an_admitted_objects_warnings_reach_kopf() -> None:
    manifest = base_manifest()
    manifest["apiVersion"] = "agents.proompteng.ai/v0"
    warnings: list[str] = []
    admission.admit(manifest, None, "CREATE", warnings, CONFIG)
    assert warnings == list(review(manifest, None, "CREATE", CONFIG).warnings) and warnings


def test_an_internal_error_admits_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(admission, "review", broken)
    warnings: list[str] = []
    admission.admit(base_manifest(), None, "CREATE", warnings, CONFIG)
    assert warnings == [admission.UNCHECKED]
