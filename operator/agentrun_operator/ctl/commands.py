"""`agentrun status | watch | cancel | approve | reject NAME`: a few API calls each; what they print
comes from `render`.

Exit codes: `status`, `cancel`, `approve` and `reject` 0 when done; `watch` 0 Succeeded, 1 Failed,
2 Cancelled, 3 when `--timeout` passed first. Any command that cannot do its job (run not found,
forbidden, no credentials, API server unreachable, a decision refused) prints one line to stderr and
exits 4.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, TextIO

import aiohttp

from agentrun_operator.api import GROUP, VERSION, AgentRun, ApprovalDecision, parse_agentrun
from agentrun_operator.api.approval import Decision
from agentrun_operator.ctl import render
from agentrun_operator.ctl import timeline as ctl_timeline
from agentrun_operator.ctl.connect import CtlError, Target
from agentrun_operator.planner.approval import DOCS, Gate, decision_problems, find_gate, why_not_waiting
from agentrun_operator.planner.tree import walk
from agentrun_operator.problem import Problem
from agentrun_operator.resolution import effective_steps
from agentrun_operator.shell.kube import Kube

WATCH_CHUNK_SECONDS = 240
CANCEL_ATTEMPTS = 5


def _runs_path(namespace: str | None, name: str | None = None) -> str:
    base = f"/apis/{GROUP}/{VERSION}"
    path = f"{base}/namespaces/{namespace}/agentruns" if namespace else f"{base}/agentruns"
    return f"{path}/{name}" if name else path


def _api_message(body: dict[str, Any]) -> str:
    return str(body.get("message") or body.get("reason") or "no message").strip()


async def _fail(kube: Kube, target: Target, status: int, body: dict[str, Any], name: str, verb: str) -> None:
    """Turn a non-2xx answer about AgentRun `name` into the one-line error a person can act on."""
    ns = target.namespace
    if status == 404:
        details = body.get("details") or {}
        if details.get("name") != name:
            raise CtlError(
                f"the AgentRun API ({GROUP}/{VERSION}) is not installed on {target.server}: "
                "install the CRDs (`agentrun crds | kubectl apply -f -`) or pick another --context"
            )
        elsewhere = await _namespaces_holding(kube, name)
        hint = f"; it exists in namespace {', '.join(elsewhere)} (use -n {elsewhere[0]})" if elsewhere else ""
        raise CtlError(f'AgentRun "{name}" not found in namespace "{ns}"{hint}')
    if status == 403:
        raise CtlError(f"forbidden: {_api_message(body)} (credentials from {target.source})")
    if status == 401:
        raise CtlError(f"unauthorized: the API server refused the credentials from {target.source}")
    raise CtlError(f"{verb} AgentRun {ns}/{name}: HTTP {status}: {_api_message(body)}")


async def _namespaces_holding(kube: Kube, name: str) -> list[str]:
    """Namespaces that have an AgentRun called `name` (empty when not allowed to list cluster-wide)."""
    query = {"fieldSelector": f"metadata.name={name}"}
    try:
        status, body = await kube.request("GET", _runs_path(None), query=query)
    except (TimeoutError, aiohttp.ClientError):
        return []
    if status != 200:
        return []
    return sorted(str((i.get("metadata") or {}).get("namespace")) for i in body.get("items") or [])


async def get_run(kube: Kube, target: Target, name: str) -> dict[str, Any]:
    status, body = await kube.request("GET", _runs_path(target.namespace, name))
    if status != 200:
        await _fail(kube, target, status, body, name, "get")
    return body


# ----------------------------------------------------------------------------------- status


async def status(
    target: Target,
    name: str,
    output: str,
    colour: bool,
    out: TextIO,
    *,
    timeline: bool = False,
    width: int = ctl_timeline.DEFAULT_WIDTH,
) -> int:
    kube = target.kube
    run = await get_run(kube, target, name)
    if output in ("json", "yaml"):
        out.write(render.render_object(run, output))
    elif timeline:
        out.write(ctl_timeline.render_timeline(run, datetime.now(UTC), width, colour))
    else:
        out.write(render.render_status(run, datetime.now(UTC), colour))
    return 0


# ----------------------------------------------------------------------------------- watch


class _Printer:
    """Prints what changed between observations, in the chosen output format."""

    def __init__(self, output: str, colour: bool, out: TextIO) -> None:
        self.output = output
        self.colour = colour
        self.out = out
        self.previous: dict[str, Any] | None = None

    def show(self, run: dict[str, Any]) -> None:
        previous, self.previous = self.previous, run
        if previous is not None and render.snapshot(previous) == render.snapshot(run):
            return
        if self.output == "json":
            self.out.write(json.dumps(run, separators=(",", ":"), ensure_ascii=False) + "\n")
        elif self.output == "yaml":
            self.out.write("---\n" + render.render_object(run, "yaml"))
        else:
            for line in render.progress_lines(previous, run, datetime.now(UTC), self.colour):
                self.out.write(line + "\n")
        self.out.flush()


async def _watch_events(
    kube: Kube, target: Target, name: str, resource_version: str
) -> AsyncIterator[dict[str, Any]]:
    """Watch events of the one AgentRun from `resource_version` until the server ends the watch."""
    query = {
        "watch": "1",
        "fieldSelector": f"metadata.name={name}",
        "resourceVersion": resource_version,
        "allowWatchBookmarks": "true",
        "timeoutSeconds": str(WATCH_CHUNK_SECONDS),
    }
    raw = await kube.send(
        "GET",
        _runs_path(target.namespace),
        query,
        {"Accept": "application/json"},
        timeout=aiohttp.ClientTimeout(total=None, sock_read=WATCH_CHUNK_SECONDS + 30),
    )
    try:
        if raw.status != 200:
            text = await raw.read()
            try:
                body = json.loads(text)
            except ValueError:
                body = {"message": text.decode(errors="replace")}
            await _fail(kube, target, int(raw.status), body, name, "watch")
        async for line in raw.content:
            if line.strip():
                yield json.loads(line)
    finally:
        raw.release()


async def _follow(kube: Kube, target: Target, name: str, printer: _Printer) -> str:
    """Print every change until the run finishes; its final phase."""
    run = await get_run(kube, target, name)
    printer.show(run)
    while not render.is_finished(run):
        version = str(run["metadata"].get("resourceVersion", ""))
        async for event in _watch_events(kube, target, name, version):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                break  # e.g. 410 Gone: the version is too old; start again from a fresh GET
            if kind == "DELETED":
                raise CtlError(f'AgentRun "{name}" was deleted before it finished')
            if kind == "BOOKMARK":
                run["metadata"]["resourceVersion"] = obj.get("metadata", {}).get("resourceVersion", version)
                continue
            run = obj
            printer.show(run)
            if render.is_finished(run):
                break
        if not render.is_finished(run):
            run = await get_run(kube, target, name)
            printer.show(run)
    return str(run["status"]["phase"])


async def watch(
    target: Target, name: str, output: str, colour: bool, timeout: float, out: TextIO, err: TextIO
) -> int:
    kube = target.kube
    printer = _Printer(output, colour, out)
    started = time.monotonic()
    try:
        phase = await asyncio.wait_for(_follow(kube, target, name, printer), timeout=timeout or None)
    except TimeoutError:
        last = render.status_of(printer.previous or {}).get("phase") or "Pending"
        err.write(
            f"agentrun watch: gave up after {render.format_duration(time.monotonic() - started)} "
            f"(--timeout {timeout:g}); AgentRun {name} is still {last}\n"
        )
        return render.EXIT_TIMEOUT
    code = render.exit_code(phase)
    return render.EXIT_ERROR if code is None else code


# ----------------------------------------------------------------------------------- cancel


async def cancel(target: Target, name: str, graceful: bool, output: str, out: TextIO) -> int:
    """Set `spec.cancel` (the only field that may change); a finished run is left as it is."""
    kube = target.kube
    mode = "Graceful" if graceful else "Immediate"
    for _ in range(CANCEL_ATTEMPTS):
        run = await get_run(kube, target, name)
        phase = render.status_of(run).get("phase") or "Pending"
        if phase in render.TERMINAL_PHASES:
            return _said(out, output, run, f"AgentRun {name} already finished ({phase}); nothing changed")
        current = (run.get("spec") or {}).get("cancel")
        if current == mode:
            return _said(
                out, output, run, f"AgentRun {name} is already being cancelled ({mode}); nothing changed"
            )
        # The resourceVersion makes the patch conditional: if the run changed meanwhile (it may
        # just have finished), the API server refuses it and we look again.
        patch = {
            "metadata": {"resourceVersion": run["metadata"]["resourceVersion"]},
            "spec": {"cancel": mode},
        }
        status, body = await kube.request(
            "PATCH",
            _runs_path(target.namespace, name),
            body=patch,
            content_type="application/merge-patch+json",
        )
        if status == 409:
            continue
        if status != 200:
            await _fail(kube, target, status, body, name, "cancel")
        what = (
            "the running iteration finishes and is recorded, then nothing more starts"
            if graceful
            else "the active Job is deleted now and its iteration is marked Cancelled"
        )
        return _said(out, output, body, f"AgentRun {name} cancel requested ({mode}): {what}")
    raise CtlError(f"AgentRun {name} kept changing; cancel not applied after {CANCEL_ATTEMPTS} attempts")


def _said(out: TextIO, output: str, run: dict[str, Any], sentence: str) -> int:
    """The sentence, or with `-o json|yaml` the run object as it now is."""
    out.write(render.render_object(run, output) if output in ("json", "yaml") else sentence + "\n")
    return 0


# ----------------------------------------------------------------------------------- approve / reject


def _gate_paths(run: AgentRun) -> str:
    return ", ".join(node.path for node in walk(run) if node.step.approval is not None) or "none"


def _refused(problem: Problem) -> CtlError:
    return CtlError(problem.render())


async def decide(
    target: Target,
    name: str,
    step: str,
    verdict: Decision,
    *,
    inputs: dict[str, str] | None = None,
    reason: str | None = None,
    iteration: int | None = None,
    output: str = "",
    out: TextIO,
) -> int:
    """Append a decision to `spec.approvals` (append-only), after checking it as the operator will:
    the run is not finished, the path names an approval gate that waits (in that iteration), no
    decision for it is pending, the inputs are declared and the required ones given."""
    verb = "approve" if verdict == "Approved" else "reject"
    if verdict == "Rejected" and not (reason or "").strip():
        raise _refused(
            Problem("--reason", reason, "a rejection needs a reason", "say why with --reason TEXT", DOCS)
        )
    kube = target.kube
    for _ in range(CANCEL_ATTEMPTS):
        raw = await get_run(kube, target, name)
        phase = render.status_of(raw).get("phase") or "Pending"
        if phase in render.TERMINAL_PHASES:
            raise CtlError(f"AgentRun {name} already finished ({phase}); there is no gate left to {verb}")
        run = parse_agentrun(raw)
        found = find_gate(effective_steps(run), run.status, step)
        at = iteration if iteration is not None else found.iteration if isinstance(found, Gate) else 1
        decision = ApprovalDecision(
            step=step.strip("/"), iteration=at, decision=verdict, inputs=inputs or None, reason=reason
        )
        why = why_not_waiting(found, decision)
        if why is not None:
            raise _refused(
                Problem(
                    "--step" if iteration is None or not isinstance(found, Gate) else "--iteration",
                    step if iteration is None or not isinstance(found, Gate) else iteration,
                    why,
                    f"name a gate that is AwaitingApproval (this run's gates: {_gate_paths(run)}), by its "
                    "path without iterations; leave out --iteration to decide the iteration it waits in",
                    DOCS,
                )
            )
        assert isinstance(found, Gate)
        existing = list(run.spec.approvals or [])
        start = (run.status.workflow.approvals_judged or 0) if run.status and run.status.workflow else 0
        for index in range(start, len(existing)):
            other = existing[index]
            if other.step == decision.step and other.iteration == decision.iteration:
                raise _refused(
                    Problem(
                        "--step",
                        decision.step,
                        f"a decision for this gate in iteration {decision.iteration} is already recorded "
                        f"(spec.approvals[{index}]: {other.decision}) and not yet applied",
                        f"wait for it (agentrun watch {name}); a gate takes one decision per iteration",
                        DOCS,
                    )
                )
        problems = decision_problems(found.spec, decision, "--input")
        if problems:
            raise _refused(problems[0])
        entry = decision.model_dump(by_alias=True, exclude_none=True, mode="json")
        patch = {
            "metadata": {"resourceVersion": raw["metadata"]["resourceVersion"]},
            "spec": {"approvals": [*(raw.get("spec") or {}).get("approvals", []), entry]},
        }
        status, body = await kube.request(
            "PATCH",
            _runs_path(target.namespace, name),
            body=patch,
            content_type="application/merge-patch+json",
        )
        if status == 409:
            continue  # the run changed meanwhile: judge again on what it is now
        if status != 200:
            await _fail(kube, target, status, body, name, verb)
        given = ", ".join(f"{k}={v}" for k, v in sorted((decision.inputs or {}).items()))
        what = f"{verdict.lower()} step {decision.step} (iteration {decision.iteration})"
        detail = f" with {given}" if given else ""
        detail += f": {decision.reason}" if decision.reason else ""
        return _said(
            out, output, body, f"AgentRun {name}: {what}{detail}; recorded as spec.approvals[{len(existing)}]"
        )
    raise CtlError(f"AgentRun {name} kept changing; decision not recorded after {CANCEL_ATTEMPTS} attempts")
