"""An iteration pod whose containers get no shared PID namespace fails its attempt at once, saying
why (docs/troubleshooting.md#reporter-cannot-see-main): the reporter could never see `main` end, so
it keeps `main` from starting and the operator fails the attempt with the reporter's words, instead
of a run that waits for its timeout (the example sets none: it would wait forever).

The pod runner is made to lack the namespace with its test switch (`AGENTRUN_PODRUNNER_PIDNS=off`,
podrunner/pidns.py), as a cluster that ignores `shareProcessNamespace` would."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_devcluster.podrunner.pidns import SWITCH
from tests.e2e.conftest import LocalDefault, start_local_default, step_status


@pytest.fixture(scope="module")
def local_default(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalDefault]:
    yield from start_local_default(
        control_plane,
        tmp_path_factory,
        namespace="e2e-blind",
        node="agentrun-e2e-blind",
        runner_env={SWITCH: "off"},
    )


def test_a_pod_without_its_shared_pid_namespace_fails_the_attempt_at_once_saying_why(
    local_default: LocalDefault,
) -> None:
    local_default.apply_example("conditional-loop.yaml")
    run = local_default.wait_for_end("conditional-loop")
    step = step_status(run)
    assert run["status"]["phase"] == "Failed", run["status"]
    failure = step.get("lastFailure") or {}
    assert failure.get("reason") == "ReporterCannotSeeMain", step
    assert "cannot see main's processes" in str(failure.get("message")), failure
    assert "docs/troubleshooting.md#reporter-cannot-see-main" in str(step.get("message")), step
    workspace = local_default.claim_dir("conditional-loop-workspace")
    assert not any(workspace.iterdir()), "main never ran: it left nothing on the claim"
