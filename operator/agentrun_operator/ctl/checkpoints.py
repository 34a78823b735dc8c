"""`agentrun checkpoints NAME` and `agentrun resume NAME --from-iteration N` (docs/concepts.md#resume).

The checkpoints live on the run's volume, which the CLI never mounts; what it lists comes from the
run's status (`iterations[].checkpoint`, recorded from each pod's report). The pure parts
(`checkpoint_rows`, `resume_manifest`) take the run as the API server returned it.
"""

from __future__ import annotations

import copy
import json
from typing import Any, TextIO

from agentrun_operator.ctl import render
from agentrun_operator.ctl.commands import _fail, _runs_path, get_run
from agentrun_operator.ctl.connect import CtlError, Target

DOCS = "docs/concepts.md#resume"
FINISHED = ("Succeeded", "Failed", "Cancelled")
"""A source run in one of these phases no longer writes its claim: only then may a new run restore into it."""


def _loop_steps(run: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(name, spec, status) of each top-level step whose loop has checkpoints."""
    steps = ((run.get("spec") or {}).get("workflow") or {}).get("steps") or []
    statuses = {s.get("name"): s for s in ((render.status_of(run).get("workflow") or {}).get("steps") or [])}
    out = []
    for step in steps:
        mode = ((step.get("loop") or {}).get("checkpoint") or {}).get("mode", "None")
        if mode != "None":
            out.append((str(step.get("name")), step, statuses.get(step.get("name")) or {}))
    return out


def checkpoint_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per checkpoint the run's status records: step, iteration, id, files, bytes, added
    bytes, time (the iteration's start) and what its pod restored."""
    rows: list[dict[str, Any]] = []
    for name, _, status in _loop_steps(run):
        for record in ((status.get("loop") or {}).get("iterations")) or []:
            checkpoint = record.get("checkpoint")
            if not isinstance(checkpoint, dict) or not checkpoint.get("id"):
                continue
            rows.append(
                {
                    "step": name,
                    "iteration": record.get("index"),
                    "id": checkpoint["id"],
                    "files": checkpoint.get("files"),
                    "bytes": checkpoint.get("bytes"),
                    "addedBytes": checkpoint.get("addedBytes"),
                    "time": record.get("startedAt"),
                    "restored": checkpoint.get("restored"),
                }
            )
    return rows


def render_rows(rows: list[dict[str, Any]]) -> str:
    """A table, as kubectl prints one; `-` for what is unknown."""
    if not rows:
        return "No checkpoints recorded (does the run's loop have loop.checkpoint?).\n"
    header = ["STEP", "ITERATION", "ID", "FILES", "SIZE", "ADDED", "TIME", "RESTORED"]
    table = [header] + [
        [
            str(r["step"]),
            str(r["iteration"]),
            str(r["id"]),
            _dash(r["files"]),
            _size(r["bytes"]),
            _size(r["addedBytes"]),
            _dash(r["time"]),
            _dash(r["restored"]),
        ]
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "".join(
        "   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n" for row in table
    )


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _size(value: Any) -> str:
    if not isinstance(value, int):
        return "-"
    amount = float(value)
    for unit in ("B", "KiB", "MiB"):
        if amount < 1024:
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} GiB"


def resume_manifest(
    source: dict[str, Any], iteration: int, name: str | None, step: str | None
) -> dict[str, Any]:
    """The new run: the source's spec (without `cancel`, `resumeFrom` and `idempotencyKey`, which
    belong to the source), its labels, and `spec.resumeFrom`. Refused, naming the fix, when the source
    has no checkpoint of iteration N's end (the one recorded at iteration N+1's start)."""
    meta = source.get("metadata") or {}
    source_name = str(meta.get("name"))
    loops = _loop_steps(source)
    if step is not None:
        loops = [entry for entry in loops if entry[0] == step]
    if not loops:
        which = f"looping step {step!r} with" if step else "looping step with"
        raise CtlError(
            f"AgentRun {source_name} has no {which} loop.checkpoint, so it has no checkpoints to resume from "
            f"(fix: add loop.checkpoint: {{mode: Files}} to the loop of new runs; see {DOCS})"
        )
    step_name, _, status = loops[0]
    if iteration < 1:
        raise CtlError(f"--from-iteration must be 1 or more, not {iteration} (see {DOCS})")
    phase = render.status_of(source).get("phase")
    if phase not in FINISHED:
        raise CtlError(
            f"cannot resume AgentRun {source_name} while it is {phase or 'Pending'}: the new run restores "
            "its checkpoint into the same claim, under the running iteration's feet (fix: wait for it to "
            f"end, or `agentrun cancel {source_name}` first; see {DOCS})"
        )
    recorded = {r["iteration"]: r for r in checkpoint_rows(source) if r["step"] == step_name}
    following = recorded.get(iteration + 1)
    if following is None:
        last = ((status.get("loop") or {}).get("currentIteration")) or 0
        if iteration >= last:
            why = (
                f"iteration {iteration} is its last (it ran {last}): no later iteration recorded the end "
                "of it; the volume as the run left it is that state (fix: start a new run on the same claim)"
            )
        else:
            why = (
                f"no checkpoint of iteration {iteration + 1}'s start is in its status (pruned from the "
                "history, or its pod did not report one; fix: pick another iteration from "
                "agentrun checkpoints)"
            )
        raise CtlError(f"cannot resume AgentRun {source_name} from iteration {iteration}: {why}; see {DOCS}")
    spec = copy.deepcopy(source.get("spec") or {})
    for key in ("cancel", "resumeFrom", "idempotencyKey", "approvals"):
        spec.pop(key, None)
    spec["resumeFrom"] = {"run": source_name, "iteration": iteration, "step": step_name}
    new_meta: dict[str, Any] = {"name": name or f"{source_name}-from-{iteration}"}
    if meta.get("namespace"):
        new_meta["namespace"] = meta["namespace"]
    if meta.get("labels"):
        new_meta["labels"] = dict(meta["labels"])
    return {"apiVersion": source.get("apiVersion"), "kind": "AgentRun", "metadata": new_meta, "spec": spec}


async def checkpoints(target: Target, name: str, output: str, out: TextIO) -> int:
    run = await get_run(target.kube, target, name)
    rows = checkpoint_rows(run)
    if output == "json":
        out.write(json.dumps(rows, indent=2) + "\n")
    elif output == "yaml":
        out.write(render.render_object({"checkpoints": rows}, "yaml"))
    else:
        out.write(render_rows(rows))
    return 0


async def resume(
    target: Target,
    name: str,
    iteration: int,
    new_name: str | None,
    step: str | None,
    output: str,
    out: TextIO,
) -> int:
    kube = target.kube
    source = await get_run(kube, target, name)
    manifest = resume_manifest(source, iteration, new_name, step)
    created = manifest["metadata"]["name"]
    status, body = await kube.request("POST", _runs_path(target.namespace), body=manifest)
    if status == 409:
        raise CtlError(f"AgentRun {created} already exists (fix: --name another name; see {DOCS})")
    if status not in (200, 201):
        await _fail(kube, target, status, body, created, "create")
    if output in ("json", "yaml"):
        out.write(render.render_object(body, output))
    else:
        checkpoint = manifest["spec"]["resumeFrom"]
        out.write(
            f"AgentRun {created} created: it starts from {name}'s state at the end of iteration "
            f"{checkpoint['iteration']} (step {checkpoint['step']})\n"
        )
    return 0
