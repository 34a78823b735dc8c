"""The Job claim that keeps a duplicate pod of a Job from running `main` (docs/concepts.md#exactly-once):
the pure file rule, and `agentrun reporter fingerprint --claim-dir` run for real as a pod runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun_operator.control.claim import PRUNE_AFTER_SECONDS, claim_job, prune_claims

MODULE = "agentrun_operator.control.reporter"


def test_the_first_pod_claims_and_the_same_pod_finds_it_its_own(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    assert claim_job(str(claims), "job-1", "pod-a").outcome == "claimed"
    assert (claims / "job-1").read_text() == "pod-a"
    assert claim_job(str(claims), "job-1", "pod-a").outcome == "ours"


def test_another_pod_of_the_same_job_finds_the_claim_taken_by_the_first(tmp_path: Path) -> None:
    claim_job(str(tmp_path), "job-1", "pod-a")
    taken = claim_job(str(tmp_path), "job-1", "pod-b")
    assert (taken.outcome, taken.detail) == ("taken", "pod-a")
    assert (tmp_path / "job-1").read_text() == "pod-a"  # the claim is never overwritten


def test_another_job_claims_on_its_own(tmp_path: Path) -> None:
    claim_job(str(tmp_path), "job-1", "pod-a")
    assert claim_job(str(tmp_path), "job-2", "pod-b").outcome == "claimed"


def test_without_uids_or_a_writable_directory_no_claim_is_taken(tmp_path: Path) -> None:
    assert claim_job(str(tmp_path), "", "pod-a").outcome == "unavailable"
    assert claim_job(str(tmp_path), "job-1", "").outcome == "unavailable"
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    unavailable = claim_job(str(blocked / "claims"), "job-1", "pod-a")
    assert unavailable.outcome == "unavailable" and str(blocked) in unavailable.detail


@settings(deadline=None, max_examples=30)  # file system work: no per-example deadline
@given(st.lists(st.sampled_from(["pod-a", "pod-b", "pod-c"]), min_size=1, max_size=8))
def test_exactly_one_pod_ever_holds_a_job(pods: list[str]) -> None:
    """Whatever the order pods of one Job arrive in, the first holds it and every other is told so."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        outcomes = [(pod, claim_job(directory, "job", pod)) for pod in pods]
    holder = pods[0]
    for pod, outcome in outcomes[1:]:
        assert (outcome.outcome, outcome.detail) == (("ours", "") if pod == holder else ("taken", holder))
    assert outcomes[0][1].outcome == "claimed"


def test_old_claims_are_pruned_and_new_ones_kept(tmp_path: Path) -> None:
    now = time.time()
    for name, age in (("old", PRUNE_AFTER_SECONDS + 60), ("new", 60)):
        (tmp_path / name).write_text("pod")
        os.utime(tmp_path / name, (now - age, now - age))
    assert prune_claims(str(tmp_path), now) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]
    assert prune_claims(str(tmp_path / "absent"), now) == 0


def _fingerprint(tmp_path: Path, pod_uid: str) -> subprocess.Popen[str]:
    control = tmp_path / "workspace" / ".agentrun" / "loop-control.json"
    args = ["fingerprint", "--path", str(control), "--out", str(tmp_path / f"fp-{pod_uid}.json")]
    args += ["--claim-dir", str(tmp_path / "claims"), "--job-uid", "job-uid-1", "--pod-uid", pod_uid]
    return subprocess.Popen(
        [sys.executable, "-m", MODULE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_duplicate_pod_waits_in_fingerprint_and_never_lets_main_start(tmp_path: Path) -> None:
    first = _fingerprint(tmp_path, "pod-a")
    _, err = first.communicate(timeout=30)
    assert first.returncode == 0, err
    assert "claimed Job job-uid-1 for this pod" in err
    assert (tmp_path / "fp-pod-a.json").is_file()

    duplicate = _fingerprint(tmp_path, "pod-b")
    try:
        assert duplicate.stderr is not None
        said = duplicate.stderr.readline()  # written just before it starts waiting
        assert "Job job-uid-1 already runs in pod pod-a: this pod is a duplicate" in said, said
        assert duplicate.poll() is None  # waiting, not ended
        assert not (tmp_path / "fp-pod-b.json").exists()  # it never got to the point before main
    finally:
        duplicate.terminate()  # the Job controller deletes the excess pod
        duplicate.communicate(timeout=30)
