"""Certificates and keys for the local control plane.

The local control plane serves TLS and authenticates its clients with certificates, like a real
cluster, so the operator is tested through the same authentication path it meets in production.
Everything is generated per state directory and never leaves it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=365)
_KEY_USAGES = (
    "digital_signature",
    "content_commitment",
    "key_encipherment",
    "data_encipherment",
    "key_agreement",
    "key_cert_sign",
    "crl_sign",
    "encipher_only",
    "decipher_only",
)
"""Every flag of the X.509 key usage extension, each of which `x509.KeyUsage` takes."""
_CA_KEY_USAGES = frozenset({"digital_signature", "key_cert_sign", "crl_sign"})
"""What the local CA's key may do: sign certificates and CRLs (and verify signatures)."""


@dataclass(frozen=True)
class PKIPaths:
    """Where each generated file lives inside the PKI directory."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.root / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.root / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.root / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.root / "sa.pub"

    def client_cert(self, name: str) -> Path:
        return self.root / f"{name}.crt"

    def client_key(self, name: str) -> Path:
        return self.root / f"{name}.key"


# Client identities the control plane needs: name -> (common name, organisation).
CLIENTS: dict[str, tuple[str, str | None]] = {
    "admin": ("agentrun-admin", "system:masters"),
    "controller-manager": ("system:kube-controller-manager", None),
    "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", "system:masters"),
    # The real node (`agentrun dev up --runtime kubelet`): each with its bootstrap RBAC identity.
    "scheduler": ("system:kube-scheduler", None),
    "kubelet": ("system:node:localhost", "system:nodes"),
}


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)


def ensure_pki(root: Path) -> PKIPaths:
    """Create the CA, serving and client certificates unless they already exist (idempotent)."""
    paths = PKIPaths(root)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    if paths.ca_cert.exists() and all(paths.client_cert(n).exists() for n in CLIENTS):
        return paths
    if paths.ca_cert.exists() and paths.ca_key.exists() and paths.serving_cert.exists():
        _issue_clients(paths, only_missing=True)  # a state directory of an earlier version: keep its CA
        return paths

    ca_key = _key()
    ca_name = _name("agentrun-dev-ca")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(**{usage: usage in _CA_KEY_USAGES for usage in _KEY_USAGES}),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(paths.ca_key, ca_key)
    _write_cert(paths.ca_cert, ca_cert)

    def issue(
        subject: x509.Name, usage: list[x509.ObjectIdentifier], sans: list[x509.GeneralName] | None
    ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = _key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now())
            .not_valid_after(_now() + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return key, builder.sign(ca_key, hashes.SHA256())

    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
    ]
    key, cert = issue(_name("kube-apiserver"), [ExtendedKeyUsageOID.SERVER_AUTH], sans)
    _write_key(paths.serving_key, key)
    _write_cert(paths.serving_cert, cert)

    _issue_clients(paths, only_missing=False)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(paths.sa_key, sa_key)
    paths.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return paths


def _issue_clients(paths: PKIPaths, only_missing: bool) -> None:
    """The client certificates, signed by the CA on disk; `only_missing`: just those a later version
    added (clients and the API server of a running plane keep trusting each other)."""
    ca_cert = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(paths.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    for client, (cn, org) in CLIENTS.items():
        if only_missing and paths.client_cert(client).exists():
            continue
        key = _key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, org))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now())
            .not_valid_after(_now() + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        _write_key(paths.client_key(client), key)
        _write_cert(paths.client_cert(client), cert)
