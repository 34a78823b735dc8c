"""Control planes the tests start: the session's shared one (tests/conftest.py), and a module's own
when it needs other kube-apiserver flags (tests/integration/test_watch_gone.py)."""

from __future__ import annotations

import atexit
import contextlib
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported when a plane starts: the tiers without one need no dev cluster
    from agentrun_devcluster.controlplane import ControlPlane

REPO = Path(__file__).resolve().parents[2]


def interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def started_control_plane(home: Path, apiserver_args: tuple[str, ...] = ()) -> Iterator[ControlPlane]:
    """A running etcd + kube-apiserver + kube-controller-manager under `home` with our CRDs
    installed, stopped on leaving; `apiserver_args` are extra kube-apiserver flags."""
    from agentrun_devcluster import toolchain
    from agentrun_devcluster.controlplane import ControlPlane

    if not all(toolchain.is_built(t) for t in toolchain.TOOLS) and shutil.which("go") is None:
        pytest.skip(
            "the local control plane is not built and Go is not on PATH to build it "
            f"(cache: {toolchain.bin_dir()}); install Go >= 1.26 or run `agentrun dev tools`"
        )
    bin_dir = toolchain.ensure_tools(print)
    plane = ControlPlane(home, bin_dir, progress=print, apiserver_args=apiserver_args)
    atexit.register(plane.stop)  # even if the session dies between yield and teardown
    # A SIGTERM (a CI timeout, a `kill`) would skip both `finally` and atexit: make it an
    # interrupt, which pytest turns into an orderly stop with fixture teardown.
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, interrupt)
    try:
        plane.start(crds_dir=REPO / "crds")
        yield plane
    finally:
        plane.stop()
