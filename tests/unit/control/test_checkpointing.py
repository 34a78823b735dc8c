"""The reporter's checkpoint step before main (control/checkpointing.py), on real files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agentrun_operator.control import checkpoint as store
from agentrun_operator.control.checkpointing import (
    CHECKPOINT_ANCHOR,
    CheckpointArgs,
    CheckpointRefusal,
    prepare_workspace,
)


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
