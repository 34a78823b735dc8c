"""The watch cache's store (shell/cache.py) and the Event merge (shell/events.py): which version of an
object wins, when a run must be re-planned, how a relist is merged in, what one merged Event says."""

from __future__ import annotations

from typing import Any

from agentrun_operator import naming
from agentrun_operator.planner.actions import EmitEvent
from agentrun_operator.shell.cache import RunCache, Store, Window, run_of_run, run_view
from agentrun_operator.shell.events import merge

NS = "ns"


def _job(
    name: str, rv: int | str, run: str = "r", uid: str = "job-uid", complete: bool = False
) -> dict[str, Any]:
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


def _run(rv: int | str, status: dict[str, Any] | None = None, uid: str = "run-uid") -> dict[str, Any]:
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


def test_an_answer_ahead_of_the_watch_is_kept_until_the_watch_delivers_it() -> None:
    """Our status write's answer stored first, the watch's older events delivered after it: they
    are skipped, in the watch's own order, until the watch reaches the answer's version. Versions
    are opaque: these sort the other way round as text, and are never compared but for equality."""
    store = Store(run_of_run, run_view)
    assert store.upsert(_run("b-1", {"phase": "Pending"})) is not None
    with store.window(NS, "r") as seen:
        answer = _run("a-3", {"phase": "Running"})
    assert store.answer(answer, seen) is not None
    assert store.upsert(_run("c-2", {"phase": "Pending"})) is None  # older: the watch is behind
    assert store.one((NS, "r"), "r") == answer
    assert store.upsert(_run("a-3", {"phase": "Running"})) is None  # the echo: nothing new
    assert store.upsert(_run("0-4", {"phase": "Succeeded"})) == (NS, "r")  # past it: news again
    assert store.one((NS, "r"), "r") == _run("0-4", {"phase": "Succeeded"})


def test_a_version_the_watch_delivered_during_a_request_is_not_overwritten_by_its_answer() -> None:
    """The watch may deliver our write, and a change after it, before the answer arrives; a read
    (a GET) may be older than what the watch delivered meanwhile."""
    store = Store(run_of_run, run_view)
    store.upsert(_run("x1"))
    with store.window(NS, "r") as seen:
        store.upsert(_run("x2", {"phase": "Running"}))  # our write's echo
        store.upsert(_run("x3", {"phase": "Succeeded"}))  # and someone's change after it
    assert store.answer(_run("x2", {"phase": "Running"}), seen) is None
    assert store.one((NS, "r"), "r") == _run("x3", {"phase": "Succeeded"})
    with store.window(NS, "r") as seen:
        store.upsert(_run("x4", {"phase": "Failed"}))
    assert store.answer(_run("x3", {"phase": "Succeeded"}), seen, read=True) is None
    assert store.one((NS, "r"), "r") == _run("x4", {"phase": "Failed"})
    with store.window(NS, "r") as seen:  # a read the watch did not move during: taken
        pass
    assert store.answer(_run("x5", {"phase": "Running"}), seen, read=True) == (NS, "r")
    # A read is not held ahead (it may be of a version the watch missed): the watch goes on.
    assert store.upsert(_run("x6", {"phase": "Failed"})) == (NS, "r")


def test_a_read_sent_after_a_write_was_answered_is_taken_and_one_answered_meanwhile_is_not() -> None:
    """A 409 on the status write: the fresh GET is newer than the answer held ahead, and the watch's
    own later events are no longer held up; a read in flight while a write is answered may be older."""
    store = Store(run_of_run, run_view)
    with store.window(NS, "r") as window:
        pass
    store.answer(_run("w1", {"phase": "Running"}), window)
    with store.window(NS, "r") as read:
        pass
    assert store.answer(_run("w2", {"phase": "Failed"}), read, read=True) == (NS, "r")
    assert store.upsert(_run("w3", {"phase": "Succeeded"})) == (NS, "r")
    with store.window(NS, "r") as read:
        with store.window(NS, "r") as write:
            pass
        store.answer(_run("w5", {"phase": "Running"}), write)
    assert store.answer(_run("w4", {"phase": "Pending"}), read, read=True) is None
    assert store.one((NS, "r"), "r") == _run("w5", {"phase": "Running"})


def test_the_resync_lets_go_of_an_answer_whose_echo_the_watch_missed() -> None:
    """The watch never delivers the write's version (a dropped event): the watch's next events wait
    behind it only until a resync's LIST, sent after the answer, lists the object."""
    store = Store(run_of_run, run_view)
    with store.window(NS, "r") as window:
        pass
    store.answer(_run("m1", {"phase": "Running"}), window)
    assert store.upsert(_run("m2", {"phase": "Failed"})) is None  # held up behind m1
    fetch, _ = store.compare([_run("m2")], store.clock(), {NS})
    assert fetch == [(NS, "r")]
    with store.window(NS, "r") as read:
        pass
    assert store.answer(_run("m2", {"phase": "Failed"}), read, read=True) == (NS, "r")
    assert store.upsert(_run("m3", {"phase": "Succeeded"})) == (NS, "r")


def test_a_relist_resets_what_was_held_ahead_of_the_watch() -> None:
    """A watch that resumes from a LIST never delivers a version older than the list: what the list
    says is the watch's from then on, whatever answer was held ahead (else it would wait forever)."""
    store = Store(run_of_run, run_view)
    with store.window(NS, "r") as seen:
        pass
    store.answer(_run("v1", {"phase": "Running"}), seen)
    store.relist([_run("v2", {"phase": "Succeeded"})], store.clock(), {NS})
    assert store.upsert(_run("v3", {"phase": "Failed"})) == (NS, "r")
    store.answer(_run("v4", {"phase": "Running"}), Window(None))
    assert store.listed(_run("v5", {"phase": "Succeeded"})) == (NS, "r")  # kopf's listing


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


def test_relist_adds_the_missed_drops_the_gone_and_keeps_what_arrived_after_the_list_was_sent() -> None:
    cache = RunCache()
    cache.jobs.upsert(_job("gone", 3, uid="a"))
    cache.jobs.upsert(_job("changed", 4, uid="c"))
    since = cache.jobs.clock()  # the LIST is sent
    cache.jobs.answer(_job("arrived-after-the-list", 12, uid="b"), Window(None))  # a Job created meanwhile
    changed = cache.jobs.relist(
        [_job("changed", 9, uid="c", complete=True), _job("missed", 8, uid="d")], since, {NS}
    )
    assert changed == {(NS, "r")}
    names = sorted(j["metadata"]["name"] for j in cache.jobs.get((NS, "r")))
    assert names == ["arrived-after-the-list", "changed", "missed"]


def test_relist_of_one_namespace_leaves_the_others_alone() -> None:
    cache = RunCache()
    other = _job("j", 1)
    other["metadata"]["namespace"] = "elsewhere"
    cache.jobs.upsert(other)
    assert cache.jobs.relist([], cache.jobs.clock(), {NS}) == set()
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
    assert agents.relist([_agent(7, {}, name="b")], agents.clock(), {NS}) == {(NS, "*")}
    assert cache.reference("agents", NS, "b") == (True, {})


def _meta_only(obj: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "PartialObjectMetadata", "metadata": obj["metadata"]}


def test_a_metadata_only_list_names_what_to_read_in_full_and_drops_the_gone() -> None:
    """The resync compares versions for equality: the same version needs nothing, another or an
    unknown object is read in full, one missing from the list is dropped unless the watch delivered
    it after the list was sent."""
    cache = RunCache()
    cache.jobs.upsert(_job("same", 3, uid="a"))
    cache.jobs.upsert(_job("changed", 4, uid="b"))
    cache.jobs.upsert(_job("gone", 5, uid="c"))
    since = cache.jobs.clock()
    cache.jobs.upsert(_job("arrived-after-the-list", 12, uid="d"))
    listed = [_job("same", 3, uid="a"), _job("changed", 9, uid="b"), _job("missed", 8, uid="e")]
    fetch, changed = cache.jobs.compare([_meta_only(j) for j in listed], since, {NS})
    assert fetch == [(NS, "changed"), (NS, "missed")]
    assert changed == {(NS, "r")}
    names = sorted(j["metadata"]["name"] for j in cache.jobs.get((NS, "r")))
    assert names == ["arrived-after-the-list", "changed", "same"]
    replaced = _job("same", 3, uid="other")  # a namesake at an equal version is still another object
    assert cache.jobs.compare([_meta_only(replaced)], cache.jobs.clock(), {NS})[0] == [(NS, "same")]


def test_a_job_getting_its_ttl_does_not_replan() -> None:
    cache = RunCache()
    cache.jobs.upsert(_job("j", 1, complete=True))
    with_ttl = _job("j", 2, complete=True)
    with_ttl["spec"] = {"ttlSecondsAfterFinished": 300}
    assert cache.jobs.upsert(with_ttl) is None


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
