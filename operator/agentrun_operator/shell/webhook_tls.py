"""The webhook's serving certificate (docs/operations.md#admission-webhook-tls).

Self-signed (the default): the operator makes an ECDSA P-256 certificate for the names the API
server uses to reach it, writes it and its key into a private directory, and makes a new one once
two thirds of its validity have passed; kopf's webhook server reloads changed files and the new
certificate's CA bundle goes into the ValidatingWebhookConfiguration. With cert-manager the files
come from the mounted Secret (tls.crt, tls.key, ca.crt) and cert-manager renews them; the operator
only reads them and logs an error when the certificate has expired.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agentrun_operator.webhook import needs_renewal

log = logging.getLogger("agentrun.webhook")

VALIDITY: timedelta = timedelta(days=365)
CHECK_SECONDS = 3600.0


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path
    ca: Path | None  # None: the certificate is its own CA (self-signed)


def self_signed(names: Sequence[str], now: datetime, validity: timedelta = VALIDITY) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) valid for `names` (DNS names or IP addresses) from `now`."""
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agentrun-operator-webhook")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))  # clocks of the API server's host may lag
        .not_valid_after(now + validity)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def validity_of(cert_pem: bytes) -> tuple[datetime, datetime]:
    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.not_valid_before_utc, cert.not_valid_after_utc


def write_self_signed(directory: Path, names: Sequence[str]) -> CertFiles:
    """Write a new self-signed certificate and key (mode 0600) into `directory`."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    cert_pem, key_pem = self_signed(names, datetime.now(UTC))
    files = CertFiles(directory / "tls.crt", directory / "tls.key", None)
    for path, data in ((files.key, key_pem), (files.cert, cert_pem)):
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        tmp.replace(path)
    return files


def mounted(directory: Path) -> CertFiles:
    """cert-manager's Secret layout (tls.crt, tls.key, ca.crt)."""
    ca = directory / "ca.crt"
    return CertFiles(directory / "tls.crt", directory / "tls.key", ca if ca.exists() else None)


async def keep_fresh(
    files: CertFiles, names: Sequence[str] | None, check_seconds: float = CHECK_SECONDS
) -> None:
    """Renew a self-signed certificate (`names` given) before it expires; for mounted files, say so
    when they expired (cert-manager did not renew them). Checks at once, then every `check_seconds`;
    runs until cancelled."""
    while True:
        try:
            not_before, not_after = validity_of(files.cert.read_bytes())
        except (OSError, ValueError):
            log.exception("cannot read the webhook's certificate", extra={"path": str(files.cert)})
            await asyncio.sleep(check_seconds)
            continue
        now = datetime.now(UTC)
        if names is not None and needs_renewal(not_before, not_after, now):
            write_self_signed(files.cert.parent, names)
            log.info("webhook certificate renewed", extra={"previous_not_after": not_after.isoformat()})
        elif names is None and now >= not_after:
            log.error(
                "the webhook's certificate has expired: the API server cannot call the webhook "
                "(docs/operations.md#admission-webhook)",
                extra={"path": str(files.cert), "not_after": not_after.isoformat()},
            )
        await asyncio.sleep(check_seconds)


def merged_bundle(current: bytes, ours: bytes, now: datetime, keep: int = 4) -> bytes:
    """The CA bundle for the configuration: ours first, then the other replicas' certificates found in
    `current` that have not expired (each replica of a self-signed installation has its own), at most
    `keep` in all. An unreadable `current` is replaced."""
    mine = x509.load_pem_x509_certificates(ours)
    try:
        others = x509.load_pem_x509_certificates(current) if current.strip() else []
    except ValueError:
        others = []
    kept = list(mine)
    for cert in others:
        if cert not in kept and cert.not_valid_after_utc > now:
            kept.append(cert)
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in kept[:keep])


def contains(bundle: bytes, ours: bytes) -> bool:
    """Whether every certificate of `ours` is in `bundle`."""
    try:
        present = x509.load_pem_x509_certificates(bundle)
    except ValueError:
        return False
    return all(cert in present for cert in x509.load_pem_x509_certificates(ours))
