"""loop.checkpoint through real processes on the local pod runner (and on the real node,
tests/node/test_real_node.py): the reporter records the state volume before main, and a retry with
onFailedAttempt: Restore starts from its iteration's start exactly (docs/concepts.md#checkpoints);
with Keep it sees what the failed attempt left. `agentrun resume` through the real CLI starts a new
run on the same claim from the state at an iteration's end (docs/concepts.md#resume)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import LocalDefault, step_status

RUN = """
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}-workspace
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
---
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
        mountPath: /workspace
  workflow:
    steps:
      - name: work
        retries: 1
        retryBackoffSeconds: 0
        loop:
          maxIterations: 2
          checkpoint:
            mode: Files
            onFailedAttempt: {on_failed}
"""

# Each attempt first records a hash of the workspace tree (paths, contents, modes; the control
# directory left out, as the checkpoint leaves it out) in .agentrun, which no restore touches.
# Iteration 1 sets the workspace up; iteration 2's first attempt writes `dirty` into a file, deletes
# another, creates a third, then exits 1; its retry succeeds.
SCRIPT = r"""
set -e
cd /workspace
mkdir -p .agentrun
tree_hash() {
  find . -path ./.agentrun -prune -o -path ./.agentrun-claims -prune -o -print | LC_ALL=C sort |
  while read -r p; do
    if [ -f "$p" ]; then echo "f $p $(stat -c %a "$p") $(sha256sum < "$p")";
    else echo "d $p $(stat -c %a "$p")"; fi
  done | sha256sum | cut -d' ' -f1
}
tree_hash > ".agentrun/hash-i${AGENTRUN_ITERATION}-a${AGENTRUN_ATTEMPT}"
if [ "$AGENTRUN_ITERATION" = 1 ]; then
  echo clean > keep.txt; echo here > gone.txt; mkdir -p sub; echo deep > sub/deep.txt; chmod 640 keep.txt
  exit 0
fi
if [ "$AGENTRUN_ATTEMPT" = 1 ]; then
  echo dirty > keep.txt; rm gone.txt; echo new > new.txt; chmod 600 sub/deep.txt
  exit 1
fi
exit 0
"""


def _manifest(name: str, on_failed: str) -> str:
    body = "\n".join("        " + line for line in SCRIPT.strip().splitlines())
    return RUN.format(name=name, script=body, on_failed=on_failed)


def _read(root: Path, name: str) -> str:
    return (root / ".agentrun" / name).read_text().strip()


@pytest.mark.parametrize("on_failed", ["Restore", "Keep"])
def test_a_retry_starts_from_its_iterations_checkpoint(local_default: LocalDefault, on_failed: str) -> None:
    name = f"ckpt-{on_failed.lower()}"
    local_default.apply(_manifest(name, on_failed))
    run = local_default.wait_for_end(name)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    loop = step_status(run)["loop"]
    records = {r["index"]: r for r in loop["iterations"]}
    assert records[2]["attempts"] == 2
    assert records[1]["checkpoint"]["id"] == f"{name}_1_1"
    assert records[2]["checkpoint"]["id"] == f"{name}_1_2"
    assert records[1]["checkpoint"]["files"] >= 0
    root = Path(local_default.claim_dir(f"{name}-workspace"))
    start, retry = _read(root, "hash-i2-a1"), _read(root, "hash-i2-a2")
    if on_failed == "Restore":
        assert records[2]["checkpoint"]["restored"] == f"{name}_1_2"
        assert retry == start
        assert (root / "keep.txt").read_text() == "clean\n"
        assert (root / "keep.txt").stat().st_mode & 0o777 == 0o640
        assert (root / "gone.txt").read_text() == "here\n"
        assert not (root / "new.txt").exists()
        assert (root / "sub" / "deep.txt").stat().st_mode & 0o777 != 0o600
    else:
        assert records[2]["checkpoint"].get("restored") is None
        assert retry != start
        assert (root / "keep.txt").read_text() == "dirty\n"
        assert not (root / "gone.txt").exists()
        assert (root / "new.txt").exists()
    assert (root / ".agentrun" / "checkpoints" / "manifests").is_dir()


# Every iteration records the tree hash at its start and at its end in .agentrun (the control
# file's directory: no checkpoint records or restores it), named by run and iteration, and changes
# the workspace in between: a file appended to, files and directories created, modes changed,
# files, a directory and a symlink made and removed.
RESUMED_SCRIPT = r"""
set -e
cd /workspace
mkdir -p .agentrun
tree_hash() {
  find . -path ./.agentrun -prune -o -path ./.agentrun-claims -prune -o -print | LC_ALL=C sort |
  while read -r p; do
    if [ -L "$p" ]; then echo "l $p $(readlink "$p")";
    elif [ -f "$p" ]; then echo "f $p $(stat -c %a "$p") $(sha256sum < "$p")";
    else echo "d $p $(stat -c %a "$p")"; fi
  done | sha256sum | cut -d' ' -f1
}
N=$AGENTRUN_ITERATION
tree_hash > ".agentrun/hash-${AGENTRUN_NAME}-i${N}-start"
echo "iteration $N" >> log.txt
echo "made in iteration $N" > "made-$N.txt"
mkdir -p "dir-$N/inner"; echo "$N" > "dir-$N/inner/file"
case "$N" in
  2) chmod 600 made-1.txt; ln -sfn made-2.txt latest ;;
  3) rm -f made-1.txt; rm -rf dir-2; ln -sfn made-3.txt latest ;;
  4) chmod 700 made-2.txt; rm -f latest log.txt ;;
esac
tree_hash > ".agentrun/hash-${AGENTRUN_NAME}-i${N}-end"
"""

RESUMED_RUN = """
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}-workspace
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
---
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
        mountPath: /workspace
  workflow:
    steps:
      - name: work
        loop:
          maxIterations: 4
          checkpoint:
            mode: Files
"""

SIZE = re.compile(r"^\d+(\.\d)? (B|KiB|MiB|GiB)$")


def _agentrun(local_default: LocalDefault, *args: str) -> subprocess.CompletedProcess[str]:
    """`agentrun ARGS` as a user runs it, against the test cluster's API server."""
    return subprocess.run(
        [sys.executable, "-m", "agentrun_operator.cli", *args, "-n", local_default.namespace],
        env={**os.environ, "KUBECONFIG": str(local_default.plane.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _table(text: str) -> list[dict[str, str]]:
    """`agentrun checkpoints`' table as rows by header (columns are three or more spaces apart; a
    size such as `1.2 KiB` has one)."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = re.split(r" {3,}", lines[0].strip())
    return [dict(zip(header, re.split(r" {3,}", line.strip()), strict=True)) for line in lines[1:]]


def _records(run: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {r["index"]: r for r in step_status(run)["loop"]["iterations"]}


def test_resume_starts_a_new_run_from_an_iterations_end(local_default: LocalDefault) -> None:
    name = "ckpt-resume"
    script = "\n".join("        " + line for line in RESUMED_SCRIPT.strip().splitlines())
    local_default.apply(RESUMED_RUN.format(name=name, script=script))
    source = local_default.wait_for_end(name)
    assert source["status"]["phase"] == "Succeeded", source["status"]
    records = _records(source)
    assert sorted(records) == [1, 2, 3, 4]
    for index, record in records.items():
        assert record["checkpoint"]["id"] == f"{name}_1_{index}", record

    # `agentrun checkpoints`: one row per iteration, with its id, iteration, size and time.
    listed = _agentrun(local_default, "checkpoints", name)
    assert listed.returncode == 0, listed.stderr
    rows = _table(listed.stdout)
    assert [r["ITERATION"] for r in rows] == ["1", "2", "3", "4"], listed.stdout
    for row in rows:
        record = records[int(row["ITERATION"])]
        assert row["ID"] == record["checkpoint"]["id"], listed.stdout
        assert row["STEP"] == "work", listed.stdout
        assert SIZE.match(row["SIZE"]), listed.stdout
        assert row["FILES"] == str(record["checkpoint"]["files"]), listed.stdout
        assert row["TIME"] == record["startedAt"], listed.stdout
    as_json = _agentrun(local_default, "checkpoints", name, "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert [r["bytes"] for r in json.loads(as_json.stdout)] == [
        records[i]["checkpoint"]["bytes"] for i in (1, 2, 3, 4)
    ]

    # The last iteration has no later one to record its end: refused, naming why.
    last = _agentrun(local_default, "resume", name, "--from-iteration", "4")
    assert last.returncode != 0 and "is its last" in last.stderr, (last.stdout, last.stderr)

    resumed = f"{name}-from-2"
    created = _agentrun(local_default, "resume", name, "--from-iteration", "2")
    assert created.returncode == 0, created.stderr
    assert f"AgentRun {resumed} created" in created.stdout, created.stdout
    new = local_default.run(resumed)
    assert new["spec"]["resumeFrom"] == {"run": name, "iteration": 2, "step": "work"}
    # The same claim: the checkpoints are on the source's volume (docs/concepts.md#resume).
    assert new["spec"]["workload"]["volumes"][0]["claimName"] == f"{name}-workspace"
    run = local_default.wait_for_end(resumed)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    first = _records(run)[1]["checkpoint"]
    assert first["id"] == f"{resumed}_1_1", first
    assert first["restored"] == f"{name}_1_3", first

    root = Path(local_default.claim_dir(f"{name}-workspace"))
    source_end_2, source_end_4 = _read(root, f"hash-{name}-i2-end"), _read(root, f"hash-{name}-i4-end")
    assert _read(root, f"hash-{name}-i3-start") == source_end_2
    assert source_end_2 != source_end_4
    assert _read(root, f"hash-{resumed}-i1-start") == source_end_2
