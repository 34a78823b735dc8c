"""The admission webhook's pure part (agentrun_operator.webhook) and its certificate (shell/webhook_tls)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import io
import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kopf
import pytest
from cryptography import x509

from agentrun_operator.config import ConfigError, OperatorConfig
from agentrun_operator.planner.problem import Problem
from agentrun_operator.shell import admission, webhook_tls
from agentrun_operator.validation_cli import check_file
from agentrun_operator.webhook import (
    KINDS,
    MAX_LINES,
    WebhookSettings,
    needs_renewal,
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
        },
        ("a", "b"),
    )
    assert settings.enabled and settings.service == ("ops", "agentrun-webhook")
    assert settings.failure_policy == "Fail" and settings.timeout_seconds == 10
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


def test_renewal_after_two_thirds_of_the_validity() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    end = start + timedelta(days=300)
    assert not needs_renewal(start, end, start + timedelta(days=199))
    assert needs_renewal(start, end, start + timedelta(days=200))


def test_the_self_signed_certificate_names_the_hosts(tmp_path: Path) -> None:
    files = webhook_tls.write_self_signed(tmp_path / "tls", ["op.ops.svc", "127.0.0.1"])
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["op.ops.svc"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert files.key.stat().st_mode & 0o077 == 0
    not_before, not_after = webhook_tls.validity_of(files.cert.read_bytes())
    assert not_after - not_before > timedelta(days=364)


def test_the_handlers_are_registered_with_kopf_only_when_a_port_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = kopf.OperatorRegistry()
    admission.register(registry, CONFIG, None)
    assert not registry._webhooks.get_all_handlers()
    monkeypatch.setenv("AGENTS_WEBHOOK_PORT", "9443")
    admission.register(registry, CONFIG, None)
    ids = sorted(h.id for h in registry._webhooks.get_all_handlers())
    assert ids == sorted(f"validate-{p}" for p in KINDS)


def test_the_bundle_keeps_the_other_replicas_certificates_until_they_expire() -> None:
    now = datetime.now(UTC)
    ours, _ = webhook_tls.self_signed(["a"], now)
    theirs, _ = webhook_tls.self_signed(["b"], now)
    expired, _ = webhook_tls.self_signed(["c"], now - timedelta(days=10), validity=timedelta(days=1))
    bundle = webhook_tls.merged_bundle(theirs + expired, ours, now)
    assert webhook_tls.contains(bundle, ours) and webhook_tls.contains(bundle, theirs)
    assert not webhook_tls.contains(bundle, expired)
    assert bundle.startswith(ours)
    assert webhook_tls.merged_bundle(bundle, ours, now) == bundle  # idempotent
    assert webhook_tls.merged_bundle(b"garbage", ours, now) == ours
    many = b"".join(webhook_tls.self_signed([f"h{i}"], now)[0] for i in range(6))
    assert len(x509.load_pem_x509_certificates(webhook_tls.merged_bundle(many, ours, now))) == 4
    assert not webhook_tls.contains(b"garbage", ours)


def _write(directory: Path, cert: bytes, key: bytes) -> webhook_tls.CertFiles:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(cert)
    (directory / "tls.key").write_bytes(key)
    return webhook_tls.mounted(directory)


async def _one_round(files: webhook_tls.CertFiles, names: list[str] | None) -> None:
    task = asyncio.create_task(webhook_tls.keep_fresh(files, names, check_seconds=3600))
    await asyncio.sleep(0.2)  # the first check runs at once
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def test_an_aged_self_signed_certificate_is_renewed(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    old_cert, old_key = webhook_tls.self_signed(["127.0.0.1"], now - timedelta(days=300))
    files = _write(tmp_path / "tls", old_cert, old_key)
    asyncio.run(_one_round(files, ["127.0.0.1"]))
    renewed = files.cert.read_bytes()
    assert renewed != old_cert and webhook_tls.validity_of(renewed)[1] > now + timedelta(days=300)


def test_an_expired_mounted_certificate_is_reported_not_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = datetime.now(UTC)
    cert, key = webhook_tls.self_signed(["a"], now - timedelta(days=3), validity=timedelta(days=1))
    files = _write(tmp_path / "mounted", cert, key)
    with caplog.at_level(logging.ERROR, logger="agentrun.webhook"):
        asyncio.run(_one_round(files, None))
    assert files.cert.read_bytes() == cert
    assert any("has expired" in r.getMessage() for r in caplog.records)
