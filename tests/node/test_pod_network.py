"""The real node's pod network on the host (docs/local-dev.md#real-node), made and removed by the
node's own functions in a network namespace of this test's, so the host's is never touched: the
bridge with the host's address, whose route wins over the pod subnet's blackhole while it has the
address; the blackhole when it has not; an older node's blackhole (metric 0, which shadowed the
bridge's route) replaced; a subnet another interface uses refused; all of it gone after a stop.

Needs root and `unshare` (a network namespace) and `ip`; skipped with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

SCRIPT = r"""
import json, subprocess
from agentrun_devcluster.node import host
from agentrun_devcluster.node.config import BRIDGE, POD_SUBNET

def ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True)

def seen():
    get = ip("route", "get", "10.244.0.7")
    shown = json.loads(ip("-j", "addr", "show", "dev", BRIDGE).stdout or "[]")
    return {
        "route_get": get.stdout.splitlines()[0].strip() if get.returncode == 0 else get.stderr.strip(),
        "routes": ip("route", "show", "exact", POD_SUBNET).stdout.strip().splitlines(),
        "bridge": [
            f"{a['local']}/{a['prefixlen']}" for i in shown for a in i["addr_info"] if a["family"] == "inet"
        ],
    }

out = {}
ip("route", "add", "blackhole", POD_SUBNET)  # what an older node left
host.ensure_pod_network()
out["made"] = seen()
host.ensure_pod_network()
out["again"] = seen()
ip("addr", "flush", "dev", BRIDGE)
out["no_address"] = seen()
host.ensure_pod_network()
out["removed"] = host.remove_network()
out["after"] = seen()
out["link_after"] = ip("link", "show", BRIDGE).returncode
ip("link", "add", "other0", "type", "bridge")  # any link will do (no dummy module here)
ip("addr", "add", "10.244.0.9/24", "dev", "other0")
try:
    host.ensure_pod_network()
    out["refused"] = None
except host.NodeUnavailable as exc:
    out["refused"] = str(exc)
print(json.dumps(out))
"""


def _in_own_network_namespace() -> dict[str, Any]:
    if os.geteuid() != 0:
        pytest.skip("the pod network's functions need root (a network namespace of the test's own)")
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            pytest.skip(
                f"`{tool}` is missing: no network namespace of the test's own to check the pod network in"
            )
    done = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_host_reaches_pods_over_the_bridge_and_the_subnet_is_blackholed_behind_it() -> None:
    from agentrun_devcluster.node.config import BLACKHOLE_METRIC, BRIDGE, BRIDGE_ADDRESS, POD_SUBNET

    seen = _in_own_network_namespace()
    blackhole = f"blackhole {POD_SUBNET} metric {BLACKHOLE_METRIC}"
    for step in ("made", "again"):  # idempotent
        made = seen[step]
        assert made["route_get"].startswith(f"10.244.0.7 dev {BRIDGE} src 10.244.0.1"), made
        assert made["bridge"] == [BRIDGE_ADDRESS], made
        # the older node's blackhole (metric 0) is gone; ours stays behind the bridge's route
        assert [r.strip() for r in made["routes"] if r.startswith("blackhole")] == [blackhole], made
    # The bridge without its address: the subnet goes nowhere (the blackhole, not a default route).
    assert seen["no_address"]["route_get"] == "RTNETLINK answers: Invalid argument", seen["no_address"]
    assert seen["removed"] == [f"link {BRIDGE} ({BRIDGE_ADDRESS})", f"route {blackhole}"]
    assert seen["after"]["routes"] == [] and seen["link_after"] != 0
    assert seen["refused"] is not None and "other0" in seen["refused"] and POD_SUBNET in seen["refused"]
