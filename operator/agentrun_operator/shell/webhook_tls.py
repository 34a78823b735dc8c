"""The webhook's serving certificate, read from files (docs/operations.md#admission-webhook-tls).

The operator makes no certificate (its wheel carries no `cryptography`): it serves the files in
`AGENTS_WEBHOOK_CERT_DIR` — cert-manager's Secret, the chart's self-signed Secret, or the dev
cluster's (`agentrun dev up`) — and kopf's webhook server reloads them when they change. `ca.crt`,
when present, is the CA bundle the API server is given; else the certificate itself.

`handshake_problem` checks the certificate as the API server will: a TLS handshake with this
operator's own webhook port, verified against that bundle. An expired or mismatched certificate is
reported in the operator's log instead of only as failed webhook calls in the API server's.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path
    ca: Path | None  # None: the certificate is its own CA (self-signed)


def mounted(directory: Path) -> CertFiles:
    """The Secret layout (tls.crt, tls.key, optional ca.crt) cert-manager and the chart write."""
    ca = directory / "ca.crt"
    return CertFiles(directory / "tls.crt", directory / "tls.key", ca if ca.exists() else None)


async def handshake_problem(host: str, port: int, ca_bundle: bytes, timeout: float = 5.0) -> str | None:
    """Why the API server could not trust the webhook at host:port (e.g. `certificate has expired`);
    None when a verified handshake succeeds. The name is not checked (the API server may use the
    Service's DNS name, the operator its own address)."""
    context = ssl.create_default_context(cadata=ca_bundle.decode("ascii", errors="replace"))
    context.check_hostname = False
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=context), timeout)
    except ssl.SSLCertVerificationError as exc:
        return str(exc.verify_message or exc)
    except (OSError, TimeoutError) as exc:
        return f"cannot connect: {exc}"
    writer.close()
    return None
