"""An informer of the operator's own (shell/informer.py) over labelled ConfigMaps, for the watch-path
integration tests: ConfigMaps stand in for any kind, and their `data` is the stored view."""

from __future__ import annotations

from agentrun_operator.shell.cache import RunCache, Store
from agentrun_operator.shell.informer import Informer
from agentrun_operator.shell.kube import Kube


def configmap_informer(kube: Kube, selector: str, namespace: str) -> tuple[RunCache, Store, Informer]:
    """(cache, store, informer) for the ConfigMaps of `namespace` that `selector` selects, all kept
    under the one run key (namespace, "all"); nothing is enqueued. Not started."""
    cache = RunCache(gates=())
    store = Store(lambda _obj: "all", lambda obj: obj.get("data"))
    watcher = Informer(
        kube, cache, store, "/api/v1", "configmaps", selector, (namespace,), lambda _key, _ending: None
    )
    return cache, store, watcher
