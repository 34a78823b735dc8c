"""A ServiceAccount's credentials for a test or a benchmark: a token from the API server's
TokenRequest (as the kubelet mounts one into a pod) and a kubeconfig holding it, so a process talks
to the control plane as that ServiceAccount and nothing more (its RBAC, its API Priority and Fairness
flow schema), not as the admin."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path

import yaml

from agentrun_devcluster.controlplane import ControlPlane


def service_account_token(plane: ControlPlane, namespace: str, name: str, seconds: int = 3600) -> str:
    """A token of ServiceAccount `namespace`/`name`, valid for `seconds`."""
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": seconds},
    }
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
    code, data = plane.api_request("POST", path, body)
    if code != 201:
        raise RuntimeError(f"TokenRequest for {namespace}/{name}: HTTP {code}: {data[:500]!r}")
    return str(json.loads(data)["status"]["token"])


def token_kubeconfig(plane: ControlPlane, token: str, path: Path) -> Path:
    """A kubeconfig at `path` (mode 0600) that authenticates to `plane` with `token` only."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {
                    "server": plane.server,
                    "certificate-authority-data": base64.b64encode(plane.pki.ca_cert.read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "local", "user": "operator"}}],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path


def get_as(plane: ControlPlane, token: str, path: str, timeout: float = 30.0) -> tuple[int, Message, bytes]:
    """GET `path` from `plane` with `token` as the only credential: (status, headers, body), the
    headers also of an error answer (the API server sets its API Priority and Fairness headers on
    every answer)."""
    context = ssl.create_default_context(cafile=str(plane.pki.ca_cert))
    request = urllib.request.Request(plane.server + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return int(resp.status), resp.headers, bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.headers, bytes(exc.read())
