"""loop.warm in the iteration pod (docs/design.md#warm-pod): `main` becomes a shell loop around the
workload's command, the reporter becomes the supervisor the operator calls, and the Job carries the
digest of its pod template so the planner knows when the next iteration may run in the same pod.
Pure."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Final

from agentrun_operator import naming
from agentrun_operator.api import LoopWarm
from agentrun_operator.jobs.reporter_container import META_VOLUME
from agentrun_operator.jobs.warm import WARM_DIR, WARM_MOUNT, WARM_SUBPATH, warm_main_command

KEY_VOLUME: Final = naming.WARM_KEY_VOLUME
KEY_MOUNT: Final = "/agentrun-warm-key"
KEY_ITEM: Final = "key"
KEY_FILE: Final = f"{KEY_MOUNT}/{KEY_ITEM}"
POD_IP_ENV: Final = "AGENTRUN_POD_IP"
FIRST_ID_ARG: Final = "--warm-first-id"
WARM_META_SIZE: Final = "16Mi"
"""The meta volume of a warm pod also holds each iteration's env file (AGENTRUN_OUTPUTS may be
large); the supervisor removes an iteration's files once its result is acknowledged."""

PER_ITERATION_ENV: Final = frozenset(
    {
        "AGENTRUN_ITERATION",
        "AGENTRUN_ATTEMPT",
        "AGENTRUN_PREVIOUS_CONTROL",
        "AGENTRUN_PREVIOUS",
        "AGENTRUN_ITEM",
        "AGENTRUN_ITEM_INDEX",
        "AGENTRUN_OUTPUTS",
    }
)
"""What the operator sends with each start (docs/design.md#warm-pod); every other part of the pod
must be the same for the next iteration to run in it."""
PER_ITERATION_LABELS: Final = (
    naming.LABEL_ITERATION,
    naming.LABEL_ATTEMPT,
    naming.LABEL_STEP_ITERATION,
    naming.LABEL_STEP_PATH,
)
"""And the step's address and path in a loop body (`1i3-1`, `develop/iteration 3/implement`): a
pass of the body is an iteration of the pod."""


def iteration_id(iteration: int, attempt: int) -> str:
    """An iteration attempt's id in its warm pod: a second start of it is a no-op. `iteration` is the
    loop's (a loop body's child: the body's pass, AGENTRUN_ITERATION)."""
    return f"{iteration}-{attempt}"


def job_iteration_id(job: dict[str, Any]) -> str:
    """The id of the iteration attempt a Job was built for, from its labels (AGENTRUN_ITERATION's
    iteration, the attempt)."""
    labels = job["metadata"]["labels"]
    return iteration_id(int(labels[naming.LABEL_ITERATION]), int(labels[naming.LABEL_ATTEMPT]))


def add_warm(
    job_spec: dict[str, Any],
    warm: LoopWarm,
    run_name: str,
    port: int,
    first_id: str,
) -> None:
    """Turn an iteration Job's spec (`main`, the reporter, the volumes) into a warm loop's: see the
    module docstring. The Job gets no `activeDeadlineSeconds`: its pod outlives an iteration, and the
    planner times each iteration itself (planner/warm.py)."""
    job_spec.pop("activeDeadlineSeconds", None)
    template = job_spec["template"]
    template["metadata"]["labels"][naming.LABEL_WARM] = "true"
    pod = template["spec"]
    reporter, main = pod["containers"][0], pod["containers"][1]
    command = main.pop("command", None) or []
    args = main.pop("args", None) or []
    main["command"] = warm_main_command(list(command), list(args))
    main["volumeMounts"] = [
        *main.get("volumeMounts", []),
        {"name": META_VOLUME, "mountPath": WARM_MOUNT, "subPath": WARM_SUBPATH},
    ]
    reporter["args"] = [
        *reporter["args"],
        "--warm",
        "--warm-port",
        str(port),
        "--warm-key-file",
        KEY_FILE,
        "--warm-dir",
        WARM_DIR,
        "--warm-idle-seconds",
        str(warm.idle_seconds),
        FIRST_ID_ARG,
        first_id,
    ]
    reporter["env"] = [
        *reporter.get("env", []),
        {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    reporter["volumeMounts"] = [
        *reporter["volumeMounts"],
        {"name": KEY_VOLUME, "mountPath": KEY_MOUNT, "readOnly": True},
    ]
    for volume in pod["volumes"]:
        if volume["name"] == META_VOLUME:
            volume["emptyDir"] = {"sizeLimit": WARM_META_SIZE}
    pod["volumes"].append(
        {
            "name": KEY_VOLUME,
            "secret": {
                "secretName": naming.warm_secret_name(run_name),
                "items": [{"key": KEY_ITEM, "path": KEY_ITEM}],
                "defaultMode": 0o444,
            },
        }
    )


def _without_iteration(template: dict[str, Any]) -> dict[str, Any]:
    """The pod template without what changes from one iteration to the next: the iteration labels,
    the per-iteration variables' values, the first id and the node preference (the pod is already
    on a node)."""
    stripped = copy.deepcopy(template)
    labels = stripped.get("metadata", {}).get("labels", {})
    for key in PER_ITERATION_LABELS:
        labels.pop(key, None)
    stripped.get("metadata", {}).get("annotations", {}).pop(naming.ANNOTATION_STEP, None)
    pod = stripped.get("spec", {})
    pod.pop("affinity", None)
    for container in pod.get("containers", []):
        for var in container.get("env", []):
            if var.get("name") in PER_ITERATION_ENV:
                var.pop("value", None)
        args = container.get("args")
        if isinstance(args, list) and FIRST_ID_ARG in args:
            where = args.index(FIRST_ID_ARG)
            container["args"] = args[:where] + args[where + 2 :]
    return stripped


def template_digest(job: dict[str, Any]) -> str:
    """The digest a warm Job carries (`naming.ANNOTATION_WARM_TEMPLATE`) and the planner compares:
    equal exactly when two iterations' Jobs differ only per iteration."""
    template = _without_iteration(job["spec"]["template"])
    text = json.dumps(template, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def iteration_env(job: dict[str, Any]) -> dict[str, str]:
    """What a start sends for the iteration of `job` (a Job built for it, never created): the values
    of the per-iteration variables of its `main`."""
    main = job["spec"]["template"]["spec"]["containers"][1]
    return {
        str(var["name"]): str(var["value"])
        for var in main.get("env", [])
        if var.get("name") in PER_ITERATION_ENV and "value" in var
    }
