"""The idempotency claim's Lease, built pure (jobs/claim_lease.py); the reconciler only creates it."""

from __future__ import annotations

from agentrun_operator import naming
from agentrun_operator.api import API_VERSION
from agentrun_operator.jobs.builder import ANNOTATION_RUN_NAME
from agentrun_operator.jobs.claim_lease import (
    ANNOTATION_AGENT_REF,
    ANNOTATION_IDEMPOTENCY_KEY,
    idempotency_claim_lease,
)


def test_the_claim_is_held_by_the_run_s_uid_owned_by_the_run_and_names_it() -> None:
    name = naming.idempotency_claim_name("team", "agent", "key-1")
    lease = idempotency_claim_lease(name, "team", "run-a", "uid-a", "key-1", "agent")
    assert lease["apiVersion"] == "coordination.k8s.io/v1" and lease["kind"] == "Lease"
    meta = lease["metadata"]
    assert (meta["name"], meta["namespace"]) == (name, "team")
    assert lease["spec"] == {"holderIdentity": "uid-a"}
    # The reconciler reads the holder's name back from this annotation to find the holding run.
    assert meta["annotations"] == {
        ANNOTATION_RUN_NAME: "run-a",
        ANNOTATION_IDEMPOTENCY_KEY: "key-1",
        ANNOTATION_AGENT_REF: "agent",
    }
    assert meta["labels"] == {naming.LABEL_MANAGED_BY: naming.MANAGED_BY}
    assert meta["ownerReferences"] == [
        {"apiVersion": API_VERSION, "kind": "AgentRun", "name": "run-a", "uid": "uid-a"}
    ]


def test_a_long_key_is_cut_to_an_annotation_value_the_name_stays_the_hash() -> None:
    key = "k" * 1000
    lease = idempotency_claim_lease("claim-x", "team", "run-a", "uid-a", key, "agent")
    assert lease["metadata"]["annotations"][ANNOTATION_IDEMPOTENCY_KEY] == "k" * 253
