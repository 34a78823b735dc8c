"""`agentrun dev`: the local default environment — control plane, local pod runner and operator.

State lives under `~/.agentrun/dev` (or `$AGENTRUN_DEV_HOME`); tools come from the shared cache.
Every component is a detached process with a pid file under `<home>/run/`, so `up` is idempotent and
`down` (from any shell) stops them all. The pod runner keeps its pods' files and logs under
`<home>/pods/`, and its local provisioner the volumes bound to PersistentVolumeClaims under
`<home>/pv/` (one directory per volume, removed when its claim is deleted).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agentrun_devcluster import processes, toolchain, webhookcert
from agentrun_devcluster.controlplane import COMPONENTS, ControlPlane, ControlPlaneError, check_state_format
from agentrun_devcluster.podrunner.adopt import stop_leftovers
from agentrun_operator import naming
from agentrun_operator.ctl import render

RUNNER = "pod-runner"
OPERATOR = "operator"
SERVICES = (RUNNER, OPERATOR)
HEALTH_STALE_SECONDS = 15.0
RUN_LOOPS_ENV = {
    "AGENTS_CONTROLLER_WORKFLOW_LOOPS_ENABLED": "true",
    "AGENTS_CONTROLLER_RESYNC_SECONDS": "10",
}


def dev_home() -> Path:
    return Path(os.environ.get("AGENTRUN_DEV_HOME") or Path.home() / ".agentrun" / "dev").expanduser()


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def control_plane(home: Path | None = None) -> ControlPlane:
    return ControlPlane(home or dev_home(), toolchain.bin_dir(), progress=_say)


def write_generated_crds(directory: Path) -> Path:
    """Write the CRDs generated from the models (the one source of truth) for installation."""
    from agentrun_operator.api.crd import write_crds

    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.yaml"):
        old.unlink()
    write_crds(directory)
    return directory


# ----------------------------------------------------------------------------------- services


def _cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "agentrun_operator.cli", *args]


def _service_env() -> dict[str, str]:
    env = dict(os.environ)
    venv_bin = str(Path(sys.executable).parent)
    if venv_bin not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    return env


def _operator_port_file(home: Path) -> Path:
    return home / "run" / "operator.json"


def runner_healthy(home: Path) -> bool:
    """The runner's heartbeat is fresh and its watches are up."""
    try:
        doc = json.loads((home / "run" / "pod-runner.health.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(doc.get("watching")) and time.time() - float(doc.get("time", 0)) < HEALTH_STALE_SECONDS


def operator_healthy(home: Path) -> bool:
    """kopf's liveness endpoint answers 200."""
    try:
        port = int(json.loads(_operator_port_file(home).read_text())["port"])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return bool(resp.status == 200)
    except (OSError, ValueError, KeyError):
        return False


def _wait_healthy(
    home: Path,
    name: str,
    check: Callable[[Path], bool],
    proc: subprocess.Popen[bytes] | None = None,
    timeout: float = 90.0,
) -> None:
    deadline = time.monotonic() + timeout
    run_dir = home / "run"
    while time.monotonic() < deadline:
        record = processes.read_record(run_dir, name)
        exited = proc.poll() is not None if proc is not None else record is None or not record.alive()
        if exited:
            log = home / "logs" / f"{name}.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise ControlPlaneError(f"{name} exited at start; log: {log}\n{tail}")
        if check(home):
            return
        time.sleep(0.2)
    raise ControlPlaneError(f"{name} did not become healthy within {timeout:.0f}s; see {home / 'logs'}")


def start_runner(plane: ControlPlane, namespaces: tuple[str, ...] = ()) -> None:
    argv = _cli_argv(
        "dev",
        "pod-runner",
        f"--kubeconfig={plane.kubeconfig}",
        f"--state-dir={plane.home}",
    ) + [f"--namespace={ns}" for ns in namespaces]
    proc = processes.start_process(
        plane.run_dir, RUNNER, argv, plane.log_dir / f"{RUNNER}.log", env=_service_env()
    )
    _wait_healthy(plane.home, RUNNER, runner_healthy, proc)


def webhook_env(home: Path) -> dict[str, str]:
    """The admission webhook on the local default (docs/operations.md#admission-webhook): the operator
    and the API server share the host's loopback, so the API server calls https://127.0.0.1:PORT with
    the dev cluster's self-signed certificate (`webhookcert`); failurePolicy Ignore (a stopped
    operator blocks nothing)."""
    return {
        "AGENTS_WEBHOOK_PORT": str(processes.free_port()),
        "AGENTS_WEBHOOK_ADDRESS": "127.0.0.1",
        "AGENTS_WEBHOOK_HOST": "127.0.0.1",
        "AGENTS_WEBHOOK_CERT_DIR": str(webhookcert.ensure(home / "webhook")),
    }


def start_operator(plane: ControlPlane, extra_env: dict[str, str] | None = None) -> None:
    port = processes.free_port()
    _operator_port_file(plane.home).parent.mkdir(parents=True, exist_ok=True)
    _operator_port_file(plane.home).write_text(json.dumps({"port": port}))
    env = {**_service_env(), **RUN_LOOPS_ENV, **webhook_env(plane.home), **(extra_env or {})}
    argv = _cli_argv("operator", f"--kubeconfig={plane.kubeconfig}", f"--liveness-port={port}")
    proc = processes.start_process(plane.run_dir, OPERATOR, argv, plane.log_dir / f"{OPERATOR}.log", env=env)
    _wait_healthy(plane.home, OPERATOR, operator_healthy, proc)


def check_runtime(runtime: str) -> str:
    """Fail before starting anything when the runtime cannot run; returns the runtime to use.

    process (the pod runner) needs bubblewrap; kubelet (the real node) needs what `host_problem` checks."""
    from agentrun_devcluster.podrunner.runtime import RuntimeUnavailable
    from agentrun_devcluster.podrunner.sandbox import find_bwrap

    if runtime == "kubelet":
        from agentrun_devcluster.node.host import host_problem

        problem = host_problem()
        if problem is not None:
            raise RuntimeUnavailable(problem)
        return runtime
    find_bwrap()
    return runtime


def _no_operator_marker(home: Path) -> Path:
    return home / "run" / "no-operator"


def running_runtime(home: Path) -> str | None:
    """The runtime since the last `up`: `kubelet` while the real node runs, `process` while the pod
    runner does (its heartbeat says so; `down` removes it), else None."""
    from agentrun_devcluster.node.node import CONTAINERD, KUBELET

    if any(
        (r := processes.read_record(home / "run", n)) is not None and r.alive() for n in (CONTAINERD, KUBELET)
    ):
        return "kubelet"
    try:
        value = json.loads((home / "run" / "pod-runner.health.json").read_text()).get("runtime")
    except (OSError, ValueError, AttributeError):
        return None
    return str(value) if value == "process" else None


def choose_runtime(requested: str | None, running: str | None) -> str:
    """The runtime `up` asks for: the runner keeps its own until `down` (its containers may outlive
    it); asking for another one meanwhile is refused rather than silently ignored."""
    if running is None:
        return requested or "process"
    if requested in (None, running):
        return running
    raise ControlPlaneError(
        f"the local default was started with --runtime {running} (its containers may still run); to "
        f"switch to --runtime {requested}, stop it all first: `agentrun dev down`, then "
        f"`agentrun dev up --runtime {requested}` (the cluster's objects and the claims' volumes are kept)"
    )


def up(operator: bool = True, runtime: str | None = None) -> int:
    """Start what is not running. `operator=False` (`--no-operator`) leaves the operator to a
    `helm install` of the chart (docs/operations.md#local-default) and stops the dev one if it runs.
    `runtime` is what runs the pods: process (the pod runner) or kubelet (the real node, see
    `check_runtime`); None: what runs already, else process."""
    runtime = check_runtime(choose_runtime(runtime, running_runtime(dev_home())))
    toolchain.ensure_tools(_say)
    plane = control_plane()
    check_state_format(plane.home, _say)  # a directory of another version: refused before any write
    images = node_images() if runtime == "kubelet" else []
    server = plane.server if plane.ports().apiserver else None
    recorded = plane.runtime
    plane.set_runtime(runtime)
    plane.start(crds_dir=write_generated_crds(plane.home / "crds"))
    if recorded != runtime and (recorded == "kubelet" or runtime == "kubelet") and server == plane.server:
        plane.restart("kube-controller-manager")  # its controllers depend on the kind of node
    if runtime == "kubelet":
        return _up_real_node(plane, images, operator, server)
    if server is not None and plane.server != server:  # new ports: services of the old address go
        _say(f"  the API server moved from {server} to {plane.server}: restarting the services")
        for name in reversed(SERVICES):
            processes.stop_process(plane.run_dir, name)
        stop_leftovers(plane.home)
    starters: dict[str, Callable[[], None]] = {
        RUNNER: lambda: start_runner(plane),
        OPERATOR: lambda: start_operator(plane),
    }
    checks = {RUNNER: runner_healthy, OPERATOR: operator_healthy}
    marker = _no_operator_marker(plane.home)
    if operator:
        marker.unlink(missing_ok=True)
    else:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("the operator is installed with Helm, not started by `agentrun dev up`\n")
        if processes.stop_process(plane.run_dir, OPERATOR, grace=20):
            _say(f"  {OPERATOR} stopped (--no-operator)")
    for name in SERVICES if operator else (RUNNER,):
        current = processes.read_record(plane.run_dir, name)
        if current is not None and current.alive():
            _say(f"  {name} already running (pid {current.pid})")
            if not checks[name](plane.home):
                _wait_healthy(plane.home, name, checks[name], timeout=30)
            continue
        processes.stop_process(plane.run_dir, name)  # a stale pid file
        starters[name]()
        record = processes.read_record(plane.run_dir, name)
        _say(f"  {name} ready (pid {record.pid if record else '?'})")
    _say(f'ready ({runtime} runtime). Use it with:  eval "$(agentrun dev env)"   (state: {plane.home})')
    return 0


def node_images() -> list[str]:
    """The images a real node needs (no registry): busybox for the examples and the operator image
    for the reporter, built with the local Docker engine (cached), then imported into containerd."""
    from agentrun_devcluster import baseimages, imagebuild
    from agentrun_devcluster.baseimages import BUSYBOX
    from agentrun_devcluster.dockerengine import EngineUnavailable
    from agentrun_devcluster.node.host import NodeUnavailable

    try:
        built = imagebuild.build_image_with_busybox(progress=_say)
    except EngineUnavailable as exc:
        raise NodeUnavailable(
            f"--runtime kubelet needs the operator image and busybox:1.36, made with a Docker engine: {exc}"
        ) from None
    images = [BUSYBOX, built.tag]
    try:  # only examples/git-loop.yaml needs it: a node without it still comes up
        images.append(baseimages.ensure_git_image(_say))
    except EngineUnavailable as exc:
        _say(f"warning: no {baseimages.GIT_IMAGE} (examples/git-loop.yaml needs it): {exc}")
    return images


def _up_real_node(plane: ControlPlane, images: list[str], operator: bool, server: str | None) -> int:
    """`up --runtime kubelet`: the real node instead of the pod runner, then the operator."""
    from agentrun_devcluster.node.node import RealNode

    if server is not None and plane.server != server:
        processes.stop_process(plane.run_dir, OPERATOR)
    if processes.stop_process(plane.run_dir, RUNNER, grace=20):
        _say(f"  {RUNNER} stopped (the real node runs the pods)")
    RealNode(plane, progress=_say).start(images)
    marker = _no_operator_marker(plane.home)
    if not operator:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("the operator is installed with Helm, not started by `agentrun dev up`\n")
        if processes.stop_process(plane.run_dir, OPERATOR, grace=20):
            _say(f"  {OPERATOR} stopped (--no-operator)")
    else:
        marker.unlink(missing_ok=True)
        current = processes.read_record(plane.run_dir, OPERATOR)
        if current is not None and current.alive():
            _say(f"  {OPERATOR} already running (pid {current.pid})")
        else:
            processes.stop_process(plane.run_dir, OPERATOR)
            start_operator(plane)
            _say(f"  {OPERATOR} ready")
    _say(
        'ready (kubelet runtime: a real node). Use it with:  eval "$(agentrun dev env)"   '
        f"(state: {plane.home})"
    )
    return 0


RESTARTABLE = (*COMPONENTS, RUNNER, OPERATOR)


def restart(component: str) -> int:
    """Stop one component and start it again with its address and data (tests and users: what
    survives what is in docs/local-dev.md#restarts)."""
    plane = control_plane()
    if component in COMPONENTS:
        plane.restart(component)
        return 0
    from agentrun_devcluster.node.node import NODE_COMPONENTS, RealNode

    if component in NODE_COMPONENTS:
        if plane.runtime != "kubelet":  # else a restart would install and start a node beside the runner
            raise ControlPlaneError(
                f"{component} belongs to the real node, and this local default runs the pod runner "
                f"({plane.runtime or 'process'} runtime): nothing to restart. The real node: "
                "`agentrun dev down`, then `agentrun dev up --runtime kubelet`"
            )
        RealNode(plane, progress=_say).restart(component)
        return 0
    if component not in SERVICES:
        raise ControlPlaneError(
            f"no component {component!r}; one of: {', '.join(RESTARTABLE + NODE_COMPONENTS)}"
        )
    if not plane.is_up():
        raise ControlPlaneError(
            f"the control plane is not up; run `agentrun dev up` before restarting {component}"
        )
    processes.stop_process(plane.run_dir, component, grace=20)  # the runner leaves its containers running
    if component == RUNNER:
        start_runner(plane)
    else:
        start_operator(plane)
    record = processes.read_record(plane.run_dir, component)
    _say(f"  {component} ready (pid {record.pid if record else '?'})")
    return 0


def down(purge: bool = False) -> int:
    plane = control_plane()
    stopped = [name for name in reversed(SERVICES) if processes.stop_process(plane.run_dir, name, grace=20)]
    if stop_leftovers(plane.home):  # containers outlive the runner, as on a node: stop them too
        stopped.append("pods")
    from agentrun_devcluster.node.node import RealNode

    stopped += RealNode(plane, progress=_say).stop()
    stopped += plane.stop()
    _operator_port_file(plane.home).unlink(missing_ok=True)
    (plane.home / "run" / "pod-runner.health.json").unlink(missing_ok=True)
    _say(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")
    if purge and plane.home.exists():
        shutil.rmtree(plane.home)
        _say(f"removed {plane.home}")
    return 0


@dataclass(frozen=True)
class Row:
    name: str
    pid: int | None
    running: bool
    healthy: bool
    log: str | None


def component_rows(plane: ControlPlane) -> list[Row]:
    rows = [Row(c.name, c.pid, c.running, c.healthy, c.log) for c in plane.component_status()]
    checks = {RUNNER: runner_healthy, OPERATOR: operator_healthy}
    services: tuple[str, ...] = SERVICES
    if plane.runtime == "kubelet":
        from agentrun_devcluster.node.node import NODE_COMPONENTS, RealNode

        node = RealNode(plane)
        for name in NODE_COMPONENTS:
            record = processes.read_record(plane.run_dir, name)
            running = record is not None and record.alive()
            rows.append(
                Row(
                    name,
                    record.pid if record else None,
                    running,
                    running and node.healthy(name),
                    record.log if record else None,
                )
            )
        services = (OPERATOR,)
    for name in services:
        record = processes.read_record(plane.run_dir, name)
        running = record is not None and record.alive()
        if name == OPERATOR and not running and _no_operator_marker(plane.home).exists():
            continue  # `up --no-operator`: the chart's operator pod serves instead
        rows.append(
            Row(
                name,
                record.pid if record else None,
                running,
                running and checks[name](plane.home),
                record.log if record else None,
            )
        )
    return rows


def status() -> int:
    plane = control_plane()
    rows = component_rows(plane)
    print(f"{'COMPONENT':<26}{'PID':>8}  {'STATE':<10}LOG")
    for row in rows:
        state = "healthy" if row.healthy else ("running" if row.running else "stopped")
        print(f"{row.name:<26}{row.pid or '-':>8}  {state:<10}{row.log or '-'}")
    if all(r.healthy for r in rows):
        print(f"server: {plane.server}\nkubeconfig: {plane.kubeconfig}\nstate: {plane.home}")
        return 0
    return 1


def env() -> int:
    plane = control_plane()
    path = f"{toolchain.bin_dir()}:{os.environ.get('PATH', '')}"
    print(f"export KUBECONFIG={shlex.quote(str(plane.kubeconfig))}")
    print(f"export PATH={shlex.quote(path)}")
    return 0


# ----------------------------------------------------------------------------------- docker


def engine(stop: bool = False) -> int:
    """`agentrun dev engine [--stop]`: make sure a Docker engine answers (see `dockerengine`)."""
    from agentrun_devcluster import dockerengine

    if stop:
        stopped = dockerengine.stop_engine()
        _say(
            "stopped the dockerd `agentrun dev engine` started"
            if stopped
            else "no dockerd of ours was running"
        )
        return 0
    dockerengine.ensure_engine(_say)
    if dockerengine.current_session() is None and dockerengine.keep_engine():
        _say("the dockerd a test run started is yours now: no test run's end will stop it")
    _say("a Docker engine answers")
    return 0


def base_images() -> int:
    """`agentrun dev base-images`: the local Python base, busybox:1.36 and the git image from Debian
    packages."""
    from agentrun_devcluster import baseimages

    print(baseimages.ensure_python_base(_say))
    print(baseimages.ensure_busybox(_say))
    print(baseimages.ensure_git_image(_say))
    return 0


def image(tag: str, base: str, with_busybox: bool = False) -> int:
    """`agentrun dev image` (`make image`): build the operator image (see `imagebuild`)."""
    from agentrun_devcluster import imagebuild

    if with_busybox:
        built = imagebuild.build_image_with_busybox(tag, base, _say)
    else:
        built = imagebuild.build_image(tag, base, _say)
    _say(f"image {built.tag} ({'cached' if built.cached else 'built'}, from {built.base})")
    print(built.tag)
    return 0


# ----------------------------------------------------------------------------------- logs


def find_pod_dir(home: Path, namespace: str, pod: str) -> Path | None:
    """The newest run of pod `namespace/pod` under the runner's state (pods are kept by uid)."""
    base = home / "pods" / namespace / pod
    runs = [p for p in base.glob("*/pod.json")] if base.is_dir() else []
    if not runs:
        return None
    return max(runs, key=lambda p: p.stat().st_mtime).parent


def logs(pod: str, container: str | None = None, namespace: str = "default", previous: bool = False) -> int:
    home = dev_home()
    if running_runtime(home) == "kubelet":  # a real node serves its logs: kubectl's way
        argv = [
            str(toolchain.bin_dir() / "kubectl"),
            f"--kubeconfig={control_plane().kubeconfig}",
            "logs",
            "-n",
            namespace,
            pod,
        ]
        argv += [f"--container={container}"] if container else []
        argv += ["--previous"] if previous else []
        return subprocess.run(argv, check=False).returncode
    pod_dir = find_pod_dir(home, namespace, pod)
    if pod_dir is None:
        print(f"agentrun dev logs: no pod {namespace}/{pod} has run here ({home / 'pods'})", file=sys.stderr)
        return 1
    meta = json.loads((pod_dir / "pod.json").read_text())
    name = container or meta.get("default")
    if name not in meta.get("containers", []):
        print(
            f"agentrun dev logs: container {name!r} is not in pod {pod}; "
            f"choose one of: {' '.join(meta.get('containers', []))}",
            file=sys.stderr,
        )
        return 1
    files = sorted((pod_dir / "logs" / str(name)).glob("*.log"), key=lambda p: int(p.stem))
    if previous:
        files = files[:-1]
    if not files:
        print(f"agentrun dev logs: container {name} of {pod} has no log (yet)", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(files[-1].read_bytes())
    sys.stdout.flush()
    return 0


# ----------------------------------------------------------------------------------- run an example


def _claims(run: dict[str, Any]) -> list[str]:
    spec = run.get("spec") or {}
    workloads = [spec.get("workload") or {}]
    workloads += [s.get("workload") or {} for s in (spec.get("workflow") or {}).get("steps") or []]
    claims: list[str] = []
    for workload in workloads:
        for volume in workload.get("volumes") or []:
            claim = volume.get("claimName")
            if volume.get("type") == "pvc" and claim and claim not in claims:
                claims.append(str(claim))
    return claims


def _progress_line(run: dict[str, Any]) -> str:
    """NAME, PHASE, the full path of the step being executed (through groups, loop bodies and
    switches), the innermost loop's iteration, the reason; a line is printed when any changes."""
    status = run.get("status") or {}
    path = render.active_path(run)
    loops = [
        s.get("loop") or {}
        for s in render.steps_of(run)
        if s.get("loop")
        and path is not None
        and (path == s.get("name") or path.startswith(f"{s.get('name')}/"))
    ]
    loop = loops[-1] if loops else {}
    iteration = f"{loop.get('currentIteration', '-')}/{loop.get('maxIterations', '-')}" if loop else "-"
    return (
        f"{run['metadata']['name']:<40} {status.get('phase') or 'Pending':<10} "
        f"{path or '-':<{STEP_COLUMN}} {iteration:<9} {status.get('reason') or ''}".rstrip()
    )


STEP_COLUMN = 32


def _step_summary(step: Any) -> str:
    """`step develop/iteration 2/sign-off: Succeeded (Approved)`; a loop's completed iterations and
    its stop reason once it has one (nothing is printed as `None`)."""
    loop = step.get("loop") or {}
    reason = loop.get("stopReason") or step.get("reason")
    line = f"step {step.get('name')}: {step.get('phase') or 'Pending'}"
    if loop:
        line += f", {loop.get('completedIterations') or 0} iterations"
    return line + (f", stop reason {reason}" if loop and reason else f" ({reason})" if reason else "")


def _approval_line(run: dict[str, Any]) -> str | None:
    """While a gate waits: what it asks and the exact approve command (its required inputs as flags),
    from the run's AwaitingApproval condition; `dev run` keeps following meanwhile."""
    waiting = render.approval_waits(run)
    return f"  awaiting approval: {waiting}" if waiting else None


JOB_CLAIMS = Path(".agentrun-claims")
"""Each iteration pod's claim of its Job (docs/concepts.md#exactly-once): counted, not shown."""


CHECKPOINT_STORE = Path(".agentrun/checkpoints")
"""loop.checkpoint's store (docs/concepts.md#checkpoints): its manifests counted, its files not shown."""


def _show_files(root: Path, limit: int = 2048) -> None:
    if not root.exists():
        print(f"  (nothing: {root} does not exist)")
        return
    files = sorted(p for p in root.rglob("*") if p.is_file())
    claims = [p for p in files if p.relative_to(root).parent == JOB_CLAIMS]
    if claims:
        print(f"--- {JOB_CLAIMS}/: {len(claims)} Job claim(s), one per iteration pod that ran (not shown)")
    store = [p for p in files if p.relative_to(root).is_relative_to(CHECKPOINT_STORE)]
    if store:
        manifests = [p for p in store if p.parent.name == "manifests"]
        print(
            f"--- {CHECKPOINT_STORE}/: {len(manifests)} checkpoint(s), {len(store)} file(s) of the store "
            "(not shown; agentrun checkpoints NAME lists them)"
        )
    hidden = set(claims) | set(store)
    for path in files:
        if path in hidden:
            continue
        rel = path.relative_to(root)
        data = path.read_bytes()
        print(f"--- {rel} ({len(data)} bytes)")
        text = data[:limit].decode("utf-8", "replace")
        print(text.rstrip("\n") + ("\n  …" if len(data) > limit else ""))


def claim_directory(plane: ControlPlane, namespace: str, claim: str) -> Path | None:
    """The directory of the local volume bound to `claim`, if it is bound to one."""
    from agentrun_devcluster.provisioner import local_path

    code, body = plane.api_get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
    volume = (json.loads(body).get("spec") or {}).get("volumeName") if code == 200 else None
    if not volume:
        return None
    code, body = plane.api_get(f"/api/v1/persistentvolumes/{volume}")
    path = local_path(json.loads(body)) if code == 200 else None
    return Path(path) if path else None


def run_example(
    manifest: Path, namespace: str = "default", timeout: float = 300.0, fresh: bool = True
) -> int:
    """Apply an example, follow its AgentRun(s) to the end, print the status and the volume's files."""
    plane = control_plane()
    if not plane.is_up():
        raise ControlPlaneError("the local default is not running; start it with `agentrun dev up`")
    try:
        docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ControlPlaneError(f"cannot read {manifest}: {' '.join(str(exc).split())}") from None
    if not all(isinstance(d, dict) for d in docs):
        raise ControlPlaneError(f"{manifest}: every YAML document must be a Kubernetes object (a mapping)")
    runs = [d for d in docs if d.get("kind") == "AgentRun"]
    if not all(isinstance((r.get("metadata") or {}).get("name"), str) for r in runs):
        raise ControlPlaneError(
            f"{manifest}: an AgentRun without metadata.name (`dev run` follows runs by name)"
        )
    claims = [c for r in runs for c in _claims(r)]
    base = f"/apis/agents.proompteng.ai/v1alpha1/namespaces/{namespace}/agentruns"
    if fresh:
        for run in runs:
            name = run["metadata"]["name"]
            if plane.api_get(f"{base}/{name}")[0] == 200:
                _say(f"deleting the previous run {namespace}/{name}")
                plane.kubectl("delete", "agentrun", name, "-n", namespace, "--wait=true", "--timeout=120s")
            # Its Jobs and pods too, at once: the new run's Jobs have the same deterministic names,
            # and the garbage collector only learns about CRDs at its 30 s discovery resync.
            selector = f"{naming.LABEL_RUN}={naming.label_value(name)}"
            for kind in ("jobs", "pods"):
                plane.kubectl(
                    "delete",
                    kind,
                    "-n",
                    namespace,
                    "-l",
                    selector,
                    "--cascade=foreground",
                    "--wait=true",
                    "--timeout=120s",
                    "--ignore-not-found",
                )
        # The claims too (their volumes, and files, are reclaimed), so the example starts afresh.
        for claim in claims:
            plane.kubectl(
                "delete", "pvc", claim, "-n", namespace, "--wait=true", "--timeout=120s", "--ignore-not-found"
            )
    _say(plane.kubectl("apply", "-n", namespace, "-f", str(manifest)).rstrip())
    print(f"{'NAME':<40} {'PHASE':<10} {'STEP':<{STEP_COLUMN}} {'ITERATION':<9} REASON", flush=True)
    deadline = time.monotonic() + timeout
    last: dict[str, str] = {}
    waits: dict[str, str | None] = {}
    final: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline and len(final) < len(runs):
        for run in runs:
            name = run["metadata"]["name"]
            code, body = plane.api_get(f"{base}/{name}")
            if code != 200:
                continue
            obj = json.loads(body)
            line = _progress_line(obj)
            gate = _approval_line(obj)
            if last.get(name) != line:
                last[name] = line
                print(line, flush=True)
            if gate is not None and waits.get(name) != gate:
                print(gate, flush=True)
            waits[name] = gate
            if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Cancelled"):
                final[name] = obj
        time.sleep(0.5)
    for run in runs:
        name = run["metadata"]["name"]
        print()
        print(plane.kubectl("get", "agentrun", name, "-n", namespace).rstrip())
        code, body = plane.api_get(f"{base}/{name}")
        obj = json.loads(body) if code == 200 else {}
        status = obj.get("status") or {}
        print(
            f"phase: {status.get('phase') or 'Pending'}  reason: {render.outcome_reason(obj)}  "
            f"message: {status.get('message') or '-'}"
        )
        if name not in final:
            print(
                f"(not finished when dev run stopped following it after {timeout:.0f}s; it goes on: "
                f"agentrun watch {name} -n {namespace})"
            )
        for step in render.steps_of(obj):
            print(_step_summary(step))
            loop = step.get("loop") or {}
            for it in loop.get("iterations") or []:
                print(
                    f"  iteration {it.get('index')}: {it.get('phase')} (attempts {it.get('attempts')}) "
                    f"{it.get('message') or ''}".rstrip()
                )
    for claim in claims:
        root = claim_directory(plane, namespace, claim)
        if root is None:
            print(f"\nPVC {claim}: not bound to a volume of the local provisioner (nothing to show)")
            continue
        print(f"\nfiles the iterations left on PVC {claim} ({root}):")
        _show_files(root)
    if len(final) < len(runs):
        _say(f"timed out after {timeout:.0f}s before every run ended")
        return 1
    return 0
