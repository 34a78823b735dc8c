"""`agentrun dev`: the local default environment (control plane now; pod runner and operator later).

State lives under `~/.agentrun/dev` (or `$AGENTRUN_DEV_HOME`); tools come from the shared cache.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

from agentrun_operator.devcluster import toolchain
from agentrun_operator.devcluster.controlplane import ControlPlane


def dev_home() -> Path:
    return Path(os.environ.get("AGENTRUN_DEV_HOME") or Path.home() / ".agentrun" / "dev").expanduser()


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def control_plane(home: Path | None = None) -> ControlPlane:
    return ControlPlane(home or dev_home(), toolchain.bin_dir(), progress=_say)


def write_generated_crds(directory: Path) -> Path:
    """Write the CRDs generated from the models (the one source of truth) for installation."""
    from agentrun_operator.api.crd import write_crds

    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.yaml"):
        old.unlink()
    write_crds(directory)
    return directory


def up() -> int:
    toolchain.ensure_tools(_say)
    plane = control_plane()
    plane.start(crds_dir=write_generated_crds(plane.home / "crds"))
    _say(f'ready. Use it with:  eval "$(agentrun dev env)"   (state: {plane.home})')
    return 0


def down(purge: bool = False) -> int:
    plane = control_plane()
    stopped = plane.stop()
    _say(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")
    if purge and plane.home.exists():
        shutil.rmtree(plane.home)
        _say(f"removed {plane.home}")
    return 0


def status() -> int:
    plane = control_plane()
    rows = plane.component_status()
    print(f"{'COMPONENT':<26}{'PID':>8}  {'STATE':<10}LOG")
    for row in rows:
        state = "healthy" if row.healthy else ("running" if row.running else "stopped")
        print(f"{row.name:<26}{row.pid or '-':>8}  {state:<10}{row.log or '-'}")
    if all(r.healthy for r in rows):
        print(f"server: {plane.server}\nkubeconfig: {plane.kubeconfig}")
        return 0
    return 1


def env() -> int:
    plane = control_plane()
    path = f"{toolchain.bin_dir()}:{os.environ.get('PATH', '')}"
    print(f"export KUBECONFIG={shlex.quote(str(plane.kubeconfig))}")
    print(f"export PATH={shlex.quote(path)}")
    return 0
