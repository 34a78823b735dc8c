"""Credentials and namespace for the CLI, resolved the way kubectl resolves them.

Order: `--kubeconfig`, else `$KUBECONFIG` (a `:`-separated list, merged, first wins), else
`~/.kube/config`; with none of those, in-cluster credentials (the pod's ServiceAccount). The
namespace is `-n`, else the context's namespace, else the pod's namespace in-cluster, else
`default`. Every failure is a `CtlError` with one line a person can act on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader
from kubernetes_asyncio.config.kube_config import KubeConfigMerger

from agentrun_operator.shell.kube import Kube

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class CtlError(Exception):
    """A CLI failure with a one-line message (printed without a traceback, exit code 4)."""


@dataclass
class Target:
    """Where the CLI talks to, and as whom."""

    kube: Kube
    namespace: str
    server: str
    source: str  # "kubeconfig PATH (context C)" or "in-cluster ServiceAccount", for error messages


def _kubeconfig_paths(explicit: str | None) -> list[str]:
    if explicit:
        path = os.path.expanduser(explicit)
        if not os.path.exists(path):
            raise CtlError(f"kubeconfig {explicit} does not exist (from --kubeconfig)")
        return [path]
    value = os.environ.get("KUBECONFIG")
    if value:
        paths = [os.path.expanduser(p) for p in value.split(os.pathsep) if p]
        return [p for p in paths if os.path.exists(p)]
    default = os.path.expanduser("~/.kube/config")
    return [default] if os.path.exists(default) else []


def _in_cluster_available() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (SERVICE_ACCOUNT_DIR / "token").exists()


async def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Target:
    """An API client for the chosen context (or in-cluster) and the namespace to work in."""
    paths = _kubeconfig_paths(kubeconfig)
    if paths:
        return await _from_kubeconfig(paths, context, namespace)
    if _in_cluster_available():
        if context:
            raise CtlError(f"--context {context} needs a kubeconfig, and none was found (running in-cluster)")
        configuration = client.Configuration()
        loader = InClusterConfigLoader(
            token_filename=str(SERVICE_ACCOUNT_DIR / "token"),
            cert_filename=str(SERVICE_ACCOUNT_DIR / "ca.crt"),
        )
        try:
            loader.load_and_set(configuration)
        except config.ConfigException as exc:
            raise CtlError(f"in-cluster credentials are unusable: {exc}") from None
        ns = namespace
        if not ns:
            try:
                ns = (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip()
            except OSError:
                ns = ""
        return Target(
            Kube(configuration),
            ns or "default",
            str(configuration.host),
            "in-cluster ServiceAccount",
        )
    where = os.environ.get("KUBECONFIG") or "~/.kube/config"
    raise CtlError(
        f"no kubeconfig found ({where} does not exist) and not running in a pod: "
        "pass --kubeconfig FILE or set KUBECONFIG"
    )


def _is_empty(path: str) -> bool:
    try:
        return not Path(path).read_text(errors="replace").strip()
    except OSError:
        return False  # unreadable: the loader names the error


async def _from_kubeconfig(paths: list[str], context: str | None, namespace: str | None) -> Target:
    joined = os.pathsep.join(paths)
    # kubectl skips empty files in the list; the loader would fail on one with a Python TypeError.
    paths = [p for p in paths if not _is_empty(p)]
    if not paths:
        raise CtlError(
            f"kubeconfig {joined} is empty: pass --kubeconfig FILE or set KUBECONFIG to a kubeconfig"
        )
    joined = os.pathsep.join(paths)
    try:
        merged = KubeConfigMerger(joined).config
        doc = merged.value if merged is not None else {}
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise CtlError(f"kubeconfig {joined} cannot be read: {exc}") from None
    entries = [getattr(c, "value", c) for c in doc.get("contexts") or []]
    contexts: dict[str, dict[str, Any]] = {str(c["name"]): dict(c.get("context") or {}) for c in entries}
    chosen = context or doc.get("current-context")
    if not chosen:
        raise CtlError(
            f"kubeconfig {joined} has no current-context: pass --context (one of {_names(contexts)})"
        )
    if chosen not in contexts:
        raise CtlError(f"context {chosen!r} is not in kubeconfig {joined} (contexts: {_names(contexts)})")
    configuration = client.Configuration()
    try:
        await config.load_kube_config(
            config_file=joined, context=chosen, client_configuration=configuration, persist_config=False
        )
    except Exception as exc:  # the loader raises many kinds (bad base64, exec plugin failing, …)
        raise CtlError(f"kubeconfig {joined}, context {chosen!r}: {exc}") from None
    ns = namespace or contexts[chosen].get("namespace") or "default"
    return Target(
        Kube(configuration),
        str(ns),
        str(configuration.host),
        f"kubeconfig {joined} (context {chosen})",
    )


def _names(contexts: dict[str, dict[str, Any]]) -> str:
    return ", ".join(sorted(contexts)) or "none"
