"""The kubelet's log endpoint, served by the local pod runner, so `kubectl logs` (and `agentrun logs`)
work on the local default as on a cluster (docs/local-dev.md#logs).

The API server answers `GET pods/NAME/log` by calling the node's kubelet at its `InternalIP` and the
port the node's status names (`daemonEndpoints.kubeletEndpoint.Port`):
`GET /containerLogs/NAMESPACE/POD/CONTAINER?follow=&previous=&tailLines=&limitBytes=`. The runner
registers its node with exactly that, and this server answers from the log files the runtimes write
(`<state>/pods/<ns>/<pod>/<uid>/logs/<container>/<restart>.log`). TLS on loopback with a key made at
start; the client (the API server's kubelet client certificate) must be signed by the cluster's CA,
as a kubelet requires.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = logging.getLogger("agentrun.podrunner.logs")

FOLLOW_POLL_SECONDS = 0.2
"""How often a followed log file is read again for new bytes (inotify is not worth it here)."""


def log_files(pod_dir: Path, container: str) -> list[Path]:
    """The container's log files, oldest restart first."""
    folder = pod_dir / "logs" / container
    if not folder.is_dir():
        return []
    return sorted(folder.glob("*.log"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)


def tail_bytes(data: bytes, lines: int | None, limit: int | None) -> bytes:
    """The last `lines` lines of `data` (all when None), then at most `limit` bytes of them."""
    if lines is not None:
        parts = data.splitlines(keepends=True)
        data = b"".join(parts[-lines:]) if lines > 0 else b""
    if limit is not None and len(data) > limit:
        data = data[:limit]
    return data


def _optional_int(query: dict[str, list[str]], key: str) -> int | None:
    values = query.get(key)
    if not values:
        return None
    try:
        return int(values[0])
    except ValueError:
        return None


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A serving certificate for 127.0.0.1 (the API server does not check a kubelet's serving
    certificate unless told a CA for it; it is still TLS, as the kubelet's endpoint is)."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agentrun-local-pod-runner")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .sign(key, hashes.SHA256())
    )
    key_file, cert_file = directory / "serving.key", directory / "serving.crt"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_file.chmod(0o600)
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_file, key_file


PodDirFinder = Callable[[str, str], Path | None]
"""(namespace, pod) -> the directory of the pod of that name the runner runs or ran last."""
Running = Callable[[Path, str], bool]
"""(pod directory, container) -> whether the container may still write to its log."""


class LogServer:
    """`/containerLogs/...` over TLS on 127.0.0.1, on a port the kernel picks."""

    def __init__(
        self, find_pod_dir: PodDirFinder, running: Running, client_ca: str | None, secrets_dir: Path
    ) -> None:
        self.find_pod_dir = find_pod_dir
        self.running = running
        self.stopping = threading.Event()
        cert, key = _self_signed(secrets_dir)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        if client_ca:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=client_ca)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                log.debug(format, *args)

            def do_GET(self) -> None:
                server.answer(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = int(self.httpd.server_address[1])

    def start(self) -> None:
        threading.Thread(target=self.httpd.serve_forever, daemon=True, name="log-server").start()

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, request: BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(request.path)
        parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
        if len(parts) != 4 or parts[0] != "containerLogs":
            self._plain(request, 404, f"not found: {url.path} (this node serves /containerLogs only)\n")
            return
        _, namespace, pod, container = parts
        query = urllib.parse.parse_qs(url.query)
        pod_dir = self.find_pod_dir(namespace, pod)
        if pod_dir is None:
            self._plain(request, 404, f"pod {namespace}/{pod} has not run on this node\n")
            return
        files = log_files(pod_dir, container)
        previous = query.get("previous", ["false"])[0] == "true"
        if previous:
            files = files[:-1]
        if not files:
            what = "a previous terminated container" if previous else "a log (it has not started)"
            self._plain(request, 400, f'container "{container}" in pod "{pod}" has no {what}\n')
            return
        path = files[-1]
        data = tail_bytes(
            path.read_bytes(), _optional_int(query, "tailLines"), _optional_int(query, "limitBytes")
        )
        follow = query.get("follow", ["false"])[0] == "true" and not previous
        request.send_response(200)
        request.send_header("Content-Type", "text/plain")
        if not follow:
            request.send_header("Content-Length", str(len(data)))
            request.end_headers()
            request.wfile.write(data)
            return
        request.send_header("Transfer-Encoding", "chunked")
        request.end_headers()
        try:
            self._chunk(request, data)
            self._follow(request, pod_dir, container, path, path.stat().st_size)
            request.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            return  # the client stopped reading (kubectl logs -f interrupted)
        request.close_connection = True

    def _follow(
        self, request: BaseHTTPRequestHandler, pod_dir: Path, container: str, path: Path, at: int
    ) -> None:
        """New bytes of `path` as they come, until the container can write no more (then the rest)."""
        while not self.stopping.is_set():
            ended = not self.running(pod_dir, container)
            size = path.stat().st_size if path.exists() else at
            if size > at:
                with path.open("rb") as handle:
                    handle.seek(at)
                    chunk = handle.read(size - at)
                at += len(chunk)
                self._chunk(request, chunk)
            elif ended:
                return
            else:
                time.sleep(FOLLOW_POLL_SECONDS)

    @staticmethod
    def _chunk(request: BaseHTTPRequestHandler, data: bytes) -> None:
        if data:
            request.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            request.wfile.flush()

    @staticmethod
    def _plain(request: BaseHTTPRequestHandler, status: int, text: str) -> None:
        body = text.encode()
        request.send_response(status)
        request.send_header("Content-Type", "text/plain")
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)
