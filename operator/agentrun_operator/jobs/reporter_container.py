"""The operator's own container in every iteration pod: the `reporter`, a regular container listed
before `main`, its postStart hook, `main`'s gate, and the names and files of the pod's layout it
shares with the Job builder (docs/design.md#iteration-pod, docs/design.md#reporter-first). Pure."""

from __future__ import annotations

from typing import Any, Final

from agentrun_operator.config import OperatorConfig
from agentrun_operator.control.gate import HOOK_MARK
from agentrun_operator.control.reporter import JOB_UID_ENV, POD_UID_ENV

REPORTER_CONTAINER: Final = "reporter"
MAIN_CONTAINER: Final = "main"
"""The workload's container, listed after the reporter, in a run with loops."""
ORIGINAL_CONTAINER: Final = "agent-runner"
"""The workload's container in a run without loops: the original controller's name, so its tooling
(`kubectl logs -c agent-runner`) keeps working (docs/migration.md#runner-pod)."""
WORKLOAD_CONTAINERS: Final = frozenset({MAIN_CONTAINER, ORIGINAL_CONTAINER})
"""Either name of the workload's container, as the shell finds it in a pod's status."""
FINGERPRINT_CONTAINER: Final = "fingerprint"
"""The init container of pods made by builds before the fingerprint hook: the shell reads its claim
report until the release after 0.1.0 removes it (docs/operations.md#earlier-pods)."""
META_VOLUME: Final = "agentrun-meta"
META_MOUNT: Final = "/agentrun-meta"
FINGERPRINT_FILE: Final = f"{META_MOUNT}/fingerprint.json"
REPORTER_READY_FILE: Final = f"{META_MOUNT}/reporter-ready"
CLAIM_REPORT_FILE: Final = f"{META_MOUNT}/claim.json"
HOOK_DONE_FILE: Final = f"{META_MOUNT}/hook-done"
GATE_SUBPATH: Final = "gate"
GATE_FILE: Final = f"{META_MOUNT}/{GATE_SUBPATH}"
GATE_MOUNT: Final = "/.agentrun-gate"
"""Where `main` mounts its gate: the meta volume's `gate`, an empty read-only directory once the
hook opened it; a symlink out of the volume while it is shut, which the kubelet refuses to mount."""
GATE_REFUSAL: Final = f'failed to prepare subPath for volumeMount "{META_VOLUME}"'
"""How the kubelet's message for a `main` held at a shut gate begins (`CreateContainerConfigError`)."""
KNOCK_SUBPATH: Final = "knock"
KNOCK_FILE: Final = f"{META_MOUNT}/{KNOCK_SUBPATH}"
KNOCK_MOUNT: Final = "/.agentrun-knock"
"""`main` mounts the meta volume's `knock` before its gate: nobody but the kubelet makes it (a
missing subPath, made as a directory as it prepares `main`'s mounts), so it tells the reporter that
the kubelet tried to start `main` (control/gate.py, docs/design.md#hook-lost)."""
HOOK_FAILED_FILE: Final = f"{META_MOUNT}/hook-failed"
"""What the postStart hook writes when it fails (the kubelet then kills the reporter)."""
TERMINATION_LOG: Final = "/dev/termination-log"
JOB_UID_LABEL: Final = "batch.kubernetes.io/controller-uid"
"""The Job controller labels each pod with its Job's uid (Kubernetes >= 1.27)."""
JOB_UID_FIELD: Final = f"metadata.labels['{JOB_UID_LABEL}']"

HELPER_RESOURCES: Final[dict[str, dict[str, str]]] = {
    "requests": {"cpu": "10m", "memory": "32Mi"},
    "limits": {"memory": "128Mi"},
}
"""Requests of the reporter container: it idles (its postStart hook a shell loop beside it), then
parses at most 64 KiB of JSON."""


def helper_container(
    name: str, subcommand: str, args: list[str], mounts: list[dict[str, Any]], config: OperatorConfig
) -> dict[str, Any]:
    """A container of the operator image running `agentrun reporter <subcommand>`."""
    return {
        "name": name,
        "image": config.reporter_image,
        # The operator's own release image: on the node after the first pod, never worth a registry
        # round trip per pod, even when configured by a moving tag such as `latest`
        # (docs/design.md#iteration-pod).
        "imagePullPolicy": "IfNotPresent",
        "command": ["agentrun", "reporter", subcommand],
        "args": args,
        "resources": HELPER_RESOURCES,
        "volumeMounts": mounts,
    }


def reporter_container(
    path: str,
    mounts: list[dict[str, Any]],
    config: OperatorConfig,
    claim_dir: str | None = None,
    claim_volume: str = "",
) -> dict[str, Any]:
    """The regular container, listed before `main`, that claims the Job and fingerprints the control
    file before `main` (`--before-main`), then watches for `main`'s end and reports the control
    envelope via its termination message (`--hook-done`); its postStart hook holds `main` back until
    then and opens `main`'s gate only for the pod that holds the claim (docs/design.md#reporter-first)."""
    args = ["--path", path, "--fingerprint", FINGERPRINT_FILE, "--termination-log", TERMINATION_LOG]
    args += ["--hook-done", HOOK_DONE_FILE, "--ready-file", REPORTER_READY_FILE, "--before-main"]
    args += ["--gate", GATE_FILE, "--knock", KNOCK_FILE, "--hook-failed", HOOK_FAILED_FILE]
    if claim_dir is not None:
        args += [
            "--claim-dir",
            claim_dir,
            "--claim-volume",
            claim_volume,
            "--claim-report",
            CLAIM_REPORT_FILE,
        ]
    container = {
        **helper_container(REPORTER_CONTAINER, "report", args, mounts, config),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "lifecycle": ready_lifecycle(),
    }
    if claim_dir is not None:
        container["env"] = [
            {"name": JOB_UID_ENV, "valueFrom": {"fieldRef": {"fieldPath": JOB_UID_FIELD}}},
            {"name": POD_UID_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        ]
    return container


def gate_mount() -> dict[str, Any]:
    """`main`'s mount of its gate (`GATE_MOUNT`): what keeps `main` of a duplicate pod from starting."""
    return {"name": META_VOLUME, "mountPath": GATE_MOUNT, "subPath": GATE_SUBPATH, "readOnly": True}


def knock_mount() -> dict[str, Any]:
    """`main`'s mount of the knock (`KNOCK_MOUNT`), listed before its gate: the kubelet makes the
    knock even when it then refuses the shut gate."""
    return {"name": META_VOLUME, "mountPath": KNOCK_MOUNT, "subPath": KNOCK_SUBPATH, "readOnly": True}


READY_HOOK_SCRIPT: Final = (
    'failed=$5; fail() { echo "agentrun: $1" >&2; echo "$1" > "$failed"; exit 1; }; '
    '{ ln -sfnT / "$3" || [ -L "$3" ]; } || fail "cannot shut main\'s gate"; '
    'i=0; while [ ! -s "$1" ]; do i=$((i+1)); '
    'if [ "$i" -gt "$2" ]; then fail "the reporter was not ready in time; main stays shut"; fi; '
    'sleep 0.02; done; read -r ready < "$1"; '
    'case "$ready" in '
    'taken) fail "another pod of this Job holds its claim; this duplicate never runs main";; '
    '""|*[!0-9]*) fail "the reporter will not run main ($ready): see its termination message";; esac; '
    'rm -f "$3" && mkdir "$3" || fail "cannot open main\'s gate"; '
    'read -r _ _ _ _ last < /proc/loadavg; echo "$last $$" > "$4"'
)
"""The reporter's postStart hook. First it shuts `main`'s gate (a symlink out of the volume: the
kubelet will not mount it, so `main` waits with `CreateContainerConfigError`; the reporter may have
made that symlink already, control/gate.py). Then it waits (20 ms polls, bounded) until the reporter
says it is ready; for the reporter's pid it opens the gate (an empty directory) and, as its last act,
writes the namespace's last PID and its own, with shell builtins only, so no process of the hook is
created after the watermark (control/mainwatch.py). For `taken` (a duplicate pod), `blind` (a
reporter that cannot see `main`, control/reporter.py `refuse_blind`), or a reporter that is never
ready, it fails with the gate shut, saying why on stderr and in `hook-failed` (so the reporter
knows the hook failed on purpose rather than was lost, control/gate.py): the kubelet kills the
reporter and goes on to `main`, which it cannot create. A shell loop rather than Python: it starts
in milliseconds."""
READY_HOOK_POLLS: Final = 1500
"""30 s of 20 ms polls: far more than the reporter's start, claim and fingerprint take."""
READY_HOOK_POLLS_CHECKPOINT: Final = 180_000
"""An hour of 20 ms polls, for a pod whose reporter records a checkpoint before it is ready
(loop.checkpoint): the first checkpoint copies the whole workspace, about 10 s per GB, and a hook
that gave up would have the kubelet kill the reporter in the middle of it, attempt after attempt. The
kubelet puts no bound of its own on an exec hook; the step's `timeoutSeconds` still ends the pod."""


def ready_hook(polls: int = READY_HOOK_POLLS) -> list[str]:
    """The command of the reporter's postStart hook (`READY_HOOK_SCRIPT` with its arguments)."""
    return [
        "sh",
        "-c",
        READY_HOOK_SCRIPT,
        HOOK_MARK,
        REPORTER_READY_FILE,
        str(polls),
        GATE_FILE,
        HOOK_DONE_FILE,
        HOOK_FAILED_FILE,
    ]


def ready_lifecycle(polls: int = READY_HOOK_POLLS) -> dict[str, Any]:
    """The reporter's `lifecycle`: its postStart hook (`ready_hook`) waiting `polls` polls for it."""
    return {"postStart": {"exec": {"command": ready_hook(polls)}}}
