"""The validating admission webhook, served by kopf (docs/operations.md#admission-webhook).

`register` adds one `kopf.on.validate` handler per kind of our group (webhook.KINDS), each answering
with `webhook.review` (the rules of `agentrun validate`), and, when `AGENTS_WEBHOOK_PORT` is set, a
startup handler that gives kopf its webhook server: kopf's `WebhookServer` with the certificate of
shell/webhook_tls.py, wrapped so that every client configuration the server yields (at start, and
after a certificate renewal) is server-side applied as our ValidatingWebhookConfiguration — kopf's own
managed mode fixes the timeout at 30 s and the failure policy per handler, so the operator writes the
configuration itself with the chosen ones.

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
import tempfile
from collections.abc import AsyncIterator
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
RESTART_SECONDS = 5.0
"""Pause before serving again after the server failed (e.g. a certificate pair read mid-update)."""


class AppliedWebhookServer:
    """kopf's webhook server protocol: serve with `server`, and apply our ValidatingWebhookConfiguration
    for every client configuration it yields (its CA bundle changes with each new certificate)."""

    def __init__(self, server: kopf.WebhookServer, settings: WebhookSettings, kubeconfig: str | None) -> None:
        self.server = server
        self.settings = settings
        self.kubeconfig = kubeconfig

    async def apply(self, client_config: kopf.WebhookClientConfig) -> None:
        ca_bundle = base64.b64decode(client_config.get("caBundle") or "")
        body = webhook_configuration(self.settings, ca_bundle)
        name = self.settings.configuration_name
        kube = await Kube.connect(self.kubeconfig)
        try:
            status, answer = await kube.request(
                "PATCH",
                f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}",
                body,
                query={"fieldManager": FIELD_MANAGER, "force": "true"},
                content_type="application/apply-patch+yaml",
            )
        finally:
            await kube.close()
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

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        while True:
            try:
                async with self.server as server:
                    async for client_config in server(fn):
                        try:
                            await self.apply(client_config)
                        except Exception:  # the API server unreachable: serve anyway, log it
                            log.exception("cannot apply the ValidatingWebhookConfiguration")
                        yield client_config
            except (OSError, ssl.SSLError):  # e.g. a key and certificate read mid-renewal
                log.exception("the webhook server stopped; starting it again")
                await asyncio.sleep(RESTART_SECONDS)


def _server(settings: WebhookSettings) -> tuple[kopf.WebhookServer, webhook_tls.CertFiles, list[str] | None]:
    """kopf's server with our certificate files, and the names a self-signed one is made for."""
    if settings.cert_dir:
        files = webhook_tls.mounted(Path(settings.cert_dir))
        names = None
    else:
        names = [settings.host, "localhost", "127.0.0.1"]
        if settings.service is not None:
            namespace, name = settings.service
            names = [f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local", *names]
        files = webhook_tls.write_self_signed(Path(tempfile.mkdtemp(prefix="agentrun-webhook-")), names)
    server = kopf.WebhookServer(
        addr=settings.address,
        port=settings.port,
        host=settings.host,
        certfile=files.cert,
        pkeyfile=files.key,
        cafile=files.ca,
        file_check_interval=10.0,
    )
    return server, files, names


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
            verdict = review(kwargs["body"], kwargs.get("old"), kwargs["operation"], config)
            kwargs["warnings"].extend(verdict.warnings)
            if not verdict.allowed:
                raise kopf.AdmissionError(verdict.message, code=422)

    tasks: list[asyncio.Task[None]] = []

    @kopf.on.startup(registry=registry)
    async def serve_webhook(settings: kopf.OperatorSettings, **_: Any) -> None:
        server, files, names = _server(webhook)
        settings.admission.server = AppliedWebhookServer(server, webhook, kubeconfig)
        settings.admission.managed = None  # we apply the configuration (see AppliedWebhookServer)
        tasks.append(asyncio.create_task(webhook_tls.keep_fresh(files, names)))
        log.info(
            "webhook serving",
            extra={"address": webhook.address, "port": webhook.port, "self_signed": names is not None},
        )

    @kopf.on.cleanup(registry=registry)
    async def stop_webhook(**_: Any) -> None:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
