"""`agentrun dev up` on a state directory of another version touches nothing (docs/local-dev.md#restarts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrun_devcluster import dev, toolchain
from agentrun_devcluster.controlplane import ControlPlaneError


def test_up_refuses_another_versions_state_directory_before_writing_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "state-format").write_text("99\n")
    monkeypatch.setenv("AGENTRUN_DEV_HOME", str(tmp_path))
    monkeypatch.setattr(dev, "check_runtime", lambda runtime: runtime)
    monkeypatch.setattr(toolchain, "ensure_tools", lambda say: None)
    with pytest.raises(ControlPlaneError, match=r"state format '99'.*Nothing was changed"):
        dev.up()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state-format"]
    assert (tmp_path / "state-format").read_text() == "99\n"
