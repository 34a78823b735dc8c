"""Best-of-N (`loop.candidates`) end to end: each iteration's candidates run at once on copies of its
start, the one with the highest score becomes the workspace, and every candidate's usage counts.
docs/concepts.md#candidates."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.conftest import LocalDefault, step_status
from tests.support.checkpoint_runs import checkpoint_run, tree_hash_function
from tests.support.polling import eventually

CANDIDATES = """\
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


def _run(
    name: str,
    script: str,
    max_iterations: int = 2,
    retries: int | None = None,
    timeout_seconds: int | None = None,
) -> str:
    """The run and its two claims: the workspace, and the logs every candidate shares."""
    return checkpoint_run(
        name,
        script,
        max_iterations=max_iterations,
        retries=retries,
        timeout_seconds=timeout_seconds,
        shared=("logs",),
        loop_extra=CANDIDATES,
    )


def _manifest(name: str) -> str:
    return _run(name, SCRIPT)


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


SLEEPER = """set -e
mkdir -p "$(dirname "$AGENTRUN_LOOP_CONTROL_PATH")"
echo '{"score": 1, "usage": {"inputTokens": 10}}' > "$AGENTRUN_LOOP_CONTROL_PATH"
echo "candidate $AGENTRUN_CANDIDATE" > "/workspace/mine-$AGENTRUN_CANDIDATE.txt"
touch "/logs/started-$AGENTRUN_CANDIDATE"
exec sleep 600
"""


def _sleepers(name: str, timeout_seconds: int | None = None) -> str:
    return (
        _run(name, SLEEPER)
        if timeout_seconds is None
        else _run(name, SLEEPER, timeout_seconds=timeout_seconds)
    )


def _run_pods(local_default: LocalDefault, name: str) -> list[str]:
    code, body = local_default.plane.api_get(
        f"/api/v1/namespaces/{local_default.namespace}/pods?labelSelector=agents.proompteng.ai/agent-run%3D{name}"
    )
    assert code == 200, body
    return [p["metadata"]["name"] for p in json.loads(body)["items"]]


def test_an_immediate_cancel_stops_every_candidate_and_promotes_nothing(local_default: LocalDefault) -> None:
    name = "best-cancelled"
    local_default.apply(_sleepers(name))
    logs = local_default.claim_dir(f"{name}-logs")
    eventually(
        lambda: all((logs / f"started-{c}").exists() for c in range(3)),
        timeout=180,
        what="all three candidates running",
    )
    local_default.patch_run(name, {"spec": {"cancel": "Immediate"}})
    run = local_default.wait_for_end(name)
    assert run["status"]["phase"] == "Cancelled", run["status"]
    record = step_status(run)["loop"]["iterations"][0]
    assert record["phase"] == "Cancelled" and record.get("candidates") is None
    eventually(lambda: not _run_pods(local_default, name), timeout=120, what="every candidate's pod gone")
    root = Path(local_default.claim_dir(f"{name}-workspace"))
    assert not list(root.glob("mine-*.txt"))  # no candidate's files became the workspace


def test_a_timed_out_iteration_of_candidates_fails_its_attempt(local_default: LocalDefault) -> None:
    name = "best-timed-out"
    local_default.apply(_sleepers(name, timeout_seconds=30))
    run = local_default.wait_for_end(name)
    assert run["status"]["phase"] == "Failed", run["status"]
    step = step_status(run)
    assert "timed out after 30s" in step["message"], step["message"]
    assert step["loop"]["iterations"][0].get("candidates") is None
    root = Path(local_default.claim_dir(f"{name}-workspace"))
    assert not list(root.glob("mine-*.txt"))


RETRIED = """set -e
cd /workspace
A=$AGENTRUN_ATTEMPT; C=$AGENTRUN_CANDIDATE
ls -A | LC_ALL=C sort | tr '\\n' ' ' > "/logs/a$A-c$C.ls"
mkdir -p "$(dirname "$AGENTRUN_LOOP_CONTROL_PATH")"
echo "{\\"score\\": $C, \\"usage\\": {\\"inputTokens\\": 1}}" > "$AGENTRUN_LOOP_CONTROL_PATH"
if [ "$A" = 1 ]; then echo junk > "junk-$C.txt"; exit 1; fi
echo "kept from candidate $C" > result.txt
"""


def test_a_retry_after_no_candidate_succeeded_starts_every_copy_afresh(local_default: LocalDefault) -> None:
    name = "best-retried"
    local_default.apply(_run(name, RETRIED, max_iterations=1, retries=1))
    run = local_default.wait_for_end(name)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    step = step_status(run)
    record = step["loop"]["iterations"][0]
    assert record["attempts"] == 2
    assert step["lastFailure"]["reason"] == "NoCandidateSucceeded"
    assert record["candidates"]["winner"] == 2 and record["candidates"]["succeeded"] == [0, 1, 2]
    assert step["usage"]["inputTokens"] == 6  # both attempts' candidates
    logs = Path(local_default.claim_dir(f"{name}-logs"))
    for c in range(3):  # the retry's copies hold nothing of the failed attempt's
        assert "junk" not in (logs / f"a2-c{c}.ls").read_text()
    root = Path(local_default.claim_dir(f"{name}-workspace"))
    assert (root / "result.txt").read_text() == "kept from candidate 2\n"
    assert not list(root.glob("junk-*.txt"))
