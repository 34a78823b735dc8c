"""The reconciler's writes and the watch cache (shell/writes.py): each answer written through, a
foreign Job never."""

from __future__ import annotations

import asyncio
from typing import Any

from agentrun_operator.api import API_VERSION
from agentrun_operator.shell.cache import RunCache
from agentrun_operator.shell.writes import Writes

NS = "ns"


def job(name: str, owner_uid: str, version: str = "5") -> dict[str, Any]:
    owner = {"apiVersion": API_VERSION, "kind": "AgentRun", "name": "r", "uid": owner_uid}
    meta = {"name": name, "namespace": NS, "uid": f"u-{name}", "resourceVersion": version}
    return {"metadata": {**meta, "ownerReferences": [owner]}, "status": {}}


class AdoptingKube:
    """Answers every create with an existing Job owned by `owner`."""

    def __init__(self, owner: str) -> None:
        self.owner = owner

    async def create_job(self, manifest: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        return False, job(manifest["metadata"]["name"], self.owner)


def test_an_adopted_job_of_this_run_is_written_through_and_a_foreign_one_is_not() -> None:
    for owner, ours in (("run-uid", True), ("earlier-run-uid", False)):
        cache = RunCache()
        writes = Writes(AdoptingKube(owner), cache)  # type: ignore[arg-type]
        manifest = {"metadata": {"name": "j"}}
        created, _, adopted = asyncio.run(writes.create_job(NS, "j", manifest, "run-uid"))
        assert (created, adopted) == (False, ours)
        assert bool(cache.jobs.get((NS, "r"))) is ours
