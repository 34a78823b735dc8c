"""The watch cache's store (shell/cache.py) and the Event merge (shell/events.py): which version of an
object wins, when a run must be re-planned, how a relist is merged in, what one merged Event says."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from agentrun_operator import naming
from agentrun_operator.planner.actions import EmitEvent
from agentrun_operator.shell.cache import RunCache, Store, run_of_run, run_view
from agentrun_operator.shell.events import merge

NS = "ns"


def _job(name: str, rv: int, run: str = "r", uid: str = "job-uid", complete: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {"startTime": "2026-01-01T00:00:00Z"}
    if complete:
        status["conditions"] = [{"type": "Complete", "status": "True"}]
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid,
            "resourceVersion": str(rv),
            "labels": {
                naming.LABEL_RUN: run,
                naming.LABEL_STEP_INDEX: "1",
                naming.LABEL_ITERATION: "1",
                naming.LABEL_ATTEMPT: "1",
            },
            "ownerReferences": [
                {
                    "apiVersion": "agents.proompteng.ai/v1alpha1",
                    "kind": "AgentRun",
                    "name": run,
                    "uid": "run-uid",
                }
            ],
        },
        "spec": {},
        "status": status,
    }


def _run(rv: int, status: dict[str, Any] | None = None, uid: str = "run-uid") -> dict[str, Any]:
    return {
        "metadata": {"name": "r", "namespace": NS, "uid": uid, "resourceVersion": str(rv), "generation": 1},
        "spec": {},
        "status": status or {},
    }


def test_a_new_object_and_a_visible_change_replan_the_run() -> None:
    cache = RunCache()
    assert cache.jobs.upsert(_job("j", 1)) == (NS, "r")
    assert cache.jobs.upsert(_job("j", 2, complete=True)) == (NS, "r")
    assert cache.jobs.get((NS, "r"))[0]["metadata"]["resourceVersion"] == "2"


def test_a_change_the_planner_cannot_see_does_not_replan() -> None:
    cache = RunCache()
    cache.jobs.upsert(_job("j", 1))
    touched = _job("j", 2)
    touched["metadata"]["annotations"] = {"unrelated": "x"}
    assert cache.jobs.upsert(touched) is None
    assert cache.jobs.get((NS, "r"))[0]["metadata"]["resourceVersion"] == "2"  # still the newest stored


def test_an_older_version_never_replaces_a_newer_one() -> None:
    """E.g. our own status write stored first, the watch's older event delivered after it."""
    store = Store(run_of_run, run_view)
    assert store.upsert(_run(5, {"phase": "Running"})) is not None
    assert store.upsert(_run(4, {"phase": "Pending"})) is None
    assert store.one((NS, "r"), "r") == _run(5, {"phase": "Running"})


def test_the_echo_of_our_own_write_does_not_replan() -> None:
    store = Store(run_of_run, run_view)
    store.upsert(_run(5, {"phase": "Running"}))
    assert store.upsert(_run(5, {"phase": "Running"})) is None


def test_delete_forgets_only_the_same_object() -> None:
    cache = RunCache()
    cache.jobs.upsert(_job("j", 3, uid="new"))
    assert cache.jobs.delete(_job("j", 2, uid="old")) is None  # a namesake's late DELETED
    assert len(cache.jobs.get((NS, "r"))) == 1
    assert cache.jobs.delete(_job("j", 4, uid="new")) == (NS, "r")
    assert cache.jobs.get((NS, "r")) == []


def test_an_orphaned_object_leaves_its_run() -> None:
    cache = RunCache()
    cache.jobs.upsert(_job("j", 1))
    orphan = _job("j", 2)
    orphan["metadata"]["ownerReferences"] = []
    assert cache.jobs.upsert(orphan) == (NS, "r")
    assert cache.jobs.get((NS, "r")) == []


def test_relist_adds_the_missed_drops_the_gone_and_keeps_what_is_newer_than_the_list() -> None:
    cache = RunCache()
    cache.jobs.upsert(_job("gone", 3, uid="a"))
    cache.jobs.upsert(_job("arrived-after-the-list", 12, uid="b"))
    cache.jobs.upsert(_job("changed", 4, uid="c"))
    changed = cache.jobs.relist(
        [_job("changed", 9, uid="c", complete=True), _job("missed", 8, uid="d")], 10, {NS}
    )
    assert changed == {(NS, "r")}
    names = sorted(j["metadata"]["name"] for j in cache.jobs.get((NS, "r")))
    assert names == ["arrived-after-the-list", "changed", "missed"]


def test_relist_of_one_namespace_leaves_the_others_alone() -> None:
    cache = RunCache()
    other = _job("j", 1)
    other["metadata"]["namespace"] = "elsewhere"
    cache.jobs.upsert(other)
    assert cache.jobs.relist([], 10, {NS}) == set()
    assert len(cache.jobs.get(("elsewhere", "r"))) == 1


def test_merge_keeps_every_message_and_the_most_telling_reason() -> None:
    merged = merge(
        [
            EmitEvent("Normal", "IterationSucceeded", "iteration 3/3 succeeded."),
            EmitEvent("Normal", "LoopCompleted", "loop completed: LoopMaxIterationsReached"),
            EmitEvent("Normal", "RunSucceeded", "run succeeded"),
        ]
    )
    assert merged == EmitEvent(
        "Normal",
        "RunSucceeded",
        "IterationSucceeded: iteration 3/3 succeeded; "
        "LoopCompleted: loop completed: LoopMaxIterationsReached; RunSucceeded: run succeeded",
    )


def test_a_failed_validation_keeps_its_own_reason_over_the_runs_end() -> None:
    """docs/concepts.md#validation: a refused run gets a Warning Event `InvalidSpec`."""
    merged = merge(
        [
            EmitEvent("Warning", "InvalidSpec", "spec.x: bad"),
            EmitEvent("Warning", "RunFailed", "InvalidSpec: spec.x: bad"),
        ]
    )
    assert merged == EmitEvent(
        "Warning", "InvalidSpec", "InvalidSpec: spec.x: bad; RunFailed: InvalidSpec: spec.x: bad"
    )


def test_merge_is_a_warning_when_any_part_is() -> None:
    merged = merge(
        [
            EmitEvent("Warning", "ConditionEvaluated", "control file missing"),
            EmitEvent("Normal", "IterationStarted", "iteration 2 started"),
        ]
    )
    assert merged.type == "Warning"
    assert merged.reason == "ConditionEvaluated"


def test_hand_overs_share_one_reason_and_a_loop_start_keeps_its_own() -> None:
    """Hand-overs fold into one series; a loop's start stays its own Event (describe shows it)."""
    start = merge(
        [EmitEvent("Normal", "LoopStarted", "loop started"), EmitEvent("Normal", "IterationStarted", "1")]
    )
    step = merge(
        [EmitEvent("Normal", "IterationSucceeded", "1"), EmitEvent("Normal", "IterationStarted", "2")]
    )
    again = merge(
        [EmitEvent("Normal", "IterationSucceeded", "2"), EmitEvent("Normal", "IterationStarted", "3")]
    )
    assert start.reason == "LoopStarted"
    assert step.reason == again.reason == "IterationStarted"


def _pod(phase: str, rv: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": NS,
            "uid": "pod-uid",
            "resourceVersion": str(rv),
            "labels": {naming.LABEL_RUN: "r", "job-name": "j"},
        },
        "status": {"phase": phase},
    }


def test_a_pod_appearing_starting_or_a_job_getting_its_start_time_does_not_replan() -> None:
    """None can change a plan (shell/relevance.py);
    a pod's end does, and so does a pod first seen already ended."""
    cache = RunCache()
    assert cache.pods.upsert(_pod("Pending", 1)) is None
    assert cache.pods.one((NS, "r"), "p") is not None  # kept all the same: the next plan sees it
    assert cache.pods.upsert(_pod("Running", 2)) is None
    assert cache.pods.upsert(_pod("Succeeded", 3)) == (NS, "r")
    started = _job("j", 1)
    cache.jobs.upsert({**started, "status": {}})
    assert cache.jobs.upsert(_job("j", 2)) is None
    assert RunCache().pods.upsert(_pod("Succeeded", 1)) == (NS, "r")


def test_the_same_version_again_is_not_converted_again() -> None:
    """A relist or the echo of our own write brings an object the cache already holds at that version:
    its view is kept, not rebuilt (the cost of a resync is one comparison per unchanged object)."""
    views: list[str] = []

    def view(obj: dict[str, Any]) -> str:
        views.append(obj["metadata"]["resourceVersion"])
        return str(obj.get("status"))

    store = Store(run_of_run, view)
    assert store.upsert(_run(5, {"phase": "Running"})) == (NS, "r")
    assert store.upsert(_run(5, {"phase": "Running"})) is None
    assert store.relist([_run(5, {"phase": "Running"})], 6, {NS}) == set()
    assert views == ["5"]
    assert store.upsert(_run(6, {"phase": "Succeeded"})) == (NS, "r")
    assert views == ["5", "6"]


def _agent(rv: int, spec: dict[str, Any], name: str = "a", ns: str = NS) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "resourceVersion": str(rv)},
        "spec": spec,
    }


def test_referenced_objects_are_kept_by_namespace_and_name_as_their_spec() -> None:
    """Agents, AgentProviders and ImplementationSpecs: found or not, and a spec change concerns the
    whole namespace (every run there may name it)."""
    cache = RunCache()
    agents = cache.references["agents"]
    assert cache.reference("agents", NS, "a") == (False, None)
    assert agents.upsert(_agent(1, {"providerRef": {"name": "p"}})) == (NS, "*")
    assert cache.reference("agents", NS, "a") == (True, {"providerRef": {"name": "p"}})
    assert cache.reference("agents", "elsewhere", "a") == (False, None)
    assert cache.reference("agentproviders", NS, "a") == (False, None)
    touched = _agent(2, {"providerRef": {"name": "p"}})
    touched["metadata"]["labels"] = {"x": "y"}
    assert agents.upsert(touched) is None  # the spec is what a plan reads
    assert agents.upsert(_agent(3, {"providerRef": {"name": "q"}})) == (NS, "*")
    assert agents.delete(_agent(4, {})) == (NS, "*")
    assert cache.reference("agents", NS, "a") == (False, None)
    assert agents.relist([_agent(7, {}, name="b")], 8, {NS}) == {(NS, "*")}
    assert cache.reference("agents", NS, "b") == (True, {})


def _meta_only(obj: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "PartialObjectMetadata", "metadata": obj["metadata"]}


def test_a_metadata_only_list_names_what_to_read_in_full_and_drops_the_gone() -> None:
    """The resync compares versions: the same version needs nothing, a newer or an unknown object is
    read in full, one missing from the list is dropped unless it is newer than the list."""
    cache = RunCache()
    cache.jobs.upsert(_job("same", 3, uid="a"))
    cache.jobs.upsert(_job("changed", 4, uid="b"))
    cache.jobs.upsert(_job("gone", 5, uid="c"))
    cache.jobs.upsert(_job("arrived-after-the-list", 12, uid="d"))
    listed = [_job("same", 3, uid="a"), _job("changed", 9, uid="b"), _job("missed", 8, uid="e")]
    fetch, changed = cache.jobs.compare([_meta_only(j) for j in listed], 10, {NS})
    assert fetch == [(NS, "changed"), (NS, "missed")]
    assert changed == {(NS, "r")}
    names = sorted(j["metadata"]["name"] for j in cache.jobs.get((NS, "r")))
    assert names == ["arrived-after-the-list", "changed", "same"]
    replaced = _job("same", 3, uid="other")  # a namesake at an equal version is still another object
    assert cache.jobs.compare([_meta_only(replaced)], 13, {NS})[0] == [(NS, "same")]


def test_the_echo_of_a_write_in_flight_does_not_replan_but_another_change_does() -> None:
    """The watch may deliver our own write before the API server's answer reaches the reconcile that
    made it: that echo (same view, keys in any order) is no news; anything else is."""
    store = Store(run_of_run, run_view)
    store.upsert(_run(5, {"phase": "Pending"}))
    written = _run(5, {"phase": "Running", "message": "m"})
    with store.writing(NS, "r", written):
        assert store.upsert(_run(6, {"message": "m", "phase": "Running"})) is None
        assert store.upsert(_run(7, {"message": "m", "phase": "Succeeded"})) == (NS, "r")
    assert store.upsert(_run(8, {"message": "m", "phase": "Running"})) == (NS, "r")  # no longer writing


def test_the_first_event_of_a_job_being_created_does_not_replan_but_its_end_does() -> None:
    cache = RunCache()
    with cache.jobs.writing(NS, "j"):
        assert cache.jobs.upsert(_job("j", 1)) is None
        assert cache.jobs.upsert(_job("j", 2, complete=True)) == (NS, "r")
    assert cache.jobs.upsert(_job("other", 3)) == (NS, "r")  # a Job we did not create: a stray


def test_a_job_getting_its_ttl_does_not_replan() -> None:
    cache = RunCache()
    cache.jobs.upsert(_job("j", 1, complete=True))
    with_ttl = _job("j", 2, complete=True)
    with_ttl["spec"] = {"ttlSecondsAfterFinished": 300}
    assert cache.jobs.upsert(with_ttl) is None


def _failed(job: dict[str, Any]) -> dict[str, Any]:
    job["status"]["conditions"] = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]
    return job


def test_a_job_ending_while_its_result_is_settled_does_not_replan_but_is_stored() -> None:
    """The reconcile recording an iteration's result (status, then the Job's TTL) planned with the
    pod's end: the Job controller marking the Job Complete or Failed meanwhile is no news."""
    cache = RunCache()
    cache.jobs.upsert(_job("j", 1))
    cache.jobs.upsert(_job("k", 1, uid="k-uid"))
    with cache.jobs.settling(NS, ["j", "k"]):
        assert cache.jobs.upsert(_job("j", 2, complete=True)) is None
        assert cache.jobs.upsert(_failed(_job("k", 2, uid="k-uid"))) is None
        assert cache.jobs.view_of((NS, "r"), "j")[1][0].outcome == "Succeeded"  # stored all the same
        assert cache.jobs.view_of((NS, "r"), "k")[1][0].outcome == "Failed"
        with_ttl = _job("j", 3, complete=True)
        with_ttl["spec"] = {"ttlSecondsAfterFinished": 300}
        assert cache.jobs.upsert(with_ttl) is None  # the TTL patch's answer, written through
    assert cache.jobs.view_of((NS, "r"), "j")[1][0].ttl_seconds_after_finished == 300
    assert [j["metadata"]["resourceVersion"] for j in cache.jobs.get((NS, "r"))] == ["3", "2"]
    assert cache.jobs.delete(_job("j", 4)) == (NS, "r")  # its deletion is still news


def test_settling_still_replans_a_deletion_or_a_change_that_is_not_an_end() -> None:
    cache = RunCache()
    cache.jobs.upsert(_job("j", 1))
    with cache.jobs.settling(NS, ["j"]):
        orphaned_owner = _job("j", 2)
        orphaned_owner["metadata"]["ownerReferences"][0]["uid"] = "another-run-uid"
        assert cache.jobs.upsert(orphaned_owner) == (NS, "r")  # not ended: as before
        deleting = _job("j", 3, complete=True)
        deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
        assert cache.jobs.upsert(deleting) == (NS, "r")
        assert cache.jobs.delete(_job("j", 4, complete=True)) == (NS, "r")


def test_settling_leaves_other_jobs_and_namespaces_alone_and_ends_with_its_context() -> None:
    cache = RunCache()
    cache.jobs.upsert(_job("j", 1))
    cache.jobs.upsert(_job("other", 1, uid="other-uid"))
    elsewhere = _job("j", 1, uid="elsewhere-uid")
    elsewhere["metadata"]["namespace"] = "elsewhere"
    cache.jobs.upsert(elsewhere)
    with cache.jobs.settling(NS, ["j"]):
        assert cache.jobs.upsert(_job("other", 2, uid="other-uid", complete=True)) == (NS, "r")
        ended_elsewhere = _job("j", 2, uid="elsewhere-uid", complete=True)
        ended_elsewhere["metadata"]["namespace"] = "elsewhere"
        assert cache.jobs.upsert(ended_elsewhere) == ("elsewhere", "r")
    assert cache.jobs.upsert(_job("j", 2, complete=True)) == (NS, "r")  # no longer settling


def test_a_job_first_seen_while_settling_replans_as_usual() -> None:
    """The plan being settled never saw it: only an update of a Job the cache held is no news."""
    cache = RunCache()
    with cache.jobs.settling(NS, ["j"]):
        assert cache.jobs.upsert(_job("j", 1, complete=True)) == (NS, "r")


def test_overlapping_settling_of_two_runs_each_ends_with_its_own_context() -> None:
    cache = RunCache()
    cache.jobs.upsert(_job("a", 1, run="r1", uid="a-uid"))
    cache.jobs.upsert(_job("b", 1, run="r2", uid="b-uid"))
    cache.jobs.upsert(_job("shared", 1, run="r1", uid="s-uid"))  # settled by both, e.g. a retried reconcile
    first, second = contextlib.ExitStack(), contextlib.ExitStack()
    first.enter_context(cache.jobs.settling(NS, ["a", "shared"]))
    second.enter_context(cache.jobs.settling(NS, ["b", "shared"]))
    first.close()  # the first reconcile ends while the second is still settling
    assert cache.jobs.upsert(_job("a", 2, run="r1", uid="a-uid", complete=True)) == (NS, "r1")
    assert cache.jobs.upsert(_job("b", 2, run="r2", uid="b-uid", complete=True)) is None
    assert cache.jobs.upsert(_job("shared", 2, run="r1", uid="s-uid", complete=True)) is None
    second.close()
    assert cache.jobs.upsert(_failed(_job("b", 3, run="r2", uid="b-uid"))) == (NS, "r2")


def test_settling_ends_even_when_the_reconcile_fails() -> None:
    cache = RunCache()
    cache.jobs.upsert(_job("j", 1))
    with pytest.raises(RuntimeError), cache.jobs.settling(NS, ["j"]):
        raise RuntimeError("the status write failed")
    assert cache.jobs.upsert(_job("j", 2, complete=True)) == (NS, "r")


def test_a_store_without_a_settled_rule_ignores_settling() -> None:
    store = Store(run_of_run, run_view)
    store.upsert(_run(1, {"phase": "Running"}))
    with store.settling(NS, ["r"]):
        assert store.upsert(_run(2, {"phase": "Succeeded"})) == (NS, "r")


def test_holds_is_the_same_object_at_that_version_or_newer() -> None:
    """The informer skips decoding the echo of what we wrote through (the created Job, the status)."""
    cache = RunCache()
    assert not cache.jobs.holds(NS, "j", "job-uid", 5)  # absent
    cache.jobs.upsert(_job("j", 5))
    assert cache.jobs.holds(NS, "j", "job-uid", 5)
    assert cache.jobs.holds(NS, "j", "job-uid", "5")
    assert cache.jobs.holds(NS, "j", "job-uid", "4")  # older: the cache has newer
    assert not cache.jobs.holds(NS, "j", "job-uid", 6)  # newer: news
    assert not cache.jobs.holds(NS, "j", "job-uid", "6")
    assert not cache.jobs.holds(NS, "j", "other-uid", 5)  # a namesake
    assert not cache.jobs.holds("elsewhere", "j", "job-uid", 5)
    assert not cache.jobs.holds(NS, "j", "job-uid", "")
    assert not cache.jobs.holds(NS, "j", "job-uid", "abc")
    cache.jobs.delete(_job("j", 6))
    assert not cache.jobs.holds(NS, "j", "job-uid", 5)  # forgotten
    runs = Store(run_of_run, run_view)  # a store keeping whole objects
    runs.upsert(_run(7))
    assert runs.holds(NS, "r", "run-uid", 7) and not runs.holds(NS, "r", "run-uid", 8)


def test_the_change_of_a_stored_object_is_computed_once() -> None:
    """Each update picks the plan-relevant part of the new view only: the stored one's was kept."""
    changes: list[Any] = []

    def change(view: Any) -> Any:
        changes.append(view)
        return view

    store = Store(run_of_run, run_view, change)
    store.upsert(_run(1, {"phase": "Pending"}))
    store.upsert(_run(2, {"phase": "Running"}))
    assert store.upsert(_run(3, {"phase": "Succeeded"})) == (NS, "r")
    assert len(changes) == 3
    store.delete(_run(4))
    assert store.upsert(_run(5, {"phase": "Succeeded"})) == (NS, "r")  # forgotten: a new arrival
    assert store.upsert(_run(6, {"phase": "Succeeded"})) is None


def test_a_decision_is_an_event_of_its_own_with_a_name_a_replay_repeats() -> None:
    """docs/operator.md#events: ConditionEvaluated is never merged (nor folded); its name is derived
    from the run and the decision, so a replayed plan posts the same object."""
    from agentrun_operator.shell.events import MAX_DECISION_EVENTS, decision_event_name, split_decisions

    decided = EmitEvent("Normal", "ConditionEvaluated", "step s: iteration 2: expression `x` is true")
    events = [
        EmitEvent("Normal", "IterationSucceeded", "2"),
        decided,
        EmitEvent("Normal", "IterationStarted", "3"),
    ]
    own, rest = split_decisions(events, posted=0)
    assert own == [decided] and [e.reason for e in rest] == ["IterationSucceeded", "IterationStarted"]
    own, rest = split_decisions(events, posted=MAX_DECISION_EVENTS)  # past the bound: folded as before
    assert own == [] and rest == events
    name = decision_event_name("run", "uid-1", decided)
    assert name == decision_event_name("run", "uid-1", decided) and name.startswith("run.")
    other = EmitEvent("Normal", "ConditionEvaluated", "step s: iteration 3: expression `x` is true")
    assert decision_event_name("run", "uid-1", other) != name
    assert decision_event_name("run", "uid-2", decided) != name  # a new run of the same name
