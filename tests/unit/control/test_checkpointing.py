"""The reporter's checkpoint step before main (control/checkpointing.py), on real files."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from agentrun_operator.control import checkpoint as store
from agentrun_operator.control import reporter
from agentrun_operator.control.checkpointing import (
    CHECKPOINT_ANCHOR,
    CheckpointArgs,
    CheckpointRefusal,
    load_facts,
    parse_candidate,
    prepare_workspace,
    record_candidate,
)
from agentrun_operator.control.envelope import decode_envelope


def _args(root: Path, **changes: object) -> CheckpointArgs:
    base = CheckpointArgs(root=str(root), checkpoint_id="run_1_2", prefix="run_1_", keep=3, owner="uid-1")
    return CheckpointArgs(**{**base.__dict__, **changes})  # type: ignore[arg-type]


def test_the_first_attempt_records_and_a_restoring_retry_gets_the_start_back(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("start")
    facts = prepare_workspace(_args(tmp_path))
    assert facts["id"] == "run_1_2" and facts["files"] == 1 and "restored" not in facts
    (tmp_path / "a.txt").write_text("dirty")
    (tmp_path / "b.txt").write_text("new")
    again = prepare_workspace(_args(tmp_path, restore_own=True, expected=True))
    assert again["restored"] == "run_1_2"
    assert (tmp_path / "a.txt").read_text() == "start"
    assert not (tmp_path / "b.txt").exists()


def test_keep_leaves_the_failed_attempts_files(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("start")
    prepare_workspace(_args(tmp_path))
    (tmp_path / "a.txt").write_text("dirty")
    facts = prepare_workspace(_args(tmp_path))
    assert "restored" not in facts
    assert (tmp_path / "a.txt").read_text() == "dirty"


def test_a_store_deleted_by_the_workload_refuses_main_and_names_it(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("start")
    prepare_workspace(_args(tmp_path))
    shutil.rmtree(tmp_path / ".agentrun")
    (tmp_path / "a.txt").write_text("dirty")
    with pytest.raises(CheckpointRefusal) as caught:
        prepare_workspace(_args(tmp_path, restore_own=True, expected=True))
    said = str(caught.value)
    assert "run_1_2" in said and said.endswith(CHECKPOINT_ANCHOR)
    assert (tmp_path / "a.txt").read_text() == "dirty"  # no silent new recording, nothing changed
    assert not store.exists(str(tmp_path), "run_1_2")


def test_a_checkpoint_of_an_earlier_run_of_the_same_name_is_not_ours(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("old run")
    prepare_workspace(_args(tmp_path, owner="uid-old"))
    (tmp_path / "a.txt").write_text("new run")
    facts = prepare_workspace(_args(tmp_path, restore_own=True))
    assert "restored" not in facts  # recorded afresh for this run
    assert store.owner(str(tmp_path), "run_1_2") == "uid-1"
    with pytest.raises(CheckpointRefusal, match="another run"):
        prepare_workspace(_args(tmp_path, owner="uid-2", restore_own=True, expected=True))


def test_a_resumed_run_starts_from_the_source_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("end of source iteration 2")
    store.record(str(tmp_path), "src_1_3", owner="uid-src")
    (tmp_path / "a.txt").write_text("later")
    facts = prepare_workspace(
        _args(tmp_path, checkpoint_id="dst_1_1", prefix="dst_1_", restore_from="src_1_3")
    )
    assert facts["restored"] == "src_1_3"
    assert (tmp_path / "a.txt").read_text() == "end of source iteration 2"
    assert store.exists(str(tmp_path), "dst_1_1")
    with pytest.raises(CheckpointRefusal, match="cannot start from checkpoint 'gone_1_9'"):
        prepare_workspace(_args(tmp_path, checkpoint_id="x_1_1", prefix="x_1_", restore_from="gone_1_9"))


# --- best-of-N candidates (loop.candidates) -----------------------------------------------------


def _candidate(root: Path, index: int, **changes: object) -> CheckpointArgs:
    """Candidate `index`'s arguments, as the Job builder writes them (and the reporter parses them)."""
    tree = f"{root}/.agentrun/candidates/run_1_2/{index}"
    candidate = parse_candidate(str(root), "run_1_2", str(index), tree, f"run_1_2c{index}")
    return _args(root, candidate=candidate, **changes)


def _tree(root: Path, index: int) -> Path:
    return root / ".agentrun" / "candidates" / "run_1_2" / str(index)


def test_two_candidates_start_from_exact_copies_and_record_their_own_ends(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("start")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "b.py").write_text("print(1)\n")
    (tmp_path / "src" / "b.py").chmod(0o750)
    stale = _tree(tmp_path, 1)
    stale.mkdir(parents=True)
    (stale / "left-by-an-earlier-attempt").write_text("x")
    (stale / ".git").mkdir()  # a restore would keep this: the tree is emptied first

    first = prepare_workspace(_candidate(tmp_path, 0, restore_own=True))
    second = prepare_workspace(_candidate(tmp_path, 1, restore_own=True))

    assert first["id"] == second["id"] == "run_1_2"
    assert first["files"] == 2 and "restored" not in first  # the first recorded the start
    assert second["restored"] == "run_1_2"  # the second found it: the root put back, harmlessly
    assert (first["candidate"], second["candidate"]) == ({"index": 0}, {"index": 1})
    start = store.tree_digest(str(tmp_path))
    assert store.tree_digest(str(_tree(tmp_path, 0))) == store.tree_digest(str(_tree(tmp_path, 1))) == start
    # What the earlier attempt left is gone; `.agentrun` is the root's (recorded, empty, as a directory).
    assert sorted(p.name for p in _tree(tmp_path, 1).iterdir()) == [".agentrun", "a.txt", "src"]
    assert list((_tree(tmp_path, 1) / ".agentrun").iterdir()) == []

    (_tree(tmp_path, 0) / "a.txt").write_text("candidate 0")  # each main works in its own copy
    (_tree(tmp_path, 1) / "a.txt").write_text("candidate 1")
    (_tree(tmp_path, 1) / "new.txt").write_text("only 1")
    ends = [record_candidate(_candidate(tmp_path, i), facts) for i, facts in enumerate((first, second))]

    assert (tmp_path / "a.txt").read_text() == "start"
    for i, end in enumerate(ends):
        assert end["id"] == "run_1_2"
        made = end["candidate"]
        assert made["index"] == i and made["id"] == f"run_1_2c{i}" and made["files"] == 2 + i
        assert made["bytes"] == len(f"candidate {i}") + len("print(1)\n") + len("only 1") * i
        assert made["addedBytes"] > 0 and isinstance(made["ms"], int)
        assert store.owner(str(tmp_path), f"run_1_2c{i}") == "uid-1"
    store.restore(str(tmp_path), "run_1_2c1")  # what the operator does with a winner
    assert (tmp_path / "a.txt").read_text() == "candidate 1" and (tmp_path / "new.txt").exists()


def test_recording_a_candidates_end_twice_gives_the_same_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("start")
    facts = prepare_workspace(_candidate(tmp_path, 0))
    (_tree(tmp_path, 0) / "a.txt").write_text("end")
    done = record_candidate(_candidate(tmp_path, 0), facts)
    manifest = tmp_path / store.STORE_DIR / "manifests" / "run_1_2c0.json.gz"
    recorded = manifest.stat()

    assert record_candidate(_candidate(tmp_path, 0), done) == done  # the facts say it is done
    assert (manifest.stat().st_ino, manifest.stat().st_mtime_ns) == (recorded.st_ino, recorded.st_mtime_ns)
    # A reporter that restarted before it kept the facts records the copy again (main has ended:
    # the copy is what it was), so the checkpoint holds the same files.
    again = record_candidate(_candidate(tmp_path, 0), facts)
    assert again["candidate"]["id"] == "run_1_2c0" and again["candidate"]["files"] == 1
    store.restore(str(tmp_path), "run_1_2c0")
    assert (tmp_path / "a.txt").read_text() == "end"


def test_a_retrys_candidate_replaces_what_the_failed_attempts_left(tmp_path: Path) -> None:
    """The same index of the iteration's next attempt records its own copy, not the failed one's."""
    (tmp_path / "a.txt").write_text("start")
    facts = prepare_workspace(_candidate(tmp_path, 0))
    (_tree(tmp_path, 0) / "a.txt").write_text("attempt 1: broken")
    record_candidate(_candidate(tmp_path, 0), facts)
    retry = prepare_workspace(_candidate(tmp_path, 0))  # a new pod: the copy made afresh
    assert (_tree(tmp_path, 0) / "a.txt").read_text() == "start"
    (_tree(tmp_path, 0) / "a.txt").write_text("attempt 2: good")
    record_candidate(_candidate(tmp_path, 0), retry)
    store.restore(str(tmp_path), "run_1_2c0")
    assert (tmp_path / "a.txt").read_text() == "attempt 2: good"


def test_a_candidate_whose_start_is_damaged_refuses_main_with_the_anchor(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("start")
    prepare_workspace(_candidate(tmp_path, 0))
    for obj in (tmp_path / store.STORE_DIR / "objects").glob("*/*"):
        obj.write_text("bit rot")
    with pytest.raises(CheckpointRefusal) as caught:
        prepare_workspace(_candidate(tmp_path, 1, expected=True))
    said = str(caught.value)
    assert "candidate 1" in said and "does not match its hash" in said and said.endswith(CHECKPOINT_ANCHOR)


def test_a_candidate_whose_end_cannot_be_recorded_says_why_and_main_stopped_early_records_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.txt").write_text("start")
    facts = prepare_workspace(_candidate(tmp_path, 0))
    shutil.rmtree(_tree(tmp_path, 0))  # main removed its own work tree's root... from within
    failed = record_candidate(_candidate(tmp_path, 0), facts)["candidate"]
    assert failed["index"] == 0 and "id" not in failed
    assert "run_1_2c0" in failed["error"] and failed["error"].endswith(CHECKPOINT_ANCHOR)
    assert "\n" not in failed["error"]
    stopped = record_candidate(_candidate(tmp_path, 0), facts, main_ended=False)["candidate"]
    assert "stopped before main ended" in stopped["error"]
    assert not store.exists(str(tmp_path), "run_1_2c0")


@pytest.mark.parametrize(
    ("index", "tree", "candidate_id", "said"),
    [
        ("-1", "{root}/.agentrun/candidates/run_1_2/-1", "run_1_2c-1", "not a whole number"),
        ("x", "{root}/.agentrun/candidates/run_1_2/x", "run_1_2cx", "not a whole number"),
        ("0", "{root}/elsewhere", "run_1_2c0", "is not candidate 0's work tree"),
        ("0", "{root}/.agentrun/candidates/run_1_2/0", "run_1_2c1", "is not 'run_1_2c0'"),
        ("0", None, "run_1_2c0", "come together"),
    ],
)
def test_candidate_arguments_that_do_not_fit_are_refused(
    tmp_path: Path, index: str, tree: str | None, candidate_id: str, said: str
) -> None:
    directory = tree.format(root=tmp_path) if tree is not None else None
    with pytest.raises(CheckpointRefusal, match=said) as caught:
        parse_candidate(str(tmp_path), "run_1_2", index, directory, candidate_id)
    assert str(caught.value).endswith(CHECKPOINT_ANCHOR)
    assert parse_candidate(str(tmp_path), "run_1_2", None, None, None) is None


def _pod(tmp_path: Path, name: str) -> dict[str, str]:
    meta = tmp_path / name
    meta.mkdir()
    return {k: str(meta / k) for k in ("fingerprint", "claims-report", "facts", "termination", "ready")}


def test_the_claim_is_per_index_and_a_duplicate_of_an_index_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    claims = str(root / ".agentrun-claims")
    monkeypatch.setenv(reporter.JOB_UID_ENV, "job-1")

    def before_main(index: int, pod_uid: str) -> bool:
        monkeypatch.setenv(reporter.POD_UID_ENV, pod_uid)
        files = _pod(tmp_path, pod_uid)
        control = str(_tree(root, index) / "control.json")
        return reporter.prepare_for_main(
            control, files["fingerprint"], claims, "ws", files["claims-report"], None,
            _candidate(root, index), files["facts"],
        )  # fmt: skip

    assert before_main(0, "pod-a") and before_main(1, "pod-b")
    assert before_main(0, "pod-c") is False
    assert json.loads(Path(_pod_file(tmp_path, "pod-c")).read_text())["detail"] == "pod-a"
    assert sorted(os.listdir(claims)) == ["job-1-0", "job-1-1"]


def _pod_file(tmp_path: Path, pod_uid: str) -> str:
    return str(tmp_path / pod_uid / "claims-report")


def test_the_reporter_records_a_candidate_after_main_and_its_envelope_carries_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`agentrun reporter report` as a candidate pod runs it: before main, then (a reporter run
    again in the same pod, main having written its tree and control file) the report."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("start")
    files = _pod(tmp_path, "meta")
    tree = _tree(root, 1)
    monkeypatch.setenv(reporter.JOB_UID_ENV, "job-1")
    monkeypatch.setenv(reporter.POD_UID_ENV, "pod-a")
    argv = [
        "report", "--path", str(tree / "control.json"), "--fingerprint", files["fingerprint"],
        "--termination-log", files["termination"], "--ready-file", files["ready"], "--before-main",
        "--claim-dir", str(root / ".agentrun-claims"), "--claim-report", files["claims-report"],
        "--checkpoint-root", str(root), "--checkpoint-id", "run_1_2", "--checkpoint-prefix", "run_1_",
        "--checkpoint-owner", "uid-1", "--checkpoint-facts", files["facts"],
        "--candidate-index", "1", "--candidate-dir", str(tree), "--candidate-checkpoint", "run_1_2c1",
    ]  # fmt: skip
    assert reporter.prepare_for_main(
        str(tree / "control.json"), files["fingerprint"], str(root / ".agentrun-claims"), "",
        files["claims-report"], None, reporter.checkpoint_args(reporter.build_parser().parse_args(argv)),
        files["facts"],
    )  # fmt: skip
    (tree / "a.txt").write_text("the candidate's work")  # main, in its own copy
    (tree / "control.json").write_text('{"continue": false}')

    assert reporter.main(argv) == 0

    envelope = decode_envelope(Path(files["termination"]).read_text(), str(tree / "control.json"))
    assert envelope.status == "found"
    assert envelope.checkpoint is not None
    assert envelope.checkpoint["id"] == "run_1_2"
    candidate = envelope.checkpoint["candidate"]
    assert candidate["index"] == 1 and candidate["id"] == "run_1_2c1"
    assert candidate["files"] == envelope.checkpoint["files"] + 1  # the start's, and the control file
    assert load_facts(files["facts"]) == envelope.checkpoint
    store.restore(str(root), "run_1_2c1")
    assert (root / "a.txt").read_text() == "the candidate's work"


def test_a_refused_candidate_argument_keeps_main_shut(tmp_path: Path) -> None:
    files = _pod(tmp_path, "meta")
    argv = [
        "report", "--path", str(tmp_path / "c.json"), "--fingerprint", files["fingerprint"],
        "--termination-log", files["termination"], "--ready-file", files["ready"], "--before-main",
        "--checkpoint-root", str(tmp_path), "--checkpoint-id", "run_1_2",
        "--checkpoint-facts", files["facts"], "--candidate-index", "x",
        "--candidate-dir", str(tmp_path), "--candidate-checkpoint", "run_1_2cx",
    ]  # fmt: skip
    assert reporter.main(argv) == 4
    assert Path(files["ready"]).read_text() == "checkpoint"
    assert Path(files["termination"]).read_text().endswith(CHECKPOINT_ANCHOR)
    assert not (tmp_path / ".agentrun").exists()  # nothing recorded, nothing emptied


def test_a_candidates_facts_outlast_the_others_when_the_message_is_tight() -> None:
    from agentrun_operator.control.envelope import MAX_ENVELOPE_BYTES, ControlEnvelope, encode_envelope

    envelope = ControlEnvelope(status="found", path="/ws/c.json", control={"continue": True})
    candidate = {"index": 2, "id": "run_1_2c2", "files": 1, "bytes": 3, "addedBytes": 3, "ms": 1}
    facts = {"id": "run_1_2", "pruneError": "x" * MAX_ENVELOPE_BYTES, "candidate": candidate}
    attached = reporter._attach_facts(envelope, facts)
    assert attached.checkpoint == {"id": "run_1_2", "candidate": candidate}
    assert len(encode_envelope(attached).encode()) <= MAX_ENVELOPE_BYTES
    small = {"id": "run_1_2", "files": 1, "candidate": candidate}
    assert reporter._attach_facts(envelope, small).checkpoint == small
