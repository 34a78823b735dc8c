"""Where the next iteration pod should run: the node of the run's newest stopped pod. Pure.

A run's iterations share a PVC. On a cluster of several nodes a `ReadWriteOnce` volume is attached
to one node at a time; when the next pod lands on another node, it waits in `ContainerCreating`
while the attach/detach controller detaches the volume from the old node and attaches it to the new
one (tens of seconds to minutes with cloud block storage). Preferring the node the last pod ran on
avoids that wait without ever blocking a pod: the preference is soft, so a node that is gone, full
or cordoned just loses it (docs/design.md#next-pod-placement).
"""

from __future__ import annotations

from collections.abc import Iterable

from agentrun_operator.planner.observed import ObservedPod


def preferred_node(pods: Iterable[ObservedPod]) -> str | None:
    """The node of the newest pod of the run that has stopped (its volume is attached there), or
    None when no stopped pod names one. Ties are broken by pod name, so the same observation always
    gives the same node (the Job manifest is deterministic)."""
    stopped = [p for p in pods if p.stopped and p.node_name]
    if not stopped:
        return None
    newest = max(
        stopped,
        key=lambda p: (
            p.finished_at is not None,
            p.finished_at.timestamp() if p.finished_at else 0.0,
            p.name,
        ),
    )
    return newest.node_name
