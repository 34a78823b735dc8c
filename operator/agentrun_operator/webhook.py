"""The validating admission webhook's decisions and configuration, without I/O
(docs/operations.md#admission-webhook).

- `review` answers one admission request with the operator's own offline validation
  (`validate_manifest`, the rules behind `agentrun validate`): the refusal lists one line per problem,
  `Kind/name: field.path: message (value: …; fix: …; see docs/…#anchor)`, exactly the line
  `agentrun validate FILE` prints after `FILE: `.
- `webhook_configuration` is the ValidatingWebhookConfiguration the operator applies: one webhook per
  kind, the failure policy and timeout of `WebhookSettings`, the watched namespaces only.
- `WebhookSettings.from_env` reads the `AGENTS_WEBHOOK_…` variables the chart and `agentrun dev up` set.

The shell (shell/admission.py) serves these through kopf's admission support.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from agentrun_operator.api import API_VERSION, GROUP, VERSION
from agentrun_operator.config import PREFIXES, ConfigError, OperatorConfig
from agentrun_operator.planner.validate import REASON_LOOPS_DISABLED, validate_manifest
from agentrun_operator.problem import Problem

KINDS: Final[dict[str, str]] = {
    "agentruns": "AgentRun",
    "agents": "Agent",
    "agentproviders": "AgentProvider",
    "implementationspecs": "ImplementationSpec",
    "versioncontrolproviders": "VersionControlProvider",
}
"""The kinds of our group the webhook checks (plural -> kind): each is checked alone, as by
`agentrun validate`; references between them are the operator's to resolve later."""

MAX_LINES: Final = 20
"""Problems listed in one refusal; the rest are counted (`agentrun validate` lists them all)."""

FailurePolicy = Literal["Ignore", "Fail"]


def handler_id(plural: str) -> str:
    """kopf's id of the handler for `plural`, also the last segment of its webhook's URL path."""
    return f"validate-{plural}"


def problem_line(label: str, problem: Problem) -> str:
    """One problem of one object, as `agentrun validate` and the webhook both print it."""
    return f"{label}: {problem.render()}"


def object_label(body: Mapping[str, Any]) -> str:
    """`Kind/name` of an object under admission (`Kind/prefix*` for a generateName without a name)."""
    kind = body.get("kind") or "?"
    metadata = body.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    name = metadata.get("name")
    if not name and metadata.get("generateName"):
        name = f"{metadata['generateName']}*"
    return f"{kind}/{name}" if name else str(kind)


def refusal_message(label: str, problems: Sequence[Problem]) -> str:
    """The lines of the first `MAX_LINES` problems, and how many more there are."""
    lines = [problem_line(label, p) for p in problems[:MAX_LINES]]
    if len(problems) > MAX_LINES:
        lines.append(f"… and {len(problems) - MAX_LINES} more problem(s) (agentrun validate FILE lists all)")
    return "\n".join(lines)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""
    warnings: tuple[str, ...] = ()


def review(
    body: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    operation: str,
    config: OperatorConfig,
) -> Verdict:
    """Admit or refuse one CREATE or UPDATE of an object of our group.

    - A version this operator does not know is admitted with a warning (it cannot judge it; the API
      server converts requests to the registered version first, so this is a manual configuration).
    - An UPDATE of an AgentRun is always admitted: the CRD keeps its spec immutable but for cancel and
      approvals, and a run admitted earlier (before a feature flag or cap changed) must stay
      cancellable and approvable.
    - An UPDATE of another kind is checked only when its spec changed (metadata-only writes pass).
    - The loops feature flag is not checked here: with loops off, a new loop run is admitted and fails
      `InvalidSpec` with reason `WorkflowLoopsDisabled` in its status (docs/concepts.md#feature-flag).
    """
    api_version = body.get("apiVersion")
    if api_version != API_VERSION:
        return Verdict(
            True,
            warnings=(
                f"{object_label(body)}: not checked by the agentrun-operator webhook, which knows "
                f"{API_VERSION} only (got {api_version}); see docs/operations.md#admission-webhook",
            ),
        )
    if operation == "UPDATE":
        if body.get("kind") == "AgentRun":
            return Verdict(True)
        if old is not None and old.get("spec") == body.get("spec"):
            return Verdict(True)
    elif operation != "CREATE":
        return Verdict(True)
    problems = [p for p in validate_manifest(dict(body), config) if p.reason != REASON_LOOPS_DISABLED]
    if not problems:
        return Verdict(True)
    return Verdict(False, refusal_message(object_label(body), problems))


# ----------------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class WebhookSettings:
    """Where the webhook listens, how the API server reaches it, and what the API server does when it
    cannot (docs/operations.md#admission-webhook). `port` 0: no webhook."""

    port: int = 0
    address: str = "0.0.0.0"
    host: str = "127.0.0.1"  # URL clientConfig: https://HOST:PORT/… (ignored when `service` is set)
    service: tuple[str, str] | None = None  # (namespace, name) of the Service in front of the webhook
    service_port: int = 443
    configuration_name: str = "agentrun-operator"
    failure_policy: FailurePolicy = "Ignore"
    timeout_seconds: int = 5
    cert_dir: str | None = None  # tls.crt, tls.key, optional ca.crt: a mounted Secret or the dev cluster's
    namespaces: tuple[str, ...] = field(default_factory=tuple)  # empty: every namespace

    @property
    def enabled(self) -> bool:
        return self.port > 0

    @classmethod
    def from_env(cls, env: Mapping[str, str], namespaces: tuple[str, ...] = ()) -> WebhookSettings:
        def raw(name: str) -> tuple[str, str] | None:
            for prefix in PREFIXES:
                if f"{prefix}{name}" in env:
                    return f"{prefix}{name}", env[f"{prefix}{name}"]
            return None

        def number(name: str, default: int, low: int, high: int) -> int:
            found = raw(name)
            if found is None or found[1] == "":
                return default
            if not found[1].isdigit() or not low <= int(found[1]) <= high:
                raise ConfigError(f"{found[0]}={found[1]!r}: expected an integer in {low}..{high}")
            return int(found[1])

        def text(name: str, default: str) -> str:
            found = raw(name)
            return found[1] if found is not None and found[1] else default

        policy = text("WEBHOOK_FAILURE_POLICY", "Ignore")
        if policy not in ("Ignore", "Fail"):
            raise ConfigError(f"AGENTS_WEBHOOK_FAILURE_POLICY={policy!r}: expected Ignore or Fail")
        port = number("WEBHOOK_PORT", 0, 0, 65535)
        cert_dir = text("WEBHOOK_CERT_DIR", "") or None
        if port and cert_dir is None:
            raise ConfigError(
                "AGENTS_WEBHOOK_PORT is set but AGENTS_WEBHOOK_CERT_DIR is not: the webhook needs a "
                "directory with tls.crt and tls.key (docs/operations.md#admission-webhook-tls)"
            )
        service = text("WEBHOOK_SERVICE", "")
        if service and service.count("/") != 1:
            raise ConfigError(f"AGENTS_WEBHOOK_SERVICE={service!r}: expected NAMESPACE/NAME")
        return cls(
            port=port,
            address=text("WEBHOOK_ADDRESS", "0.0.0.0"),
            host=text("WEBHOOK_HOST", "127.0.0.1"),
            service=tuple(service.split("/")) if service else None,  # type: ignore[arg-type]
            configuration_name=text("WEBHOOK_CONFIGURATION_NAME", "agentrun-operator"),
            failure_policy="Fail" if policy == "Fail" else "Ignore",
            timeout_seconds=number("WEBHOOK_TIMEOUT_SECONDS", 5, 1, 30),
            cert_dir=cert_dir,
            namespaces=namespaces,
        )


def client_config(settings: WebhookSettings, plural: str, ca_bundle: bytes) -> dict[str, Any]:
    """How the API server reaches the handler of `plural`: a Service, else a URL (the local default,
    where the operator and the API server share the host's loopback)."""
    path = f"/{handler_id(plural)}"
    config: dict[str, Any] = {"caBundle": base64.b64encode(ca_bundle).decode("ascii")}
    if settings.service is not None:
        namespace, name = settings.service
        config["service"] = {
            "namespace": namespace,
            "name": name,
            "port": settings.service_port,
            "path": path,
        }
    else:
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        config["url"] = f"https://{host}:{settings.port}{path}"
    return config


def webhook_configuration(settings: WebhookSettings, ca_bundle: bytes) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration (server-side applied by the operator)."""
    selector: dict[str, Any] = {}
    if settings.namespaces:
        selector = {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(settings.namespaces)}
            ]
        }
    webhooks = [
        {
            "name": f"{plural}.{GROUP}",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": settings.failure_policy,
            "timeoutSeconds": settings.timeout_seconds,
            # Requests for another served version are converted to this one before they are sent.
            "matchPolicy": "Equivalent",
            "namespaceSelector": selector,
            "rules": [
                {
                    "apiGroups": [GROUP],
                    "apiVersions": [VERSION],
                    "resources": [plural],
                    "operations": ["CREATE", "UPDATE"],
                    "scope": "Namespaced",
                }
            ],
            "clientConfig": client_config(settings, plural, ca_bundle),
        }
        for plural in KINDS
    ]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {
            "name": settings.configuration_name,
            "labels": {"app.kubernetes.io/managed-by": "agentrun-operator"},
        },
        "webhooks": webhooks,
    }
