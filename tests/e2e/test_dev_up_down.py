"""`agentrun dev up | status | env | run | logs | restart | down` as a user runs them, with its own
state directory: up starts the control plane, the pod runner and the operator (idempotently) and
restarts only what is down, on the same addresses; down leaves no process, port or mount behind,
even with a pod running.

One local default for the whole module (each `dev up` from nothing costs a control plane start): the
tests run in file order on it, and the last one takes it down."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentrun_devcluster import processes
from agentrun_devcluster.controlplane import COMPONENTS, ControlPlane
from agentrun_devcluster.dev import SERVICES, component_rows
from agentrun_devcluster.toolchain import bin_dir
from tests.e2e.conftest import EXAMPLES
from tests.fixtures.invalid_agentruns import OPERATOR_ONLY_AGENTRUNS
from tests.support.polling import eventually
from tests.support.processes import processes_with


def agentrun(home: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentrun_operator.cli", *args],
        env=dict(os.environ, AGENTRUN_DEV_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def processes_mentioning(text: str) -> list[str]:
    """Live processes whose command line mentions `text` (bwrap's argv names the pod's directories)."""
    found = []
    needle = text.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state != "Z":
            shown = cmdline.replace(b"\0", b" ")[:200]
            found.append(f"{entry.name}: {shown!r}")
    return found


def mounts_mentioning(text: str) -> list[str]:
    """Mount entries naming `text`, in any mount namespace still alive."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            lines = (entry / "mountinfo").read_text().splitlines()
        except OSError:
            continue
        found += [f"{entry.name}: {line}" for line in lines if text in line]
    return found


HIDDEN_PROGRAMS = frozenset(
    {"ctr", "runc", "crun", "kubelet", "crictl", "ip", "iptables", "ip6tables", "nft"}
)
HIDDEN_PREFIXES = ("containerd", "docker")
"""What a machine that never had containerd, Docker or a real node lacks (and `ip`, which minimal
images lack): hidden from `bare_path`, whatever this host or an earlier test run installed."""


def bare_path(directory: Path) -> str:
    """A PATH with this host's programs minus `HIDDEN_PROGRAMS`/`HIDDEN_PREFIXES`: one directory of
    symlinks to the rest (the first of each name, as PATH resolves it)."""
    directory.mkdir(parents=True)
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry or not Path(entry).is_dir():
            continue
        for program in Path(entry).iterdir():
            name = program.name
            if name in HIDDEN_PROGRAMS or name.startswith(HIDDEN_PREFIXES):
                continue
            link = directory / name
            if not link.is_symlink() and program.is_file() and os.access(program, os.X_OK):
                link.symlink_to(program)
    return str(directory)


def gone(pid: int) -> bool:
    """No such process, or only its zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return True


def test_up_and_down_on_a_machine_without_containerd_docker_or_a_node(tmp_path: Path) -> None:
    """`make demo` then `make down` where nothing of a container runtime was ever installed: `down`
    stops all that `up` started and exits 0 (it crashed on the missing `ctr` and left the control
    plane running), and every `dev` command either works or names what is missing in one line."""
    home = tmp_path / "dev"
    path = bare_path(tmp_path / "bin")
    for program in ("ctr", "containerd", "docker", "dockerd", "runc", "ip"):
        assert shutil.which(program, path=path) is None, program
    env = dict(os.environ, AGENTRUN_DEV_HOME=str(home), PATH=path)

    def dev(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "agentrun_operator.cli", "dev", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert "Traceback" not in done.stdout + done.stderr, (args, done.stdout + done.stderr)
        return done

    def one_line_refusal(*args: str) -> str:
        done = dev(*args)
        assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
        return done.stderr

    run_dir = home / "run"
    names = (*COMPONENTS, *SERVICES)
    try:
        up = dev("up")
        assert up.returncode == 0, up.stderr
        pids = {n: r.pid for n in names if (r := processes.read_record(run_dir, n)) is not None}
        assert set(pids) == set(names) and not any(gone(p) for p in pids.values()), pids
        assert dev("status").returncode == 0
        assert f"export KUBECONFIG={home / 'kubeconfig'}" in dev("env").stdout

        assert "--runtime kubelet" in one_line_refusal("restart", "containerd")
        assert "no pod default/nothing" in one_line_refusal("logs", "nothing")
        assert str(tmp_path / "absent.yaml") in one_line_refusal("run", str(tmp_path / "absent.yaml"))

        down = dev("down")
        assert down.returncode == 0, down.stderr
        assert [n for n, p in pids.items() if not gone(p)] == []
        eventually(lambda: processes_mentioning(str(home)) == [], 10, "every process of the state to exit")
        assert not list(run_dir.glob("*.pid"))
        stopped = dev("status")
        assert stopped.returncode == 1 and "stopped" in stopped.stdout
        again = dev("down")
        assert again.returncode == 0 and "nothing was running" in again.stderr, again.stderr
    finally:  # whatever `down` left (it crashed before the fix): stopped by the pids `up` recorded
        for name in names:
            processes.stop_process(run_dir, name)


@dataclass
class Dev:
    """The module's local default: its state directory and the first `dev up`'s answer."""

    home: Path
    first: subprocess.CompletedProcess[str]
    plane: ControlPlane


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    home = tmp_path_factory.mktemp("dev-cli") / "dev"
    first = agentrun(home, "dev", "up")
    try:
        assert first.returncode == 0, first.stderr
        yield Dev(home, first, ControlPlane(home, bin_dir()))
    finally:
        agentrun(home, "dev", "down")  # the last test took it down already (`down` is idempotent)


def _pids(home: Path) -> dict[str, int | None]:
    run_dir = home / "run"
    names = (*COMPONENTS, "pod-runner", "operator")
    return {n: (r.pid if (r := processes.read_record(run_dir, n)) else None) for n in names}


def test_dev_up_is_idempotent_and_status_and_env_describe_it(dev: Dev) -> None:
    home, plane = dev.home, dev.plane
    assert "control plane ready" in dev.first.stderr
    rows = {r.name: r for r in component_rows(plane)}
    assert set(COMPONENTS) | set(SERVICES) <= set(rows)
    assert all(r.healthy for r in rows.values()), rows
    pids = {name: r.pid for name, r in rows.items()}

    second = agentrun(home, "dev", "up")
    assert second.returncode == 0, second.stderr
    assert "control plane already running" in second.stderr
    assert "pod-runner already running" in second.stderr
    assert "operator already running" in second.stderr
    assert {r.name: r.pid for r in component_rows(plane)} == pids  # nothing restarted

    status = agentrun(home, "dev", "status")
    assert status.returncode == 0, status.stdout
    for name, pid in pids.items():
        line = next(ln for ln in status.stdout.splitlines() if ln.startswith(name))
        assert str(pid) in line and "healthy" in line

    env = agentrun(home, "dev", "env")
    assert f"export KUBECONFIG={home / 'kubeconfig'}" in env.stdout
    assert f"export PATH={bin_dir()}:" in env.stdout
    shell = subprocess.run(
        [
            "bash",
            "-c",
            f'eval "$({sys.executable} -m agentrun_operator.cli dev env)" && kubectl get crd -o name',
        ],
        env=dict(os.environ, AGENTRUN_DEV_HOME=str(home)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert "customresourcedefinition.apiextensions.k8s.io/agentruns.agents.proompteng.ai" in shell.stdout, (
        shell.stderr
    )


def test_dev_up_configures_the_admission_webhook(dev: Dev, tmp_path: Path) -> None:
    """The operator on the host serves the webhook on loopback; `kubectl apply` of a run the CRD
    admits but the operator refuses is refused with `agentrun validate`'s line
    (docs/operations.md#admission-webhook)."""

    def configured() -> list[dict[str, Any]] | None:  # the operator writes it just after it starts
        out = dev.plane.kubectl(
            "get", "validatingwebhookconfiguration", "agentrun-operator", "-o", "json", check=False
        )
        return (json.loads(out).get("webhooks") or None) if out.strip() else None

    webhooks = eventually(configured, timeout=60, what="the webhook configuration")
    assert {w["name"] for w in webhooks} >= {"agentruns.agents.proompteng.ai"}
    assert all(w["clientConfig"]["url"].startswith("https://127.0.0.1:") for w in webhooks)
    assert all(w["failurePolicy"] == "Ignore" for w in webhooks)
    case, manifest, field = OPERATOR_ONLY_AGENTRUNS[0]
    path = tmp_path / f"{case}.json"
    path.write_text(json.dumps(manifest))
    expected = agentrun(dev.home, "validate", str(path)).stdout.strip().removeprefix(f"{path}: ")
    assert f": {field}: " in expected

    def refused() -> str:
        proc = subprocess.run(
            [str(bin_dir() / "kubectl"), f"--kubeconfig={dev.home / 'kubeconfig'}", "apply", "-f", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        return proc.stderr if "denied the request" in proc.stderr else ""

    stderr = eventually(refused, 60, "the webhook to refuse the run")
    assert stderr.split("denied the request: ", 1)[1].strip() == expected


def test_dev_run_follows_an_example_and_logs_show_its_containers(dev: Dev) -> None:
    home = dev.home
    ran = agentrun(home, "dev", "run", str(EXAMPLES / "fixed-loop.yaml"), "--timeout", "240")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "Succeeded" in ran.stdout and "LoopMaxIterationsReached" in ran.stdout
    assert "iteration 3 of 3" in ran.stdout
    pod = next(p for p in (home / "pods" / "default").iterdir() if "iter-3" in p.name).name
    logs = agentrun(home, "dev", "logs", pod)
    assert logs.returncode == 0 and "iteration 3 of 3" in logs.stdout, logs.stderr
    reporter = agentrun(home, "dev", "logs", pod, "-c", "reporter")
    assert '"status":"missing"' in reporter.stdout, reporter.stdout + reporter.stderr


def test_dev_run_shows_the_gate_it_waits_at_with_the_approve_command_and_a_real_reason(dev: Dev) -> None:
    """docs/local-dev.md#run: the STEP column is the full path, the wait names the approve command
    with the gate's required input, and a run still waiting when --timeout passes says so (no None).
    The run is brought to its gate first (applied by `dev run`, then waited for by its condition),
    and followed again with `--keep`: the timeout passes while it waits there, however busy the
    machine, and nobody waits out a long one."""
    example = str(EXAMPLES / "approval-loop.yaml")
    started = agentrun(dev.home, "dev", "run", example, "--timeout", "1")
    assert started.returncode in (0, 1), started.stdout + started.stderr

    def at_gate() -> bool:
        code, body = dev.plane.api_get(
            "/apis/agents.proompteng.ai/v1alpha1/namespaces/default/agentruns/approval-loop"
        )
        conditions = (json.loads(body).get("status") or {}).get("conditions") or [] if code == 200 else []
        return any(c.get("type") == "AwaitingApproval" and c.get("status") == "True" for c in conditions)

    eventually(at_gate, timeout=300, what="approval-loop waiting at its gate")
    ran = agentrun(dev.home, "dev", "run", example, "--keep", "--timeout", "2")
    shown = ran.stdout + ran.stderr
    assert ran.returncode == 1, shown  # it waits for a person: dev run gives up, the run goes on
    assert re.search(r"^approval-loop +Running +develop/iteration 1/sign-off +1/5$", ran.stdout, re.M), shown
    assert (
        "  awaiting approval: step develop/iteration 1/sign-off: awaiting approval: Review change.log"
        in ran.stdout
    ), shown
    assert (
        "approve with `agentrun approve approval-loop -n default --step develop/sign-off --input "
        "verdict=VALUE` (required: verdict: revise (another iteration) or final)"
    ) in ran.stdout, shown
    assert "reason: still Running: step develop/iteration 1/sign-off AwaitingApproval" in ran.stdout, shown
    assert "None" not in ran.stdout, shown
    decided = agentrun(
        dev.home,
        "reject",
        "approval-loop",
        "--step",
        "develop/sign-off",
        "--reason",
        "done",
        "--kubeconfig",
        str(dev.home / "kubeconfig"),
    )
    assert decided.returncode == 0, decided.stderr


def test_up_restarts_only_what_is_down_on_the_same_ports(dev: Dev) -> None:
    home, plane = dev.home, dev.plane
    ports = plane.ports()
    pids = _pids(home)

    # The API server dies: `up` restarts it alone, on its port; everything else keeps running.
    os.kill(pids["kube-apiserver"] or 0, signal.SIGKILL)
    again = agentrun(home, "dev", "up")
    assert again.returncode == 0, again.stderr
    after = _pids(home)
    assert after["kube-apiserver"] != pids["kube-apiserver"]
    assert {k: v for k, v in after.items() if k != "kube-apiserver"} == {
        k: v for k, v in pids.items() if k != "kube-apiserver"
    }
    assert plane.ports() == ports
    assert "etcd already running" in again.stderr

    # `dev restart` of etcd and of the pod runner: new processes, same addresses.
    for component in ("etcd", "pod-runner"):
        restarted = agentrun(home, "dev", "restart", component)
        assert restarted.returncode == 0, restarted.stderr
        assert _pids(home)[component] != after[component]
    assert plane.ports() == ports
    status = agentrun(home, "dev", "status")
    assert status.returncode == 0, status.stdout

    # A port taken by someone else while the rest runs: `up` names it and says what to do.
    kcm = _pids(home)["kube-controller-manager"]
    os.kill(kcm or 0, signal.SIGKILL)
    eventually(
        lambda: not processes.port_open(ports.controller_manager), 30, "the killed one's port to close"
    )
    with socket.create_server(("127.0.0.1", ports.controller_manager)):
        taken = agentrun(home, "dev", "up")
    assert taken.returncode == 1
    assert f"kube-controller-manager cannot start on its port {ports.controller_manager}" in taken.stderr
    assert "agentrun dev down" in taken.stderr

    # A state directory of another version: refused, nothing touched.
    (home / "state-format").write_text("0\n")
    old = agentrun(home, "dev", "up")
    assert old.returncode == 1 and "state format '0'" in old.stderr, old.stderr
    assert (home / "etcd-data").is_dir()
    (home / "state-format").write_text("2\n")
    back = agentrun(home, "dev", "up")
    assert back.returncode == 0, back.stderr
    assert plane.ports() == ports


def test_down_with_a_pod_running_leaves_nothing(dev: Dev) -> None:
    home, plane = dev.home, dev.plane
    pids = {r.name: r.pid for r in component_rows(plane)}
    # A pod still running when `down` comes.
    plane.kubectl("run", "sleeper", "--image=busybox", "--restart=Never", "--command", "--", "sleep", "7781")
    eventually(lambda: processes_with("sleep", "7781"), timeout=120, what="the sleeper to run")
    assert processes_mentioning(str(home))
    ports = plane.ports()

    down = agentrun(home, "dev", "down")
    assert down.returncode == 0, down.stderr
    # SIGKILLed processes take a moment to exit (and a shim's orphans to be reaped) after `down` returns.
    eventually(
        lambda: not processes_with("sleep", "7781") and processes_mentioning(str(home)) == [],
        timeout=10,
        what="every process of the pod and of the local default to exit",
    )
    assert mounts_mentioning(str(home)) == []
    for pid in pids.values():
        assert pid is not None
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    for port in (ports.etcd_client, ports.etcd_peer, ports.apiserver, ports.controller_manager):
        assert not processes.port_open(port)
    stopped = agentrun(home, "dev", "status")
    assert stopped.returncode == 1 and "stopped" in stopped.stdout
    for name in pids:
        assert name in stopped.stdout
    assert not list((home / "run").glob("*.pid"))
