"""A real local Kubernetes control plane: etcd + kube-apiserver + kube-controller-manager.

It runs from binaries built by `toolchain` on free loopback ports with generated certificates.
Used by the integration tests (a session fixture) and by `agentrun dev up`. Every component is a
detached process with a pid file under the state directory, so `stop()` works from any process.
"""

from __future__ import annotations

import base64
import contextlib
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

from agentrun_devcluster import processes
from agentrun_devcluster.pki import PKIPaths, ensure_pki
from agentrun_devcluster.podrunner.api import JSON, open_json_request

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
# With a real node (`--runtime kubelet`): what keeps a cluster's nodes schedulable — it lifts the
# `not-ready` taint the kubelet registers with once the node is Ready, and watches its Lease. Not with
# the pod runner, whose Node has no Lease (the controller would taint and evict it).
REAL_NODE_CONTROLLERS = ("node-lifecycle-controller",)
RUNTIME_FILE = "runtime"
"""`<home>/runtime`: the runtime `agentrun dev up` started (`kubelet` or `process`)."""
_PORT_ATTEMPTS = 5
_PORT_FIELDS = {
    "etcd": ("etcd_client", "etcd_peer"),
    "kube-apiserver": ("apiserver",),
    "kube-controller-manager": ("controller_manager",),
}
STATE_FORMAT = 2
"""The layout of the state directory. 1: before the file existed (compatible, upgraded in place);
2: containers outlive the pod runner (launch records), ports kept across restarts."""
_FORMAT_FILE = "state-format"
_WONT_COME_BACK = (
    "What to do: read the log above; `agentrun dev restart {name}` tries again; "
    "`agentrun dev down` then `agentrun dev up` restarts everything (the claims' volumes under pv/ are kept)."
)


def port_taken_message(name: str, *ports: int) -> str:
    listed = ", ".join(str(p) for p in ports)
    return (
        f"{name} cannot start on its port {listed}: another process is listening there "
        f"(see `ss -ltnp 'sport = :{ports[0]}'`). Stop that process and run `agentrun dev up` again, "
        "or move the whole local default to new ports with `agentrun dev down` then `agentrun dev up` "
        "(running pods are stopped; the claims' volumes under pv/ are kept)."
    )


def check_state_format(home: Path, say: Callable[[str], None]) -> None:
    """Refuse a state directory this version cannot read, touching nothing in it."""
    marker = home / _FORMAT_FILE
    if marker.exists():
        text = marker.read_text().strip()
        if text == str(STATE_FORMAT):
            return
        if text != "1":
            raise ControlPlaneError(
                f"the state directory {home} has state format {text!r}, and this agentrun reads "
                f"format {STATE_FORMAT}: it was made by another version. Nothing was changed. Use "
                f"that version, or keep your claims' files (copy {home / 'pv'} elsewhere) and start fresh "
                "with `agentrun dev down --purge` then `agentrun dev up` (or set AGENTRUN_DEV_HOME "
                "to a new directory)."
            )
    elif not (home / "etcd-data").exists():
        return  # a new state directory
    say(
        f"  state directory {home} is from an older agentrun (format 1): upgraded in place to "
        f"format {STATE_FORMAT}; pods it was running are reported lost"
    )
    write_state_format(home)


def write_state_format(home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / _FORMAT_FILE).write_text(f"{STATE_FORMAT}\n")


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

    def __init__(
        self,
        home: Path,
        bin_dir: Path,
        progress: Progress | None = None,
        controller_manager_args: tuple[str, ...] = (),
        apiserver_args: tuple[str, ...] = (),
    ) -> None:
        self.home = home
        # Extra flags of kube-controller-manager (the KWOK plane lifts its API rate limit, kwok.py).
        self.controller_manager_args = controller_manager_args
        # Extra flags of kube-apiserver (a test's plane that reads some kinds from etcd uncached).
        self.apiserver_args = apiserver_args
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
        self, method: str, path: str, body: Any = None, content_type: str = JSON, timeout: float = 5.0
    ) -> tuple[int, bytes]:
        """One request as the admin user (tests and tools); (status, body), 0 when unreachable."""
        if self._ssl is None:
            try:
                self._ssl = self._client_ssl()
            except (OSError, ssl.SSLError):
                return 0, b""  # no certificates yet: nothing can be up
        try:
            with open_json_request(
                method, self.server + path, body, content_type, self._ssl, timeout
            ) as resp:
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
        return self.controller_manager_get("/healthz", port)[0] == 200

    def controller_manager_get(
        self, path: str, port: int | None = None, timeout: float = 2.0
    ) -> tuple[int, bytes]:
        """GET from kube-controller-manager's secure port as the admin user (`/healthz`, `/metrics`);
        (status, body), status 0 when unreachable."""
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # its serving cert is self-signed by itself
        with contextlib.suppress(OSError, ssl.SSLError):  # no client cert yet: anonymous (healthz)
            ctx.load_cert_chain(str(self.pki.client_cert("admin")), str(self.pki.client_key("admin")))
        url = f"https://127.0.0.1:{port or self.ports().controller_manager}{path}"
        try:
            with urllib.request.urlopen(url, context=ctx, timeout=timeout) as r:
                return int(r.status), bytes(r.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), bytes(exc.read())
        except (OSError, ssl.SSLError):
            return 0, b""

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
    def start(self, crds_dir: Path | None = None, timeout: float = 300.0) -> None:
        """Bring up what is down, on the ports and data it had (a healthy plane is left as it is).

        Components that run are kept, so clients (the pod runner, the operator, pods) keep their
        address; a component whose process runs but does not answer (frozen, wedged) is restarted
        on its own port. New ports are chosen only when the whole plane is down and a remembered
        port has been taken meanwhile."""
        check_state_format(self.home, self.say)
        if self.is_up():
            self.say(f"control plane already running at {self.server}")
            if crds_dir is not None:
                self.install_crds(crds_dir)
            return
        ensure_pki(self.pki.root)
        write_state_format(self.home)
        ports, fresh = self._ports_for_start()
        for name in COMPONENTS:
            self._ensure(name, ports, fresh, timeout)
            if name == "kube-apiserver":
                self._write_kubeconfig()
        self._wait(
            "the default ServiceAccount (serviceaccount controller)",
            lambda: self.api_get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
            timeout,
            "kube-controller-manager",
        )
        if crds_dir is not None:
            self.install_crds(crds_dir)
        self.say(f"control plane ready at {self.server}; KUBECONFIG={self.kubeconfig}")

    def restart(self, name: str, timeout: float = 300.0) -> None:
        """Stop one component and start it again on its port with its data (`agentrun dev restart`)."""
        if name not in COMPONENTS:
            raise ControlPlaneError(f"no control plane component {name!r}; one of: {', '.join(COMPONENTS)}")
        ports = self.ports()
        if not all(getattr(ports, f) for f in _PORT_FIELDS[name]):
            raise ControlPlaneError("the control plane was never started here; run `agentrun dev up`")
        processes.stop_process(self.run_dir, name)
        self._start_component(name, ports, fresh=set(), timeout=timeout)
        # The others depend on it (the API server on etcd): done when the whole plane answers again,
        # so a command right after this one (e.g. restarting the pod runner) finds it up.
        deadline = time.monotonic() + timeout
        while not all(self._healthy(other, ports) for other in COMPONENTS):
            if time.monotonic() > deadline:
                down = [c for c in COMPONENTS if not self._healthy(c, ports)]
                raise ControlPlaneError(
                    f"{name} restarted, but {', '.join(down)} did not answer again within {timeout:g}s; "
                    f"see the logs under {self.run_dir} or run `agentrun dev up`"
                )
            time.sleep(0.2)

    def _alive(self, name: str) -> bool:
        record = processes.read_record(self.run_dir, name)
        return record is not None and record.alive()

    def _ports_for_start(self) -> tuple[Ports, set[str]]:
        """The remembered ports of the components that are down, checked free; (ports, the
        components given new ports)."""
        ports = self.ports()
        any_running = any(self._alive(n) for n in COMPONENTS)
        fresh: set[str] = set()
        for name in COMPONENTS:
            if self._alive(name):
                continue
            for f in _PORT_FIELDS[name]:
                port = int(getattr(ports, f))
                if port == 0:
                    fresh.add(name)
                elif processes.port_open(port):
                    if any_running:
                        raise ControlPlaneError(port_taken_message(name, port))
                    self.say(f"  {name}: port {port} is taken by another process; using a new port")
                    fresh.add(name)
        return ports, fresh

    def _healthy(self, name: str, ports: Ports) -> bool:
        if name == "etcd":
            return self._etcd_healthy(ports.etcd_client)
        if name == "kube-apiserver":  # a loaded machine answers slowly: a slow answer is an answer
            return self.api_get("/readyz", timeout=10.0)[0] == 200
        return self._kcm_healthy(ports.controller_manager)

    def _ensure(self, name: str, ports: Ports, fresh: set[str], timeout: float) -> None:
        """Keep `name` when it runs and answers; otherwise (re)start it."""
        record = processes.read_record(self.run_dir, name)
        if record is not None and record.alive():
            deadline = time.monotonic() + timeout  # a loaded machine starts slowly: no early kill
            while time.monotonic() < deadline:
                if self._healthy(name, ports):
                    self.say(f"  {name} already running (pid {record.pid})")
                    return
                time.sleep(0.2)
            self.say(f"  {name} (pid {record.pid}) runs but does not answer: restarting it on its port")
            processes.stop_process(self.run_dir, name)
        self._start_component(name, ports, fresh, timeout)

    def _start_component(self, name: str, ports: Ports, fresh: set[str], timeout: float) -> None:
        """Start `name` on its ports; new free ports (retried when taken meanwhile) when in `fresh`."""
        argv: Callable[[Ports], list[str]] = {
            "etcd": self._etcd_argv,
            "kube-apiserver": self._apiserver_argv,
            "kube-controller-manager": self._kcm_argv,
        }[name]
        attempts = _PORT_ATTEMPTS if name in fresh else 1
        for attempt in range(1, attempts + 1):
            if name in fresh:
                for f in _PORT_FIELDS[name]:
                    setattr(ports, f, processes.free_port())
            self._save_ports(ports)
            log = self.log_dir / f"{name}.log"
            offset = log.stat().st_size if log.exists() else 0
            proc = processes.start_process(self.run_dir, name, argv(ports), log)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
                if self._healthy(name, ports):
                    self.say(f"  {name} ready (pid {proc.pid})")
                    return
                time.sleep(0.1)
            text = log.read_bytes()[offset:].decode(errors="replace")[-4000:]
            processes.stop_process(self.run_dir, name)
            if "address already in use" in text:
                if attempt < attempts:
                    self.say(f"  {name}: a port was taken meanwhile, retrying with other ports")
                    continue
                if name not in fresh:
                    taken = [int(getattr(ports, f)) for f in _PORT_FIELDS[name]]
                    raise ControlPlaneError(port_taken_message(name, *taken))
            raise ControlPlaneError(
                f"{name} did not become ready within {timeout:.0f}s (exit code {proc.poll()}); "
                f"log: {log}\n{text[-1500:]}\n{_WONT_COME_BACK.format(name=name)}"
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
        """Stop every component (reverse order); returns the names that were running. The ports are
        remembered, so the next start uses the same addresses when they are free."""
        return [n for n in reversed(COMPONENTS) if processes.stop_process(self.run_dir, n)]

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
            "--authorization-mode=Node,RBAC",  # Node: the real node's kubelet, as on a cluster
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
            *self.apiserver_args,
        ]

    @property
    def runtime(self) -> str | None:
        """The runtime recorded by the last `up` (None: none recorded, the pod runner's)."""
        try:
            return (self.home / RUNTIME_FILE).read_text().strip() or None
        except OSError:
            return None

    def set_runtime(self, runtime: str) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / RUNTIME_FILE).write_text(f"{runtime}\n")

    def controllers(self) -> tuple[str, ...]:
        return CONTROLLERS + (REAL_NODE_CONTROLLERS if self.runtime == "kubelet" else ())

    def _kcm_argv(self, p: Ports) -> list[str]:
        kubeconfig = self.home / "controller-manager.kubeconfig"
        self._write_kubeconfig_for("controller-manager", kubeconfig)
        return [
            self._bin("kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--controllers={','.join(self.controllers())}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={p.controller_manager}",
            # Each controller acts as its own ServiceAccount with its bootstrap RBAC role.
            "--use-service-account-credentials=true",
            f"--root-ca-file={self.pki.ca_cert}",
            "--concurrent-job-syncs=10",
            "--concurrent-gc-syncs=10",
            "--v=1",
            *self.controller_manager_args,
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
        crds = []
        for path in sorted(crds_dir.glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc and doc.get("kind") == "CustomResourceDefinition":
                    crds.append(doc)
        for crd in crds:
            name = crd["metadata"]["name"]
            self._wait(
                f"CRD {name} to be Established",
                functools.partial(self._crd_established, name),
                timeout,
                "kube-apiserver",
            )
            # The API server publishes a CRD's OpenAPI schema a moment after Established; until then
            # `kubectl explain` and client-side schema lookups do not know the kind.
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in (v["name"] for v in crd["spec"]["versions"] if v.get("served", True)):
                self._wait(
                    f"the OpenAPI schema of {kind} {group}/{version} to be published",
                    functools.partial(self._crd_schema_published, group, version, kind),
                    timeout,
                    "kube-apiserver",
                )
        self.say(f"  installed {len(crds)} CRDs from {crds_dir}")

    def _crd_schema_published(self, group: str, version: str, kind: str) -> bool:
        code, body = self.api_get(f"/openapi/v3/apis/{group}/{version}")
        if code != 200:
            return False
        schemas = json.loads(body).get("components", {}).get("schemas", {})
        return any(key.endswith(f".{version}.{kind}") for key in schemas)

    def _crd_established(self, name: str) -> bool:
        code, body = self.api_get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        if code != 200:
            return False
        conditions = json.loads(body).get("status", {}).get("conditions", [])
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
