"""The operator's own container in every iteration pod: the `reporter` native sidecar, its postStart
hook, and the names and files of the pod's layout it shares with the Job builder
(docs/design.md#iteration-pod, docs/design.md#fingerprint-hook). Pure."""

from __future__ import annotations

from typing import Any, Final

from agentrun_operator.config import OperatorConfig
from agentrun_operator.control.reporter import JOB_UID_ENV, POD_UID_ENV

REPORTER_CONTAINER: Final = "reporter"
FINGERPRINT_CONTAINER: Final = "fingerprint"
"""The init container pods made before the fingerprint hook have (the shell still reads its report)."""
META_VOLUME: Final = "agentrun-meta"
META_MOUNT: Final = "/agentrun-meta"
FINGERPRINT_FILE: Final = f"{META_MOUNT}/fingerprint.json"
REPORTER_READY_FILE: Final = f"{META_MOUNT}/reporter-ready"
CLAIM_REPORT_FILE: Final = f"{META_MOUNT}/claim.json"
TERMINATION_LOG: Final = "/dev/termination-log"
JOB_UID_FIELD: Final = "metadata.labels['batch.kubernetes.io/controller-uid']"
"""The Job controller labels each pod with its Job's uid (Kubernetes >= 1.27)."""

HELPER_RESOURCES: Final[dict[str, dict[str, str]]] = {
    "requests": {"cpu": "10m", "memory": "32Mi"},
    "limits": {"memory": "128Mi"},
}
"""Requests of the reporter container: it idles (its postStart hook a shell loop beside it), then
parses at most 64 KiB of JSON."""


def _helper_container(
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
    """The native sidecar that claims the Job and fingerprints the control file before `main`
    (`--before-main`), then reports the control envelope via its termination message; its postStart
    hook holds `main` back until then (docs/design.md#fingerprint-hook)."""
    args = ["--path", path, "--fingerprint", FINGERPRINT_FILE, "--termination-log", TERMINATION_LOG]
    args += ["--wait-for-signal", "--ready-file", REPORTER_READY_FILE, "--before-main"]
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
        **_helper_container(REPORTER_CONTAINER, "report", args, mounts, config),
        "restartPolicy": "Always",
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "lifecycle": {"postStart": {"exec": {"command": ready_hook()}}},
    }
    if claim_dir is not None:
        container["env"] = [
            {"name": JOB_UID_ENV, "valueFrom": {"fieldRef": {"fieldPath": JOB_UID_FIELD}}},
            {"name": POD_UID_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        ]
    return container


READY_HOOK_SCRIPT: Final = (
    'i=0; while [ ! -s "$1" ]; do i=$((i+1)); '
    'if [ "$i" -gt "$2" ]; then echo "agentrun: the reporter was not ready in time" >&2; exit 1; fi; '
    "sleep 0.05; done; "
    'if [ "$(cat "$1")" = taken ]; then '
    'echo "agentrun: another pod of this Job holds its claim; this duplicate never runs main" >&2; exit 1; fi'
)
"""The reporter's postStart hook: wait (50 ms polls, bounded) until the reporter says it is ready; fail
for `taken` (a duplicate pod) or when it never does, so the kubelet kills and restarts the reporter
and `main` never starts. A shell loop rather than Python: it starts in milliseconds."""
READY_HOOK_POLLS: Final = 600
"""30 s of 50 ms polls: far more than the reporter's start, claim and fingerprint take."""


def ready_hook() -> list[str]:
    """The command of the reporter's postStart hook (`READY_HOOK_SCRIPT` with its arguments)."""
    return ["sh", "-c", READY_HOOK_SCRIPT, "agentrun-ready", REPORTER_READY_FILE, str(READY_HOOK_POLLS)]
