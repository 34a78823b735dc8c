"""A subPath that is a file of a configMap volume is mounted on a file inside another volume, as the
kubelet does (the runner contract mounts /workspace/run.json over a PVC at /workspace)."""

from __future__ import annotations

from pathlib import Path

from agentrun_devcluster.podrunner import spec as S
from agentrun_devcluster.podrunner.process import place_mounts
from agentrun_devcluster.podrunner.sandbox import Bind
from agentrun_devcluster.podrunner.volumes import binds


def test_a_file_subpath_is_bound_as_a_file_inside_another_volume(tmp_path: Path) -> None:
    pvc, config = tmp_path / "pvc", tmp_path / "config"
    pvc.mkdir()
    config.mkdir()
    (config / "run.json").write_text("{}")
    container = {
        "volumeMounts": [
            {"name": "ws", "mountPath": "/workspace"},
            {"name": "cfg", "mountPath": "/workspace/run.json", "subPath": "run.json", "readOnly": True},
            {"name": "cfg", "mountPath": "/workspace/sub", "subPath": "made"},
        ]
    }
    volumes = {"ws": S.Volume("ws", "emptyDir"), "cfg": S.Volume("cfg", "configMap")}
    out = binds(container, volumes, {"ws": pvc, "cfg": config})
    assert [b.source for b in out] == [str(pvc), str(config / "run.json"), str(config / "made")]
    assert (config / "made").is_dir() and (config / "run.json").read_text() == "{}"
    placed, _, _ = place_mounts(out, [Bind(str(tmp_path / "term"), "/dev/termination-log")], tmp_path / "tmp")
    assert (pvc / "run.json").is_file() and (pvc / "sub").is_dir()
    assert [b.target for b in placed][:1] == ["/workspace"]
