"""The admission webhook's certificate on the local default (docs/operations.md#admission-webhook-tls).

`agentrun dev up` runs the operator on the host, where the API server calls its webhook at
`https://127.0.0.1:PORT`. The operator's wheel carries no `cryptography`, so the dev cluster makes the
certificate: self-signed (it is its own CA bundle), ECDSA P-256, for 127.0.0.1 and localhost, valid
a year, written into `<home>/webhook/` (tls.crt, tls.key, mode 0600); each operator start makes a new
one once two thirds of its validity have passed. The operator reads the files as it reads
cert-manager's (`AGENTS_WEBHOOK_CERT_DIR`) and reloads them when they change.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = timedelta(days=365)
NAMES = ("127.0.0.1", "localhost")


def self_signed(names: Sequence[str], now: datetime, validity: timedelta = VALIDITY) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) for `names` (DNS names or IP addresses), valid from `now`."""
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
        .not_valid_before(now - timedelta(minutes=5))
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


def needs_renewal(cert_pem: bytes, now: datetime) -> bool:
    """Two thirds of the certificate's validity have passed (or it cannot be read)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return True
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return now >= start + (end - start) * 2 / 3


def ensure(directory: Path, names: Sequence[str] = NAMES) -> Path:
    """`directory` with a current tls.crt and tls.key (made or renewed as needed); returns it."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    now = datetime.now(UTC)
    if cert_path.exists() and key_path.exists() and not needs_renewal(cert_path.read_bytes(), now):
        return directory
    cert_pem, key_pem = self_signed(names, now)
    for path, data in ((key_path, key_pem), (cert_path, cert_pem)):
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        tmp.replace(path)
    return directory
