"""The iteration benchmark's checkpoint runs on the real node (`bench_iterations --runtime kubelet
--checkpoint`): what `loop.checkpoint: {mode: Files}` costs an iteration inside the pod.

Each run has its own claim (`<run>-workspace`, the local provisioner's) mounted at `/workspace`, and
runs in pairs: `bench-none-<r>` (`checkpoint: {mode: None}`, the baseline) then `bench-files-<r>`
(`{mode: Files, onFailedAttempt: Restore}`), the same `main` in both:

- iteration 1 seeds the workspace: `--workspace-files` files of random bytes, `--workspace-megabytes`
  MiB in all, in 100 directories of `/workspace/w` (busybox:1.36 has no `split`: a `head -c` per
  file, ~5 s); its checkpoint (taken before it, of an empty volume) is not counted;
- iteration 2's checkpoint is the first of the seeded workspace (every file copied once): `first`;
- every later iteration's `main` writes new random content into the first `--changed` files (of
  the same size), so the checkpoints of iterations 3..K each follow one iteration that changed them:
  `steady`;
- with `--restore-at F`, attempt 1 of iteration F changes the files and exits 1; its retry (the
  step has `retries: 1`) restores them first in mode Files (`onFailedAttempt: Restore`): `retry`.

The time is the reporter's start → its postStart hook done (`reporter_start_to_hook_done`, from
containerd's events): the claim, the fingerprint and the checkpoint (or restore), all before `main`.
The bytes come from the runs' status (`iterations[].checkpoint.addedBytes`).
"""

from __future__ import annotations

from typing import Any

from agentrun_operator import naming
from tests.bench.figures import percentiles

MODES = ("None", "Files")
HOOK = "reporter_start_to_hook_done"


def run_names(runs: int) -> dict[str, list[str]]:
    """The runs of each mode, `bench-none-<r>` and `bench-files-<r>`."""
    return {mode: [f"bench-{mode.lower()}-{r}" for r in range(runs)] for mode in MODES}


def interleaved(names: dict[str, list[str]]) -> list[str]:
    """The order the runs are made in: a baseline, then its checkpointed pair, and so on."""
    pairs = zip(*(names[mode] for mode in MODES), strict=True)
    return [name for pair in pairs for name in pair]


def script(files: int, megabytes: int, changed: int, restore_at: int) -> str:
    """`main` of every iteration (busybox sh): seed once, then change `changed` files."""
    total = megabytes * 1024 * 1024
    size = total // files
    return f"""set -e
mkdir -p /workspace/w
cd /workspace/w
i=0
if [ "$AGENTRUN_ITERATION" = 1 ]; then n={files}; else n={changed}; fi
while [ $i -lt $n ]; do
  [ -d d$((i % 100)) ] || mkdir d$((i % 100))
  head -c {size} /dev/urandom > d$((i % 100))/f$i
  i=$((i + 1))
done
if [ "$AGENTRUN_ITERATION" = {restore_at} ] && [ "$AGENTRUN_ATTEMPT" = 1 ]; then exit 1; fi
"""


def claim(name: str, namespace: str, megabytes: int) -> dict[str, Any]:
    """The run's workspace claim: room for the workspace and its store (the first copy is whole)."""
    gib = max(1, -(-3 * megabytes // 1024))
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"{name}-workspace", "namespace": namespace},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": f"{gib}Gi"}}},
    }


def agentrun(
    name: str, namespace: str, iterations: int, mode: str, main: str, restore_at: int
) -> dict[str, Any]:
    """A looped run on its claim, with `checkpoint: {mode}` (a retry only when `restore_at`)."""
    checkpoint: dict[str, Any] = {"mode": mode}
    if mode != "None":
        checkpoint["onFailedAttempt"] = "Restore"
    step: dict[str, Any] = {
        "name": "loop",
        "loop": {"maxIterations": iterations, "checkpoint": checkpoint},
    }
    if restore_at:
        step.update(retries=1, retryBackoffSeconds=0)
    return {
        "apiVersion": "agents.proompteng.ai/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "workload": {
                "image": "busybox:1.36",
                "command": ["sh", "-c"],
                "args": [main],
                "volumes": [
                    {
                        "name": "workspace",
                        "type": "pvc",
                        "claimName": f"{name}-workspace",
                        "mountPath": "/workspace",
                    }
                ],
            },
            "workflow": {"steps": [step]},
        },
    }


def _records(run: dict[str, Any]) -> dict[int, dict[str, Any]]:
    steps = ((run.get("status") or {}).get("workflow") or {}).get("steps") or [{}]
    return {int(r["index"]): r for r in (steps[0].get("loop") or {}).get("iterations") or [] if "index" in r}


def checkpoint_figures(
    names: dict[str, list[str]],
    iterations: int,
    restore_at: int,
    by_job: dict[str, dict[str, float]],
    runs: list[dict[str, Any]],
) -> dict[str, Any]:
    """Per mode: the hook's time (ms) of the seeding, first, steady and retry pods, and the bytes
    each iteration's checkpoint added (`first`, `steady`), and how many iterations' records say
    their checkpoint was restored. Pure.

    `by_job` is `node_stages.in_pod_stages_by_job` (seconds); `runs` the AgentRuns as listed."""
    by_name = {r["metadata"]["name"]: r for r in runs}
    figures: dict[str, Any] = {}
    for mode, mode_names in names.items():
        hook: dict[str, list[float]] = {"seed": [], "first": [], "steady": [], "retry": []}
        added: dict[str, list[float]] = {"first": [], "steady": []}
        restored = 0
        for name in mode_names:
            records = _records(by_name.get(name) or {})
            for k in range(1, iterations + 1):
                kind = "seed" if k == 1 else "first" if k == 2 else "steady"
                stages = by_job.get(naming.job_name(name, 1, k, 1))
                if stages is not None:
                    hook[kind].append(1000 * stages[HOOK])
                if k == restore_at:
                    retry = by_job.get(naming.job_name(name, 1, k, 2))
                    if retry is not None:
                        hook["retry"].append(1000 * retry[HOOK])
                record = (records.get(k) or {}).get("checkpoint") or {}
                if kind != "seed" and "addedBytes" in record:
                    added[kind].append(float(record["addedBytes"]))
                restored += bool(record.get("restored"))
        figures[mode] = {
            "hook_ms": {kind: percentiles(values) for kind, values in hook.items()},
            "added_bytes": {
                kind: {**percentiles(values), "max": max(values, default=float("nan"))}
                for kind, values in added.items()
            },
            "restored": restored,
        }
    return figures


def print_figures(figures: dict[str, Any]) -> None:
    """The checkpoint figures as rows, mode by mode."""
    print(f"inside the pod, {HOOK} (ms, n p50 p95) and bytes the checkpoint added:")
    for mode, f in figures.items():
        for kind, d in f["hook_ms"].items():
            print(f"    mode {mode:<5} {kind:<6} n={d['n']:<3} p50 {d['p50']:8.1f}  p95 {d['p95']:8.1f}")
        for kind, d in f["added_bytes"].items():
            print(
                f"    mode {mode:<5} {kind:<6} added n={d['n']:<3} p50 {d['p50']:12.0f} B  "
                f"max {d['max']:12.0f} B"
            )
        print(f"    mode {mode:<5} iterations recorded as restored: {f['restored']}")
