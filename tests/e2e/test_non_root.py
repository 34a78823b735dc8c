"""`make demo` as an ordinary user: `agentrun dev up` and the conditional-loop example run by a user
that is not root, to their end (docs/local-dev.md#non-root).

An ordinary user's pod runner gives a pod's containers their shared PID namespace from a user
namespace of its own (podrunner/pidns.py); without it the reporter cannot see `main` end and the run
would wait until its timeout. CI is root, so the test runs the commands as `nobody`
(tests/support/nonroot.py); a user that is not root runs them as itself. It cannot skip: what it
cannot arrange fails it with the reason."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import EXAMPLES
from tests.support.nonroot import kill_leftovers, ordinary_user


@pytest.fixture
def reachable_tmp() -> Iterator[Path]:
    """A temporary directory every user can reach (pytest's own are root's alone, mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="agentrun-nonroot-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _pod_logs(tmp: Path) -> str:
    """The pod runner's log and every container log of the user's dev cluster, their last lines."""
    home = next(tmp.glob("**/.agentrun/dev"), None)
    if home is None:
        return "\n(no dev home found)"
    shown = []
    for log in sorted([*home.glob("logs/*.log"), *home.glob("**/pods/**/*.log")]):
        if "pod-runner" in log.name or "/pods/" in str(log):
            lines = log.read_text(errors="replace").splitlines()[-40:]
            shown.append(f"\n--- {log.relative_to(home)}\n" + "\n".join(lines))
    return "".join(shown)


def test_an_ordinary_user_runs_the_demo_loop_to_its_end(reachable_tmp: Path) -> None:
    user = ordinary_user(reachable_tmp)
    up = user.agentrun("dev", "up", timeout=900)
    try:
        assert up.returncode == 0, f"dev up as uid {user.uid}:\n{up.stdout}\n{up.stderr}"
        run = user.agentrun("dev", "run", str(EXAMPLES / "conditional-loop.yaml"), "--timeout", "300")
        shown = f"dev run as uid {user.uid}:\n{run.stdout}\n{run.stderr}"
        if run.returncode != 0:  # what the pods said, before the fixture removes the user's home
            shown += _pod_logs(reachable_tmp)
        assert run.returncode == 0, shown
        assert re.search(r"^phase: Succeeded ", run.stdout, re.M), shown
        loop = r": Succeeded, 3 iterations, stop reason LoopConditionFalse$"
        assert re.search(loop, run.stdout, re.M), shown
    finally:
        down = user.agentrun("dev", "down")
        # Whether `dev down` ends well is test_dev_up_down's; here: the user's pods, pod runner and
        # operator are stopped (the control plane is the last thing `down` stops, and whatever of it
        # an unfinished `down` left is killed here).
        left = kill_leftovers(str(reachable_tmp))
        pods = [line for line in left if not line.startswith(f"{reachable_tmp}/cache/")]
        assert not pods, f"left running after dev down ({down.returncode}: {down.stderr[-500:]}): {pods}"
