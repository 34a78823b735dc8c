"""The chaos suite: looping runs with real processes on the local default while its parts fail.

    python -m tests.chaos.run --runs 50 --iterations 5 --faults 20

starts a local default of its own (`agentrun dev up` in a temporary AGENTRUN_DEV_HOME), creates
`--runs` AgentRuns that loop `--iterations` times (each iteration sleeps `--iteration-seconds`, and
writes `start N` and `done N` to a log on the run's PVC), and meanwhile injects `--faults` faults of
each kind, round-robin in a shuffled order, `--gap` seconds apart, while any run is in flight (a
slow machine may end the runs before every fault is injected: the report counts what was injected;
a longer `--iteration-seconds` keeps runs in flight longer):

- operator-kill:     SIGKILL the operator, then `agentrun dev up` (restarts only what is down)
- apiserver-freeze:  SIGSTOP the API server for `--freeze-seconds`, then SIGCONT
- apiserver-restart: SIGKILL the API server, then `agentrun dev up` (same port, same data)
- etcd-restart:      `agentrun dev restart etcd`
- runner-restart:    SIGKILL the pod runner, then `agentrun dev up` (its containers keep running)
- kubelet-restart:   on the real node (`--runtime kubelet`, instead of runner-restart): SIGKILL the
                     kubelet, then `agentrun dev up` (its containers keep running)

`--control-off-volume` mounts each run's PVC at `/w` instead of `/workspace`, so the control path
(the default, under `/workspace`) lies on no volume: the Job claim is then taken on the PVC all the
same (docs/concepts.md#exactly-once), and `apiserver-restart` shows whether any `main` runs twice.

`--checkpoints` gives each run `loop.checkpoint: {mode: Files, onFailedAttempt: Restore}` and one
retry; every attempt records the workspace's tree hash at its start, and in one iteration per run
(from the seed) the first attempt dirties the workspace and fails: every retry must start with its
iteration's start hash, and the iteration's status record must say it restored its checkpoint
(docs/development.md#chaos-checkpoints).

`--candidates N` gives each run `loop.candidates: {count: N}` (with `loop.checkpoint: {mode: Files}`)
and a second claim, mounted at /logs, that the candidates share (each works on its own copy of the
workspace): every candidate of every iteration must start and finish once, each iteration's
candidates must have seen the previous iteration's winner's files, and the workspace must end as the
chain of winners (docs/development.md#chaos-candidates).

`--warm` gives each run `loop.warm` (its iterations run in one live pod, told by the operator) and
retries, and adds the fault kind `warm-pod-kill`: a warm pod deleted while an iteration runs in it
(one the pod did not start with, when there is one). Every iteration must be recorded once, the
workload's own log must show each recorded attempt's command started once and only the last one
done, and each iteration must have seen the previous iteration's control (`AGENTRUN_PREVIOUS_CONTROL`)
and state (docs/development.md#chaos-warm).

Afterwards every run must have Succeeded and each run's PVC log must show each iteration started
and done exactly once (an attempt that failed on purpose and its retry count as one start). The
report gives the faults injected per kind and the counts of wrong terminal states, repeated and lost
iterations (with `--checkpoints`, also `restore_mismatch` and `not_retried`); the exit code is 0
only when all of them are 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrun_devcluster import processes, toolchain
from agentrun_devcluster.controlplane import ControlPlane
from agentrun_devcluster.dev import claim_directory
from agentrun_operator import naming
from agentrun_operator.jobs.reporter_container import REPORTER_CONTAINER
from tests.support.manifests import claim_yaml

PROCESS_KINDS = ("operator-kill", "apiserver-freeze", "apiserver-restart", "etcd-restart", "runner-restart")
NODE_KINDS = ("operator-kill", "apiserver-freeze", "apiserver-restart", "etcd-restart", "kubelet-restart")
"""On the real node (`--runtime kubelet`) the kubelet is killed instead of the pod runner."""
WARM_KINDS = ("operator-kill", "warm-pod-kill")
"""With `--warm`, by default: the operator killed, and a warm pod deleted while an iteration runs in it."""
KINDS = (*PROCESS_KINDS, "kubelet-restart", "warm-pod-kill")
NAMESPACE = "default"
AR_PATH = f"/apis/agents.proompteng.ai/v1alpha1/namespaces/{NAMESPACE}/agentruns"
TERMINAL = ("Succeeded", "Failed", "Cancelled")
POLL_SECONDS = 0.5
"""How often the suite looks at the runs and their claims (one or two GETs each time)."""
WARM_KILL_PREFER_SECONDS = 30.0
"""`warm-pod-kill` waits this long for a warm pod running an iteration it did not start with before
it takes any warm pod mid-iteration."""

RUN_TEMPLATE = """\
apiVersion: agents.proompteng.ai/v1alpha1
kind: AgentRun
metadata:
  name: {name}
spec:
  runtime:
    type: workflow
  workload:
    image: busybox:1.36
    command: [sh, -c]
    args:
      - |
{script}
    volumes:
      - name: workspace
        type: pvc
        claimName: {name}-workspace
        mountPath: {mount}
  workflow:
    steps:
      - name: loop
{retries}        loop:
          maxIterations: {iterations}
          state:
            required: true
            volumeNames: [workspace]
{checkpoint}"""

HOLD = """\
if [ "$AGENTRUN_ITERATION" = {hold_iteration} ] && [ "{hold}" = yes ]; then
  while [ ! -e {mount}/release ]; do sleep 0.5; done
fi
"""

SCRIPT = """\
set -eu
echo "start $AGENTRUN_ITERATION" >> {mount}/chaos.log
{hold}sleep {sleep}
echo "done $AGENTRUN_ITERATION" >> {mount}/chaos.log
"""

CANDIDATES_VOLUME = """\
      - name: logs
        type: pvc
        claimName: {name}-logs
        mountPath: /logs
"""

CANDIDATES_LOOP = """\
          checkpoint:
            mode: Files
          candidates:
            count: {count}
            select: "candidates.filter(c, candidates.all(o, o.control.score <= c.control.score))[0].index"
"""

# `--candidates N`: each candidate logs its start and end on the shared /logs claim, and what the
# workspace it started from ends with; it adds its own line to state.txt and scores so that the
# winner of iteration N is candidate (N - 1) mod count (`winner_of`).
CANDIDATES_SCRIPT = """\
set -eu
cd /workspace
N=$AGENTRUN_ITERATION
C=$AGENTRUN_CANDIDATE
echo "start $N $C" >> /logs/chaos.log
{hold}sleep {sleep}
echo "$N $C saw $(tail -n 1 state.txt 2>/dev/null || echo none)" >> /logs/seen.log
echo "$N by $C" >> state.txt
SCORE=0
if [ $(( (C - N + 1 + {count} * {iterations}) % {count} )) -eq 0 ]; then SCORE=1; fi
mkdir -p "$(dirname "$AGENTRUN_LOOP_CONTROL_PATH")"
echo "{{\\"score\\": $SCORE}}" > "$AGENTRUN_LOOP_CONTROL_PATH"
echo "done $N $C" >> /logs/chaos.log
"""

WARM_STEP = """\
        retries: {retries}
        retryBackoffSeconds: 0
"""

WARM_LOOP = """\
          warm:
            idleSeconds: {idle}
"""

WARM_IDLE_SECONDS = 300
"""`--warm`: how long a warm pod waits for the next iteration (the operator may be down meanwhile)."""

# `--warm`: each attempt logs its start (with its pod and how many iterations its container has run:
# more than 1 is a warm one) and what it found: the last line of state.txt and its
# AGENTRUN_PREVIOUS_CONTROL; at its end it appends `N A` to state.txt, writes its control
# `{"n": N, "a": A}` and logs `done N A`. A warm pod deleted mid-iteration ends its command there.
WARM_SCRIPT = """\
set -eu
cd /workspace
N=$AGENTRUN_ITERATION
A=$AGENTRUN_ATTEMPT
C=$(cat /tmp/chaos-count 2>/dev/null || echo 0); C=$((C + 1)); echo "$C" > /tmp/chaos-count
echo "start $N $A $(hostname) $C" >> chaos.log
echo "$N $A|$(tail -n 1 state.txt 2>/dev/null || echo none)|$AGENTRUN_PREVIOUS_CONTROL" >> seen.log
{hold}sleep {sleep}
echo "$N $A" >> state.txt
mkdir -p "$(dirname "$AGENTRUN_LOOP_CONTROL_PATH")"
echo "{{\\"n\\": $N, \\"a\\": $A}}" > "$AGENTRUN_LOOP_CONTROL_PATH"
echo "done $N $A" >> chaos.log
"""

CHECKPOINT_EXCLUDE = ("chaos.log", "release", "chaos-hashes")
"""The suite's own files on the volume (`--checkpoints`): neither recorded nor restored, so the log
keeps the failed attempt's lines, the release stays, and every attempt's start hash is kept."""

CHECKPOINT_STEP = """\
        retries: 1
        retryBackoffSeconds: 0
"""

CHECKPOINT_LOOP = """\
          checkpoint:
            mode: Files
            onFailedAttempt: Restore
            exclude: [{exclude}]
"""

# `--checkpoints`: every attempt first hashes the workspace tree into
# chaos-hashes/i<iteration>-a<attempt> (each path with its type, mode and owner; a file's size, mtime
# and content; a link's target; not a directory's mtime, which the suite's own files change; the
# control directory, the Job claims and the suite's own files left out, as the checkpoint leaves them
# out), then works: files written and appended to, a directory created. In the run's failing
# iteration (`fail_iteration`, from the suite's seed) the first attempt instead dirties the workspace
# (a file appended to and its mode changed, the previous iteration's file and directory deleted,
# files, a directory and a link created) and exits 1; its retry must start from the iteration's
# start hash.
CHECKPOINT_SCRIPT = """\
set -eu
cd {mount}
N=$AGENTRUN_ITERATION
A=$AGENTRUN_ATTEMPT
tree_hash() {{
  find . \\( -path ./.agentrun -o -path ./.agentrun-claims -o -path ./chaos.log -o -path ./release \\
    -o -path ./chaos-hashes \\) -prune -o -print | LC_ALL=C sort | while read -r p; do
    if [ -L "$p" ]; then echo "l $p $(readlink "$p") $(stat -c '%u %g' "$p")"
    elif [ -f "$p" ]; then echo "f $p $(stat -c '%a %u %g %s %Y' "$p") $(sha256sum < "$p")"
    else echo "d $p $(stat -c '%a %u %g' "$p")"; fi
  done | sha256sum | cut -d' ' -f1
}}
mkdir -p chaos-hashes
tree_hash > chaos-hashes/i$N-a$A
echo "start $N $A" >> chaos.log
{hold}sleep {sleep}
if [ "$N" = {fail_iteration} ] && [ "$A" = 1 ]; then
  echo "dirty $N" >> state.txt; chmod 600 state.txt
  rm -f iter-$((N - 1)).txt; rm -rf dir-$((N - 1))
  echo junk > junk-$N.txt; mkdir -p new-$N/deep; echo x > new-$N/deep/f; ln -s state.txt link-$N
  echo "fail $N $A" >> chaos.log
  exit 1
fi
echo "iteration $N" > iter-$N.txt; chmod 640 iter-$N.txt
echo "$N" >> state.txt
mkdir -p dir-$N; echo "$N" > dir-$N/f
echo "done $N $A" >> chaos.log
"""


@dataclass(frozen=True)
class Config:
    runs: int = 3
    iterations: int = 3
    faults: int = 1
    kinds: tuple[str, ...] = PROCESS_KINDS
    runtime: str = "process"
    """`process` (the local pod runner) or `kubelet` (the real node)."""
    iteration_seconds: float = 2.0
    freeze_seconds: float = 5.0
    gap: float = 2.0
    timeout: float = 900.0
    seed: int = 0
    hold: bool = False
    """Hold every run in iteration `hold_iteration` (a running container) until every fault is in:
    each fault meets runs in flight, however fast or slow the machine (the size `make test` runs
    holds them in iteration 1, so each fault meets running containers)."""
    control_off_volume: bool = False
    """Mount the PVC at /w, so the control path (/workspace/...) lies on no volume."""
    hold_iteration: int = 1
    """1: faults start once every run's first iteration runs. The last iteration: the iterations
    before it run (pods created, bound, ended, the next one planned) while faults go in, and the
    runs wait in the last one for the faults that remain."""
    checkpoints: bool = False
    """Each run's loop has `loop.checkpoint` (Files, onFailedAttempt: Restore) and one retry; the first
    attempt of one iteration per run, chosen from the seed (`fail_iterations`), dirties the workspace
    and fails: its retry must start from the iteration's start (docs/concepts.md#checkpoints)."""
    candidates: int = 0
    """Each run's loop has `loop.candidates: {count: candidates}` and a shared /logs claim (0: none)."""
    warm: bool = False
    """Each run's loop has `loop.warm` and `retries` (a deleted warm pod's attempt is retried in a new
    pod); the fault kind `warm-pod-kill` deletes a warm pod mid-iteration."""

    @property
    def warm_retries(self) -> int:
        """`--warm`: every warm pod kill could hit one run (each fails an attempt), and one more."""
        return min(100, self.faults * self.kinds.count("warm-pod-kill") + 1)


def manifest(config: Config, name: str, fail_iteration: int = 0) -> str:
    """One run and its claim; with `config.checkpoints`, its loop has `loop.checkpoint` (Files,
    Restore) and one retry, and the first attempt of iteration `fail_iteration` fails dirty."""
    mount = "/w" if config.control_off_volume else "/workspace"
    hold = HOLD.format(hold_iteration=config.hold_iteration, hold="yes" if config.hold else "no", mount=mount)
    if config.candidates:
        return candidates_manifest(config, name)
    if config.warm:
        return warm_manifest(config, name)
    if config.checkpoints:
        script = CHECKPOINT_SCRIPT.format(
            mount=mount, hold=hold, sleep=config.iteration_seconds, fail_iteration=fail_iteration
        )
    else:
        script = SCRIPT.format(mount=mount, hold=hold, sleep=config.iteration_seconds)
    return claim_yaml(f"{name}-workspace") + RUN_TEMPLATE.format(
        name=name,
        script="\n".join(f"        {line}" if line else "" for line in script.splitlines()),
        mount=mount,
        iterations=config.iterations,
        retries=CHECKPOINT_STEP if config.checkpoints else "",
        checkpoint=CHECKPOINT_LOOP.format(exclude=", ".join(CHECKPOINT_EXCLUDE))
        if config.checkpoints
        else "",
    )


def candidates_manifest(config: Config, name: str) -> str:
    """`--candidates`: one run, its workspace claim and the /logs claim its candidates share."""
    hold = HOLD.format(
        hold_iteration=config.hold_iteration, hold="yes" if config.hold else "no", mount="/logs"
    )
    script = CANDIDATES_SCRIPT.format(
        hold=hold, sleep=config.iteration_seconds, count=config.candidates, iterations=config.iterations
    )
    run = RUN_TEMPLATE.format(
        name=name,
        script="\n".join(f"        {line}" if line else "" for line in script.splitlines()),
        mount="/workspace",
        iterations=config.iterations,
        retries="",
        checkpoint=CANDIDATES_LOOP.format(count=config.candidates),
    )
    volume_end = "        mountPath: /workspace\n"
    run = run.replace(volume_end, volume_end + CANDIDATES_VOLUME.format(name=name), 1)
    return claim_yaml(f"{name}-workspace") + claim_yaml(f"{name}-logs") + run


def warm_manifest(config: Config, name: str) -> str:
    """`--warm`: one run with `loop.warm` and retries, and its workspace claim."""
    hold = HOLD.format(
        hold_iteration=config.hold_iteration, hold="yes" if config.hold else "no", mount="/workspace"
    )
    script = WARM_SCRIPT.format(hold=hold, sleep=config.iteration_seconds)
    return claim_yaml(f"{name}-workspace") + RUN_TEMPLATE.format(
        name=name,
        script="\n".join(f"        {line}" if line else "" for line in script.splitlines()),
        mount="/workspace",
        iterations=config.iterations,
        retries=WARM_STEP.format(retries=config.warm_retries),
        checkpoint=WARM_LOOP.format(idle=WARM_IDLE_SECONDS),
    )


def warm_check(
    log: str, seen: str, run: dict[str, Any], iterations: int
) -> tuple[list[int], list[int], list[str]]:
    """`--warm`: (repeated, lost, wrong) of one run. Lost: an iteration not recorded `Succeeded`, or
    whose recorded last attempt never logged `done`. Repeated: an attempt that started or finished
    twice, an attempt that ran beyond those the status records, or a failed attempt whose command
    finished too (the iteration's work done twice). Wrong: a recorded attempt whose command never
    started, an iteration that did not see the previous iteration's control
    (`{"n": N-1, "a": <its recorded attempts>}`, `null` for the first) or state (its line `N-1 A`, or
    the line of an earlier attempt of its own iteration that was killed after writing it)."""
    records: dict[int, dict[str, Any]] = {}
    for step in ((run.get("status") or {}).get("workflow") or {}).get("steps") or []:
        for record in (step.get("loop") or {}).get("iterations") or []:
            if isinstance(record.get("index"), int):
                records[record["index"]] = record
    starts = Counter(_log_lines(log, "start"))
    dones = Counter(_log_lines(log, "done"))
    repeated: set[int] = set()
    lost: set[int] = set()
    wrong: list[str] = []
    attempts: dict[int, int] = {}
    for k in range(1, iterations + 1):
        record = records.get(k) or {}
        ran = sorted(a for (i, a) in starts if i == k and a is not None)
        if any(n > 1 for (i, _a), n in starts.items() if i == k) or any(
            n > 1 for (i, _a), n in dones.items() if i == k
        ):
            repeated.add(k)
        if record.get("phase") != "Succeeded" or not isinstance(record.get("attempts"), int):
            lost.add(k)
            wrong.append(f"iteration {k}: recorded as {record.get('phase')!r}")
            continue
        last = attempts[k] = int(record["attempts"])
        if any(a > last for a in ran):
            repeated.add(k)
            wrong.append(f"iteration {k}: attempts {ran} ran, the status records {last}")
        never = [a for a in range(1, last + 1) if a not in ran]
        if never:
            wrong.append(f"iteration {k}: recorded attempt(s) {never} never started their command")
        if dones[k, last] != 1:
            lost.add(k)
        if any(dones[k, a] for a in range(1, last)):
            repeated.add(k)
            wrong.append(f"iteration {k}: a failed attempt's command finished too: {sorted(dones)}")
    for line in seen.splitlines():  # "<N> <A>|<last line of state.txt>|<AGENTRUN_PREVIOUS_CONTROL>"
        head, _, rest = line.partition("|")
        before, _, control = rest.partition("|")
        k, a = (int(x) for x in head.split())
        if k == 1:
            want_state, want_control = "none", None
        elif k - 1 in attempts:
            want_state, want_control = f"{k - 1} {attempts[k - 1]}", {"n": k - 1, "a": attempts[k - 1]}
        else:
            continue  # the previous iteration is not recorded: already counted lost
        killed_own = (
            before.startswith(f"{k} ") and int(before.split()[1]) < a and not dones[k, int(before.split()[1])]
        )
        if before != want_state and not killed_own:
            wrong.append(f"iteration {k} attempt {a} started from state {before!r}, not {want_state!r}")
        try:
            found = json.loads(control)
        except ValueError:
            found = control
        if found != want_control:
            wrong.append(
                f"iteration {k} attempt {a} saw the previous control {control!r}, not {want_control}"
            )
    return sorted(repeated), sorted(lost), wrong


def warm_iterations(log: str) -> int:
    """`--warm`: how many commands ran in a container that had run an earlier iteration (the count
    each one logs after its pod's name)."""
    return sum(
        1
        for line in log.splitlines()
        if line.startswith("start ") and len(line.split()) == 5 and line.split()[4] != "1"
    )


def winner_of(iteration: int, count: int) -> int:
    """`--candidates`: the candidate whose score wins iteration `iteration` (CANDIDATES_SCRIPT)."""
    return (iteration - 1) % count


def candidates_check(
    log: str, seen: str, state: str, run: dict[str, Any], iterations: int, count: int
) -> tuple[list[int], list[int], list[str]]:
    """`--candidates`: (repeated, lost, wrong) of one run. An iteration is repeated when one of its
    candidates started or finished twice, lost when one never finished; wrong lists what else is off:
    a candidate that started from another state than the previous iteration's winner left, the
    workspace not ending as the chain of winners, a record without its winner promoted."""
    starts = Counter((k, c) for k, c in _log_lines(log, "start"))
    dones = Counter((k, c) for k, c in _log_lines(log, "done"))
    pairs = [(k, c) for k in range(1, iterations + 1) for c in range(count)]
    repeated = sorted({k for k, c in pairs if starts[k, c] > 1 or dones[k, c] > 1})
    lost = sorted({k for k, c in pairs if dones[k, c] == 0})
    wrong: list[str] = []
    for line in seen.splitlines():  # "<N> <C> saw <last line of state.txt>"
        k, c, _, before = line.split(" ", 3)
        expected = "none" if int(k) == 1 else f"{int(k) - 1} by {winner_of(int(k) - 1, count)}"
        if before != expected:
            wrong.append(f"iteration {k} candidate {c} started from {before!r}, not {expected!r}")
    chain = [f"{k} by {winner_of(k, count)}" for k in range(1, iterations + 1)]
    if state.splitlines() != chain:
        wrong.append(f"the workspace ends as {state.splitlines()}, not the winners' chain {chain}")
    for step in ((run.get("status") or {}).get("workflow") or {}).get("steps") or []:
        for record in (step.get("loop") or {}).get("iterations") or []:
            found = record.get("candidates") or {}
            k = record.get("index")
            if isinstance(k, int) and (
                found.get("winner") != winner_of(k, count) or not found.get("promoted")
            ):
                wrong.append(f"iteration {k}: its record says {found}")
    return repeated, lost, wrong


@dataclass
class Report:
    config: Config
    injected: Counter[str] = field(default_factory=Counter)
    phases: dict[str, str] = field(default_factory=dict)
    repeated: dict[str, list[int]] = field(default_factory=dict)
    lost: dict[str, list[int]] = field(default_factory=dict)
    seconds: float = 0.0
    home: str = ""
    adopted: int = 0
    """Pods a restarted pod runner adopted (their containers had outlived the old runner)."""
    duplicates_held: int = 0
    """Duplicate pods of a Job (the Job controller's) that waited at the Job claim, never running main."""
    failed_recoveries: int = 0
    """Recovery commands (`dev up`, `dev restart`) that failed and were run again."""
    job_claims: int = 0
    """Job claims found on the runs' PVCs (one per attempt's Job that ran: docs/concepts.md#exactly-once)."""
    error: str = ""
    """Why the suite stopped early (the local default did not come back), empty when it did not."""
    fail_iterations: dict[str, int] = field(default_factory=dict)
    """`--checkpoints`: the iteration of each run whose first attempt fails dirty."""
    retries_checked: int = 0
    """`--checkpoints`: retries whose start hash was compared with their iteration's start hash."""
    restore_mismatch: dict[str, list[str]] = field(default_factory=dict)
    candidates_wrong: dict[str, list[str]] = field(default_factory=dict)
    """`--candidates`: per run, what is off besides lost and repeated (`candidates_check`)."""
    """`--checkpoints`: per run, the retries that did not start from their iteration's start hash."""
    not_retried: list[str] = field(default_factory=list)
    """`--checkpoints`: runs whose failing iteration did not fail once and then run again."""
    warm_wrong: dict[str, list[str]] = field(default_factory=dict)
    """`--warm`: per run, what is off besides lost and repeated (`warm_check`)."""
    warm_pods_killed: list[str] = field(default_factory=list)
    """`--warm`: each warm pod deleted, and the iteration attempt it was running."""
    warm_iterations: int = 0
    """`--warm`: commands that ran in a container that had run an earlier iteration."""
    warm_attempts: int = 0
    """`--warm`: iteration attempts the runs' status records (one per iteration, more when retried)."""

    @property
    def wrong_terminal(self) -> dict[str, str]:
        return {name: phase for name, phase in self.phases.items() if phase != "Succeeded"}

    @property
    def ok(self) -> bool:
        return (
            not self.error
            and not self.wrong_terminal
            and not any(self.repeated.values())
            and not any(self.lost.values())
            and not any(self.restore_mismatch.values())
            and not any(self.candidates_wrong.values())
            and not any(self.warm_wrong.values())
            and not self.not_retried
        )

    def summary(self) -> str:
        c = self.config
        lines = [
            f"chaos: {c.runs} runs x {c.iterations} iterations, {sum(self.injected.values())} faults "
            f"in {self.seconds:.0f}s (seed {c.seed})",
            f"{'FAULT KIND':<20}{'INJECTED':>9}  (scheduled {c.faults} of each)",
            *(f"{kind:<20}{self.injected.get(kind, 0):>9}" for kind in c.kinds),
            f"runs: {len(self.phases)}  wrong terminal states: {len(self.wrong_terminal)}  "
            f"repeated iterations: {sum(len(v) for v in self.repeated.values())}  "
            f"lost iterations: {sum(len(v) for v in self.lost.values())}  "
            f"pods adopted by a restarted runner: {self.adopted}  "
            f"duplicate pods held at the Job claim: {self.duplicates_held}  "
            f"recoveries run again: {self.failed_recoveries}  "
            f"Job claims on the PVCs: {self.job_claims}",
        ]
        if c.checkpoints:
            lines.append(
                f"checkpoints (Files, Restore): failing attempts injected: {len(self.fail_iterations)}  "
                f"retries checked: {self.retries_checked}  "
                f"restore_mismatch: {sum(len(v) for v in self.restore_mismatch.values())}  "
                f"not_retried: {len(self.not_retried)}"
            )
        if c.candidates:
            lines.append(
                f"candidates ({c.candidates} per iteration): candidate runs checked: "
                f"{c.runs * c.iterations * c.candidates}  "
                f"candidates_wrong: {sum(len(v) for v in self.candidates_wrong.values())}"
            )
        if c.warm:
            lines.append(
                f"warm: iterations in a pod that ran an earlier one: {self.warm_iterations}  "
                f"attempts recorded: {self.warm_attempts}  warm pods killed mid-iteration: "
                f"{len(self.warm_pods_killed)}  warm_wrong: {sum(len(v) for v in self.warm_wrong.values())}"
            )
            lines += [f"  killed {what}" for what in self.warm_pods_killed]
        if self.error:
            lines.append(f"STOPPED EARLY: {self.error}")
        for name, phase in sorted(self.wrong_terminal.items()):
            lines.append(f"  {name}: {phase}")
        for what, table in (("repeated", self.repeated), ("lost", self.lost)):
            for name, its in sorted(table.items()):
                if its:
                    lines.append(f"  {name}: {what} iterations {its}")
        for name, problems in sorted(self.restore_mismatch.items()):
            lines += [f"  {name}: {problem}" for problem in problems]
        for name, problems in sorted(self.candidates_wrong.items()):
            lines += [f"  {name}: {problem}" for problem in problems]
        for name, problems in sorted(self.warm_wrong.items()):
            lines += [f"  {name}: {problem}" for problem in problems]
        for name in self.not_retried:
            lines.append(
                f"  {name}: iteration {self.fail_iterations.get(name)} did not fail once and run again"
            )
        return "\n".join(lines)


DUPLICATE_SAID = "this pod is a duplicate the Job controller created"
"""What the reporter of a Job's duplicate pod logs (docs/concepts.md#exactly-once): the reporter, a
regular container listed before `main`, claims the Job (docs/design.md#reporter-first). Every pod of
a chaos run is made by this operator, so none has the fingerprint init container of older builds'
pods (docs/operations.md#earlier-pods)."""


def duplicates_held(home: Path) -> int:
    """Pods whose reporter found their Job claimed by another pod (the runner keeps each container's
    log at `<home>/pods/<namespace>/<pod>/<uid>/logs/<container>/<n>.log`, the real node's kubelet at
    `<home>/node/pod-logs/<namespace>_<pod>_<uid>/<container>/<n>.log`)."""
    logs = [
        *home.glob(f"pods/*/*/*/logs/{REPORTER_CONTAINER}/*.log"),
        *home.glob(f"node/pod-logs/*/{REPORTER_CONTAINER}/*.log"),
    ]
    return sum(DUPLICATE_SAID in log.read_text(errors="replace") for log in logs)


def _log_lines(log: str, word: str) -> list[tuple[int, int | None]]:
    """(iteration, attempt) of the log's lines `<word> N` (`<word> N A` with `--checkpoints`)."""
    out: list[tuple[int, int | None]] = []
    for line in log.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == word:
            out.append((int(parts[1]), int(parts[2]) if len(parts) > 2 else None))
    return out


def iteration_counts(log: str, iterations: int) -> tuple[list[int], list[int]]:
    """(repeated, lost) iterations of one run's PVC log: `main` started more than once (an attempt
    that failed on purpose, `fail N A`, and its retry are one start), an attempt started twice, or
    done more than once; never done."""
    started = _log_lines(log, "start")
    starts = Counter(k for k, _ in started)
    attempts = Counter(started)
    fails = Counter(k for k, _ in _log_lines(log, "fail"))
    dones = Counter(k for k, _ in _log_lines(log, "done"))
    twice = {k for (k, a), n in attempts.items() if a is not None and n > 1}
    repeated = sorted(
        k for k in range(1, iterations + 1) if starts[k] - fails[k] > 1 or dones[k] > 1 or k in twice
    )
    lost = sorted(k for k in range(1, iterations + 1) if dones[k] == 0)
    return repeated, lost


def status_check(run: dict[str, Any], log: str) -> list[str]:
    """What one run's status says of its retries, against its PVC log: an iteration retried on the
    volume has as many attempts in its record, and its record says it restored its own checkpoint
    (`status…iterations[].checkpoint.restored`); an iteration the log shows once has no restore."""
    attempts = Counter(k for k, a in _log_lines(log, "start") if a is not None)
    problems: list[str] = []
    for step in ((run.get("status") or {}).get("workflow") or {}).get("steps") or []:
        for record in (step.get("loop") or {}).get("iterations") or []:
            k = record.get("index")
            checkpoint = record.get("checkpoint") or {}
            restored = checkpoint.get("restored")
            if not isinstance(k, int) or k not in attempts:
                continue
            if record.get("attempts") != attempts[k]:
                problems.append(
                    f"iteration {k}: status says {record.get('attempts')} attempts, the volume {attempts[k]}"
                )
            if attempts[k] > 1 and (restored is None or restored != checkpoint.get("id")):
                problems.append(f"iteration {k}: retried, but its status says it restored {restored!r}")
            if attempts[k] == 1 and restored is not None:
                problems.append(f"iteration {k}: one attempt, but its status says it restored {restored!r}")
    return problems


def fail_iterations(config: Config, names: list[str]) -> dict[str, int]:
    """`--checkpoints`: the iteration of each run whose first attempt fails dirty, from the seed (a
    generator of its own, so the fault schedule of a seed is the same with and without)."""
    rng = random.Random(f"{config.seed}/checkpoints")
    return {name: rng.randint(1, config.iterations) for name in names}


def restore_check(
    log: str, hashes: dict[tuple[int, int], str], fail_iteration: int
) -> tuple[int, list[str], bool]:
    """One run's retries against their iterations' starts: (retries compared, mismatches, whether the
    failing iteration failed once and ran again). `hashes` holds each attempt's start hash by
    (iteration, attempt); every attempt after the first must start with its iteration's first
    attempt's hash, whichever iteration it is in (a fault that made an attempt fail is retried too)."""
    checked = 0
    problems: list[str] = []
    for k, a in sorted({(k, a) for k, a in _log_lines(log, "start") if a is not None and a > 1}):
        first, retry = hashes.get((k, 1)), hashes.get((k, a))
        checked += 1
        if first is None or retry is None:
            problems.append(
                f"iteration {k} attempt {a}: no start hash of attempt {1 if first is None else a}"
            )
        elif first != retry:
            problems.append(
                f"iteration {k} attempt {a}: start hash {retry[:12]} != the iteration's start {first[:12]}"
            )
    fails = _log_lines(log, "fail")
    exercised = fails == [(fail_iteration, 1)] and (fail_iteration, 2) in set(_log_lines(log, "start"))
    return checked, problems, exercised


class LocalDefault:
    """A local default of the suite's own, driven through the `agentrun dev` CLI as a user would."""

    def __init__(self, home: Path, say: Callable[[str], None], namespace_only: bool = False) -> None:
        self.home = home
        self.say = say
        # A local default shared with other tests (the real-node tier's): the suite's operator
        # watches only the suite's namespace, so it never meets their runs.
        self.extra_env = {"AGENTS_CONTROLLER_NAMESPACES": NAMESPACE} if namespace_only else {}
        self.log_claim = "workspace"
        """The claim whose root holds chaos.log and release: `logs` with `--candidates`."""
        self.plane = ControlPlane(home, toolchain.bin_dir())
        self.failed_recoveries = 0
        self.names: list[str] = []
        """The suite's runs (a warm pod to kill is one of theirs)."""
        self.rng = random.Random(0)
        self.warm_pods_killed: list[str] = []

    def agentrun(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "agentrun_operator.cli", *args],
            env=dict(os.environ, AGENTRUN_DEV_HOME=str(self.home), **self.extra_env),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"agentrun {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
            )
        return proc

    def pid(self, component: str) -> int:
        record = processes.read_record(self.home / "run", component)
        if record is None or not record.alive():
            raise RuntimeError(f"{component} is not running")
        return record.pid

    def kill_and_up(self, component: str) -> None:
        """A crash (SIGKILL), then `agentrun dev up`, which must restart it alone."""
        os.kill(self.pid(component), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            record = processes.read_record(self.home / "run", component)
            if record is None or not record.alive():
                break
            time.sleep(0.05)
        self.recover("dev", "up")

    def recover(self, *args: str, attempts: int = 3) -> None:
        """Run a recovery command as a user would: when it fails (a component too slow to come
        back on a loaded machine), say so, count it, and run `agentrun dev up` again."""
        for attempt in range(1, attempts + 1):
            proc = (
                self.agentrun(*args, check=False) if attempt == 1 else self.agentrun("dev", "up", check=False)
            )
            if proc.returncode == 0:
                return
            self.failed_recoveries += 1
            self.say(
                f"chaos: `agentrun {' '.join(args)}` failed (attempt {attempt}): {proc.stderr.strip()[-300:]}"
            )
        raise RuntimeError(f"the local default did not come back after {attempts} attempts")

    def freeze(self, component: str, seconds: float) -> None:
        pid = self.pid(component)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)

    def inject(self, kind: str, config: Config) -> bool:
        """Inject one fault of `kind`; False when it could not be (`warm-pod-kill`: every run ended)."""
        if kind == "operator-kill":
            self.kill_and_up("operator")
        elif kind == "apiserver-freeze":
            self.freeze("kube-apiserver", config.freeze_seconds)
        elif kind == "apiserver-restart":
            self.kill_and_up("kube-apiserver")
        elif kind == "etcd-restart":
            self.recover("dev", "restart", "etcd")
        elif kind == "runner-restart":
            self.kill_and_up("pod-runner")
        elif kind == "kubelet-restart":
            self.kill_and_up("kubelet")  # its containers keep running, as on a node
        elif kind == "warm-pod-kill":
            return self.kill_warm_pod(time.monotonic() + config.timeout)
        else:
            raise ValueError(kind)
        return True

    def kill_warm_pod(self, deadline: float) -> bool:
        """Delete (as `kubectl delete pod` does: its grace period, SIGTERM first) a warm pod while an
        iteration's command runs in it, one the pod did not start with when there is such a pod (the
        iterations the operator started over the channel are what is new here); otherwise, after
        `WARM_KILL_PREFER_SECONDS`, any warm pod mid-iteration. Waits for one; False when every run
        has ended first."""
        since = time.monotonic()
        while True:
            found = self.warm_pods_mid_iteration()
            later = [f for f in found if f[3]]
            if time.monotonic() - since >= WARM_KILL_PREFER_SECONDS:
                later = later or found
            if later:
                pod, run, (k, a), warm, first = self.rng.choice(sorted(later))
                code, _ = self.plane.api_request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}")
                if code in (200, 202):
                    what = "an iteration it started over the channel" if warm else "its first iteration"
                    self.warm_pods_killed.append(
                        f"{pod} ({run}, iteration {k} attempt {a}: {what}; the pod started at {first})"
                    )
                    self.say(f"chaos: deleted warm pod {pod} during iteration {k} attempt {a} of {run}")
                    return True
            if self.all_ended(len(self.names)):
                return False
            if time.monotonic() > deadline:
                raise RuntimeError("timed out waiting for a warm pod mid-iteration")
            time.sleep(POLL_SECONDS)

    def warm_pods_mid_iteration(self) -> list[tuple[str, str, tuple[int, int], bool, str]]:
        """(pod, run, the (iteration, attempt) its command runs, whether the pod started with another
        iteration, the iteration it started with) of each live warm pod of the suite's runs whose run's
        log last started an attempt that has not finished."""
        code, body = self.plane.api_get(
            f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={naming.LABEL_WARM}%3Dtrue", timeout=10
        )
        if code != 200:
            return []
        found = []
        for pod in json.loads(body).get("items") or []:
            meta = pod.get("metadata") or {}
            labels = meta.get("labels") or {}
            run = labels.get(naming.LABEL_RUN)
            if run not in self.names or meta.get("deletionTimestamp"):
                continue
            if (pod.get("status") or {}).get("phase") != "Running":
                continue
            log = self.claim_log(run)
            started = _log_lines(log, "start")
            if not started:
                continue
            k, a = started[-1]
            if a is None or (k, a) in set(_log_lines(log, "done")):
                continue
            first = int(labels.get(naming.LABEL_ITERATION, "0"))
            found.append((str(meta["name"]), run, (k, a), k > first, f"iteration {first}"))
        return found

    def phases(self) -> dict[str, str] | None:
        code, body = self.plane.api_get(AR_PATH, timeout=10)
        if code != 200:
            return None
        items = json.loads(body).get("items") or []
        return {i["metadata"]["name"]: (i.get("status") or {}).get("phase") or "Pending" for i in items}

    def all_ended(self, runs: int) -> bool:
        phases = self.phases()
        return phases is not None and len(phases) == runs and all(p in TERMINAL for p in phases.values())

    def all_started(self, names: list[str]) -> bool:
        return all("start 1" in self.claim_log(n) for n in names)

    def release(self, names: list[str], deadline: float) -> None:
        """Let the held runs go on. The last fault may still be healing (an API server restarting):
        wait for it to answer rather than taking its silence for an unbound claim."""
        for name in names:
            found: list[Path] = []

            def readable(run: str = name, found: list[Path] = found) -> bool:
                claim = self.claim_dir(run, self.log_claim)
                if claim is not None:
                    found.append(claim)
                return claim is not None

            self.wait_for(readable, deadline, f"the claim of {name} (the API server back, the claim bound)")
            (found[-1] / "release").touch()

    def wait_for(self, check: Callable[[], bool], deadline: float, what: str) -> None:
        while not check():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(POLL_SECONDS)

    def claim_dir(self, name: str, claim: str = "workspace") -> Path | None:
        """The directory of the volume bound to the run's claim `<name>-<claim>` (None until bound)."""
        return claim_directory(self.plane, NAMESPACE, f"{name}-{claim}")

    def job_claims(self, name: str) -> int:
        claim = self.claim_dir(name)
        claims = claim / ".agentrun-claims" if claim is not None else None
        return len(list(claims.iterdir())) if claims is not None and claims.is_dir() else 0

    def start_hashes(self, name: str) -> dict[tuple[int, int], str]:
        """`--checkpoints`: each attempt's start hash, by (iteration, attempt)."""
        claim = self.claim_dir(name)
        folder = claim / "chaos-hashes" if claim is not None else None
        if folder is None or not folder.is_dir():
            return {}
        out: dict[tuple[int, int], str] = {}
        for path in folder.iterdir():  # i<iteration>-a<attempt>
            k, _, a = path.name.removeprefix("i").partition("-a")
            out[int(k), int(a)] = path.read_text().strip()
        return out

    def agentrun_object(self, name: str) -> dict[str, Any]:
        code, body = self.plane.api_get(f"{AR_PATH}/{name}", timeout=10)
        if code != 200:
            raise RuntimeError(f"GET AgentRun {name}: HTTP {code}")
        doc: dict[str, Any] = json.loads(body)
        return doc

    def claim_log(self, name: str, file: str = "chaos.log") -> str:
        """A file of the run's log claim: the workspace's, or with `--candidates` the shared /logs."""
        claim = self.claim_dir(name, self.log_claim)
        path = claim / file if claim is not None else None
        return path.read_text() if path is not None and path.exists() else ""

    def workspace_file(self, name: str, file: str) -> str:
        claim = self.claim_dir(name)
        path = claim / file if claim is not None else None
        return path.read_text() if path is not None and path.exists() else ""


def schedule(config: Config) -> list[str]:
    """`faults` of each kind, interleaved round-robin, each round in a shuffled order."""
    rng = random.Random(config.seed)
    order: list[str] = []
    for _ in range(config.faults):
        kinds = list(config.kinds)
        rng.shuffle(kinds)
        order += kinds
    return order


def _say(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def run(
    config: Config, home: Path, say: Callable[[str], None] = _say, keep: bool = False, shared: bool = False
) -> Report:
    """`shared`: `home` is a local default other tests use too (left running, its other operators
    undisturbed: this suite's operator watches only its namespace, and is stopped at the end)."""
    report = Report(config, home=str(home))
    env = LocalDefault(home, say, namespace_only=shared)
    if config.candidates:
        env.log_claim = "logs"
    started = time.monotonic()
    try:
        say(f"chaos: starting a local default in {home} ({config.runtime} runtime)")
        env.agentrun("dev", "up", f"--runtime={config.runtime}")
        names = [f"chaos-{i:03d}" for i in range(config.runs)]
        env.names = names
        env.rng = random.Random(f"{config.seed}/warm")
        if config.checkpoints:
            report.fail_iterations = fail_iterations(config, names)
        manifests = "---\n".join(manifest(config, n, report.fail_iterations.get(n, 0)) for n in names)
        env.plane.kubectl("apply", "-n", NAMESPACE, "-f", "-", input_text=manifests)
        say(f"chaos: {len(names)} runs created; injecting {config.faults} faults of each kind")
        deadline = time.monotonic() + config.timeout
        phases: dict[str, str] = {}
        order = schedule(config)
        if config.hold and config.hold_iteration == 1:
            env.wait_for(lambda: env.all_started(names), deadline, "every run's first iteration to run")
        for kind in order:
            if time.monotonic() > deadline or (not config.hold and env.all_ended(len(names))):
                break  # faults are injected while runs are in flight only
            time.sleep(config.gap)
            say(f"chaos: {kind}")
            if env.inject(kind, config):
                report.injected[kind] += 1
        if config.hold:
            env.release(names, deadline)
        while time.monotonic() < deadline:
            seen = env.phases()
            if seen is not None:
                phases = seen
                if len(phases) == len(names) and all(p in TERMINAL for p in phases.values()):
                    break
            time.sleep(POLL_SECONDS)
        report.phases = {n: phases.get(n, "missing") for n in names}
        for name in names:
            env.wait_for(
                lambda n=name: env.claim_dir(n) is not None, time.monotonic() + 60, f"{name}'s claim"
            )
            log = env.claim_log(name)
            if config.candidates:
                seen, state = env.claim_log(name, "seen.log"), env.workspace_file(name, "state.txt")
                repeated, lost, wrong = candidates_check(
                    log, seen, state, env.agentrun_object(name), config.iterations, config.candidates
                )
                report.candidates_wrong[name] = wrong
            elif config.warm:
                obj = env.agentrun_object(name)
                repeated, lost, wrong = warm_check(
                    log, env.claim_log(name, "seen.log"), obj, config.iterations
                )
                report.warm_wrong[name] = wrong
                report.warm_iterations += warm_iterations(log)
                report.warm_attempts += sum(
                    int(r.get("attempts") or 0)
                    for step in ((obj.get("status") or {}).get("workflow") or {}).get("steps") or []
                    for r in (step.get("loop") or {}).get("iterations") or []
                )
            else:
                repeated, lost = iteration_counts(log, config.iterations)
            report.repeated[name] = repeated
            report.lost[name] = lost
            if config.checkpoints:
                checked, problems, exercised = restore_check(
                    log, env.start_hashes(name), report.fail_iterations[name]
                )
                report.retries_checked += checked
                report.restore_mismatch[name] = problems + status_check(env.agentrun_object(name), log)
                if not exercised:
                    report.not_retried.append(name)
            report.job_claims += env.job_claims(name)
        runner_log = home / "logs" / "pod-runner.log"
        if runner_log.exists():
            report.adopted = runner_log.read_text(errors="replace").count("from an earlier runner process")
        report.duplicates_held = duplicates_held(home)
    except RuntimeError as exc:  # the local default did not come back: the report says so
        report.error = str(exc)
    finally:
        report.failed_recoveries = env.failed_recoveries
        report.warm_pods_killed = list(env.warm_pods_killed)
        report.seconds = time.monotonic() - started
        if shared:
            processes.stop_process(home / "run", "operator", grace=20)
        elif not keep:
            env.agentrun("dev", "down", check=False)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=Config.runs)
    parser.add_argument("--iterations", type=int, default=Config.iterations)
    parser.add_argument("--faults", type=int, default=Config.faults, help="faults of each kind")
    parser.add_argument(
        "--kinds",
        default=None,
        help=f"comma-separated subset of {','.join(KINDS)} (default: every kind of the runtime)",
    )
    parser.add_argument(
        "--runtime",
        choices=("process", "kubelet"),
        default=Config.runtime,
        help="the local pod runner, or the real node (root; the kubelet is killed instead of the runner)",
    )
    parser.add_argument("--iteration-seconds", type=float, default=Config.iteration_seconds)
    parser.add_argument("--freeze-seconds", type=float, default=Config.freeze_seconds)
    parser.add_argument("--gap", type=float, default=Config.gap, help="seconds between two faults")
    parser.add_argument("--timeout", type=float, default=Config.timeout, help="give up after this long")
    parser.add_argument("--seed", type=int, default=Config.seed)
    parser.add_argument(
        "--hold",
        action="store_true",
        help="hold runs in an iteration until every fault is in (every fault meets runs in flight)",
    )
    parser.add_argument(
        "--hold-iteration",
        type=int,
        default=Config.hold_iteration,
        help="the iteration --hold holds runs in (1: faults start once all run; the last: the "
        "iterations before it run while faults go in)",
    )
    parser.add_argument(
        "--control-off-volume",
        action="store_true",
        help="mount each run's PVC at /w: the control path lies on no volume (the claim is on the PVC)",
    )
    parser.add_argument(
        "--checkpoints",
        action="store_true",
        help="loop.checkpoint (Files, onFailedAttempt: Restore) and one retry per run; one iteration's "
        "first attempt per run dirties the workspace and fails: every retry must start from its "
        "iteration's start hash",
    )
    parser.add_argument(
        "--candidates",
        type=int,
        default=0,
        metavar="N",
        help="loop.candidates with N candidates per iteration and a shared /logs claim: every candidate "
        "runs once, each iteration starts from the previous winner, the workspace ends as the winners' chain",
    )
    parser.add_argument(
        "--warm",
        action="store_true",
        help="loop.warm and retries per run, and the fault kind warm-pod-kill (default kinds: "
        f"{','.join(WARM_KINDS)}): every iteration recorded once, each recorded attempt's command "
        "started once, each iteration saw the previous one's control and state",
    )
    parser.add_argument("--home", help="the local default's state directory (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="leave the local default running afterwards")
    args = parser.parse_args(argv)
    default = WARM_KINDS if args.warm else NODE_KINDS if args.runtime == "kubelet" else PROCESS_KINDS
    kinds = tuple(k for k in args.kinds.split(",") if k) if args.kinds else default
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown fault kinds {unknown}; choose from {', '.join(KINDS)}")
    if "warm-pod-kill" in kinds and not args.warm:
        parser.error("the fault kind warm-pod-kill needs --warm")
    if args.warm and (args.checkpoints or args.candidates or args.control_off_volume):
        parser.error("--warm goes with neither --checkpoints, --candidates nor --control-off-volume")
    if not 1 <= args.hold_iteration <= args.iterations:
        parser.error(f"--hold-iteration must be between 1 and --iterations ({args.iterations})")
    config = Config(
        runs=args.runs,
        iterations=args.iterations,
        faults=args.faults,
        kinds=kinds,
        runtime=args.runtime,
        iteration_seconds=args.iteration_seconds,
        freeze_seconds=args.freeze_seconds,
        gap=args.gap,
        timeout=args.timeout,
        seed=args.seed,
        hold=args.hold,
        hold_iteration=args.hold_iteration,
        control_off_volume=args.control_off_volume,
        checkpoints=args.checkpoints,
        candidates=args.candidates,
        warm=args.warm,
    )
    home = Path(args.home) if args.home else Path(tempfile.mkdtemp(prefix="agentrun-chaos-")) / "dev"
    report = run(config, home, keep=args.keep)
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
