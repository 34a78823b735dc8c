"""The tiers are isolated: the e2e tier's operator and pod runner are gone before this tier runs
(its `local_default` is package-scoped, so pytest tears it down after the last e2e test). In a
full session this runs after the e2e tier; run alone it checks that nothing of an e2e run lingers."""

from __future__ import annotations

from pathlib import Path

from agentrun_devcluster.controlplane import ControlPlane
from tests.e2e.conftest import NAMESPACE, NODE


def _e2e_services(kubeconfig: Path) -> list[str]:
    """This session's e2e services (other sessions on the machine run their own)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"--kubeconfig={kubeconfig}" not in cmdline:
            continue
        runner = "dev pod-runner" in cmdline and f"--node={NODE}" in cmdline
        operator = "agentrun_operator.cli operator" in cmdline and (
            f"AGENTS_CONTROLLER_NAMESPACES={NAMESPACE}".encode() in environ
        )
        if runner or operator:
            found.append(f"{entry.name}: {cmdline}")
    return found


def test_no_e2e_runner_or_operator_runs_during_the_integration_tier(control_plane: ControlPlane) -> None:
    assert _e2e_services(control_plane.kubeconfig) == []
