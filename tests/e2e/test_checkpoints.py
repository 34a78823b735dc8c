"""loop.checkpoint through real processes on the local pod runner (and on the real node,
tests/node/test_real_node.py): the reporter records the state volume before main, and a retry with
onFailedAttempt: Restore starts from its iteration's start exactly (docs/concepts.md#checkpoints);
with Keep it sees what the failed attempt left. `agentrun resume` through the real CLI starts a new
run on the same claim from the state at an iteration's end (docs/concepts.md#resume)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import LocalDefault, step_status
from tests.support.checkpoint_runs import checkpoint_run, hashing_script, read_record

# Each attempt first records a hash of the workspace tree (paths, contents, modes; the control
# directory left out, as the checkpoint leaves it out) in .agentrun, which no restore touches.
# Iteration 1 sets the workspace up; iteration 2's first attempt writes `dirty` into a file, deletes
# another, creates a third, then exits 1; its retry succeeds.
SCRIPT = hashing_script(
    r"""
mkdir -p .agentrun
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
)


@pytest.mark.parametrize("on_failed", ["Restore", "Keep"])
def test_a_retry_starts_from_its_iterations_checkpoint(local_default: LocalDefault, on_failed: str) -> None:
    name = f"ckpt-{on_failed.lower()}"
    local_default.apply(checkpoint_run(name, SCRIPT, max_iterations=2, retries=1, on_failed=on_failed))
    run = local_default.wait_for_end(name)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    loop = step_status(run)["loop"]
    records = {r["index"]: r for r in loop["iterations"]}
    assert records[2]["attempts"] == 2
    assert records[1]["checkpoint"]["id"] == f"{name}_1_1"
    assert records[2]["checkpoint"]["id"] == f"{name}_1_2"
    assert records[1]["checkpoint"]["files"] >= 0
    root = Path(local_default.claim_dir(f"{name}-workspace"))
    start, retry = read_record(root, "hash-i2-a1"), read_record(root, "hash-i2-a2")
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
RESUMED_SCRIPT = hashing_script(
    r"""
mkdir -p .agentrun
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
)

SIZE = re.compile(r"^\d+(\.\d)? (B|KiB|MiB|GiB)$")


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
    local_default.apply(checkpoint_run(name, RESUMED_SCRIPT, max_iterations=4))
    source = local_default.wait_for_end(name)
    assert source["status"]["phase"] == "Succeeded", source["status"]
    records = _records(source)
    assert sorted(records) == [1, 2, 3, 4]
    for index, record in records.items():
        assert record["checkpoint"]["id"] == f"{name}_1_{index}", record

    # `agentrun checkpoints`: one row per iteration, with its id, iteration, size and time.
    listed = local_default.cli("checkpoints", name, timeout=120)
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
    as_json = local_default.cli("checkpoints", name, "-o", "json", timeout=120)
    assert as_json.returncode == 0, as_json.stderr
    assert [r["bytes"] for r in json.loads(as_json.stdout)] == [
        records[i]["checkpoint"]["bytes"] for i in (1, 2, 3, 4)
    ]

    # The last iteration has no later one to record its end: refused, naming why.
    last = local_default.cli("resume", name, "--from-iteration", "4", timeout=120)
    assert last.returncode != 0 and "is its last" in last.stderr, (last.stdout, last.stderr)

    resumed = f"{name}-from-2"
    created = local_default.cli("resume", name, "--from-iteration", "2", timeout=120)
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
    source_end_2, source_end_4 = (
        read_record(root, f"hash-{name}-i2-end"),
        read_record(root, f"hash-{name}-i4-end"),
    )
    assert read_record(root, f"hash-{name}-i3-start") == source_end_2
    assert source_end_2 != source_end_4
    assert read_record(root, f"hash-{resumed}-i1-start") == source_end_2
