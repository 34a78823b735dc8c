"""loop.checkpoint through real processes on the local pod runner: the reporter records the state
volume before main, and a retry with onFailedAttempt: Restore starts from its iteration's start
exactly (docs/concepts.md#checkpoints); with Keep it sees what the failed attempt left."""

from __future__ import annotations

from pathlib import Path

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
