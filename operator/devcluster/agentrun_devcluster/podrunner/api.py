"""A small synchronous Kubernetes API client for the pod runner (threads, not asyncio).

It reads a kubeconfig (server, CA and client certificate, inline or as files), keeps the decoded
certificate and key in a private directory under the runner's state, and offers JSON requests and
a line-by-line watch. One HTTPS request per call; the runner's load is a handful per pod.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import yaml

JSON: Final = "application/json"
SMP: Final = "application/strategic-merge-patch+json"


class ApiError(Exception):
    """A non-2xx answer (or no answer: status 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def _material(entry: dict[str, Any], key: str, base: Path, out: Path) -> str | None:
    """A kubeconfig `*-data` (base64, written to `out`) or a file path (relative to the kubeconfig)."""
    data = entry.get(f"{key}-data")
    if data:
        out.write_bytes(base64.b64decode(data))
        out.chmod(0o600)
        return str(out)
    path = entry.get(key)
    if path:
        return str((base / str(path)).resolve())
    return None


def open_json_request(
    method: str,
    url: str,
    body: Any,
    content_type: str,
    context: ssl.SSLContext,
    timeout: float,
    token: str | None = None,
) -> Any:
    """Send one request with a JSON body (if any) and open its answer; HTTPError on non-2xx."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", content_type)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    return urllib.request.urlopen(req, context=context, timeout=timeout)


class Api:
    """JSON requests against the API server of a kubeconfig's current context."""

    def __init__(self, kubeconfig: Path, secrets_dir: Path) -> None:
        doc = yaml.safe_load(kubeconfig.read_text())
        contexts = {c["name"]: c["context"] for c in doc.get("contexts") or []}
        context = contexts[doc["current-context"]]
        cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in doc["users"] if u["name"] == context["user"])
        secrets_dir.mkdir(parents=True, exist_ok=True)
        secrets_dir.chmod(0o700)
        base = kubeconfig.parent
        self.server = str(cluster["server"]).rstrip("/")
        ca = _material(cluster, "certificate-authority", base, secrets_dir / "ca.crt")
        cert = _material(user, "client-certificate", base, secrets_dir / "client.crt")
        key = _material(user, "client-key", base, secrets_dir / "client.key")
        self.ca_file = ca
        self.ssl = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
        if cert and key:
            self.ssl.load_cert_chain(cert, key)
        self.token = user.get("token")

    def _request(self, method: str, path: str, body: Any, content_type: str, timeout: float) -> Any:
        return open_json_request(
            method, self.server + path, body, content_type, self.ssl, timeout, token=self.token
        )

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = JSON, timeout: float = 15.0
    ) -> dict[str, Any]:
        """One request; the decoded JSON answer, or ApiError."""
        try:
            with self._request(method, path, body, content_type, timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                message = str(json.loads(raw).get("message", raw[:300]))
            except ValueError:
                message = raw[:300].decode("utf-8", "replace")
            raise ApiError(exc.code, message) from None
        except (OSError, ssl.SSLError, http.client.HTTPException) as exc:
            # HTTPException: e.g. IncompleteRead, the API server killed while it answered
            raise ApiError(0, f"{type(exc).__name__}: {exc}") from None
        try:
            result: dict[str, Any] = json.loads(raw) if raw else {}
        except ValueError as exc:  # a truncated answer: no answer
            raise ApiError(0, f"unreadable answer: {exc}") from None
        return result

    def get(self, path: str) -> dict[str, Any] | None:
        """GET, or None when the object does not exist."""
        try:
            return self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def watch(self, path: str, resource_version: str, timeout_seconds: int = 240) -> Iterator[dict[str, Any]]:
        """Watch events (`{"type", "object"}`) from `resource_version` until the server ends the watch."""
        query = urllib.parse.urlencode(
            {
                "watch": "1",
                "resourceVersion": resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(timeout_seconds),
            }
        )
        sep = "&" if "?" in path else "?"
        try:
            resp = self._request("GET", f"{path}{sep}{query}", None, "", timeout_seconds + 30)
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, exc.read()[:300].decode("utf-8", "replace")) from None
        except (OSError, ssl.SSLError) as exc:
            raise ApiError(0, str(exc)) from None
        with resp:
            while True:
                try:
                    line = resp.readline()
                except (OSError, ssl.SSLError, http.client.HTTPException) as exc:
                    raise ApiError(0, f"watch broken: {exc}") from None
                if not line:
                    return
                if line.strip():
                    event: dict[str, Any] = json.loads(line)
                    yield event


def pod_path(namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{namespace}/pods"
    return f"{base}/{name}" if name else base


def transient(exc: Exception) -> bool:
    """An API failure worth retrying: no answer, a timeout, throttling, a server error, or the
    authorizer not ready yet (401/403 right after an API server restart)."""
    return isinstance(exc, ApiError) and (exc.status in (0, 401, 403, 408, 429) or exc.status >= 500)
