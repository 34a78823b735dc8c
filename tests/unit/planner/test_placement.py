"""The next iteration pod prefers the node of the run's newest stopped pod, where the run's
`ReadWriteOnce` volume is attached (docs/design.md#next-pod-placement). Pure."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from agentrun_operator.planner.actions import CreateJob
from agentrun_operator.planner.observed import ObservedPod
from agentrun_operator.planner.placement import preferred_node
from agentrun_operator.shell.relevance import pod_relevant
from tests.unit.planner.world import PlannerWorld, envelope_found, loop_step, manifest

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def pod(name: str, node: str | None, *, ended: int | None = None, phase: str = "Running") -> ObservedPod:
    return ObservedPod(
        name=name,
        job_name=f"{name}-job",
        phase=phase,
        node_name=node,
        containers_ended=ended is not None,
        finished_at=T0 + timedelta(seconds=ended) if ended is not None else None,
    )


def test_the_newest_stopped_pod_s_node_wins() -> None:
    pods = [pod("a", "n1", ended=1), pod("b", "n2", ended=5), pod("c", "n3")]  # c still runs
    assert preferred_node(pods) == "n2"
    assert preferred_node([pod("a", "n1", ended=1), pod("b", "n2", phase="Failed")]) == "n1"


def test_no_stopped_pod_with_a_node_means_no_preference() -> None:
    assert preferred_node([]) is None
    assert preferred_node([pod("a", "n1"), pod("b", None, ended=3)]) is None


def test_the_choice_does_not_depend_on_the_order_pods_are_seen() -> None:
    pods = [pod("a", "n1", ended=4), pod("b", "n2", ended=4), pod("c", "n3", ended=2)]
    assert preferred_node(pods) == preferred_node(list(reversed(pods))) == "n2"


def affinity(result: Any) -> Any:
    created = [a for a in result.actions if isinstance(a, CreateJob)]
    assert len(created) == 1
    return created[0].manifest["spec"]["template"]["spec"].get("affinity")


def reported_on(world: PlannerWorld, job: str, node: str) -> None:
    """The Job's pod ended with its report, on `node`."""
    world.pods[f"{job}-pod"] = replace(
        world.pods[f"{job}-pod"],
        main_exit_code=0,
        reporter_message=envelope_found({"n": 1}),
        containers_ended=True,
        finished_at=world.now,
        node_name=node,
    )


def test_the_next_iteration_s_job_prefers_the_node_the_last_pod_ran_on() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3)]))
    first_plan = world.plan()
    assert affinity(first_plan) is None  # nothing ran yet
    first = world.active()
    reported_on(world, first, "node-7")
    term = affinity(world.plan())["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["preference"] == {
        "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-7"]}]
    }


def test_a_pod_without_a_pvc_has_nothing_to_stay_near() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3)], volumes=[]))
    world.plan()
    first = world.active()
    reported_on(world, first, "node-7")
    assert affinity(world.plan()) is None


def test_being_scheduled_re_plans_nothing_but_a_stopped_pod_s_node_does() -> None:
    running = pod("a", None)
    assert pod_relevant(running) == pod_relevant(replace(running, node_name="n1"))
    stopped = pod("a", "n1", ended=1)
    assert pod_relevant(stopped).node_name == "n1"
