"""The local provisioner's decisions: which claims get a volume, what volume, which volumes go."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agentrun_devcluster import provisioner as P

ROOT = Path("/state")


def claim(name: str = "ws", **changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": f"uid-{name}",
            "annotations": {P.ANN_PROVISIONER: P.PROVISIONER},
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "2Gi"}},
            "storageClassName": P.STORAGE_CLASS,
        },
        "status": {"phase": "Pending"},
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            obj[section][field] = value
        else:
            obj[section] = value
    return obj


def volume(name: str, phase: str, path: str | None = None, **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": annotations or {P.ANN_PROVISIONED_BY: P.PROVISIONER}},
        "spec": {
            "persistentVolumeReclaimPolicy": "Delete",
            "local": {"path": path or str(P.volume_dir(ROOT, name))},
        },
        "status": {"phase": phase},
    }


def test_a_claim_the_binder_handed_to_us_gets_a_volume_once() -> None:
    wanted = claim()
    assert P.claims_to_provision([wanted], []) == [wanted]
    assert P.claims_to_provision([wanted], [P.volume_name(wanted)]) == []


@pytest.mark.parametrize(
    "other",
    [
        claim(metadata__annotations={P.ANN_PROVISIONER: "ebs.csi.aws.com"}),
        claim(metadata__annotations={}),  # the binder has not decided (yet), or no class
        claim(spec__volumeName="pv-pre-bound"),
        claim(status={"phase": "Bound"}),
        claim(spec__volumeMode="Block"),
    ],
)
def test_claims_that_are_not_ours_or_need_nothing_are_left_alone(other: dict[str, Any]) -> None:
    assert P.claims_to_provision([other], []) == []


def test_the_beta_annotation_counts_too() -> None:
    older = claim(metadata__annotations={P.ANN_PROVISIONER_BETA: P.PROVISIONER})
    assert P.claims_to_provision([older], []) == [older]


def test_a_claim_being_deleted_gets_nothing() -> None:
    going = claim()
    going["metadata"]["deletionTimestamp"] = "2026-11-23T10:00:00Z"
    assert P.claims_to_provision([going], []) == []


def test_the_volume_fits_the_claim_and_is_pre_bound_to_it() -> None:
    pv = P.volume_for(claim(), ROOT, "node-a")
    assert pv["metadata"]["name"] == "pvc-uid-ws"
    assert pv["metadata"]["annotations"][P.ANN_PROVISIONED_BY] == P.PROVISIONER
    spec = pv["spec"]
    assert spec["capacity"] == {"storage": "2Gi"}
    assert spec["accessModes"] == ["ReadWriteOnce"]
    assert spec["storageClassName"] == P.STORAGE_CLASS
    assert spec["persistentVolumeReclaimPolicy"] == "Delete"
    assert spec["claimRef"] == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": "team",
        "name": "ws",
        "uid": "uid-ws",
    }
    assert spec["local"] == {"path": "/state/pv/pvc-uid-ws"}
    assert P.local_path(pv) == "/state/pv/pvc-uid-ws"


def test_the_volume_is_local_to_its_node_so_a_kubelet_applies_fs_group_to_it() -> None:
    """A `local` volume (not `hostPath`, to which the kubelet applies no fsGroup) needs a required
    node affinity; it names the Node's hostname label, which the kubelet sets from the host name."""
    spec = P.volume_for(claim(), ROOT, "host-1")["spec"]
    assert "hostPath" not in spec
    on_host = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["host-1"]}
    assert spec["nodeAffinity"] == {"required": {"nodeSelectorTerms": [{"matchExpressions": [on_host]}]}}
    node = {"metadata": {"name": "agentrun-node", "labels": {"kubernetes.io/hostname": "host-1"}}}
    assert P.node_hostname(node) == "host-1"
    assert P.node_hostname({"metadata": {"name": "agentrun-node"}}) == "agentrun-node"


def test_the_directory_is_made_as_a_typical_provisioner_makes_it(tmp_path: Path) -> None:
    """Root's (when the provisioner is root), 0755: no permissive mode hides a uid that cannot write."""
    directory = tmp_path / "pv" / "pvc-1"
    P.make_volume_dir(directory)
    info = directory.stat()
    assert info.st_mode & 0o7777 == 0o755
    if os.geteuid() == 0:
        assert (info.st_uid, info.st_gid) == (0, 0)


def test_hostpath_volumes_of_an_older_version_are_still_found() -> None:
    older = {"spec": {"hostPath": {"path": "/state/pv/pvc-old"}}}
    assert P.local_path(older) == "/state/pv/pvc-old"


def test_the_default_storage_class_uses_our_provisioner() -> None:
    sc = P.storage_class()
    assert sc["metadata"]["annotations"][P.ANN_DEFAULT_CLASS] == "true"
    assert sc["provisioner"] == P.PROVISIONER
    assert sc["reclaimPolicy"] == "Delete"


def test_released_volumes_of_ours_are_reclaimed_and_nothing_else() -> None:
    released = volume("pvc-a", "Released")
    failed = volume("pvc-b", "Failed")
    bound = volume("pvc-c", "Bound")
    foreign = volume("pvc-d", "Released", **{P.ANN_PROVISIONED_BY: "ebs.csi.aws.com"})
    elsewhere = volume("pvc-e", "Released", path="/other-state/pv/pvc-e")
    escaping = volume("pvc-f", "Released", path="/state/pv/../../etc")
    retained = volume("pvc-g", "Released")
    retained["spec"]["persistentVolumeReclaimPolicy"] = "Retain"
    candidates = [released, failed, bound, foreign, elsewhere, escaping, retained]
    assert P.volumes_to_reclaim(candidates, ROOT) == [released, failed]


def test_is_under_refuses_the_root_itself_and_escapes() -> None:
    assert P.is_under("/state/pv/x", ROOT / "pv")
    assert not P.is_under("/state/pv", ROOT / "pv")
    assert not P.is_under("/state/pv/../x", ROOT / "pv")
    assert not P.is_under(None, ROOT / "pv")
