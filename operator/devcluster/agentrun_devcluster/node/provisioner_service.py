"""`agentrun dev provisioner`: the local provisioner as a service of its own, for the real node.

With the pod runner, the provisioner runs inside it (the node owns its disks); with a real kubelet
there is no pod runner, so the node starts this beside the kubelet. Same code, same volumes.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from agentrun_devcluster.podrunner.api import Api
from agentrun_devcluster.provisioner import LocalProvisioner


def run_provisioner(kubeconfig: Path, state_dir: Path, node: str) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    api = Api(kubeconfig, state_dir / "run" / "provisioner-client")
    provisioner = LocalProvisioner(api, state_dir)
    stopping = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("agentrun.provisioner").info("got %s; stopping", signal.Signals(signum).name)
        stopping.set()
        provisioner.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    logging.getLogger("agentrun.provisioner").info(
        "provisioning volumes on node %s under %s", node, state_dir / "pv"
    )
    provisioner.run(stopping)
    return 0
