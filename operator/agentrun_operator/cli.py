"""The `agentrun` command (also installed as `kubectl-agentrun`, so `kubectl agentrun` works)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def _cmd_crds(args: argparse.Namespace) -> int:
    from agentrun_operator.api.crd import render_crds_yaml, write_crds

    if args.write:
        for path in write_crds(Path(args.write)):
            print(path)
        return 0
    sys.stdout.write(render_crds_yaml())
    return 0


DEV_CLUSTER_MISSING = (
    "agentrun dev: the local development cluster is not installed here. It is its own distribution, "
    "agentrun-devcluster (operator/devcluster/ in the repository), and not part of the operator's "
    "wheel or image. From a checkout: `make setup`, or `pip install -e operator/devcluster`; "
    "see docs/development.md#dev-cluster-package"
)


def _cmd_dev(args: argparse.Namespace) -> int:
    try:
        from agentrun_devcluster import dev, toolchain
        from agentrun_devcluster.controlplane import ControlPlaneError
        from agentrun_devcluster.dockerengine import EngineUnavailable
        from agentrun_devcluster.podrunner.runtime import RuntimeUnavailable
        from agentrun_devcluster.podrunner.sandbox import SandboxUnavailable
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith(("agentrun_devcluster", "cryptography")):
            raise
        print(DEV_CLUSTER_MISSING, file=sys.stderr)
        return 2

    try:
        if args.dev_command == "up":
            return dev.up(operator=not args.no_operator, runtime=args.runtime)
        if args.dev_command == "down":
            return dev.down(purge=args.purge)
        if args.dev_command == "restart":
            return dev.restart(args.component)
        if args.dev_command == "status":
            return dev.status()
        if args.dev_command == "env":
            return dev.env()
        if args.dev_command == "logs":
            return dev.logs(args.pod, args.container, args.namespace, args.previous)
        if args.dev_command == "run":
            return dev.run_example(Path(args.manifest), args.namespace, args.timeout, fresh=not args.keep)
        if args.dev_command == "pod-runner":
            from agentrun_devcluster.podrunner.main import run_pod_runner

            return run_pod_runner(
                Path(args.kubeconfig),
                Path(args.state_dir),
                args.node,
                tuple(args.namespace or ()),
            )
        if args.dev_command == "provisioner":
            import logging

            from agentrun_devcluster.provisioner import run_provisioner

            logging.basicConfig(
                level=logging.INFO,
                format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                stream=sys.stderr,
            )
            run_provisioner(Path(args.kubeconfig), Path(args.state_dir), args.node)
            return 0
        if args.dev_command == "tools":
            print(toolchain.ensure_tools())
            if args.prometheus:
                toolchain.ensure_prometheus()
            return 0
        if args.dev_command == "engine":
            return dev.engine(stop=args.stop)
        if args.dev_command == "base-images":
            return dev.base_images()
        if args.dev_command == "image":
            return dev.image(args.tag, args.base, with_busybox=args.with_busybox)
    except (
        toolchain.ToolchainError,
        ControlPlaneError,
        SandboxUnavailable,
        EngineUnavailable,
        RuntimeUnavailable,
    ) as exc:
        print(f"agentrun dev {args.dev_command}: {exc}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:
        # The last line of defence (each command checks what it needs and says so itself): a program
        # or file this host lacks is named in one line, never as a traceback.
        if exc.filename is None:
            raise
        print(
            f"agentrun dev {args.dev_command}: {exc.filename} is missing on this host ({exc.strerror})",
            file=sys.stderr,
        )
        return 1
    raise AssertionError(args.dev_command)


def _cmd_operator(args: argparse.Namespace) -> int:
    from agentrun_operator.config import ConfigError
    from agentrun_operator.shell.main import run_operator

    try:
        return run_operator(
            kubeconfig=args.kubeconfig,
            metrics_port=args.metrics_port,
            liveness_port=args.liveness_port,
            log_format=args.log_format,
            workers=args.workers,
            standalone=not args.peering,
            peering_name=args.peering_name,
        )
    except ConfigError as exc:
        print(f"agentrun operator: invalid configuration: {exc}", file=sys.stderr)
        return 2


def _cmd_reporter(args: argparse.Namespace) -> int:
    from agentrun_operator.control.reporter import main as reporter_main

    return int(reporter_main(list(args.reporter_args)))


def _cmd_validate(args: argparse.Namespace) -> int:
    from agentrun_operator.validation_cli import main as validate_main

    return int(
        validate_main(
            list(args.files), loops_enabled=not args.loops_disabled, max_iterations=args.max_iterations
        )
    )


def _default_image_tag() -> str:
    from agentrun_operator.config import DEFAULT_REPORTER_IMAGE

    return DEFAULT_REPORTER_IMAGE


def _cmd_ctl(args: argparse.Namespace) -> int:
    from agentrun_operator.ctl.main import run_ctl

    return run_ctl(args)


def _add_ctl_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from agentrun_operator.ctl.args import add_arguments

    status = sub.add_parser(
        "status",
        help="show a run: phase, conditions, steps, iterations, stop reasons, last control, durations",
    )
    add_arguments(status)
    status.add_argument(
        "--timeline",
        action="store_true",
        help="draw each step's iterations and attempts as bars on one time axis (waits, retries, slow ones)",
    )
    status.set_defaults(func=_cmd_ctl)

    watch = sub.add_parser(
        "watch",
        help="follow a run, one line per change; exit 0 Succeeded, 1 Failed, 2 Cancelled, 3 timeout",
    )
    add_arguments(watch)
    watch.add_argument(
        "--timeout", type=float, default=0.0, help="give up after this many seconds (exit 3); 0: never"
    )
    watch.set_defaults(func=_cmd_ctl)

    cancel = sub.add_parser("cancel", help="cancel a run (Immediate: delete its active Job now)")
    add_arguments(cancel)
    cancel.add_argument(
        "--graceful", action="store_true", help="let the running iteration finish, then start nothing more"
    )
    cancel.set_defaults(func=_cmd_ctl)

    approve = sub.add_parser(
        "approve", help="approve a waiting approval gate (appends to spec.approvals), with its inputs"
    )
    add_arguments(approve)
    _add_gate_arguments(approve)
    approve.add_argument(
        "--input",
        action="append",
        metavar="KEY=VALUE",
        help="a value of one of the gate's declared inputs (repeatable)",
    )
    approve.add_argument("--reason", help="an optional note kept with the decision")
    approve.set_defaults(func=_cmd_ctl)

    reject = sub.add_parser(
        "reject", help="reject a waiting approval gate (its step fails: ApprovalRejected)"
    )
    add_arguments(reject)
    _add_gate_arguments(reject)
    reject.add_argument("--reason", required=True, help="why (required; shown in the run's message)")
    reject.set_defaults(func=_cmd_ctl)

    checkpoints = sub.add_parser(
        "checkpoints", help="list a run's checkpoints (loop.checkpoint): id, iteration, size, time"
    )
    add_arguments(checkpoints)
    checkpoints.set_defaults(func=_cmd_ctl)

    resume = sub.add_parser(
        "resume", help="create a new run that starts from a run's state at the end of an iteration"
    )
    add_arguments(resume)
    resume.add_argument(
        "--from-iteration",
        type=int,
        required=True,
        metavar="N",
        help="the source iteration whose end to start from",
    )
    resume.add_argument("--name", dest="new_name", help="the new run's name (default: NAME-from-N)")
    resume.add_argument("--step", help="the source's looping step (default: the first with loop.checkpoint)")
    resume.set_defaults(func=_cmd_ctl)

    logs = sub.add_parser(
        "logs",
        help="print the workload's log of a run's attempt (default: its latest), following with -f",
    )
    add_arguments(logs, output=False)
    logs.add_argument(
        "--step",
        metavar="PATH",
        help="the step's path as logs name it, e.g. develop/review (all its attempts)",
    )
    logs.add_argument("--iteration", type=int, metavar="N", help="only this iteration (needs --step)")
    logs.add_argument("--attempt", type=int, metavar="A", help="only this attempt (needs --step)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing while the attempt runs")
    logs.add_argument("-c", "--container", help="a container of the pod (default: the workload's)")
    logs.set_defaults(func=_cmd_ctl)


def _add_gate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--step", required=True, metavar="PATH", help="the gate's path as logs name it, e.g. develop/sign-off"
    )
    parser.add_argument(
        "--iteration",
        type=int,
        help="the iteration of the loop body the gate waits in (default: the one it waits in now)",
    )


def build_parser() -> argparse.ArgumentParser:
    # Imported here, not at the top: `agentrun reporter` (every iteration pod, twice) never builds
    # this parser, and the version's lookup (importlib.metadata) costs it ~0.2 s of startup.
    from agentrun_operator import __version__

    parser = argparse.ArgumentParser(prog="agentrun", description=__doc__)
    parser.add_argument("--version", action="version", version=f"agentrun {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    crds = sub.add_parser("crds", help="print the CRDs generated from the API models")
    crds.add_argument("--write", metavar="DIR", help="write one file per CRD into DIR instead")
    crds.set_defaults(func=_cmd_crds)

    op = sub.add_parser("operator", help="run the operator (configuration from the environment)")
    op.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    op.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics on this port")
    op.add_argument("--liveness-port", type=int, default=0, help="serve /healthz on this port")
    op.add_argument("--log-format", choices=["json", "text"], default="json")
    op.add_argument("--workers", type=int, default=32, help="concurrent reconciles (one per run at a time)")
    op.add_argument("--peering", action="store_true", help="use kopf peering (hot standby replicas)")
    op.add_argument(
        "--peering-name",
        default="agentrun-operator",
        help="the kopf peering object of this operator's replicas (with --peering)",
    )
    op.set_defaults(func=_cmd_operator)

    rep = sub.add_parser("reporter", help="the in-pod reporter of the loop-control file", add_help=False)
    rep.add_argument("reporter_args", nargs=argparse.REMAINDER)
    rep.set_defaults(func=_cmd_reporter)

    val = sub.add_parser("validate", help="validate AgentRun manifests offline, as the operator would")
    val.add_argument("files", nargs="+", metavar="FILE")
    val.add_argument("--loops-disabled", action="store_true", help="validate as if loops were switched off")
    val.add_argument("--max-iterations", type=int, default=None, help="the installation's iteration cap")
    val.set_defaults(func=_cmd_validate)

    _add_ctl_commands(sub)

    dev = sub.add_parser("dev", help="the local control plane for development and tests")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True)
    runtime_help = (
        "how pods run: process (the local pod runner: host tools in a sandbox, the default), "
        "kubelet (a real node: the upstream kubelet on containerd; root)"
    )
    up = dev_sub.add_parser("up", help="build the tools if needed and start everything (idempotent)")
    up.add_argument(
        "--no-operator",
        action="store_true",
        help="start the control plane and the pod runner only (install the operator with Helm)",
    )
    up.add_argument(
        "--runtime",
        choices=["process", "kubelet"],
        default=None,
        help=f"{runtime_help}; what runs keeps running until `agentrun dev down`",
    )
    down = dev_sub.add_parser("down", help="stop everything `up` started")
    down.add_argument("--purge", action="store_true", help="also delete the state directory")
    restart = dev_sub.add_parser(
        "restart", help="restart one component in place (same address and data; pods keep running)"
    )
    restart.add_argument(
        "component",
        choices=(
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "pod-runner",
            "operator",
            "containerd",
            "kubelet",
            "kube-scheduler",
            "provisioner",
        ),
    )
    dev_sub.add_parser("status", help="show each component, its pid and health")
    dev_sub.add_parser("env", help='print shell exports: eval "$(agentrun dev env)"')
    tools = dev_sub.add_parser(
        "tools", help="build (or reuse) the control plane tools and print their directory"
    )
    tools.add_argument(
        "--prometheus", action="store_true", help="also Prometheus and promtool (for the monitoring tests)"
    )
    logs = dev_sub.add_parser("logs", help="print a container's log from the local pod runner")
    logs.add_argument("pod")
    logs.add_argument("-c", "--container", help="container name (default: the pod's first container)")
    logs.add_argument("-n", "--namespace", default="default")
    logs.add_argument("-p", "--previous", action="store_true", help="the log of the previous restart")
    run = dev_sub.add_parser("run", help="apply an example, follow it to the end, show status and files")
    run.add_argument("manifest")
    run.add_argument("-n", "--namespace", default="default")
    run.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
    run.add_argument("--keep", action="store_true", help="keep an earlier run of it and its PVC files")
    runner = dev_sub.add_parser("pod-runner", help="run the local pod runner in the foreground")
    runner.add_argument("--kubeconfig", required=True)
    runner.add_argument("--state-dir", required=True, help="pods, logs and PVC directories go here")
    runner.add_argument("--node", default="agentrun-local", help="the Node it registers")
    runner.add_argument("--namespace", action="append", help="watch only this namespace (repeatable)")
    prov = dev_sub.add_parser("provisioner", help="run the local provisioner in the foreground (real node)")
    prov.add_argument("--kubeconfig", required=True)
    prov.add_argument("--state-dir", required=True, help="volumes go under <state-dir>/pv")
    prov.add_argument("--node", required=True, help="the Node whose disk holds the volumes")
    engine = dev_sub.add_parser(
        "engine", help="make sure a Docker engine answers (root: install and start one)"
    )
    engine.add_argument("--stop", action="store_true", help="stop the dockerd `agentrun dev engine` started")
    dev_sub.add_parser(
        "base-images", help="make the local python and busybox base images from Debian packages"
    )
    image = dev_sub.add_parser("image", help="build the operator image with a Docker engine (`make image`)")
    image.add_argument("--tag", default=_default_image_tag(), help="image tag (default: %(default)s)")
    image.add_argument(
        "--base",
        choices=["auto", "local", "registry"],
        default="auto",
        help="build from the pinned registry base, the local Debian-made one, or whichever is available",
    )
    image.add_argument("--with-busybox", action="store_true", help="also make busybox:1.36 for the examples")
    dev.set_defaults(func=_cmd_dev)
    return parser


CLUSTER_COMMANDS = ("status", "watch", "cancel", "approve", "reject", "logs", "checkpoints", "resume")
USAGE_ERROR_EXIT = 4
"""Bad arguments of a cluster command exit 4, not argparse's 2 (which `watch` uses for Cancelled)."""


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:2] == ["reporter", "promote"]:  # loop.candidates' promotion pod
        from agentrun_operator.control.promote import main as promote_main

        return int(promote_main(args_list[2:]))
    if args_list[:1] == ["reporter"]:
        # Straight to the reporter's own parser: argparse.REMAINDER would refuse a leading option
        # (`agentrun reporter --help` exited 2 with "unrecognized arguments").
        from agentrun_operator.control.reporter import main as reporter_main

        return int(reporter_main(args_list[1:]))
    try:
        args = build_parser().parse_args(args_list)
    except SystemExit as exc:
        if exc.code == 2 and args_list and args_list[0] in CLUSTER_COMMANDS:
            return USAGE_ERROR_EXIT
        raise
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
