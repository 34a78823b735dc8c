"""The real node's configuration files, as pure functions of its paths and ports (unit-tested).

- containerd: its own instance (own root, state, sockets; never the Docker engine's), the CRI
  plugin's sandbox image made here, `restrict_oom_score_adj` (root in this kind of sandbox lacks
  CAP_SYS_RESOURCE, and runc fails every container without it), network namespaces under its state
  directory (not /var/run/netns).
- CNI: a bridge the node makes itself, with the subnet's first address as the host's
  (`BRIDGE_ADDRESS`), so the host reaches its pods as a node's kubelet does (probes, the operator's
  warm channel); the plugin is told `isGateway: false` and `ipMasq: false` (it would turn on IP
  forwarding host-wide and add NAT), and host-local IPAM starts at the second address. Pods get an
  `eth0` in the subnet and no other route: nothing out of the subnet, no default route.
- kubelet: serves on loopback only, cgroupfs on cgroup v1 (`failCgroupV1: false`), its pod logs,
  volume plugins and state under the node's directory, no eviction thresholds (a dev node on a
  shared disk must not evict iteration pods).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PAUSE_IMAGE = "agentrun.local/pause:1"
BRIDGE = "agentrun0"
POD_SUBNET = "10.244.0.0/24"
BRIDGE_ADDRESS = "10.244.0.1/24"
"""The host's address on the bridge: the subnet's first, which host-local IPAM never hands to a pod
(it is the range's gateway, and the range starts after it)."""
FIRST_POD_ADDRESS = "10.244.0.2"
BLACKHOLE_METRIC = 4242
"""The pod subnet's blackhole route, behind the bridge's connected route (metric 0): while the bridge
has its address the host reaches its pods over it; without it the subnet still goes nowhere."""
NODE_NAME = "localhost"
"""The node's name, and so the `Hostname` address the API server dials for logs and exec: it resolves
to loopback, where the kubelet serves (the kubelet refuses a loopback node IP of its own)."""


@dataclass(frozen=True)
class NodePaths:
    """Everything the node writes under its own directory (`<state>/node/`)."""

    root: Path

    @property
    def containerd_dir(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_config(self) -> Path:
        return self.containerd_dir / "config.toml"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_dir / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.root / "kubelet.kubeconfig"

    @property
    def scheduler_kubeconfig(self) -> Path:
        return self.root / "scheduler.kubeconfig"

    @property
    def pod_logs_dir(self) -> Path:
        return self.root / "pod-logs"

    @property
    def volume_plugin_dir(self) -> Path:
        return self.root / "volume-plugins"

    @property
    def images_dir(self) -> Path:
        return self.root / "images"

    @property
    def host_paths_record(self) -> Path:
        """The host paths outside `root` the node created (removed again by `dev down`)."""
        return self.root / "host-paths.json"


def containerd_config(paths: NodePaths, cni_bin_dir: str) -> str:
    """containerd 1.6's config (version 2) for the node's own instance."""
    c = paths.containerd_dir
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    lines = [
        "version = 2",
        f'root = "{c / "root"}"',
        f'state = "{c / "state"}"',
        'disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",'
        ' "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]',
        "[grpc]",
        f'  address = "{paths.containerd_socket}"',
        "[ttrpc]",
        f'  address = "{paths.containerd_socket}.ttrpc"',
        '[plugins."io.containerd.internal.v1.opt"]',
        f'  path = "{c / "opt"}"',
        f"[{cri}]",
        f'  sandbox_image = "{PAUSE_IMAGE}"',
        "  restrict_oom_score_adj = true",
        "  netns_mounts_under_state_dir = true",
        '  stream_server_address = "127.0.0.1"',
        f"  [{cri}.containerd]",
        '    snapshotter = "overlayfs"',
        '    default_runtime_name = "runc"',
        f"    [{cri}.containerd.runtimes.runc]",
        '      runtime_type = "io.containerd.runc.v2"',
        f"  [{cri}.cni]",
        f'    bin_dir = "{cni_bin_dir}"',
        f'    conf_dir = "{paths.cni_conf_dir}"',
        "",
    ]
    return "\n".join(lines)


def cni_conflist(paths: NodePaths) -> str:
    """The bridge (the node made it, with the host's address; the plugin adds no address, route or NAT)
    and the loopback plugin; pod addresses from `POD_SUBNET`, after the host's."""
    doc: dict[str, Any] = {
        "cniVersion": "1.0.0",
        "name": "agentrun",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": False,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(paths.cni_ipam_dir),
                    "ranges": [
                        [
                            {
                                "subnet": POD_SUBNET,
                                "rangeStart": FIRST_POD_ADDRESS,
                                "gateway": BRIDGE_ADDRESS.split("/")[0],
                            }
                        ]
                    ],
                },
            },
            {"type": "loopback"},
        ],
    }
    return json.dumps(doc, indent=2) + "\n"


def kubelet_config(paths: NodePaths, ca_file: Path, port: int, healthz_port: int) -> str:
    """The KubeletConfiguration: loopback only, cgroupfs on cgroup v1, no evictions, our paths."""
    doc: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "podLogsDir": str(paths.pod_logs_dir),
        "volumePluginDir": str(paths.volume_plugin_dir),
        "resolvConf": "",
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "0%",
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
        },
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": False,
        "localStorageCapacityIsolation": False,
        "maxPods": 110,
        "nodeStatusReportFrequency": "10s",
        "nodeStatusUpdateFrequency": "10s",
    }
    return yaml.safe_dump(doc, sort_keys=False)
