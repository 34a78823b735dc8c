"""Properties of warm loops under random worlds (hypothesis): supervisors that run what they are told
(docs/design.md#warm-channel), commands lost on the way, status writes lost, operator restarts that
forget what was heard, pods that die (their Job failed or not yet) or idle out, failures and
retries. After every step: no
iteration attempt runs twice anywhere, at most one pod runs, and an iteration is recorded
succeeded at most once; a world that keeps answering brings the run to its end."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agentrun_operator.celeval import compile_expression
from agentrun_operator.planner.actions import CreateJob, WarmCommand
from agentrun_operator.planner.observed import ObservedWarm, WarmResult
from tests.unit.planner.world import PlannerWorld, envelope_found, loop_step, manifest

compile_expression("true")  # celpy raises the recursion limit once; do it before hypothesis watches

TERMINAL = ("Succeeded", "Failed", "Cancelled")
LAST = 5
OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["plan"] * 6
            + ["plan_lost_status"] * 2
            + ["lose_commands"] * 2
            + ["deliver"] * 5
            + ["poll"] * 4
            + ["finish"] * 5
            + ["fail"]
            + ["forget"] * 2
            + ["pod_dies"]
            + ["idle_out"] * 2
            + ["advance", "settle"]
        ),
        st.integers(0, 1000),
    ),
    max_size=120,
)


@dataclass
class Supervisor:
    """One warm pod's supervisor, as the protocol says."""

    pod: str
    running: str | None = None
    result: WarmResult | None = None
    seen: set[str] = field(default_factory=set)
    alive: bool = True


@dataclass
class Cluster:
    world: PlannerWorld
    supervisors: dict[str, Supervisor] = field(default_factory=dict)
    runs: dict[str, int] = field(default_factory=dict)  # iteration id -> times run, in any pod
    pending: list[WarmCommand] = field(default_factory=list)
    succeeded: dict[int, int] = field(default_factory=dict)

    def run(self, supervisor: Supervisor, id_: str) -> None:
        supervisor.seen.add(id_)
        supervisor.running = id_
        self.runs[id_] = self.runs.get(id_, 0) + 1

    def created(self) -> None:
        """A new warm Job's pod starts its first iteration at once."""
        for job in self.world.created:
            pod = f"{job}-pod"
            if pod not in self.supervisors:
                manifest_ = self.world.manifests[job]
                args = manifest_["spec"]["template"]["spec"]["containers"][0]["args"]
                supervisor = Supervisor(pod)
                self.supervisors[pod] = supervisor
                self.run(supervisor, args[args.index("--warm-first-id") + 1])

    def plan(self, persist: bool = True) -> None:
        """One reconcile; its status is written with the uids of the Jobs it created, as the shell
        writes it (planner/job_uids.py)."""
        before = set(self.world.jobs)
        result = self.world.plan(persist=persist)
        if persist:
            uids = {n: j.uid for n, j in self.world.jobs.items() if n not in before}
            self.world.status = result.status_after(uids)
        self.pending += self.world.commands
        self.world.commands.clear()
        self.created()
        for supervisor in self.supervisors.values():
            if f"{supervisor.pod}" not in self.world.pods:
                supervisor.alive = False

    def deliver(self) -> None:
        for command in self.pending:
            supervisor = self.supervisors.get(command.pod)
            if supervisor is None or not supervisor.alive:
                continue
            result = supervisor.result
            if command.verb == "start" and supervisor.running is None and command.id not in supervisor.seen:
                if result is not None:
                    supervisor.result = replace(result, acked=True)
                self.run(supervisor, command.id)
            elif command.verb == "ack" and result is not None and result.id == command.id:
                supervisor.result = replace(result, acked=True)
        self.pending.clear()

    def poll(self) -> None:
        """The operator hears each live pod's state."""
        for supervisor in self.supervisors.values():
            if supervisor.alive and supervisor.pod in self.world.pods:
                phase = "running" if supervisor.running else "idle"
                heard = ObservedWarm(supervisor.pod, phase, supervisor.running, supervisor.result)
                self.world.warm[supervisor.pod] = heard

    def finish(self, code: int, pick: int) -> None:
        live = [s for s in self.supervisors.values() if s.alive and s.running]
        if not live:
            return
        supervisor = live[pick % len(live)]
        id_ = supervisor.running
        assert id_ is not None
        iteration = int(id_.split("-")[0])
        control = {"continue": iteration < LAST}
        text = envelope_found(control)
        supervisor.result = WarmResult(id_, code, text, self.world.now)
        supervisor.running = None

    def pod_dies(self, pick: int) -> None:
        live = [s for s in self.supervisors.values() if s.alive]
        if not live:
            return
        supervisor = live[pick % len(live)]
        supervisor.alive = False
        pod = self.world.pods.get(supervisor.pod)
        if pod is not None:
            self.world.pods[supervisor.pod] = replace(pod, phase="Failed", reason="Evicted", message="gone")
            job = self.world.jobs.get(pod.job_name)
            if job is not None and pick % 2:  # the Job controller has seen it: backoffLimit 0
                self.world.jobs[pod.job_name] = replace(job, outcome="Failed", finished_at=self.world.now)
        self.world.warm.pop(supervisor.pod, None)

    def idle_out(self, pick: int) -> None:
        """An idle pod whose result was acknowledged ends on its own, saying what it ran last."""
        idle = [
            s
            for s in self.supervisors.values()
            if s.alive and s.running is None and (s.result is None or s.result.acked)
        ]
        if not idle:
            return
        supervisor = idle[pick % len(idle)]
        supervisor.alive = False
        pod = self.world.pods.get(supervisor.pod)
        last = supervisor.result
        warm = f'"warm":{{"id":"{last.id}","exitCode":{last.exit_code}}}' if last else '"warm":{}'
        said = '{"v":1,"status":"missing","path":"/p","size":null,"reason":"x","control":null,' + warm + "}"
        if pod is not None:
            self.world.pods[supervisor.pod] = replace(
                pod, phase="Succeeded", reporter_message=said, main_exit_code=0, containers_ended=True
            )
            job = self.world.jobs.get(pod.job_name)
            if job is not None:
                self.world.jobs[pod.job_name] = replace(job, outcome="Succeeded", finished_at=self.world.now)
        self.world.warm.pop(supervisor.pod, None)

    def check(self) -> None:
        assert all(count == 1 for count in self.runs.values()), self.runs
        running = [s for s in self.supervisors.values() if s.alive and s.running]
        assert len(running) <= 1, running
        live = [j for j in self.world.jobs.values() if not j.finished and not j.deleting]
        assert len(live) <= 1, live
        status = self.world.status
        if status is not None and status.workflow is not None:
            loop = status.workflow.steps[0].loop
            if loop is not None:
                indices = [r.index for r in loop.iterations if r.phase == "Succeeded"]
                assert len(indices) == len(set(indices)), indices


def warm_manifest(retries: int) -> dict[str, Any]:
    step = loop_step(
        "work",
        LAST + 2,
        expression="iteration.last.control.continue == true",
        retries=retries,
        retryBackoffSeconds=1,
        timeoutSeconds=600,
        workload={"command": ["sh", "-c"], "args": ["work"]},
        loop={"warm": {"idleSeconds": 30}},
    )
    return manifest([step])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(retries=st.integers(0, 3), ops=OPS)
def test_warm_loops_never_run_an_iteration_twice_and_finish(retries: int, ops: list[tuple[str, int]]) -> None:
    cluster = Cluster(PlannerWorld(warm_manifest(retries)))
    cluster.plan()
    for op, arg in ops:
        if cluster.world.phase in TERMINAL:
            break
        if op == "plan":
            cluster.plan()
        elif op == "plan_lost_status":
            cluster.plan(persist=False)
        elif op == "lose_commands":
            cluster.pending.clear()
        elif op == "deliver":
            cluster.deliver()
        elif op == "poll":
            cluster.poll()
        elif op == "finish":
            cluster.finish(0, arg)
        elif op == "fail":
            cluster.finish(1 + arg % 3, arg)
        elif op == "forget":
            cluster.world.warm.clear()  # an operator restart: nothing heard yet
        elif op == "pod_dies":
            cluster.pod_dies(arg)
        elif op == "idle_out":
            cluster.idle_out(arg)
        elif op == "advance":
            cluster.world.advance(arg % 40)
        elif op == "settle":
            cluster.world.settle()
        cluster.check()
    # A world that keeps answering: every command delivered, every iteration ends well.
    for _ in range(400):
        if cluster.world.phase in TERMINAL:
            break
        cluster.deliver()
        cluster.finish(0, 0)
        cluster.poll()
        cluster.plan()
        cluster.check()
        if not cluster.world.live_jobs():
            cluster.world.settle()
            cluster.world.advance(cluster.world.last_requeue or 1.0)
    assert cluster.world.phase in TERMINAL, cluster.world.status
    records = cluster.world.step_status().loop.iterations
    event(
        f"{cluster.world.phase}, {sum(bool(r.warm) for r in records)} warm, {len(cluster.world.created)} Jobs"
    )
    created = [a for p in cluster.world.plans for a in p.actions if isinstance(a, CreateJob)]
    assert len({c.name for c in created}) == len(cluster.world.created)
