"""A thin async Kubernetes adapter over `kubernetes_asyncio`'s connection, speaking plain JSON dicts.

`kubernetes_asyncio` provides the login (kubeconfig or in-cluster, token refresh included) and its
aiohttp session; requests go through that session directly (`Kube.send`). Why not its `call_api`:
the generated models cost milliseconds per object to deserialize (the planner wants dicts anyway),
and even without models it walks every request body value by value (`sanitize_for_serialization`)
before the standard library's `json.dumps`, which was a tenth of the operator's CPU in the profile
(docs/operator.md#performance). Bodies are encoded and answers decoded with pydantic-core's JSON
functions (`encode_json`, `decode_json`), several times faster than the standard library's on
Kubernetes objects. Every call is one HTTP request; nothing here decides anything.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Final
from urllib.parse import urlencode

import aiohttp
from kubernetes_asyncio import client, config
from pydantic_core import from_json, to_json

from agentrun_operator.api import GROUP, VERSION
from agentrun_operator.shell import metrics

METADATA_LIST: Final = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

REQUEST_TIMEOUT_SECONDS: Final = 30.0
"""Whole-request timeout: a frozen API server fails the call (retried with backoff) instead of holding
a worker forever."""
_REQUEST_TIMEOUT: Final = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)


def decode_json(data: bytes | str) -> Any:
    """JSON text to plain dicts and lists (ValueError when it is not JSON)."""
    return from_json(data)


_MANAGED_FIELDS: Final = b',"managedFields":['
_METADATA_END: Final = b']},"spec":'


def _managed_fields(data: bytes) -> tuple[int, int] | None:
    """Where `metadata.managedFields` is in the text (`data[start:stop]`, its key's comma included),
    or None when the text is not of the shape `decode_object_json` relies on."""
    start = data.find(_MANAGED_FIELDS)
    if start < 0:
        return None
    end = data.find(_METADATA_END, start)
    if end < 0 or data.find(b'"metadata":', start, end) >= 0:  # not one object's metadata
        return None
    return start, end + 1


def decode_object_json(data: bytes) -> Any:
    """`decode_json` of an object or a watch event, without `metadata.managedFields`.

    managedFields (server-side apply's bookkeeping, which the operator never reads) are nearly half
    the bytes of every Job and Pod, and decoding was the largest cost per watch event in the profile
    (docs/operator.md#performance); they are cut out of the text before it is decoded. The API
    server writes `managedFields` as metadata's last field and `spec` right after metadata, and in
    JSON text a `"` inside a string is always escaped, so `,"managedFields":[` is that key and
    the first `]},"spec":` after it ends it: nothing inside the list (its keys are `manager`,
    `fieldsV1`, `f:…`, …) can spell either. Text of any other shape is decoded whole."""
    cut = _managed_fields(data)
    if cut is None:
        return decode_json(data)
    try:
        return decode_json(data[: cut[0]] + data[cut[1] :])
    except ValueError:
        return decode_json(data)


_SPEC: Final = b',"spec":{'
_STATUS: Final = b'},"status":{'
_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_SCALAR: Final = re.compile(
    rb'(?:-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null|"[^"\\]*(?:\\.[^"\\]*)*")(?=[,}])', re.DOTALL
)
_FIELD_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@cache
def _key_text(key: str) -> bytes:
    """`"key":` as the API server writes it; only plain field names, whose text is the name itself
    (the API server escapes some characters differently from us, and a key it spelled otherwise
    would be taken for absent)."""
    if not _FIELD_NAME.fullmatch(key):
        raise ValueError(f"not a plain field name: {key!r}")
    return b'"' + key.encode() + b'":'


def _depth(text: bytes, at: int) -> int:
    """How many brackets of a JSON value's text enclose position `at` (1: the value's own fields),
    counted on the shorter side of `at` with the strings (which may hold brackets) taken out."""
    if at <= len(text) - at:
        rest = _STRING.sub(b"", text[:at])
        return rest.count(b"{") + rest.count(b"[") - rest.count(b"}") - rest.count(b"]")
    rest = _STRING.sub(b"", text[at:])
    return rest.count(b"}") + rest.count(b"]") - rest.count(b"{") - rest.count(b"[")


def _scalar_fields(spec: bytes, keys: tuple[str, ...]) -> bytes | None:
    """The JSON text of an object holding those of `keys` that are fields of the object `spec`
    (its text) with a scalar value, or None when one is there with another value (or twice).

    `"key":` right after `{` or `,` is a key (that quote is unescaped, so it opens a string); it is
    one of spec's own fields when one bracket encloses it: a Job's template may hold the same name."""
    fields = []
    for key in keys:
        name = _key_text(key)
        found: bytes | None = None
        at = spec.find(name)
        while at >= 0:
            if spec[at - 1] in b"{," and _depth(spec, at) == 1:
                value = _SCALAR.match(spec, at + len(name))
                if found is not None or value is None:
                    return None
                found = value.group()
            at = spec.find(name, at + len(name))
        if found is not None:
            fields.append(name + found)
    return b"{" + b",".join(fields) + b"}"


def decode_status_json(data: bytes, spec_keys: tuple[str, ...] = ()) -> Any:
    """`decode_object_json` of an object or a watch event whose reader wants its metadata and status
    but of its spec only the scalar fields `spec_keys`: `spec` holds just those that are set.

    A Pod's spec is about half its bytes once managedFields are gone, and the informers decode every
    Pod and Job watch event (docs/operator.md#performance), so the spec's text is cut out before
    decoding. The API server writes an object's fields in the order kind, apiVersion, metadata,
    spec, status, with nothing after status; `,"spec":{` (its quote unescaped, so outside any
    string) cannot occur in metadata, whose maps hold strings only, so its first occurrence is the
    object's spec; the last `},"status":{` ends it unless status holds a `status` object, and then
    the cut text's brackets do not pair up and it fails to decode. Any text of another shape (no
    status, no spec, a spec field that is not a scalar, not JSON at all) is decoded by
    `decode_object_json`: the result is never wrong, at worst fuller. The spec's own text is not
    checked: a spec that is not valid JSON goes unnoticed. ValueError for a key that is not a plain
    field name (`[A-Za-z_][A-Za-z0-9_]*`), whatever the text."""
    for key in spec_keys:
        _key_text(key)
    start, stop = _managed_fields(data) or (0, 0)
    spec_at = data.find(_SPEC, stop)
    status_at = data.rfind(_STATUS)
    if spec_at < 0 or status_at < spec_at:
        return decode_object_json(data)
    spec = b"{}"
    if spec_keys:
        found = _scalar_fields(data[spec_at + len(_SPEC) - 1 : status_at + 1], spec_keys)
        if found is None:
            return decode_object_json(data)
        spec = found
    try:
        decoded = decode_json(
            b"".join((data[:start], data[stop:spec_at], b',"spec":', spec, data[status_at + 1 :]))
        )
    except ValueError:
        return decode_object_json(data)
    obj = decoded.get("object") if isinstance(decoded, dict) and data.startswith(b'{"type":') else decoded
    if not isinstance(obj, dict) or "spec" not in obj or "status" not in obj:  # the cut was elsewhere
        return decode_object_json(data)
    return decoded


def decode_job_event(data: bytes) -> Any:
    """A Job or its watch event as the operator reads it: metadata, status and the TTL."""
    return decode_status_json(data, ("ttlSecondsAfterFinished",))


def decode_pod_event(data: bytes) -> Any:
    """A Pod or its watch event as the operator reads it: metadata and status (`spec` is `{}`)."""
    return decode_status_json(data)


def encode_json(value: Any) -> bytes:
    """Plain dicts and lists to compact JSON."""
    return to_json(value)


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


def in_cluster_server(env: Mapping[str, str]) -> str | None:
    """The API server an in-cluster client talks to, as client-go's InClusterConfig finds it: from
    `KUBERNETES_SERVICE_HOST/PORT`, which the kubelet sets in every pod. kopf's own ServiceAccount
    login names `https://kubernetes.default.svc` instead, which needs cluster DNS: a `hostNetwork`
    pod with `dnsPolicy: Default`, or a pod on the local default, has none."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


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

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.counters = Counters()
        # kubernetes_asyncio opens its aiohttp session with trust_env=True, which reads ~/.netrc and
        # the proxy variables in a worker thread on *every* request: two thread hand-offs per call,
        # a visible share of CPU in the profile (docs/operator.md#performance). The API server is
        # reached directly (in-cluster, or the kubeconfig's server), so neither applies.
        session = getattr(getattr(api, "rest_client", None), "pool_manager", None)
        if session is not None and hasattr(session, "_trust_env"):
            session._trust_env = False

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> Kube:
        """In-cluster config when running in a pod, else the kubeconfig (`$KUBECONFIG`)."""
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            return cls(client.ApiClient())
        api = await config.new_client_from_config(config_file=kubeconfig or os.environ.get("KUBECONFIG"))
        return cls(api)

    async def close(self) -> None:
        await self.api.close()

    async def send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
        timeout: aiohttp.ClientTimeout = _REQUEST_TIMEOUT,
    ) -> aiohttp.ClientResponse:
        """One HTTP request on the API client's session, authenticated as `call_api` would (the
        bearer token refreshed by its hook, if any). The caller reads and releases the response."""
        rest = self.api.rest_client
        all_headers = {**self.api.default_headers, **(headers or {})}
        await self.api.update_params_for_auth(all_headers, [], ["BearerToken"])
        url = f"{self.api.configuration.host}{path}"
        if query:
            url += "?" + urlencode(query)
        extra: dict[str, Any] = {}
        if rest.server_hostname:
            extra["server_hostname"] = rest.server_hostname
        if rest.proxy:
            extra["proxy"] = rest.proxy
            extra["proxy_headers"] = rest.proxy_headers
        session: aiohttp.ClientSession = rest.pool_manager
        return await session.request(method, url, data=data, headers=all_headers, timeout=timeout, **extra)

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        whole: bool = True,
    ) -> tuple[int, dict[str, Any]]:
        """(HTTP status, decoded answer); `whole=False` for an answer that is one object whose
        managedFields nobody reads (`decode_object_json`)."""
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
            parsed = (decode_json(raw) if whole else decode_object_json(raw)) if raw else {}
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
        metadata_only: bool = False,
    ) -> tuple[list[dict[str, Any]], int | None]:
        """A LIST (cluster-wide when `namespace` is None) and the resourceVersion it was taken at.

        `metadata_only` asks for each object's metadata alone (a PartialObjectMetadataList): a
        fraction of the bytes to send and decode when only names and versions are compared."""
        path = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
        query = {"labelSelector": selector} if selector else None
        accept = METADATA_LIST if metadata_only else "application/json"
        body = await self._ok("GET", path, f"list {plural}", query=query, accept=accept)
        try:
            version: int | None = int((body.get("metadata") or {}).get("resourceVersion", ""))
        except ValueError:
            version = None
        return list(body.get("items") or []), version  # a metadata-only list says null for none

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
        status, body = await self.request("POST", path, body=manifest, whole=False)
        if status == 201 or status == 200:
            return True, body
        if status == 409:
            status, existing = await self.request(
                "GET", f"{path}/{manifest['metadata']['name']}", whole=False
            )
            if status == 200:
                return False, existing
        raise KubeError(status, body, f"create job {manifest['metadata']['name']}")

    async def delete_job(self, namespace: str, name: str) -> None:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"
        status, resp = await self.request("DELETE", path, body=body)
        if status not in (200, 202, 404):
            raise KubeError(status, resp, f"delete job {name}")

    async def set_job_ttl(self, namespace: str, name: str, seconds: int) -> dict[str, Any] | None:
        """The patched Job (None when it is gone)."""
        path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"
        patch = {"spec": {"ttlSecondsAfterFinished": seconds}}
        status, resp = await self.request(
            "PATCH", path, body=patch, content_type="application/merge-patch+json", whole=False
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
