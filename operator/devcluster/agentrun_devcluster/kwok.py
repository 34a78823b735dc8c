"""The KWOK plane: the local control plane, kube-scheduler and KWOK's simulated nodes, for benchmarks.

The same etcd, kube-apiserver and kube-controller-manager as `agentrun dev up` (its state under its
own home), plus kube-scheduler and `kwok` (sigs.k8s.io/kwok, built and cached by the toolchain),
and N fake nodes that KWOK keeps Ready. KWOK plays every pod bound to them with the Stages of
`kwok_stages` (docs/local-dev.md#kwok). A benchmark-only mode, not a runtime of `agentrun dev up`:
its pods run nothing, so a user's run on it would show no work; it answers scale questions only.

Reusable by other benchmarks (a workflow engine side by side on the same plane):

    python -m agentrun_devcluster.kwok up --home /tmp/x --nodes 20     # prints the kubeconfig path
    python -m agentrun_devcluster.kwok down --home /tmp/x

or `KwokPlane(home, nodes).start()` from Python.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from agentrun_devcluster import processes, toolchain
from agentrun_devcluster.controlplane import ControlPlane, ControlPlaneError, Progress
from agentrun_devcluster.kwok_stages import NODE_ANNOTATION, NODE_ANNOTATION_VALUE, stages_yaml

SCHEDULER = "kube-scheduler"
KWOK = "kwok"
API_QPS = 1000
"""The client rate limit of the Job controller and the scheduler on this plane: at their defaults
(20 and 50 requests/s) they, not the operator, would set the pace of thousands of runs."""
POD_PLAY_PARALLELISM = 32
"""How many pod Stages KWOK plays at once (its `podPlayStageParallelism`). At KWOK's default (4), each
play one status PATCH, a busy API server's latency made KWOK the pace of the whole plane: a scheduled
pod waited about 12 s to start at 1,000 runs, while the operator's queue stood empty."""
NODE_PREFIX = "kwok-node-"
POD_CIDR = "127.192.0.0/12"
"""Where KWOK allocates pod IPs: loopback, so that a connection to a simulated pod's IP (the operator
calling a warm pod's supervisor, docs/design.md#warm-channel) stays on `lo` (Linux routes all of
127.0.0.0/8 there, and a process may bind any of it without setup), where the benchmark's simulated
supervisor listens (tests/bench/warm_sim.py). Disjoint from the pod runner's 127.64.0.0/10."""


def controller_sync_args(syncs: int | None) -> tuple[str, ...]:
    """kube-controller-manager's workers for Jobs, garbage collection and finished-Job TTLs, when
    set (`KwokPlane(controller_syncs=N)`, `bench_scale --controller-syncs N`).

    At 5,000 runs and more, the Job controller's 10 workers, each waiting on a saturated API server,
    fall behind: its queue grew past 12,000 Jobs while the operator stood idle. More workers let those
    sizes finish; at 1,000 and fewer they make every client's requests slower (100 x 3: pod ended ->
    next Job p95 450 ms with the defaults, 8.2 s with 50), so the plane keeps its defaults unless
    asked (docs/operator.md#scale)."""
    if syncs is None:
        return ()
    return (
        f"--concurrent-job-syncs={syncs}",
        f"--concurrent-gc-syncs={syncs}",
        f"--concurrent-ttl-after-finished-syncs={syncs}",
    )


def kwok_configuration() -> str:
    """KWOK's own options (config.kwok.x-k8s.io KwokConfiguration), loaded with the Stages. A
    configuration file given leaves KWOK's other parallelism options at 0 (its defaulting does not
    run for them, and it refuses 0), so they are written at KWOK's defaults too."""
    options = {
        "podPlayStageParallelism": POD_PLAY_PARALLELISM,
        "nodePlayStageParallelism": 4,
        "nodeLeaseParallelism": 4,
        "podsOnNodeSyncParallelism": 1,
    }
    lines = "".join(f"  {k}: {v}\n" for k, v in options.items())
    return f"apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n{lines}"


class KwokPlane:
    """Start, fill with nodes, and stop a KWOK plane kept under `home`."""

    def __init__(
        self,
        home: Path,
        nodes: int = 10,
        progress: Progress | None = None,
        extra_stages: tuple[Path, ...] = (),
        controller_syncs: int | None = None,
        profiling: bool = False,
        apiserver_args: tuple[str, ...] = (),
    ) -> None:
        self.home = home
        self.nodes = nodes
        # More Stages (another workload's pods, e.g. a workflow engine's), loaded beside ours.
        self.extra_stages = extra_stages
        self.say: Progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.plane = ControlPlane(
            home,
            toolchain.bin_dir(),
            progress=self.say,
            controller_manager_args=(
                f"--kube-api-qps={API_QPS}",
                f"--kube-api-burst={API_QPS}",
                *controller_sync_args(controller_syncs),
            ),
            # kube-apiserver's /debug/pprof (the dev plane turns it off; the controller manager
            # serves it by default), for a benchmark that asks where the plane's CPU goes; then any
            # other flags a benchmark asks for (API Priority and Fairness on, its concurrency limit).
            apiserver_args=(*(("--profiling=true",) if profiling else ()), *apiserver_args),
        )

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    def start(self, crds_dir: Path | None = None) -> KwokPlane:
        """Build what is missing (control plane, then KWOK), start what is down, add the nodes."""
        toolchain.ensure_tools(self.say)
        kwok_bin = toolchain.ensure_kwok(self.say)  # before anything starts: its failure is one line
        self.plane.start(crds_dir=crds_dir)
        self._start_scheduler()
        self._start_kwok(kwok_bin)
        self.ensure_nodes(self.nodes)
        return self

    def _start_scheduler(self) -> None:
        record = processes.read_record(self.plane.run_dir, SCHEDULER)
        if record is not None and record.alive():
            return
        kubeconfig = self.home / "scheduler.kubeconfig"
        self.plane._write_kubeconfig_for("admin", kubeconfig)
        argv = [
            str(toolchain.tool_path("kube-scheduler")),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={processes.free_port()}",
            f"--kube-api-qps={API_QPS}",
            f"--kube-api-burst={API_QPS}",
            "--v=1",
        ]
        processes.start_process(self.plane.run_dir, SCHEDULER, argv, self.plane.log_dir / f"{SCHEDULER}.log")

    def _start_kwok(self, kwok_bin: Path) -> None:
        record = processes.read_record(self.plane.run_dir, KWOK)
        if record is not None and record.alive():
            return
        config = self.home / "kwok.yaml"
        config.write_text(stages_yaml() + "---\n" + kwok_configuration())
        argv = [
            str(kwok_bin),
            f"--kubeconfig={self.kubeconfig}",
            f"--config={config}",
            *(f"--config={extra}" for extra in self.extra_stages),
            f"--manage-nodes-with-annotation-selector={NODE_ANNOTATION}={NODE_ANNOTATION_VALUE}",
            "--node-lease-duration-seconds=0",  # no node-lifecycle controller here reads leases
            f"--server-address=127.0.0.1:{processes.free_port()}",
            f"--cidr={POD_CIDR}",
        ]
        processes.start_process(self.plane.run_dir, KWOK, argv, self.plane.log_dir / f"{KWOK}.log")

    def node_names(self, count: int) -> list[str]:
        return [f"{NODE_PREFIX}{i}" for i in range(count)]

    def ensure_nodes(self, count: int, timeout: float = 120.0) -> None:
        """Create `count` fake nodes (adopting those that exist) and wait until KWOK made them Ready."""
        names = self.node_names(count)
        for name in names:
            self.add_node(name)
        self.wait_ready(names, timeout)
        self.say(f"kwok plane: {count} fake nodes Ready at {self.plane.server}")

    def add_node(self, name: str) -> None:
        """One fake node (creating one that exists adopts it); KWOK makes it Ready."""
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {NODE_ANNOTATION: NODE_ANNOTATION_VALUE},
                "labels": {"kubernetes.io/hostname": name, "type": "kwok"},
            },
        }
        code, data = self.plane.api_request("POST", "/api/v1/nodes", body)
        if code not in (201, 409):
            raise ControlPlaneError(f"creating fake node {name}: {code} {data[:200]!r}")
        # The API server taints a new node not-ready (admission TaintNodesByCondition); on a cluster
        # the node-lifecycle controller lifts it once the kubelet reports Ready. Here KWOK is that
        # kubelet and no such controller runs (it would also want the leases KWOK does not renew).
        code, data = self.plane.api_request(
            "PATCH",
            f"/api/v1/nodes/{name}",
            {"spec": {"taints": None}},
            content_type="application/merge-patch+json",
        )
        if code != 200:
            raise ControlPlaneError(f"untainting fake node {name}: {code} {data[:200]!r}")

    def delete_node(self, name: str) -> None:
        code, data = self.plane.api_request("DELETE", f"/api/v1/nodes/{name}")
        if code not in (200, 404):
            raise ControlPlaneError(f"deleting fake node {name}: {code} {data[:200]!r}")

    def wait_ready(self, names: list[str], timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            if set(names) <= self.ready_nodes():
                return
            time.sleep(0.2)
        raise ControlPlaneError(
            f"KWOK did not make {len(names)} fake nodes Ready within {timeout:.0f}s; "
            f"see {self.plane.log_dir / 'kwok.log'}"
        )

    def ready_nodes(self) -> set[str]:
        """The names of the fake nodes that are Ready."""
        code, data = self.plane.api_request("GET", "/api/v1/nodes?labelSelector=type%3Dkwok")
        if code != 200:
            return set()
        ready = set()
        for node in json.loads(data).get("items", []):
            conditions = (node.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                ready.add(str(node["metadata"]["name"]))
        return ready

    def _check_alive(self) -> None:
        for name in (SCHEDULER, KWOK):
            record = processes.read_record(self.plane.run_dir, name)
            if record is None or not record.alive():
                log = self.plane.log_dir / f"{name}.log"
                tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                raise ControlPlaneError(f"{name} exited at start; log: {log}\n{tail}")

    def stop(self) -> list[str]:
        stopped = [n for n in (KWOK, SCHEDULER) if processes.stop_process(self.plane.run_dir, n)]
        return stopped + self.plane.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m agentrun_devcluster.kwok", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("command", choices=("up", "down", "build"))
    ap.add_argument("--home", type=Path, default=None, help="the plane's state directory (up, down)")
    ap.add_argument("--nodes", type=int, default=10, help="fake nodes (up)")
    ap.add_argument("--crds", type=Path, default=None, help="a directory of CRDs to install (up)")
    ap.add_argument(
        "--stages", type=Path, action="append", default=[], help="a file of more KWOK Stages (up; repeatable)"
    )
    args = ap.parse_args(argv)
    if args.command == "build":  # the tools only (`make test` builds them in the background)
        try:
            toolchain.ensure_tools()
            print(toolchain.ensure_kwok())
        except toolchain.ToolchainError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.home is None:
        ap.error(f"{args.command} needs --home DIR")
    kwok = KwokPlane(args.home, args.nodes, extra_stages=tuple(args.stages))
    try:
        if args.command == "up":
            kwok.start(crds_dir=args.crds)
            print(kwok.kubeconfig)
        else:
            stopped = kwok.stop()
            print(f"stopped: {', '.join(stopped) or 'nothing was running'}", file=sys.stderr)
    except (toolchain.ToolchainError, ControlPlaneError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
