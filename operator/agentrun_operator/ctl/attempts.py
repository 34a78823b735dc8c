"""Which attempts `agentrun logs` shows: the run's attempts, from its Jobs and its status, and the
choice among them by `--step`, `--iteration` and `--attempt`. Pure (no API calls), so the choice and
every refusal are unit-tested (docs/operations.md#logs).

An attempt is named as a user names it: the step's run path (`develop/review`), the iteration its
Jobs carry in their `iteration` label (for a loop body's child: the body's iteration) and the attempt.
An attempt whose Job is gone is still listed when the run's status knows of it (its pod was
collected: the line that says so is `collected_line`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Final

from agentrun_operator import naming
from agentrun_operator.api import AgentRun
from agentrun_operator.ctl.connect import CtlError
from agentrun_operator.planner.tree import walk

DOCS = "docs/operations.md#logs"


@dataclass(frozen=True)
class Attempt:
    """One attempt of one iteration of one step, with its Job and pod when they still exist."""

    step: str  # run path without iterations: `develop/review`
    iteration: int
    attempt: int
    label: str = ""  # the path as logs name it (`develop/iteration 2/review`); "" for a top-level step
    job: dict[str, Any] | None = None
    pods: tuple[dict[str, Any], ...] = ()
    phase: str | None = None  # from the status, when it records this attempt
    order: tuple[str, str] = ("", "")  # (creationTimestamp of its Job, Job name): Jobs are in run order
    pod_name: str | None = None  # loop.warm: the pod the status says ran it
    warm_id: str | None = None
    """loop.warm: its id in that pod, whose `main` log holds several iterations, each after a line
    `agentrun: iteration <id>` (jobs/warm.py): the attempt's log is its slice."""

    @property
    def job_name(self) -> str | None:
        return None if self.job is None else str(self.job["metadata"]["name"])

    @property
    def title(self) -> str:
        where = self.label or self.step
        attempt = str(self.attempt) if self.attempt else "? (not recorded)"
        return f"{where} · iteration {self.iteration} · attempt {attempt}"


@dataclass
class Selection:
    """What `--step`, `--iteration`, `--attempt` asked for (None: not given)."""

    step: str | None = None
    iteration: int | None = None
    attempt: int | None = None
    workload_steps: tuple[str, ...] = field(default_factory=tuple)


def _int(labels: dict[str, str], key: str) -> int | None:
    try:
        return int(labels.get(key, ""))
    except ValueError:
        return None


def from_jobs(jobs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> list[Attempt]:
    """The attempts whose Jobs still exist, each with its pods (found by the Job's `job-name` label)."""
    by_job: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        owner = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name")
        if owner:
            by_job.setdefault(str(owner), []).append(pod)
    found: list[Attempt] = []
    promotions: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:  # a loop candidates' promotion Job: its pods go with the candidates' attempt
        name = str((job.get("metadata") or {}).get("name", ""))
        if naming.is_promotion_job(name):
            promotions[name] = by_job.get(name, [])
    for job in jobs:
        meta = job.get("metadata") or {}
        labels = meta.get("labels") or {}
        iteration, attempt = _int(labels, naming.LABEL_ITERATION), _int(labels, naming.LABEL_ATTEMPT)
        if iteration is None or attempt is None:
            continue
        label = str((meta.get("annotations") or {}).get(naming.ANNOTATION_STEP) or "")
        step = naming.tree_path(label) if label else str(labels.get(naming.LABEL_STEP, ""))
        name = str(meta.get("name"))
        if name in promotions:
            continue
        mine = sorted(by_job.get(name, []), key=lambda p: str(p["metadata"].get("creationTimestamp", "")))
        mine += promotions.get(naming.promotion_job_name(name), [])
        found.append(
            Attempt(
                step,
                iteration,
                attempt,
                label,
                job,
                tuple(mine),
                order=(str(meta.get("creationTimestamp", "")), name),
            )
        )
    return found


NOT_RUN: Final = frozenset({"Pending", "Skipped"})


def _from_entry(
    entry: dict[str, Any], prefix: str, body_iteration: int | None, workloads: frozenset[str]
) -> list[Attempt]:
    """The attempts a step's status entry records (its own and its children's); ordered by when
    their iteration (or step) started, as far as the status says. A group's entry holds only its
    current iteration's children; of earlier iterations, its records name each child's phase (the
    number of attempts is not kept: `attempt` 0)."""
    name = str(entry.get("name", ""))
    path = f"{prefix}/{name}" if prefix else name
    loop = entry.get("loop") or {}
    records = loop.get("iterations") or []
    current = int(loop.get("currentIteration") or 0)
    found: list[Attempt] = []
    for record in records:
        index = int(record.get("index", 1))
        started = str(record.get("startedAt") or entry.get("startedAt") or "")
        if path in workloads:
            attempts = int(record.get("attempts") or 0)
            found += _recorded(path, index, attempts, record, started)
        elif index != current:
            for position, (child, phase) in enumerate((record.get("steps") or {}).items()):
                child_path = f"{path}/{child}"
                if child_path in workloads and phase not in NOT_RUN:
                    order = (started, f"{position:06d}")
                    found.append(Attempt(child_path, index, 0, phase=str(phase), order=order))
    if not records and path in workloads and entry.get("jobRef") and int(entry.get("attempt") or 0) >= 1:
        attempts = int(entry.get("attempt") or 0)
        started = str(entry.get("startedAt") or "")
        found += _recorded(path, body_iteration or 1, attempts, entry, started)
    children_iteration = current or body_iteration
    for child in entry.get("steps") or []:
        found += _from_entry(child, path, children_iteration, workloads)
    return found


def _recorded(
    path: str, iteration: int, attempts: int, record: dict[str, Any], started: str
) -> list[Attempt]:
    """Attempts 1..`attempts` of an iteration `record` (an iteration record, or a loop body's child
    entry): earlier ones failed; the last has the record's phase and, when it ran in a warm pod
    (`pod`), that pod and its id there (`<iteration>-<attempt>`)."""
    found: list[Attempt] = []
    for number in range(1, attempts + 1):
        last = number == attempts
        pod = record.get("pod") if last else None
        found.append(
            Attempt(
                path,
                iteration,
                number,
                phase=record.get("phase") if last else "Failed",
                order=(started, f"{path}\0{number:06d}"),
                pod_name=str(pod) if pod else None,
                warm_id=f"{iteration}-{number}" if pod else None,
            )
        )
    return found


def from_status(run: dict[str, Any], workloads: frozenset[str]) -> list[Attempt]:
    """The attempts the run's status records (its history may be pruned: docs/api.md#status), of the
    steps in `workloads` (run paths of the workload steps: only they have Jobs)."""
    workflow = (run.get("status") or {}).get("workflow") or {}
    found: list[Attempt] = []
    for entry in workflow.get("steps") or []:
        found += _from_entry(entry, "", None, workloads)
    return found


def merged(with_jobs: list[Attempt], recorded: list[Attempt]) -> list[Attempt]:
    """Every attempt once, in run order (by when its Job was created; for an attempt whose Job was
    collected, by when its iteration started): the phase from the status where it records it."""
    key = {(a.step, a.iteration, a.attempt): a for a in with_jobs}
    by_key = {(a.step, a.iteration, a.attempt): a for a in recorded}
    result = [
        replace(a, phase=by_key[k].phase, pod_name=by_key[k].pod_name, warm_id=by_key[k].warm_id)
        if k in by_key
        else a
        for k, a in key.items()
    ]
    iterations = {(a.step, a.iteration) for a in with_jobs}
    result += [
        a
        for a in recorded
        if (a.step, a.iteration, a.attempt) not in key
        and not (a.attempt == 0 and (a.step, a.iteration) in iterations)
    ]
    result.sort(key=lambda a: a.order)
    return result


WARM_MARK_PREFIX: Final = "agentrun: iteration "
"""How a warm pod's `main` loop begins each iteration's part of its log (jobs/warm.py)."""


def with_warm_pods(attempts: list[Attempt], pods: list[dict[str, Any]]) -> list[Attempt]:
    """A warm attempt whose Job started with an earlier iteration gets the pod the status names."""
    by_name = {str(p["metadata"]["name"]): p for p in pods}
    return [
        replace(a, pods=(by_name[a.pod_name],)) if a.pod_name in by_name and not a.pods else a
        for a in attempts
    ]


class WarmSlice:
    """Keeps the lines of one warm iteration from a warm pod's `main` log, fed in chunks: those after
    its line `agentrun: iteration <id>`, up to the next such line (`done` then)."""

    def __init__(self, warm_id: str) -> None:
        self.mark = f"{WARM_MARK_PREFIX}{warm_id}"
        self.inside = False
        self.done = False
        self._partial = ""

    def feed(self, text: str, final: bool = False) -> str:
        kept: list[str] = []
        lines = (self._partial + text).split("\n")
        self._partial = "" if final else lines.pop()
        for line in lines:
            if self.done:
                break
            if line.startswith(WARM_MARK_PREFIX):
                if self.inside:
                    self.done = True
                    break
                self.inside = line == self.mark
                continue
            if self.inside:
                kept.append(line + "\n")
        if final and kept and not text.endswith("\n"):
            kept[-1] = kept[-1][:-1]
        return "".join(kept)


def step_paths(run: AgentRun) -> tuple[str, ...]:
    """Run paths of every step of the spec (groups and switches too: they select their children)."""
    return tuple(node.path for node in walk(run))


def workload_paths(run: AgentRun) -> frozenset[str]:
    """Run paths of the steps that run pods (not groups, switches or approval gates)."""
    return frozenset(node.path for node in walk(run) if node.step.kind == "workload")


def _span(values: list[int]) -> str:
    return ", ".join(str(v) for v in sorted(set(values))) or "none"


def select(name: str, attempts: list[Attempt], chosen: Selection) -> list[Attempt]:
    """The attempts to show, in run order; a CtlError (one line, exit 4) when the choice names
    nothing: a step not in the run, an iteration or attempt not started yet."""
    if chosen.step is None:
        if chosen.iteration is not None or chosen.attempt is not None:
            raise CtlError(
                f"--iteration/--attempt need --step (value: --iteration {chosen.iteration}, --attempt "
                f"{chosen.attempt}; fix: add --step PATH, e.g. --step {_example(chosen)}; see {DOCS})"
            )
        if not attempts:
            raise CtlError(f"AgentRun {name} has not started an attempt yet (see agentrun status {name})")
        return [attempts[-1]]
    step = chosen.step.strip("/")
    if step not in chosen.workload_steps:
        raise CtlError(
            f"--step: {chosen.step!r} is not a step of AgentRun {name} (value: {chosen.step!r}; fix: one of "
            f"{', '.join(chosen.workload_steps) or 'none'}, paths without iterations; see {DOCS})"
        )
    mine = [a for a in attempts if a.step == step or a.step.startswith(step + "/")]
    if not mine:
        raise CtlError(f"step {step} of AgentRun {name} has not started yet (see agentrun status {name})")
    if chosen.iteration is not None:
        started = [a.iteration for a in mine]
        mine = [a for a in mine if a.iteration == chosen.iteration]
        if not mine:
            raise CtlError(
                f"--iteration: step {step} has no iteration {chosen.iteration} (value: "
                f"{chosen.iteration}; iterations so far: {_span(started)}; fix: name one of them, or "
                f"wait: agentrun watch {name}; see {DOCS})"
            )
    if chosen.attempt is not None:
        started = [a.attempt for a in mine]
        mine = [a for a in mine if a.attempt == chosen.attempt]
        if not mine:
            raise CtlError(
                f"--attempt: step {step} has no attempt {chosen.attempt} in that iteration (value: "
                f"{chosen.attempt}; attempts so far: {_span(started)}; see {DOCS})"
            )
    return mine


def _example(chosen: Selection) -> str:
    return chosen.workload_steps[0] if chosen.workload_steps else "STEP"


def collected_line(run_name: str, attempt: Attempt, strategy: str | None, titled: bool = True) -> str:
    """Why an attempt has no pod to read any more (one line; without the attempt's title when a
    header above it names the attempt)."""
    head = f"{attempt.title}{f' ({attempt.phase})' if attempt.phase else ''}: " if titled else ""
    policy = f"spec.podGC.strategy {strategy}" if strategy else "the installation's pod GC policy"
    if attempt.job is None:
        if attempt.phase == "Succeeded":
            why = "a succeeded attempt's Job gets the Job TTL, AGENTS_CONTROLLER_JOB_TTL_SECONDS"
        else:
            why = "not kept by the strategy, or past podGC.retentionSeconds or maxKeptPods"
        return (
            f"{head}pod collected after the result was recorded ({why}; {policy}); the outcome is in "
            f"agentrun status {run_name}; see docs/api.md#podgc"
        )
    ttl = (attempt.job.get("spec") or {}).get("ttlSecondsAfterFinished")
    when = f"; its Job goes {ttl}s after it finished (ttlSecondsAfterFinished)" if ttl is not None else ""
    return (
        f"{head}Job {attempt.job_name} has no pod any more (deleted or evicted){when}; see docs/api.md#podgc"
    )
