"""The pod runner's imitation of the kubelet's volume checks (podrunner/volumes.check_mountable): a
`local` path that does not exist and a `hostPath` of type `Directory` that is none are a
`FailedMount` in the kubelet's words; anything else passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrun_devcluster.podrunner import spec as S
from agentrun_devcluster.podrunner.volumes import check_mountable


def test_the_kubelets_volume_checks_in_its_words(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    with pytest.raises(S.VolumeMountError) as local:
        check_mountable("pv-x", {"spec": {"local": {"path": str(gone)}}})
    assert str(local.value) == (
        f'MountVolume.NewMounter initialization failed for volume "pv-x" : path "{gone}" does not exist'
    )
    assert local.value.event_reason == "FailedMount"
    with pytest.raises(S.VolumeMountError) as host:
        check_mountable("pv-y", {"spec": {"hostPath": {"path": str(gone), "type": "Directory"}}})
    assert str(host.value) == (
        f'MountVolume.SetUp failed for volume "pv-y" : hostPath type check failed: {gone} is not a directory'
    )
    check_mountable("pv-z", {"spec": {"local": {"path": str(tmp_path)}}})
    check_mountable("pv-z", {"spec": {"hostPath": {"path": str(tmp_path), "type": "Directory"}}})
    check_mountable("pv-z", {"spec": {"hostPath": {"path": str(gone)}}})  # no type: no check
