"""The real-node tier: the e2e tests again, on the upstream kubelet and containerd.

Its fixtures stand in for the e2e tier's of the same names (`local_default`, `release`), so the
test functions the modules of this directory take over from tests/e2e run unchanged on a real node
(docs/development.md#tiers). Skipped, with the reason, where the node cannot run: not root, no
cgroups, no Docker engine to make the images (`make test` installs what it can as root).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrun_devcluster import processes, toolchain
from agentrun_devcluster.controlplane import ControlPlane
from tests.e2e.conftest import LocalDefault, start_local_default
from tests.e2e.test_helm_install import IMAGE, Release, ensure_namespaces, installed
from tests.integration.helm import Helm
from tests.support.node import NodeHost

REPO = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="session")
def real_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of its own with the real node (kubelet, containerd, kube-scheduler) on it."""
    from agentrun_devcluster.node.host import host_problem
    from agentrun_devcluster.node.node import HOST_LOCK

    problem = host_problem()
    if problem is not None:
        pytest.skip(f"no real node here: {problem}")
    from agentrun_devcluster import dev, dockerengine

    try:
        dockerengine.ensure_engine(print)
    except dockerengine.EngineUnavailable as exc:
        pytest.skip(f"no real node here: its images are made with a Docker engine, and none can run: {exc}")
    # The images `agentrun dev up --runtime kubelet` imports: busybox, the operator's, and the git
    # image of examples/git-loop.yaml (made from Debian packages once, then cached).
    images = dev.node_images()
    plane = ControlPlane(tmp_path_factory.mktemp("real-node"), toolchain.ensure_tools(print), progress=print)
    # One real node per host: another session's (or a developer's by-hand) run waits its turn.
    with processes.exclusive(HOST_LOCK):
        yield from _node_on(plane, images)


def _node_on(plane: ControlPlane, images: list[str]) -> Iterator[ControlPlane]:
    from agentrun_devcluster.node.host import NodeUnavailable
    from agentrun_devcluster.node.node import RealNode

    plane.set_runtime("kubelet")
    node = RealNode(plane, progress=print)
    try:
        plane.start(crds_dir=REPO / "crds")
        try:
            node.start(images)
        except NodeUnavailable as exc:
            raise AssertionError(f"the real node did not start on a host that can run it: {exc}") from None
        yield plane
    finally:
        node.stop()
        plane.stop()
    # What `agentrun dev down` promises (docs/local-dev.md#real-node): nothing of the node is left.
    assert not leftovers(plane), leftovers(plane)


def leftovers(plane: ControlPlane) -> list[str]:
    """Processes, mounts, the route, the bridge and the host paths the node made, if any remain."""
    from agentrun_devcluster.node import host
    from agentrun_devcluster.node.config import BRIDGE, POD_SUBNET

    found = [f"mount {m}" for m in host.mounts_under([plane.home])]
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(plane.home) in argv and proc.name.isdigit():
            found.append(f"process {proc.name}: {argv[:120]}")
    routes = subprocess.run(["ip", "route", "show", POD_SUBNET], capture_output=True, text=True, check=False)
    if routes.stdout.strip():
        found.append(f"route {routes.stdout.strip()}")
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True, check=False).returncode == 0:
        found.append(f"link {BRIDGE}")
    return found


@pytest.fixture(scope="module")
def local_default(
    real_node: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalDefault]:
    """The e2e tier's `local_default`, with the real node running the pods."""
    yield from start_local_default(real_node, tmp_path_factory, host=NodeHost(real_node), sleep_offset=100)


@pytest.fixture(scope="module")
def release(real_node: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """The chart installed with loops on, its operator a real container on the real node: in the
    node's network (the API server listens on loopback), its image imported into containerd."""
    from agentrun_devcluster.node.config import NODE_NAME

    plane = real_node
    release_ns, runs_ns = "agentrun-helm-kubelet", "helm-runs-kubelet"
    ensure_namespaces(plane, release_ns, runs_ns)
    helm = Helm(Path(plane.bin_dir) / "helm", tmp_path_factory.mktemp("helm-home"), plane.kubeconfig)
    values = {
        "loops": {"enabled": True},
        "watchNamespaces": [runs_ns],
        "image": {"repository": IMAGE, "pullPolicy": "Never"},
        "hostNetwork": True,
        "extraEnv": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(plane.ports().apiserver)},
        ],
        "probes": {"port": processes.free_port()},
        "metrics": {"port": processes.free_port()},
        "resyncSeconds": 3600,
    }
    yield from installed(Release(plane, helm, NodeHost(plane), release_ns, runs_ns, NODE_NAME), values)
