"""The validating admission webhook, served by kopf (docs/operations.md#admission-webhook).

`register` adds one `kopf.on.validate` handler per kind of our group (webhook.KINDS), each answering
with `admit` (`webhook.review`'s verdict: the rules of `agentrun validate`), and, when
`AGENTS_WEBHOOK_PORT` is set, a startup handler that gives kopf its webhook server: kopf's
`WebhookServer` with the certificate of shell/webhook_tls.py, wrapped so that every client
configuration the server yields (at start, and after a certificate renewal) is server-side applied
as our ValidatingWebhookConfiguration — kopf's own managed mode fixes the timeout at 30 s and the
failure policy per handler, so the operator writes the configuration itself with the chosen ones.
Every replica serves the same certificate (a mounted Secret), so they all write the same CA bundle;
a check every minute applies the configuration again if it was deleted or changed, and reports a
certificate the API server would not trust.

What never happens: a refused or failed webhook call stopping the operator, or an object admitted
earlier being refused later (UPDATEs of AgentRuns always pass; see `webhook.review`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import ssl
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import kopf

from agentrun_operator.api import GROUP
from agentrun_operator.config import OperatorConfig
from agentrun_operator.shell import webhook_tls
from agentrun_operator.shell.kube import Kube
from agentrun_operator.webhook import KINDS, WebhookSettings, handler_id, review, webhook_configuration

log = logging.getLogger("agentrun.webhook")

FIELD_MANAGER = "agentrun-operator-webhook"
RECHECK_SECONDS = 60.0
"""How often the operator checks that its configuration is in place with its certificate."""
UNCHECKED = (
    "not checked by the agentrun-operator webhook (an internal error, in the operator's log); "
    "the operator checks it at its first reconcile"
)
RESTART_SECONDS = 5.0
"""Pause before serving again after the server failed (e.g. a certificate pair read mid-update)."""


class AppliedWebhookServer:
    """kopf's webhook server protocol: serve with `server`, and apply our ValidatingWebhookConfiguration
    for every client configuration it yields (its CA bundle changes with each new certificate)."""

    def __init__(self, server: kopf.WebhookServer, settings: WebhookSettings, kubeconfig: str | None) -> None:
        self.server = server
        self.settings = settings
        self.kubeconfig = kubeconfig
        self.ca: bytes | None = None  # the CA bundle of the certificate being served

    @property
    def path(self) -> str:
        name = self.settings.configuration_name
        return f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}"

    async def _current_bundle(self, kube: Kube) -> bytes | None:
        """The CA bundle of the configuration in the cluster; None when there is none."""
        status, current = await kube.request("GET", self.path)
        if status != 200:
            return None
        webhooks = current.get("webhooks") or [{}]
        return base64.b64decode((webhooks[0].get("clientConfig") or {}).get("caBundle") or "")

    async def apply(self) -> None:
        """Server-side apply the configuration with the CA bundle of the certificate being served."""
        assert self.ca is not None
        kube = await Kube.connect(self.kubeconfig)
        try:
            status, answer = await kube.request(
                "PATCH",
                self.path,
                webhook_configuration(self.settings, self.ca),
                query={"fieldManager": FIELD_MANAGER, "force": "true"},
                content_type="application/apply-patch+yaml",
            )
        finally:
            await kube.close()
        name = self.settings.configuration_name
        if not 200 <= status < 300:
            # Serving goes on: the API server keeps the last configuration (or none).
            log.error(
                "cannot apply the ValidatingWebhookConfiguration",
                extra={"configuration": name, "status": status, "message": answer.get("message")},
            )
            return
        log.info(
            "webhook configured",
            extra={
                "configuration": name,
                "failure_policy": self.settings.failure_policy,
                "timeout_seconds": self.settings.timeout_seconds,
            },
        )

    async def check(self) -> str | None:
        """Apply again when the configuration is missing or has another CA bundle; return why the
        API server could not trust this replica's certificate (None: it can)."""
        assert self.ca is not None
        kube = await Kube.connect(self.kubeconfig)
        try:
            current = await self._current_bundle(kube)
        finally:
            await kube.close()
        if current != self.ca:
            await self.apply()
        host = "127.0.0.1" if self.settings.address in ("0.0.0.0", "") else self.settings.address
        try:
            return await webhook_tls.handshake_problem(host, self.settings.port, self.ca)
        except ssl.SSLError as exc:  # the bundle itself cannot be loaded
            return f"the CA bundle cannot be read: {exc}"

    async def keep_configured(self, every: float = RECHECK_SECONDS, first: float = 1.0) -> None:
        """`check` as soon as the server serves, then every `every` seconds; a certificate problem is
        logged as an error when it appears (and when it changes), and when it is gone. Runs until
        cancelled."""
        while self.ca is None:  # until the server has started with its certificate
            await asyncio.sleep(first)
        reported: str | None = None
        while True:
            try:
                problem = await self.check()
                if problem != reported:
                    if problem is not None:
                        log.error(
                            f"the API server cannot trust the webhook's certificate: {problem} "
                            "(docs/operations.md#admission-webhook)",
                            extra={"port": self.settings.port},
                        )
                    else:
                        log.info("the webhook's certificate is trusted again")
                    reported = problem
            except Exception:  # the next round retries
                log.exception("cannot check the ValidatingWebhookConfiguration")
            await asyncio.sleep(every)

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        while True:
            try:
                async with self.server as server:
                    async for client_config in server(fn):
                        self.ca = base64.b64decode(client_config.get("caBundle") or "")
                        try:
                            await self.apply()
                        except Exception:  # the API server unreachable: serve anyway; retried later
                            log.exception("cannot apply the ValidatingWebhookConfiguration")
                        yield client_config
            except (OSError, ssl.SSLError):  # e.g. a key and certificate read mid-renewal
                log.exception("the webhook server stopped; starting it again")
                await asyncio.sleep(RESTART_SECONDS)


def _server(settings: WebhookSettings) -> kopf.WebhookServer:
    """kopf's server with the mounted certificate files, reloaded within 10 s of a change."""
    assert settings.cert_dir is not None  # WebhookSettings.from_env requires it with a port
    files = webhook_tls.mounted(Path(settings.cert_dir))
    return kopf.WebhookServer(
        addr=settings.address,
        port=settings.port,
        host=settings.host,
        certfile=files.cert,
        pkeyfile=files.key,
        cafile=files.ca,
        file_check_interval=10.0,
    )


def admit(
    body: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    operation: str,
    warnings: list[str],
    config: OperatorConfig,
) -> None:
    """What each validation handler does with one admission request: `webhook.review`'s verdict, as
    kopf takes it (its warnings appended, a refusal raised as `kopf.AdmissionError`, 422). A bug of
    ours admits, with a warning saying the object went unchecked, and never refuses."""
    try:
        verdict = review(body, old, operation, config)
    except Exception:  # a bug of ours must not refuse the user's object: admit, say so
        log.exception("the webhook could not check an object; admitted unchecked")
        warnings.append(UNCHECKED)
        return
    warnings.extend(verdict.warnings)
    if not verdict.allowed:
        raise kopf.AdmissionError(verdict.message, code=422)


def register(registry: kopf.OperatorRegistry, config: OperatorConfig, kubeconfig: str | None) -> None:
    """The validation handlers, and (when `AGENTS_WEBHOOK_PORT` is set) the server that serves them."""
    webhook = WebhookSettings.from_env(os.environ, config.watched_namespaces)
    if not webhook.enabled:
        return

    for plural in KINDS:

        @kopf.on.validate(
            group=GROUP,
            plural=plural,
            id=handler_id(plural),
            operations=["CREATE", "UPDATE"],
            registry=registry,
        )
        def check(**kwargs: Any) -> None:  # a sync handler: kopf runs it in its thread pool
            admit(kwargs["body"], kwargs.get("old"), kwargs["operation"], kwargs["warnings"], config)

    tasks: list[asyncio.Task[None]] = []

    @kopf.on.startup(registry=registry)
    async def serve_webhook(settings: kopf.OperatorSettings, **_: Any) -> None:
        applied = AppliedWebhookServer(_server(webhook), webhook, kubeconfig)
        settings.admission.server = applied
        settings.admission.managed = None  # we apply the configuration (see AppliedWebhookServer)
        tasks.append(asyncio.create_task(applied.keep_configured()))
        log.info("webhook serving", extra={"address": webhook.address, "port": webhook.port})

    @kopf.on.cleanup(registry=registry)
    async def stop_webhook(**_: Any) -> None:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
