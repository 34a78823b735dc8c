"""`agentrun dev run` lists the files the iterations left on a PVC; the Job claims are only counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrun_devcluster.dev import _show_files


def test_claims_are_counted_and_the_iterations_files_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / ".agentrun-claims").mkdir(parents=True)
    (tmp_path / ".agentrun").mkdir()
    for job in ("job-1", "job-2"):
        (tmp_path / ".agentrun-claims" / job).write_text("pod-uid")
    (tmp_path / ".agentrun" / "loop-control.json").write_text('{"continue": false}')
    (tmp_path / "notes.txt").write_text("iteration 1\n")
    _show_files(tmp_path)
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "--- .agentrun-claims/: 2 Job claim(s), one per iteration pod that ran (not shown)",
        "--- .agentrun/loop-control.json (19 bytes)",
        '{"continue": false}',
        "--- notes.txt (12 bytes)",
        "iteration 1",
    ]


def test_the_checkpoint_store_is_counted_not_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentrun_operator.control import checkpoint

    (tmp_path / "answer.txt").write_text("one\n")
    checkpoint.record(str(tmp_path), "run_1_1")
    (tmp_path / "answer.txt").write_text("two\n")
    checkpoint.record(str(tmp_path), "run_1_2")
    _show_files(tmp_path)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("--- .agentrun/checkpoints/: 2 checkpoint(s), ")
    assert out[0].endswith("(not shown; agentrun checkpoints NAME lists them)")
    assert out[1:] == ["--- answer.txt (4 bytes)", "two"]
