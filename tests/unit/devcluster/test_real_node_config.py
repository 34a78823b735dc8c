"""The real node's configuration and images, as pure functions (docs/local-dev.md#real-node)."""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import tarfile
import tomllib
from pathlib import Path

import yaml

from agentrun_devcluster.node.config import (
    BRIDGE,
    BRIDGE_ADDRESS,
    PAUSE_IMAGE,
    POD_SUBNET,
    NodePaths,
    cni_conflist,
    containerd_config,
    kubelet_config,
)
from agentrun_devcluster.node.ociimage import Entry, oci_archive

PATHS = NodePaths(Path("/state/node"))


def test_containerd_is_its_own_instance_with_the_settings_this_host_needs() -> None:
    doc = tomllib.loads(containerd_config(PATHS, "/usr/lib/cni"))
    assert doc["version"] == 2
    assert doc["root"] == "/state/node/containerd/root" and doc["state"] == "/state/node/containerd/state"
    assert doc["grpc"]["address"] == "/state/node/containerd/containerd.sock"  # never Docker's
    cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == PAUSE_IMAGE
    assert cri["restrict_oom_score_adj"] is True  # runc fails every pod without it here
    assert cri["netns_mounts_under_state_dir"] is True  # not /var/run/netns
    assert cri["stream_server_address"] == "127.0.0.1"
    assert cri["cni"] == {"bin_dir": "/usr/lib/cni", "conf_dir": "/state/node/cni/net.d"}


def test_the_pod_network_leaves_the_hosts_address_to_the_host_and_adds_no_gateway_or_masquerade() -> None:
    """The host's address on the bridge (the node sets it, docs/local-dev.md#real-node) is never a
    pod's; the plugin adds no address, no default route and no NAT (isGateway would also turn on IP
    forwarding host-wide)."""
    doc = json.loads(cni_conflist(PATHS))
    bridge = doc["plugins"][0]
    assert (bridge["type"], bridge["bridge"]) == ("bridge", BRIDGE)
    assert bridge["isGateway"] is False and bridge["ipMasq"] is False and "isDefaultGateway" not in bridge
    ((pod_range,),) = bridge["ipam"]["ranges"]
    assert pod_range["subnet"] == POD_SUBNET and "routes" not in bridge["ipam"]
    host = ipaddress.ip_interface(BRIDGE_ADDRESS)
    assert host.network == ipaddress.ip_network(POD_SUBNET) and host.ip == host.network.network_address + 1
    assert pod_range["gateway"] == str(host.ip)  # host-local never hands out its range's gateway
    assert ipaddress.ip_address(pod_range["rangeStart"]) == host.ip + 1
    assert bridge["ipam"]["dataDir"] == "/state/node/cni/ipam"  # not /var/lib/cni/networks
    assert [p["type"] for p in doc["plugins"]] == ["bridge", "loopback"]


def test_the_kubelet_serves_on_loopback_only_and_never_evicts() -> None:
    doc = yaml.safe_load(kubelet_config(PATHS, Path("/pki/ca.crt"), port=4321, healthz_port=4322))
    assert (doc["address"], doc["healthzBindAddress"]) == ("127.0.0.1", "127.0.0.1")
    assert (doc["port"], doc["healthzPort"], doc["readOnlyPort"]) == (4321, 4322, 0)
    assert doc["authentication"]["anonymous"]["enabled"] is False
    assert doc["authentication"]["x509"]["clientCAFile"] == "/pki/ca.crt"
    assert (doc["cgroupDriver"], doc["failCgroupV1"]) == ("cgroupfs", False)
    assert doc["containerRuntimeEndpoint"] == "unix:///state/node/containerd/containerd.sock"
    assert doc["podLogsDir"].startswith("/state/node/") and doc["volumePluginDir"].startswith("/state/node/")
    assert set(doc["evictionHard"].values()) == {"0%"}


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: (tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()}  # type: ignore[union-attr]


def test_an_oci_archive_is_a_layout_whose_blobs_match_their_digests() -> None:
    archive = oci_archive("agentrun.local/pause:1", {"pause": Entry(b"\x7fELF...", 0o755)}, ["/pause"])
    files = _members(archive)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():
        if name.startswith("blobs/sha256/") and data:
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(files["index.json"])
    (entry,) = index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "agentrun.local/pause:1"
    manifest = json.loads(files["blobs/sha256/" + entry["digest"].split(":")[1]])
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    assert config["config"]["Entrypoint"] == ["/pause"]
    layer = files["blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1]]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        member = tar.getmember("pause")
        assert (member.mode, member.uid, tar.extractfile(member).read()) == (0o755, 0, b"\x7fELF...")  # type: ignore[union-attr]


def test_the_same_input_gives_the_same_archive_and_a_short_name_gets_dockers_library_prefix() -> None:
    first = oci_archive("busybox:1.36", {"bin/busybox": Entry(b"x")}, ["sh"])
    assert first == oci_archive("busybox:1.36", {"bin/busybox": Entry(b"x")}, ["sh"])
    index = json.loads(_members(first)["index.json"])
    assert (
        index["manifests"][0]["annotations"]["io.containerd.image.name"] == "docker.io/library/busybox:1.36"
    )
