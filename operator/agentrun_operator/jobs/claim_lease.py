"""The idempotency claim: the Lease whose create-or-conflict decides which run holds a key
(docs/concepts.md#idempotency). A pure builder, like the Job's: the reconciler only applies it."""

from __future__ import annotations

from typing import Any, Final

from agentrun_operator import naming
from agentrun_operator.api import API_VERSION
from agentrun_operator.jobs.builder import ANNOTATION_RUN_NAME

ANNOTATION_IDEMPOTENCY_KEY: Final = f"{naming.GROUP}/idempotency-key"
ANNOTATION_AGENT_REF: Final = f"{naming.GROUP}/agent-ref"
MAX_ANNOTATION_KEY: Final = 253
"""The key as an annotation, cut to this length: the claim's name (a hash) is what is unique."""


def idempotency_claim_lease(
    name: str, namespace: str, run_name: str, run_uid: str, key: str, agent_ref: str
) -> dict[str, Any]:
    """The Lease that claims `key` for the run: held by the run's uid, named for it by the planner
    (`naming.idempotency_claim_name`), and owned by the run, so it lives as long as the run does."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {naming.LABEL_MANAGED_BY: naming.MANAGED_BY},
            "annotations": {
                ANNOTATION_RUN_NAME: run_name,
                ANNOTATION_IDEMPOTENCY_KEY: key[:MAX_ANNOTATION_KEY],
                ANNOTATION_AGENT_REF: agent_ref,
            },
            "ownerReferences": [
                {"apiVersion": API_VERSION, "kind": "AgentRun", "name": run_name, "uid": run_uid}
            ],
        },
        "spec": {"holderIdentity": run_uid},
    }
