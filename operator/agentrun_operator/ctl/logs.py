"""`agentrun logs NAME [--step PATH] [--iteration N] [--attempt A] [-f] [-c CONTAINER]`: the workload's
log of a run's attempts, read through the API server (`pods/log`) as `kubectl logs` reads it.

Default: the latest attempt of the run. Several attempts (a step, or an iteration with retries) are
printed one after the other, each under a header; an attempt whose pod is gone gets one line saying
so and why. Exit 0 when every chosen attempt's log was printed, 1 when some pod was gone, 4 when the
command could not do its job (docs/operations.md#logs).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Final, TextIO

import aiohttp

from agentrun_operator import naming
from agentrun_operator.api import parse_agentrun
from agentrun_operator.ctl import render
from agentrun_operator.ctl.attempts import (
    Attempt,
    Selection,
    WarmSlice,
    collected_line,
    from_jobs,
    from_status,
    merged,
    select,
    step_paths,
    with_warm_pods,
    workload_paths,
)
from agentrun_operator.ctl.commands import get_run
from agentrun_operator.ctl.connect import CtlError, Target
from agentrun_operator.jobs.builder import DEFAULT_CONTAINER_ANNOTATION
from agentrun_operator.jobs.reporter_container import WORKLOAD_CONTAINERS
from agentrun_operator.shell.kube import Kube

EXIT_POD_GONE = 1
WAIT_FOR_START_SECONDS = 1.0
"""How often `-f` looks again at a pod whose container has not started yet."""


async def _list(kube: Kube, target: Target, resource: str, run_name: str) -> list[dict[str, Any]]:
    base = "/apis/batch/v1" if resource == "jobs" else "/api/v1"
    query = {"labelSelector": f"{naming.LABEL_RUN}={naming.label_value(run_name)}"}
    status, body = await kube.request("GET", f"{base}/namespaces/{target.namespace}/{resource}", query=query)
    if status == 403:
        raise CtlError(
            f"forbidden: cannot list {resource} in namespace {target.namespace}: "
            f"{render_message(body)} (credentials from {target.source}; reading logs needs get/list on "
            "jobs and pods and get on pods/log; see docs/operations.md#logs)"
        )
    if status != 200:
        raise CtlError(f"list {resource} of AgentRun {run_name}: HTTP {status}: {render_message(body)}")
    return list(body.get("items") or [])


def render_message(body: dict[str, Any]) -> str:
    return str(body.get("message") or body.get("reason") or "no message").strip()


def _container(pod: dict[str, Any], chosen: str | None) -> str:
    if chosen:
        return chosen
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    default = annotations.get(DEFAULT_CONTAINER_ANNOTATION)
    if default:
        return str(default)
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return str(containers[0].get("name", ""))


def _started(pod: dict[str, Any], container: str) -> bool:
    """Whether the container has a log to read: it runs or ran (not only waits to start)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if status.get("name") == container:
            state = status.get("state") or {}
            return "running" in state or "terminated" in state or bool(status.get("lastState"))
    return False


async def _get_pod(kube: Kube, target: Target, name: str) -> dict[str, Any] | None:
    status, body = await kube.request("GET", f"/api/v1/namespaces/{target.namespace}/pods/{name}")
    return body if status == 200 else None


async def _stream(
    kube: Kube,
    target: Target,
    pod: dict[str, Any],
    container: str,
    follow: bool,
    out: TextIO,
    warm_id: str | None = None,
) -> None:
    """Copy the container's log to `out` (to its end; with `follow`, until the container ends); with
    `warm_id`, only that warm iteration's part (with `follow`, until the next iteration begins)."""
    name = str(pod["metadata"]["name"])
    if follow:
        while not _started(pod, container):
            await asyncio.sleep(WAIT_FOR_START_SECONDS)  # a CLI waiting on a pod, not a test
            fresh = await _get_pod(kube, target, name)
            if fresh is None:
                raise CtlError(f"pod {name} was deleted before its container {container} started")
            pod = fresh
    query = {"container": container}
    if follow:
        query["follow"] = "true"
    raw = await kube.send(
        "GET",
        f"/api/v1/namespaces/{target.namespace}/pods/{name}/log",
        query,
        {"Accept": "*/*"},
        timeout=aiohttp.ClientTimeout(total=None, sock_read=None if follow else 60),
    )
    try:
        if raw.status != 200:
            text = (await raw.read()).decode(errors="replace")
            raise CtlError(_log_error(int(raw.status), text, name, container, target))
        part = WarmSlice(warm_id) if warm_id is not None else None
        async for chunk in raw.content.iter_any():
            text = chunk.decode(errors="replace")
            out.write(text if part is None else part.feed(text))
            out.flush()
            if part is not None and part.done:
                break
        if part is not None and not part.done:
            out.write(part.feed("", final=True))
            out.flush()
    finally:
        raw.release()


def _log_error(status: int, text: str, pod: str, container: str, target: Target) -> str:
    try:
        message = render_message(json.loads(text))
    except ValueError:
        message = text.strip()[:300]
    if status == 403:
        return (
            f"forbidden: cannot read the log of pod {pod}: {message} (credentials from {target.source}; "
            "reading logs needs get on pods/log; see docs/operations.md#logs)"
        )
    if status == 400 and "not valid for pod" in message:
        return f"-c: {message} (value: {container!r}; fix: name one of the pod's containers)"
    return f"log of pod {pod} (container {container}): HTTP {status}: {message}"


def _header(attempt: Attempt, pod: dict[str, Any] | None) -> str:
    phase = f" · {attempt.phase}" if attempt.phase else ""
    index = candidate_index(pod) if pod is not None else None
    which = f" · candidate {index}" if index is not None else ""
    if pod is not None and naming.is_promotion_job(_job_of(pod)):
        which = " · promotion of the winner"
    where = f" · pod {pod['metadata']['name']}" if pod is not None else ""
    return f"==> {attempt.title}{phase}{which}{where} <=="


COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"


def candidate_index(pod: dict[str, Any]) -> int | None:
    """A loop candidate's index (its Indexed Job's completion index), else None."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(COMPLETION_INDEX)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def shown_pods(attempt: Attempt) -> list[dict[str, Any] | None]:
    """The pods whose logs an attempt shows: each candidate's, by index, of a loop with candidates
    (docs/concepts.md#candidates); else its newest pod (None: none left)."""
    candidates = [p for p in attempt.pods if candidate_index(p) is not None]
    if candidates:
        by_index: dict[int, dict[str, Any]] = {}
        for pod in candidates:  # oldest first: a later pod of an index replaces an earlier one
            by_index[candidate_index(pod) or 0] = pod
        promotion = [p for p in attempt.pods if naming.is_promotion_job(_job_of(p))]
        return [*(by_index[i] for i in sorted(by_index)), *promotion[-1:]]
    return [attempt.pods[-1] if attempt.pods else None]


def _job_of(pod: dict[str, Any]) -> str:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return str(labels.get("batch.kubernetes.io/job-name") or labels.get("job-name") or "")


async def logs(
    target: Target,
    name: str,
    chosen: Selection,
    container: str | None,
    follow: bool,
    colour: bool,
    out: TextIO,
    err: TextIO,
) -> int:
    kube = target.kube
    raw = await get_run(kube, target, name)
    try:
        run = parse_agentrun(raw)
    except ValueError:
        run = None
    workloads: frozenset[str] = frozenset()
    if run is not None:
        chosen.workload_steps = step_paths(run)
        workloads = workload_paths(run)
    jobs = await _list(kube, target, "jobs", name)
    pods = await _list(kube, target, "pods", name)
    attempts = with_warm_pods(merged(from_jobs(jobs, pods), from_status(raw, workloads)), pods)
    picked = select(name, attempts, chosen)
    strategy = run.spec.pod_gc.strategy if run is not None and run.spec.pod_gc is not None else None
    shown = [(attempt, pod) for attempt in picked for pod in shown_pods(attempt)]
    several = len(shown) > 1
    code = 0
    for index, (attempt, pod) in enumerate(shown):
        if several:
            out.write(
                ("\n" if index else "") + render.paint(_header(attempt, pod), attempt.phase, colour) + "\n"
            )
            out.flush()
        if pod is None:
            line = collected_line(name, attempt, strategy, titled=not several)
            (out if several else err).write(line + "\n")
            code = EXIT_POD_GONE
            continue
        last = index == len(shown) - 1
        chosen_container = _container(pod, container)
        # A warm pod's workload log holds several iterations: this attempt's part of it.
        warm = attempt.warm_id if chosen_container in WORKLOAD_CONTAINERS else None
        await _stream(kube, target, pod, chosen_container, follow and last, out, warm)
    return code
