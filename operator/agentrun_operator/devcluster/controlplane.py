"""A real local Kubernetes control plane: etcd + kube-apiserver + kube-controller-manager.

It runs from binaries built by `toolchain` on free loopback ports with generated certificates.
Used by the integration tests (a session fixture) and by `agentrun dev up`. Every component is a
detached process with a pid file under the state directory, so `stop()` works from any process.
"""

from __future__ import annotations

import base64
import functools
import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from agentrun_operator.devcluster import processes
from agentrun_operator.devcluster.pki import PKIPaths, ensure_pki

Progress = Callable[[str], None]

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager")
# Controllers the local default runs (docs/design.md#real-parts, docs/local-dev.md): Jobs, owner GC,
# TTL, what makes a namespace usable, and what `helm install` of a Deployment needs (Deployments,
# ReplicaSets, a Service's endpoints, the kube-root-ca.crt ConfigMap in-cluster clients read).
CONTROLLERS = (
    "job-controller",
    "garbage-collector-controller",
    "ttl-after-finished-controller",
    "serviceaccount-controller",
    "namespace-controller",
    "pod-garbage-collector-controller",
    "deployment-controller",
    "replicaset-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "root-ca-certificate-publisher-controller",
    # PersistentVolumeClaims bind as on a cluster: the binder pairs claims with the volumes the local
    # provisioner creates (devcluster/provisioner.py); the protection controllers lift the finalizers
    # the apiserver puts on both, so deleting a claim (and then its volume) completes.
    "persistentvolume-binder-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
)
_PORT_ATTEMPTS = 5


class ControlPlaneError(RuntimeError):
    """The control plane did not come up; the message names the component and its log."""


@dataclass
class Ports:
    etcd_client: int = 0
    etcd_peer: int = 0
    apiserver: int = 0
    controller_manager: int = 0


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    running: bool
    healthy: bool
    log: str | None


class ControlPlane:
    """Start, check and stop the local control plane kept under `home`."""

    def __init__(self, home: Path, bin_dir: Path, progress: Progress | None = None) -> None:
        self.home = home
        self.bin_dir = bin_dir
        self.pki: PKIPaths = PKIPaths(home / "pki")
        self.run_dir = home / "run"
        self.log_dir = home / "logs"
        self.say: Progress = progress or (lambda _msg: None)
        self._ssl: ssl.SSLContext | None = None

    # -- paths -----------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.home / "kubeconfig"

    @property
    def _ports_file(self) -> Path:
        return self.run_dir / "ports.json"

    def ports(self) -> Ports:
        try:
            return Ports(**json.loads(self._ports_file.read_text()))
        except (OSError, ValueError, TypeError):
            return Ports()

    def _save_ports(self, ports: Ports) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._ports_file.write_text(json.dumps(asdict(ports)))

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports().apiserver}"

    # -- health ----------------------------------------------------------------------------------
    def _client_ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.client_cert("admin")), str(self.pki.client_key("admin")))
        return ctx

    def api_get(self, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
        """GET from the apiserver as the admin user; (status, body), status 0 when unreachable."""
        return self.api_request("GET", path, timeout=timeout)

    def api_request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 5.0,
    ) -> tuple[int, bytes]:
        """One request as the admin user (tests and tools); (status, body), 0 when unreachable."""
        if self._ssl is None:
            try:
                self._ssl = self._client_ssl()
            except (OSError, ssl.SSLError):
                return 0, b""  # no certificates yet: nothing can be up
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=timeout) as resp:
                return int(resp.status), bytes(resp.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), bytes(exc.read())
        except (OSError, ssl.SSLError):
            return 0, b""

    def _etcd_healthy(self, port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def _kcm_healthy(self, port: int) -> bool:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # its serving cert is self-signed by itself
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx, timeout=2) as r:
                return bool(r.status == 200)
        except (OSError, ssl.SSLError):
            return False

    def component_status(self) -> list[ComponentStatus]:
        ports = self.ports()
        checks: dict[str, Callable[[], bool]] = {
            "etcd": lambda: self._etcd_healthy(ports.etcd_client),
            "kube-apiserver": lambda: self.api_get("/readyz")[0] == 200,
            "kube-controller-manager": lambda: self._kcm_healthy(ports.controller_manager),
        }
        result = []
        for name in COMPONENTS:
            rec = processes.read_record(self.run_dir, name)
            running = rec is not None and rec.alive()
            result.append(
                ComponentStatus(
                    name=name,
                    pid=rec.pid if rec else None,
                    running=running,
                    healthy=running and checks[name](),
                    log=rec.log if rec else None,
                )
            )
        return result

    def is_up(self) -> bool:
        return all(c.healthy for c in self.component_status())

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, crds_dir: Path | None = None, timeout: float = 120.0) -> None:
        """Bring every component up (idempotent: a healthy plane is left as it is)."""
        if self.is_up():
            self.say(f"control plane already running at {self.server}")
            if crds_dir is not None:
                self.install_crds(crds_dir)
            return
        self.stop()  # a half-started plane is restarted from scratch, keeping its data
        ensure_pki(self.pki.root)
        ports = Ports()
        self._start_with_free_port(
            "etcd", ports, ("etcd_client", "etcd_peer"), self._etcd_argv, self._etcd_healthy_for, timeout
        )
        self._start_with_free_port(
            "kube-apiserver", ports, ("apiserver",), self._apiserver_argv, self._apiserver_ready, timeout
        )
        self._write_kubeconfig()
        self._start_with_free_port(
            "kube-controller-manager",
            ports,
            ("controller_manager",),
            self._kcm_argv,
            lambda p: self._kcm_healthy(p.controller_manager),
            timeout,
        )
        self._wait(
            "the default ServiceAccount (serviceaccount controller)",
            lambda: self.api_get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
            timeout,
            "kube-controller-manager",
        )
        if crds_dir is not None:
            self.install_crds(crds_dir)
        self.say(f"control plane ready at {self.server}; KUBECONFIG={self.kubeconfig}")

    def _etcd_healthy_for(self, ports: Ports) -> bool:
        return self._etcd_healthy(ports.etcd_client)

    def _apiserver_ready(self, ports: Ports) -> bool:
        return self.api_get("/readyz")[0] == 200

    def _start_with_free_port(
        self,
        name: str,
        ports: Ports,
        fields: tuple[str, ...],
        argv: Callable[[Ports], list[str]],
        ready: Callable[[Ports], bool],
        timeout: float,
    ) -> None:
        """Start `name` on fresh free ports; a port taken in the meantime means a retry, never a failure."""
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            for f in fields:
                setattr(ports, f, processes.free_port())
            self._save_ports(ports)
            log = self.log_dir / f"{name}.log"
            proc = processes.start_process(self.run_dir, name, argv(ports), log)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
                if ready(ports):
                    self.say(f"  {name} ready (pid {proc.pid})")
                    return
                time.sleep(0.1)
            text = log.read_text(errors="replace")[-4000:]
            processes.stop_process(self.run_dir, name)
            if "address already in use" in text and attempt < _PORT_ATTEMPTS:
                self.say(f"  {name}: a port was taken meanwhile, retrying with other ports")
                continue
            raise ControlPlaneError(
                f"{name} did not become ready within {timeout:.0f}s "
                f"(exit code {proc.poll()}); log: {log}\n{text[-1500:]}"
            )

    def _wait(self, what: str, check: Callable[[], bool], timeout: float, component: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.1)
        raise ControlPlaneError(
            f"timed out after {timeout:.0f}s waiting for {what}; see {self.log_dir / (component + '.log')}"
        )

    def stop(self) -> list[str]:
        """Stop every component (reverse order); returns the names that were running."""
        stopped = [n for n in reversed(COMPONENTS) if processes.stop_process(self.run_dir, n)]
        self._ports_file.unlink(missing_ok=True)
        return stopped

    # -- argv ------------------------------------------------------------------------------------
    def _bin(self, name: str) -> str:
        return str(self.bin_dir / name)

    def _etcd_argv(self, p: Ports) -> list[str]:
        data = self.home / "etcd-data"
        return [
            self._bin("etcd"),
            "--name=agentrun-dev",
            f"--data-dir={data}",
            f"--listen-client-urls=http://127.0.0.1:{p.etcd_client}",
            f"--advertise-client-urls=http://127.0.0.1:{p.etcd_client}",
            f"--listen-peer-urls=http://127.0.0.1:{p.etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{p.etcd_peer}",
            f"--initial-cluster=agentrun-dev=http://127.0.0.1:{p.etcd_peer}",
            "--unsafe-no-fsync=true",  # a throwaway dev store: speed over durability
            "--quota-backend-bytes=2147483648",
            "--log-level=warn",
        ]

    def _apiserver_argv(self, p: Ports) -> list[str]:
        k = self.pki
        return [
            self._bin("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{p.etcd_client}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={p.apiserver}",
            f"--tls-cert-file={k.serving_cert}",
            f"--tls-private-key-file={k.serving_key}",
            f"--client-ca-file={k.ca_cert}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={k.sa_pub}",
            f"--service-account-signing-key-file={k.sa_key}",
            "--api-audiences=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=none",  # loopback is not a valid Service endpoint
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            f"--requestheader-client-ca-file={k.ca_cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--kubelet-client-certificate={k.client_cert('apiserver-kubelet-client')}",
            f"--kubelet-client-key={k.client_key('apiserver-kubelet-client')}",
            "--v=1",
        ]

    def _kcm_argv(self, p: Ports) -> list[str]:
        kubeconfig = self.home / "controller-manager.kubeconfig"
        self._write_kubeconfig_for("controller-manager", kubeconfig)
        return [
            self._bin("kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--controllers={','.join(CONTROLLERS)}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={p.controller_manager}",
            # Each controller acts as its own ServiceAccount with its bootstrap RBAC role.
            "--use-service-account-credentials=true",
            f"--root-ca-file={self.pki.ca_cert}",
            "--concurrent-job-syncs=10",
            "--concurrent-gc-syncs=10",
            "--v=1",
        ]

    # -- kubeconfig & CRDs -----------------------------------------------------------------------
    def _kubeconfig_doc(self, user: str) -> dict[str, Any]:
        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "agentrun-dev",
                    "cluster": {"server": self.server, "certificate-authority-data": b64(self.pki.ca_cert)},
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": b64(self.pki.client_cert(user)),
                        "client-key-data": b64(self.pki.client_key(user)),
                    },
                }
            ],
            "contexts": [
                {
                    "name": "agentrun-dev",
                    "context": {"cluster": "agentrun-dev", "user": user, "namespace": "default"},
                }
            ],
            "current-context": "agentrun-dev",
        }

    def _write_kubeconfig_for(self, user: str, path: Path) -> None:
        path.write_text(yaml.safe_dump(self._kubeconfig_doc(user), sort_keys=False))
        path.chmod(0o600)

    def _write_kubeconfig(self) -> None:
        self._write_kubeconfig_for("admin", self.kubeconfig)

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True) -> str:
        """Run the built kubectl against this control plane; returns stdout."""
        proc = subprocess.run(
            [self._bin("kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=input_text,
            capture_output=True,
            text=True,
            check=False,
        )
        if check and proc.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def install_crds(self, crds_dir: Path, timeout: float = 60.0) -> None:
        """Apply the CRDs and wait until each is Established."""
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds_dir))
        names = []
        for path in sorted(crds_dir.glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc and doc.get("kind") == "CustomResourceDefinition":
                    names.append(doc["metadata"]["name"])
        for name in names:
            self._wait(
                f"CRD {name} to be Established",
                functools.partial(self._crd_established, name),
                timeout,
                "kube-apiserver",
            )
        self.say(f"  installed {len(names)} CRDs from {crds_dir}")

    def _crd_established(self, name: str) -> bool:
        code, body = self.api_get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        if code != 200:
            return False
        conditions = json.loads(body).get("status", {}).get("conditions", [])
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
