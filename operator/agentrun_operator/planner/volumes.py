"""Claims that exist but are not bound yet: the run waits before its first Job. Pure.

A claim that does not exist at all is a validation problem (`validate`: waited for during the
reference grace period, then `InvalidSpec`). A claim that exists but is not `Bound` (its volume is
still being provisioned, or waits for an admin to create one) would leave the first iteration's pod
Pending with no word in the run's status; instead the run stays `Pending` with reason
`PersistentVolumeClaimPending` (and condition `Ready=False` with that reason) and is looked at
again every few seconds. There is no deadline: a claim binds when the cluster's storage can serve
it, and `kubectl describe pvc` says why it does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from agentrun_operator.planner.observed import Observed

REASON_CLAIM_PENDING: Final = "PersistentVolumeClaimPending"
RECHECK_SECONDS: Final = 3.0
"""How often an unbound claim is looked at again (the operator does not watch claims)."""


@dataclass(frozen=True)
class Waiting:
    """Why the run may not start yet."""

    reason: str
    message: str


def unbound_claims(observed: Observed) -> Waiting | None:
    """The wait for unbound claims, or None when every claim the run mounts is bound (or unchecked)."""
    if not observed.pvc_unbound:
        return None
    names = sorted(observed.pvc_unbound)
    listed = ", ".join(f"{name} (phase {observed.pvc_unbound[name]})" for name in names)
    noun = "PersistentVolumeClaim" if len(names) == 1 else "PersistentVolumeClaims"
    them = "it is" if len(names) == 1 else "they are"
    return Waiting(
        REASON_CLAIM_PENDING,
        f"waiting for {noun} {listed} to be bound to a volume; the first Job starts once {them} "
        f"(see `kubectl describe pvc {names[0]}` for why not yet)",
    )
