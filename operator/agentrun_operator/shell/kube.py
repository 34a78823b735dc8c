"""A thin async Kubernetes adapter, speaking plain JSON dicts over its own aiohttp session.

One credential stack (docs/design.md#watch-path): `kubernetes_asyncio`'s configuration loaders read
the kubeconfig or the in-cluster ServiceAccount (token refresh and exec plugins included), and
every request here is authenticated from that configuration's public API (`auth_settings`, its
TLS files); kopf logs in from the same configuration (`kopf_login`), not with its own readers.
Requests go through this adapter's own session (`Kube.send`), never the client's internals. Why
not its `call_api`:
the generated models cost milliseconds per object to deserialize (the planner wants dicts anyway),
and even without models it walks every request body value by value (`sanitize_for_serialization`)
before the standard library's `json.dumps`, which was a tenth of the operator's CPU in the profile
(docs/operator.md#performance). Bodies are encoded and answers decoded with pydantic-core's JSON
functions (`encode_json`, `decode_json`), several times faster than the standard library's on
Kubernetes objects. Every call is one HTTP request; nothing here decides anything.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlencode

import aiohttp
import kopf
from kubernetes_asyncio import client, config

from agentrun_operator.api import GROUP, VERSION
from agentrun_operator.jobs.reporter_container import JOB_UID_LABEL
from agentrun_operator.shell import metrics
from agentrun_operator.shell.codec import decode_json, encode_json

USER_AGENT: Final = "agentrun-operator"
METADATA_LIST: Final = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

REQUEST_TIMEOUT_SECONDS: Final = 30.0
"""Whole-request timeout: a frozen API server fails the call (retried with backoff) instead of holding
a worker forever."""
_REQUEST_TIMEOUT: Final = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)


def _resource_of(path: str) -> str:
    """The resource segment of an API path, e.g. `jobs` or `agentruns/status` (a bounded label)."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    if "namespaces" in parts:
        rest = parts[parts.index("namespaces") + 2 :]
    else:
        rest = parts[3:] if parts and parts[0] == "apis" else parts[2:]
    if not rest:
        return "namespaces"
    return rest[0] + ("/" + rest[2] if len(rest) > 2 else "")


async def load_configuration(kubeconfig: str | None = None) -> client.Configuration:
    """In-cluster config when running in a pod (the API server at `KUBERNETES_SERVICE_HOST/PORT`, as
    client-go finds it: no cluster DNS needed), else the kubeconfig (`$KUBECONFIG`)."""
    configuration = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        path = kubeconfig or os.environ.get("KUBECONFIG")
        await config.load_kube_config(config_file=path, client_configuration=configuration)
    return configuration


async def auth_headers(configuration: client.Configuration) -> dict[str, str]:
    """The Authorization header of a request, from the configuration's public API (a bearer token,
    refreshed by its loader's hook, or basic auth); none for client certificates."""
    bearer = (await configuration.auth_settings()).get("BearerToken")
    if bearer and bearer.get("value"):
        return {"Authorization": str(bearer["value"])}
    if configuration.username:
        return {"Authorization": str(configuration.get_basic_auth_token())}
    return {}


def ssl_context(configuration: client.Configuration) -> ssl.SSLContext:
    """TLS as the configuration says: its CA, its client certificate, or no verification."""
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


async def kopf_login(kubeconfig: str | None = None) -> kopf.ConnectionInfo:
    """kopf's login from the operator's one credential stack (`load_configuration`): kopf calls it
    at start and again when the API server refuses its credentials (a token rotated meanwhile)."""
    configuration = await load_configuration(kubeconfig)
    header = (await auth_headers(configuration)).get("Authorization", "")
    token = header.removeprefix("Bearer ") if header.startswith("Bearer ") else None
    return kopf.ConnectionInfo(
        server=str(configuration.host),
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        token=token,
        username=configuration.username or None,
        password=configuration.password or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


LIST_PAGE = 500
"""Objects per page of a resync's metadata LIST (`limit`)."""
IDENTITY = ("namespace", "name", "uid", "resourceVersion")


class KubeError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, body: dict[str, Any] | str, what: str) -> None:
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else body
        self.reason = str(message or f"HTTP {status}")
        """The API server's own message (it names the field path of a refused object)."""
        super().__init__(f"{what}: HTTP {status}: {message}")


@dataclass
class Counters:
    """API calls made, by verb; the benchmarks read these to report writes per iteration."""

    reads: int = 0
    writes: int = 0


class Kube:
    """The handful of calls the operator makes."""

    def __init__(self, configuration: client.Configuration) -> None:
        self.configuration = configuration
        self.counters = Counters()
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> Kube:
        """In-cluster config when running in a pod, else the kubeconfig (`$KUBECONFIG`)."""
        return cls(await load_configuration(kubeconfig))

    def _open(self) -> aiohttp.ClientSession:
        """The session, made on first use (inside the event loop). `trust_env` off: aiohttp would
        read ~/.netrc and the proxy variables in a worker thread on every request, a visible share
        of CPU in the profile (docs/operator.md#performance); the configuration names any proxy."""
        if self._session is None:
            https = str(self.configuration.host).startswith("https:")
            tls = ssl_context(self.configuration) if https else False
            connector = aiohttp.TCPConnector(ssl=tls, limit=100)
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
        timeout: aiohttp.ClientTimeout = _REQUEST_TIMEOUT,
    ) -> aiohttp.ClientResponse:
        """One HTTP request on this adapter's session, authenticated from the configuration (the
        bearer token refreshed by its loader's hook, if any). The caller reads and releases the
        response."""
        configuration = self.configuration
        all_headers = {"User-Agent": USER_AGENT, **(headers or {}), **await auth_headers(configuration)}
        url = f"{configuration.host}{path}"
        if query:
            url += "?" + urlencode(query)
        extra: dict[str, Any] = {}
        if configuration.tls_server_name:
            extra["server_hostname"] = configuration.tls_server_name
        if configuration.proxy:
            extra["proxy"] = configuration.proxy
            extra["proxy_headers"] = configuration.proxy_headers
        session = self._open()
        return await session.request(method, url, data=data, headers=all_headers, timeout=timeout, **extra)

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> tuple[int, dict[str, Any]]:
        """(HTTP status, decoded answer)."""
        if method == "GET":
            self.counters.reads += 1
        else:
            self.counters.writes += 1
        metrics.api_request(method, _resource_of(path))
        headers = {"Accept": accept, "Content-Type": content_type}
        data = None if body is None else encode_json(body)
        resp = await self.send(method, path, query, headers, data)
        try:
            status = resp.status
            raw = await resp.read()
        finally:
            resp.release()
        try:
            parsed = decode_json(raw) if raw else {}
        except ValueError:
            parsed = {"message": raw.decode(errors="replace")}
        return status, parsed

    async def _ok(self, method: str, path: str, what: str, **kwargs: Any) -> dict[str, Any]:
        status, body = await self.request(method, path, **kwargs)
        if not 200 <= status < 300:
            raise KubeError(status, body, what)
        return body

    # -- AgentRuns & friends -------------------------------------------------------------------
    @staticmethod
    def _custom(namespace: str, plural: str, name: str | None = None) -> str:
        base = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}"
        return f"{base}/{name}" if name else base

    async def get_custom(self, namespace: str, plural: str, name: str) -> dict[str, Any] | None:
        status, body = await self.request("GET", self._custom(namespace, plural, name))
        if status == 404:
            return None
        if status != 200:
            raise KubeError(status, body, f"get {plural}/{name}")
        return body

    async def replace_run_status(self, run: dict[str, Any]) -> dict[str, Any]:
        """PUT the status subresource; the object's resourceVersion makes it optimistic (409 on race)."""
        meta = run["metadata"]
        path = self._custom(meta["namespace"], "agentruns", meta["name"]) + "/status"
        return await self._ok("PUT", path, f"update status of agentrun {meta['name']}", body=run)

    async def delete_run(self, namespace: str, name: str, uid: str) -> None:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
        status, resp = await self.request("DELETE", self._custom(namespace, "agentruns", name), body=body)
        if status not in (200, 202, 404, 409):
            raise KubeError(status, resp, f"delete agentrun {name}")

    # -- Jobs & Pods ---------------------------------------------------------------------------
    async def list_with_version(
        self,
        prefix: str,
        plural: str,
        namespace: str | None,
        selector: str | None = None,
        fields: str | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """A LIST (cluster-wide when `namespace` is None) and the resourceVersion it was taken at (opaque:
        a watch resumes from it)."""
        path = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
        query = {"labelSelector": selector} if selector else {}
        if fields:
            query["fieldSelector"] = fields
        body = await self._ok("GET", path, f"list {plural}", query=query or None)
        version = (body.get("metadata") or {}).get("resourceVersion")
        return list(body.get("items") or []), str(version) if version else None  # null for none

    async def list_identities(
        self,
        prefix: str,
        plural: str,
        namespace: str | None,
        selector: str | None = None,
        page: int = LIST_PAGE,
    ) -> list[dict[str, Any]]:
        """Every object's identity (namespace, name, uid, resourceVersion), from a metadata-only LIST
        read in pages of `page` (limit/continue: one consistent snapshot). Each page is cut to the
        identities and let go before the next is read, so a resync's memory does not grow with the
        objects' metadata (their managedFields, labels and annotations were most of a page; whole,
        the lists of 3,000 Jobs and pods were the operator's peak memory, docs/operator.md#scale)."""
        path = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
        out: list[dict[str, Any]] = []
        token = ""
        while True:
            query = {"limit": str(page)}
            if selector:
                query["labelSelector"] = selector
            if token:
                query["continue"] = token
            body = await self._ok("GET", path, f"list {plural}", query=query, accept=METADATA_LIST)
            for item in body.get("items") or []:
                meta = item.get("metadata") or {}
                out.append({"metadata": {k: meta.get(k) for k in IDENTITY}})
            token = str((body.get("metadata") or {}).get("continue") or "")
            if not token:
                return out

    async def get_object(self, prefix: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One object of any kind (None when it does not exist)."""
        status, body = await self.request("GET", f"{prefix}/namespaces/{namespace}/{plural}/{name}")
        if status == 404:
            return None
        if status != 200:
            raise KubeError(status, body, f"get {plural}/{name}")
        return body

    async def create_job(self, manifest: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """(created, job). An existing Job of the same name is returned for adoption, not an error."""
        ns = manifest["metadata"]["namespace"]
        path = f"/apis/batch/v1/namespaces/{ns}/jobs"
        status, body = await self.request("POST", path, body=manifest)
        if status == 201 or status == 200:
            return True, body
        if status == 409:
            status, existing = await self.request("GET", f"{path}/{manifest['metadata']['name']}")
            if status == 200:
                return False, existing
        raise KubeError(status, body, f"create job {manifest['metadata']['name']}")

    async def create_config_map(self, manifest: dict[str, Any]) -> bool:
        """Create a ConfigMap; True when created, False when one of that name exists (adopted as it
        is: the names the operator gives are hashes of the data, docs/api.md#runner-contract)."""
        ns = manifest["metadata"]["namespace"]
        status, body = await self.request("POST", f"/api/v1/namespaces/{ns}/configmaps", body=manifest)
        if status in (200, 201):
            return True
        if status == 409:
            return False
        raise KubeError(status, body, f"create configmap {manifest['metadata']['name']}")

    async def delete_job_pods(self, namespace: str, job_uid: str, grace_seconds: int) -> bool:
        """Delete every pod of the Job with this uid, with an explicit grace period (an immediate
        cancel, docs/design.md#grace-period). Selected by the label the Job controller gives its pods,
        so a pod the operator has not observed yet is deleted too. False when RBAC refuses it (the
        grant `deletecollection` on pods is missing): the pods then stop with their own grace."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": grace_seconds}
        query = {"labelSelector": f"{JOB_UID_LABEL}={job_uid}"}
        path = f"/api/v1/namespaces/{namespace}/pods"
        status, resp = await self.request("DELETE", path, body=body, query=query)
        if status == 403:
            return False
        if status not in (200, 202, 404):
            raise KubeError(status, resp, f"delete pods of job uid {job_uid}")
        return True

    async def delete_job(self, namespace: str, name: str, foreground: bool = False) -> None:
        """Delete a Job and, by the garbage collector, its pods: at once (`Background`), or with the
        Job kept, being deleted, until its pods are gone (`Foreground`)."""
        policy = "Foreground" if foreground else "Background"
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": policy}
        path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"
        status, resp = await self.request("DELETE", path, body=body)
        if status not in (200, 202, 404):
            raise KubeError(status, resp, f"delete job {name}")

    async def set_job_ttl(self, namespace: str, name: str, seconds: int | None) -> dict[str, Any] | None:
        """The patched Job (None when it is gone); `seconds` None removes its TTL (a merge patch's null)."""
        path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"
        patch = {"spec": {"ttlSecondsAfterFinished": seconds}}
        status, resp = await self.request(
            "PATCH", path, body=patch, content_type="application/merge-patch+json"
        )
        if status not in (200, 404):
            raise KubeError(status, resp, f"set ttl of job {name}")
        return resp if status == 200 else None

    # -- PersistentVolumeClaims (read only) -----------------------------------------------------
    async def get_pvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        status, body = await self.request(
            "GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}"
        )
        if status == 404:
            return None
        if status != 200:
            raise KubeError(status, body, f"get persistentvolumeclaim {name}")
        return body

    # -- ConfigMaps and Secrets (read only: the keys a system prompt reference names) -------------
    async def get_data_keys(self, namespace: str, kind: str, name: str) -> frozenset[str] | None:
        """The keys of a ConfigMap or Secret (`data` and `binaryData`); None when it does not exist.
        Only the key names leave this method, never a value."""
        plural = "secrets" if kind == "Secret" else "configmaps"
        status, body = await self.request("GET", f"/api/v1/namespaces/{namespace}/{plural}/{name}")
        if status == 404:
            return None
        if status != 200:
            raise KubeError(status, body, f"get {kind.lower()} {name}")
        return frozenset([*(body.get("data") or {}), *(body.get("binaryData") or {})])

    async def get_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """A Secret's `data` (base64 values); None when it does not exist. Only for the operator's own
        Secrets (a run's warm key, docs/design.md#warm-pod)."""
        status, body = await self.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        if status == 404:
            return None
        if status != 200:
            raise KubeError(status, body, f"get secret {name}")
        return {str(k): str(v) for k, v in (body.get("data") or {}).items()}

    async def create_secret(self, manifest: dict[str, Any]) -> bool:
        """Create a Secret; True when created, False when one of that name exists (read it instead)."""
        ns = manifest["metadata"]["namespace"]
        status, body = await self.request("POST", f"/api/v1/namespaces/{ns}/secrets", body=manifest)
        if status in (200, 201):
            return True
        if status == 409:
            return False
        raise KubeError(status, body, f"create secret {manifest['metadata']['name']}")

    # -- Leases (idempotency claims) -----------------------------------------------------------
    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        status, body = await self.request("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise KubeError(status, body, f"get lease {name}")
        return body

    async def create_lease(self, namespace: str, manifest: dict[str, Any]) -> bool:
        """True when we created it; False when it already existed (someone else holds the key)."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        status, body = await self.request("POST", path, body=manifest)
        if status in (200, 201):
            return True
        if status == 409:
            return False
        raise KubeError(status, body, f"create lease {manifest['metadata']['name']}")

    # -- Events --------------------------------------------------------------------------------
    async def create_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
        status, body = await self.request("POST", f"/api/v1/namespaces/{namespace}/events", body=event)
        if status not in (200, 201):
            raise KubeError(status, body, "create event")
        return body

    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """Update an Event series (count, lastTimestamp, message) with a merge patch."""
        path = f"/api/v1/namespaces/{namespace}/events/{name}"
        status, body = await self.request(
            "PATCH", path, body=patch, content_type="application/merge-patch+json"
        )
        if status not in (200, 404):
            raise KubeError(status, body, f"patch event {name}")
