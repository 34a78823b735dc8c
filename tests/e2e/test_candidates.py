"""Best-of-N (`loop.candidates`) end to end: each iteration's candidates run at once on copies of its
start, the one with the highest score becomes the workspace, and every candidate's usage counts.
docs/concepts.md#candidates."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.conftest import LocalDefault, step_status
from tests.support.checkpoint_runs import tree_hash_function

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
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}-logs
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
      - name: logs
        type: pvc
        claimName: {name}-logs
        mountPath: /logs
  workflow:
    steps:
      - name: work
        loop:
          maxIterations: 2
          state:
            volumeNames: [workspace]
          checkpoint:
            mode: Files
          candidates:
            count: 3
            select: "candidates.filter(c, candidates.all(o, o.control.score <= c.control.score))[0].index"
"""

# Each candidate logs (on the shared, uncheckpointed `logs` volume) the tree hash it starts from and
# what the workspace holds, then changes the workspace its own way and reports a score and 10 tokens.
# Iteration 1: candidate 1 scores highest. Iteration 2: candidate 0 does; candidate 2 fails.
SCRIPT = f"""set -e
cd /workspace
{tree_hash_function()}
N=$AGENTRUN_ITERATION; C=$AGENTRUN_CANDIDATE
LOG="/logs/i$N-c$C"
tree_hash > "$LOG.hash"
ls -A | LC_ALL=C sort | tr '\\n' ' ' > "$LOG.ls"
cat work.txt > "$LOG.work" 2>/dev/null || echo none > "$LOG.work"
echo "candidate $C iteration $N" > work.txt
echo "$C" > "only-$N-$C.txt"
rm -f "only-$((N - 1))-1.txt"
if [ "$N" = 1 ]; then SCORE=$C; [ "$C" = 1 ] && SCORE=5; else SCORE=$C; [ "$C" = 0 ] && SCORE=9; fi
mkdir -p .agentrun
echo "{{\\"score\\": $SCORE, \\"usage\\": {{\\"inputTokens\\": 10}}}}" > "$AGENTRUN_LOOP_CONTROL_PATH"
if [ "$N" = 2 ] && [ "$C" = 2 ]; then exit 1; fi
exit 0
"""


def _manifest(name: str) -> str:
    body = "\n".join("        " + line for line in SCRIPT.strip().splitlines())
    return RUN.format(name=name, script=body)


def test_the_best_candidate_becomes_the_next_iterations_workspace(local_default: LocalDefault) -> None:
    name = "best-of-three"
    local_default.apply(_manifest(name))
    run = local_default.wait_for_end(name)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    step = step_status(run)
    records = {r["index"]: r for r in step["loop"]["iterations"]}
    first, second = records[1]["candidates"], records[2]["candidates"]
    assert first == {
        "count": 3,
        "succeeded": [0, 1, 2],
        "winner": 1,
        "checkpoint": f"{name}_1_1c1",
        "promoted": True,
    }
    assert second["succeeded"] == [0, 1] and second["winner"] == 0 and second["promoted"] is True
    assert records[2]["checkpoint"]["id"] == f"{name}_1_2"
    # Every candidate's usage counts, the losers' and the failed one's too: 2 iterations x 3 x 10.
    assert step["usage"]["inputTokens"] == 60, step["usage"]

    logs = Path(local_default.claim_dir(f"{name}-logs"))
    start_hashes = {(logs / f"i1-c{c}.hash").read_text() for c in range(3)}
    assert len(start_hashes) == 1  # all three start from the same (empty) workspace
    for c in range(3):
        assert (logs / f"i1-c{c}.work").read_text().strip() == "none"
        # Iteration 2 starts from candidate 1's files, and only its files.
        assert (logs / f"i2-c{c}.work").read_text().strip() == "candidate 1 iteration 1"
        listing = (logs / f"i2-c{c}.ls").read_text().split()
        assert "only-1-1.txt" in listing and "only-1-0.txt" not in listing and "only-1-2.txt" not in listing
    assert len({(logs / f"i2-c{c}.hash").read_text() for c in range(3)}) == 1

    # The workspace is the last iteration's winner (candidate 0), and the copies are gone.
    root = Path(local_default.claim_dir(f"{name}-workspace"))
    assert (root / "work.txt").read_text() == "candidate 0 iteration 2\n"
    assert (root / "only-2-0.txt").exists()
    assert not (root / "only-1-1.txt").exists()  # candidate 0 of iteration 2 removed it
    assert not (root / "only-2-1.txt").exists() and not (root / "only-2-2.txt").exists()
    candidates = root / ".agentrun" / "candidates"
    assert not candidates.exists() or not any(candidates.iterdir())
