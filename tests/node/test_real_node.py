"""The e2e tier's runs again on the real node: every example, the control-file rows, the operating
checks, the kubelet behaviours the pod runner imitates and the Helm install with its flag rollout
(docs/development.md#tiers), and what only a real node can show (image_waits.py, checkpoint_owners.py).

One module, so one pytest worker owns the node (it is host-wide). The test functions are the e2e
modules' own, taken over unchanged; this directory's conftest gives them the real node's
`local_default` and `release`. A behaviour only the pod runner has (its restarts, its sandbox) stays
in tests/e2e.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agentrun_devcluster import processes
from agentrun_devcluster.controlplane import ControlPlane
from tests.chaos.run import NODE_KINDS, Config, run
from tests.e2e import (
    test_candidates,
    test_checkpoints,
    test_control_file,
    test_examples,
    test_helm_install,
    test_job_claim,
    test_kubelet_behaviours,
    test_operating,
    test_pod_waits,
    test_stopping,
    test_warm,
)
from tests.node import checkpoint_owners, image_waits
from tests.support.polling import eventually

OVERRIDDEN = ("local_default", "release")
"""The fixtures this tier provides itself (tests/node/conftest.py)."""
NOT_ON_ONE_NODE = {
    "test_two_replicas_peer_and_the_standby_takes_over": (
        "two replicas of the chart's operator on the one real node: with hostNetwork (how a pod reaches "
        "the API server on loopback, docs/local-dev.md#real-node) both would serve /healthz and /metrics "
        "on the node's same ports, so the scheduler places only one, as on any one-node cluster; "
        "peering is tested on the pod runner, where each pod has its own network namespace"
    ),
}
"""Tests that need what one node with a loopback-only API server cannot give, and why."""
KNOWN_TO_FAIL_HERE: dict[str, str] = {}
"""Tests that still run here but are expected to fail until a known defect is fixed (not strict)."""


def _marked(test: Callable[..., None], mark: pytest.MarkDecorator) -> Callable[..., None]:
    """A marked copy: a mark on the e2e module's own function would apply there too."""

    @functools.wraps(test)
    def copy(*args: Any, **kwargs: Any) -> None:
        test(*args, **kwargs)

    marked: Callable[..., None] = mark(copy)
    return marked


def take_over(modules: tuple[ModuleType, ...], into: dict[str, Any]) -> list[str]:
    """Put the modules' tests and their module fixtures into `into`; a clash of names is an error
    (it would silently drop a test)."""
    taken: list[str] = []
    for module in modules:
        for name, value in vars(module).items():
            is_fixture = (
                hasattr(value, "_pytestfixturefunction")
                or type(value).__name__ == "FixtureFunctionDefinition"
            )
            if not (name.startswith("test_") and callable(value)) and not is_fixture:
                continue
            if name in OVERRIDDEN:
                continue
            if name in into and into[name] is not value:
                raise AssertionError(f"{module.__name__}.{name} clashes with a test of the same name")
            if name in NOT_ON_ONE_NODE:
                value = _marked(value, pytest.mark.skip(reason=NOT_ON_ONE_NODE[name]))
            elif name in KNOWN_TO_FAIL_HERE:
                value = _marked(value, pytest.mark.xfail(reason=KNOWN_TO_FAIL_HERE[name], strict=False))
            into[name] = value
            taken.append(name)
    return taken


TAKEN = take_over(
    (
        test_kubelet_behaviours,
        test_examples,
        test_control_file,
        test_stopping,
        test_job_claim,
        test_operating,
        test_pod_waits,
        test_checkpoints,
        test_candidates,
        test_warm,
        test_helm_install,
        image_waits,
        checkpoint_owners,
    ),
    globals(),
)


def _dev(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentrun_operator.cli", "dev", *args],
        env=dict(os.environ, AGENTRUN_DEV_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_dev_status_and_restart_know_the_nodes_components(real_node: ControlPlane) -> None:
    """`agentrun dev status` lists containerd, the kubelet, kube-scheduler and the provisioner with
    the control plane; `agentrun dev restart kubelet` brings the node back Ready on its own."""
    from agentrun_devcluster.node.node import NODE_COMPONENTS, RealNode

    status = _dev(real_node.home, "status")
    rows = {
        line.split()[0]: line.split()[2] for line in status.stdout.splitlines()[1:] if len(line.split()) > 2
    }
    for name in ("kube-apiserver", *NODE_COMPONENTS):
        assert rows.get(name) == "healthy", status.stdout
    before = processes.read_record(real_node.run_dir, "kubelet")
    restarted = _dev(real_node.home, "restart", "kubelet")
    assert restarted.returncode == 0, restarted.stderr
    after = processes.read_record(real_node.run_dir, "kubelet")
    assert before is not None and after is not None and after.pid != before.pid
    eventually(
        RealNode(real_node).node_ready, timeout=120, what="the node Ready again after the kubelet restart"
    )


def test_runs_survive_one_fault_of_each_kind_on_the_real_node(real_node: ControlPlane) -> None:
    """The chaos suite at its `make test` size, on this tier's node: the operator killed, the API
    server frozen and killed, etcd restarted, the kubelet killed (its containers run on), each healed
    with `agentrun dev up`/`restart` as a user would; every run Succeeded, no iteration repeated or
    lost. Last in this module: its faults would disturb the tests above."""
    config = Config(
        runs=2,
        iterations=2,
        faults=1,
        kinds=NODE_KINDS,
        runtime="kubelet",
        iteration_seconds=1.0,
        freeze_seconds=2.0,
        gap=0.5,
        timeout=600,
        hold=True,
    )
    report = run(config, real_node.home, shared=True)
    print(report.summary())
    assert not report.error, report.summary()
    assert sum(report.injected.values()) == len(NODE_KINDS), report.summary()
    assert report.phases == {"chaos-000": "Succeeded", "chaos-001": "Succeeded"}, report.summary()
    assert not any(report.repeated.values()), report.summary()
    assert not any(report.lost.values()), report.summary()
