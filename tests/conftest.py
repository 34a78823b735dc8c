"""Shared fixtures. The control plane is real (docs/design.md#real-parts): built once from upstream,
started per session."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.support.planes import interrupt, started_control_plane

REPO = Path(__file__).resolve().parent.parent

# Hypothesis, deliberately: no per-example deadline. Hypothesis' default (200 ms) is a timed
# assertion, and on a 2-core machine shared with control planes and pod runners a CEL evaluation or a
# planner step can take longer for reasons that say nothing about correctness; speed is measured by
# the benchmarks, not here. Every property still runs its `max_examples`, and a failure prints the
# blob that reproduces it (`@reproduce_failure`). `HYPOTHESIS_PROFILE=…` picks another profile.
settings.register_profile(
    "agentrun",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "agentrun"))


# Tiers that need no control plane are sorted first: on a machine without the control plane tools,
# `make test` builds them in the background meanwhile (docs/development.md#make-test).
TIERS_WITHOUT_CONTROL_PLANE = ("unit", "packaging", "docker")


# Then the real-node tier: one file on one worker, the longest (a real pod start per iteration), so
# it starts as early as the control plane allows while the other worker runs the rest.
TIERS_FIRST_WITH_CONTROL_PLANE = ("node",)


def _tier_rank(item: pytest.Item) -> int:
    """The place of an item's tier: those without a control plane first, in the order listed."""
    parts = Path(str(item.fspath)).relative_to(REPO / "tests").parts
    if parts and parts[0] in TIERS_WITHOUT_CONTROL_PLANE:
        return TIERS_WITHOUT_CONTROL_PLANE.index(parts[0])
    if parts and parts[0] in TIERS_FIRST_WITH_CONTROL_PLANE:
        return len(TIERS_WITHOUT_CONTROL_PLANE) + TIERS_FIRST_WITH_CONTROL_PLANE.index(parts[0])
    return len(TIERS_WITHOUT_CONTROL_PLANE) + len(TIERS_FIRST_WITH_CONTROL_PLANE)


# The Docker engine: what the tests start, they stop. A pytest run is one engine session (its pid in
# AGENTRUN_ENGINE_SESSION, which the xdist workers and every process they start inherit) unless it
# runs inside one already (`make test`, which ends its session itself). At the end, also on a failure
# or an interrupt, a dockerd the session started is stopped and one that was running before is left
# alone (agentrun_devcluster.dockerengine, docs/development.md#docker).
ENGINE_SESSION_OWNER = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("AGENTRUN_ENGINE_SESSION"):
        return  # inside `make test`'s session, or an xdist worker of this run
    os.environ["AGENTRUN_ENGINE_SESSION"] = str(os.getpid())
    config.stash[ENGINE_SESSION_OWNER] = os.getpid()
    # A SIGTERM would end this process before the session's end: make it an interrupt.
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, interrupt)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(ENGINE_SESSION_OWNER, None)
    if session != os.getpid():
        return
    try:
        from agentrun_devcluster import dockerengine
    except ImportError:  # no dev cluster installed: nothing here can have started an engine
        return
    reason = dockerengine.end_session(session)
    if reason != dockerengine.NOTHING_TO_STOP:
        print(f"docker engine: {reason}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests by directory, so `-m "not integration"` selects the fast tiers; the tiers
    without a control plane first (a stable sort: the order inside each part is pytest's)."""
    items.sort(key=_tier_rank)
    for item in items:
        parts = Path(str(item.fspath)).parts
        if "integration" in parts:
            item.add_marker(pytest.mark.integration)
        if "e2e" in parts:
            item.add_marker(pytest.mark.e2e)
        if "docker" in parts:
            item.add_marker(pytest.mark.docker)
        if "node" in parts:
            item.add_marker(pytest.mark.node)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A running etcd + kube-apiserver + kube-controller-manager with our CRDs installed."""
    with started_control_plane(tmp_path_factory.mktemp("controlplane")) as plane:
        os.environ.setdefault("AGENTRUN_TEST_KUBECONFIG", str(plane.kubeconfig))
        yield plane


@pytest.fixture(scope="session")
def prometheus_bin() -> Path:
    """The directory holding `prometheus` and `promtool`, built from upstream once (the toolchain)."""
    from agentrun_devcluster import toolchain

    if not toolchain.is_built(toolchain.PROMETHEUS) and shutil.which("go") is None:
        pytest.skip(
            "Prometheus is not built and Go is not on PATH to build it "
            f"(cache: {toolchain.bin_dir()}); install Go >= 1.26 or run `agentrun dev tools --prometheus`"
        )
    return toolchain.ensure_prometheus(print)


@pytest.fixture(scope="session")
def docker_image() -> str:
    """The operator image (and busybox:1.36) on a Docker engine, built once and cached by content.

    Skipped, with the one-line reason, where no engine answers and none can be started (not root,
    no apt-get), or with AGENTRUN_DOCKER=0. Where one answers, a failed base or image build fails
    the test: that is ours.
    """
    from agentrun_devcluster import dockerengine, imagebuild

    if os.environ.get("AGENTRUN_DOCKER") == "0":
        pytest.skip("AGENTRUN_DOCKER=0: the Docker tiers are switched off")
    # One preparer at a time on this machine: parallel test processes (pytest-xdist workers, another
    # checkout's session, `make test`'s background build) share the engine and the image's tag.
    try:
        dockerengine.ensure_engine(print)
    except dockerengine.EngineUnavailable as exc:
        pytest.skip(f"no Docker engine: {exc}")
    built = imagebuild.build_image_with_busybox(imagebuild.DEFAULT_TAG, "auto", print)
    return built.tag


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed e2e or real-node test's report shows the cluster as it was (`LocalDefault.diagnosis`):
    a CI log is all there is afterwards, and a status in an assertion's repr is cut short."""
    report: pytest.TestReport = yield
    funcargs = getattr(item, "funcargs", {})
    local = funcargs.get("local_default") if isinstance(funcargs, dict) else None
    diagnosis = getattr(local, "diagnosis", None)
    if report.failed and call.when == "call" and callable(diagnosis):
        try:
            text = str(diagnosis())
        except Exception as exc:  # the test's own failure is what matters
            text = f"no diagnosis: {exc!r}"
        report.sections.append(("the local default at the failure", text))
    return report
