"""The periodic resync's reads: compare every cached kind with the API server (docs/operator.md#cache).

The watch cache (shell/cache.py) only keeps and merges; the requests that check it are made here.
Each kind is listed as metadata only, in pages cut to names and versions (`Kube.list_identities`,
`Store.compare`), and only the objects the cache does not hold
at their listed version are read in full, each with a GET whose answer is merged in as a read
(`Store.answer`): a resync of an up-to-date cache decodes names and versions, not every pod's spec
and status. Whatever a watch missed is found here, one resync period late at most.
"""

from __future__ import annotations

from agentrun_operator import naming
from agentrun_operator.api import GROUP, VERSION
from agentrun_operator.shell.cache import Key, RunCache, Store
from agentrun_operator.shell.kube import Kube

KINDS = (
    # (store attribute, API prefix, plural, label selector)
    ("runs", f"/apis/{GROUP}/{VERSION}", "agentruns", None),
    ("jobs", "/apis/batch/v1", "jobs", naming.LABEL_RUN),
    ("pods", "/api/v1", "pods", naming.LABEL_RUN),
)


async def relist(kube: Kube, cache: RunCache, namespaces: tuple[str, ...]) -> set[Key]:
    """Compare every kind with the API server and merge what differs in. Returns the runs whose view
    changed, i.e. those a watch event had been missed for."""
    changed: set[Key] = set()
    scopes: list[str | None] = list(namespaces) or [None]
    for attr, prefix, plural, selector in KINDS:
        store: Store = getattr(cache, attr)
        for ns in scopes:
            since = store.clock()
            metas = await kube.list_identities(prefix, plural, ns, selector)
            fetch, dropped = store.compare(metas, since, {ns} if ns else None)
            changed |= dropped
            for obj_ns, name in fetch:
                with store.window(obj_ns, name) as window:
                    obj = await kube.get_object(prefix, plural, obj_ns, name)
                # Gone since: its DELETED event, or the next round, drops it.
                key = store.answer(obj, window, read=True) if obj is not None else None
                if key is not None:
                    changed.add(key)
    return changed
