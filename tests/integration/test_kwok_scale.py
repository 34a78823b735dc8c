"""The scale benchmark's small size, and the simulated node's failures, on a KWOK plane of its own.

KWOK (built by the toolchain from its Go module, like the control plane) plays every iteration pod
on fake nodes, its reporter's control envelope included (agentrun_devcluster/kwok_stages.py); a warm
loop's pod is served by the simulated supervisor (tests/bench/warm_sim.py, its own process) at the
loopback IP KWOK gave it; the operator is the released one, as a process. Correctness only: no
figure here is timed (tests/bench/bench_scale.py measures; docs/operator.md#scale).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from agentrun_devcluster import processes, toolchain
from agentrun_devcluster.kwok import KwokPlane
from agentrun_operator import naming
from tests.bench.bench_iterations import FINAL, NS, JobWatch, lost_and_repeated
from tests.bench.bench_scale import CONTROL, ROOT, create_all, list_all_runs, scale_run, simulator_check
from tests.bench.warm_sim import WarmSimProcess
from tests.support import api
from tests.support.api import ready_namespace
from tests.support.polling import eventually
from tests.support.processes import OperatorProcess

# The first use on a machine builds KWOK (`make test` starts that build in the background; a test that
# comes first waits for it through the toolchain's lock): more than pytest's 900 s on a loaded machine.
pytestmark = pytest.mark.timeout(3600)

RUNS = int(os.environ.get("AGENTRUN_KWOK_TEST_RUNS", "50"))
ITERATIONS = 3
WARM_RUNS, WARM_ITERATIONS = 20, 5
RUNS_PATH = f"{api.RUNS}/namespaces/{NS}/agentruns"


@pytest.fixture(scope="module")
def kwok_and_sim(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[KwokPlane, JobWatch, WarmSimProcess]]:
    built = toolchain.is_built(toolchain.KWOK) and all(toolchain.is_built(t) for t in toolchain.TOOLS)
    if not built and shutil.which("go") is None:
        pytest.skip("KWOK and the control plane are not built and Go is not on PATH to build them")
    plane = KwokPlane(tmp_path_factory.mktemp("kwok"), nodes=2, progress=print)
    operator: OperatorProcess | None = None
    simulator: WarmSimProcess | None = None
    try:
        plane.start(crds_dir=ROOT / "crds")
        ready_namespace(plane.plane, NS)
        watch = JobWatch(plane.plane).start()
        simulator = WarmSimProcess(plane.home, NS, tmp_path_factory.mktemp("warm-sim")).start()
        env = {
            "AGENTS_CONTROLLER_RESYNC_SECONDS": "30",
            # Where warm pods' supervisors listen: a port of this plane's own on the pods' loopback IPs.
            "AGENTS_CONTROLLER_WARM_PORT": str(processes.free_port()),
        }
        operator = OperatorProcess(plane.plane, tmp_path_factory.mktemp("operator"), env=env).start()
        yield plane, watch, simulator
    finally:
        if operator is not None:
            operator.stop()
        if simulator is not None:
            simulator.stop()
        plane.stop()


@pytest.fixture(scope="module")
def kwok(kwok_and_sim: tuple[KwokPlane, JobWatch, WarmSimProcess]) -> tuple[KwokPlane, JobWatch]:
    return kwok_and_sim[0], kwok_and_sim[1]


def _phase(kwok: KwokPlane, name: str) -> str:
    return str((api.agentrun(kwok.plane, NS, name).get("status") or {}).get("phase") or "")


def _loop(run: dict[str, Any]) -> dict[str, Any]:
    steps = ((run.get("status") or {}).get("workflow") or {}).get("steps") or [{}]
    return dict(steps[0].get("loop") or {})


def test_runs_at_once_lose_and_repeat_no_iteration(kwok: tuple[KwokPlane, JobWatch]) -> None:
    plane, watch = kwok
    names = [f"small-{i}" for i in range(RUNS)]
    create_all(plane, RUNS_PATH, [scale_run(n, ITERATIONS) for n in names])

    def ended() -> list[dict[str, Any]] | None:
        runs = [r for r in list_all_runs(plane) if r["metadata"]["name"] in set(names)]
        final = [r for r in runs if (r.get("status") or {}).get("phase") in FINAL]
        return runs if len(final) == len(names) else None

    runs = eventually(ended, timeout=1200, what=f"{RUNS} runs x {ITERATIONS} iterations to end", every=2)
    check = lost_and_repeated(runs, names, ITERATIONS, watch)
    assert (check["lost"], check["repeated"], check["succeeded"]) == (0, 0, RUNS), check
    # The envelope KWOK wrote is the one the reporter would: the condition read `continue: true` from
    # it every time, so each run went on to its last iteration.
    assert {_loop(r).get("stopReason") for r in runs} == {"LoopMaxIterationsReached"}, _loop(runs[0])
    assert all(_loop(r).get("lastControl") == CONTROL for r in runs), _loop(runs[0])


def test_a_container_that_never_ends_ends_by_the_attempt_timeout(kwok: tuple[KwokPlane, JobWatch]) -> None:
    plane, watch = kwok
    create_all(plane, RUNS_PATH, [scale_run("hangs", ITERATIONS, hang=True, timeout_seconds=5)])
    eventually(lambda: _phase(plane, "hangs") in FINAL, timeout=300, what="the hung run to end", every=1)
    run = api.agentrun(plane.plane, NS, "hangs")
    assert run["status"]["phase"] == "Failed", run["status"]
    assert "timed out after 5s" in run["status"]["message"], run["status"]["message"]
    records = _loop(run).get("iterations") or []
    assert [(r.get("index"), r.get("attempts")) for r in records] == [(1, 1)], records
    assert watch.adds[naming.job_name("hangs", 1, 1, 1)] == 1
    assert naming.job_name("hangs", 1, 2, 1) not in watch.added


def test_a_fake_node_deleted_mid_iteration(kwok: tuple[KwokPlane, JobWatch]) -> None:
    plane, watch = kwok
    plane.add_node("kwok-doomed")
    plane.wait_ready(["kwok-doomed"])
    create_all(
        plane,
        RUNS_PATH,
        [scale_run("orphaned", ITERATIONS, hang=True, timeout_seconds=20, node="kwok-doomed")],
    )
    selector = f"{naming.LABEL_RUN}=orphaned"

    def running() -> bool:
        pods = api.items(plane.plane, "/api/v1", NS, "pods", selector)
        return any((p.get("status") or {}).get("phase") == "Running" for p in pods)

    eventually(running, timeout=300, what="the run's pod Running on the doomed node", every=0.5)
    plane.delete_node("kwok-doomed")
    eventually(
        lambda: _phase(plane, "orphaned") in FINAL, timeout=600, what="the orphaned run to end", every=1
    )
    run = api.agentrun(plane.plane, NS, "orphaned")
    assert run["status"]["phase"] == "Failed", run["status"]
    assert "timed out after 20s" in run["status"]["message"], run["status"]["message"]
    records = _loop(run).get("iterations") or []
    assert [r.get("index") for r in records] == [1], records
    assert watch.adds[naming.job_name("orphaned", 1, 1, 1)] == 1
    assert naming.job_name("orphaned", 1, 2, 1) not in watch.added


def test_warm_runs_lose_and_repeat_no_iteration_in_one_job_each(
    kwok_and_sim: tuple[KwokPlane, JobWatch, WarmSimProcess],
) -> None:
    """`loop.warm`: every iteration of a run in the pod of its one Job, the operator calling the pod's
    supervisor (simulated: tests/bench/warm_sim.py) at the loopback IP KWOK gave the pod."""
    plane, watch, simulator = kwok_and_sim
    names = [f"warm-{i}" for i in range(WARM_RUNS)]
    create_all(plane, RUNS_PATH, [scale_run(n, WARM_ITERATIONS, warm=True) for n in names])

    def ended() -> list[dict[str, Any]] | None:
        runs = [r for r in list_all_runs(plane) if r["metadata"]["name"] in set(names)]
        final = [r for r in runs if (r.get("status") or {}).get("phase") in FINAL]
        return runs if len(final) == len(names) else None

    runs = eventually(ended, timeout=1200, what=f"{WARM_RUNS} warm runs x {WARM_ITERATIONS} to end", every=2)
    ran = simulator.stats()["ran"]
    check = lost_and_repeated(runs, names, WARM_ITERATIONS, watch, warm=frozenset(names))
    check = simulator_check(check, runs, names, WARM_ITERATIONS, ran)
    assert (check["lost"], check["repeated"], check["succeeded"]) == (0, 0, WARM_RUNS), check
    assert check["not_warm"] == 0 and check["simulator_iterations"] == WARM_RUNS * WARM_ITERATIONS, check
    jobs = {n: [j for j in watch.added if j.startswith(f"{n}-step-")] for n in names}
    assert all(found == [naming.job_name(n, 1, 1, 1)] for n, found in jobs.items()), jobs
    for run in runs:
        loop = _loop(run)
        records = loop.get("iterations") or []
        assert loop.get("stopReason") == "LoopMaxIterationsReached", loop
        assert loop.get("lastControl") == CONTROL, loop
        # The first iteration started its pod; each one after it ran in that pod, told to.
        assert [r.get("warm", False) for r in records] == [False] + [True] * (WARM_ITERATIONS - 1), records
        assert len({r.get("pod") for r in records}) == 1, records
