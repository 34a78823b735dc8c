"""The reporter's extras: the commit a Git checkout is at (read without git), artifact facts, and
how they ride in the control envelope."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from agentrun_operator.control.envelope import (
    MAX_ENVELOPE_BYTES,
    ControlEnvelope,
    attach_extras,
    decode_envelope,
    encode_envelope,
)
from agentrun_operator.control.extras import artifact_fact, head_commit
from agentrun_operator.control.reporter import prepare_for_main, report_text

ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@x",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@x",
}


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
        env=ENV | {"PATH": "/usr/bin:/bin", "HOME": str(repo)},
    )
    return out.stdout.strip()


def commit(repo: Path, text: str) -> str:
    (repo / "file.txt").write_text(text)
    git(repo, "add", "file.txt")
    git(repo, "commit", "-q", "-m", text)
    return git(repo, "rev-parse", "HEAD")


def test_head_commit_loose_packed_detached_and_worktree(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    assert head_commit(str(repo)) is None  # no commit yet
    first = commit(repo, "one")
    assert head_commit(str(repo)) == first
    git(repo, "pack-refs", "--all")
    assert head_commit(str(repo)) == first  # packed
    second = commit(repo, "two")
    assert head_commit(str(repo)) == second
    git(repo, "checkout", "-q", "--detach", first)
    assert head_commit(str(repo)) == first  # detached
    git(repo, "worktree", "add", "-q", "-b", "side", str(tmp_path / "wt"), second)
    assert head_commit(str(tmp_path / "wt")) == second  # a .git file
    assert head_commit(str(tmp_path / "nothing")) is None


def test_artifact_facts(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    report.write_bytes(b"done\n")
    digest = hashlib.sha256(b"done\n").hexdigest()
    assert artifact_fact("r", str(report)) == {
        "name": "r",
        "path": str(report),
        "size": 5,
        "digest": f"sha256:{digest}",
    }
    assert artifact_fact("m", str(tmp_path / "no")) == {
        "name": "m",
        "path": str(tmp_path / "no"),
        "missing": True,
    }
    assert artifact_fact("d", str(tmp_path))["missing"] is True


def test_extras_fit_or_are_dropped_never_the_control() -> None:
    control = {"continue": True, "pad": "x" * 3500}
    env = ControlEnvelope(status="found", path="/w/c.json", size=10, control=control)
    many = [
        {"name": f"a{i}", "path": f"/w/{i}", "size": i, "digest": "sha256:" + "0" * 64} for i in range(40)
    ]
    fitted = attach_extras(env, "a" * 40, many)
    wire = encode_envelope(fitted)
    assert fitted.control == control and fitted.commit == "a" * 40
    assert fitted.artifacts is not None and 0 < len(fitted.artifacts) < 40
    assert len(wire.encode()) <= MAX_ENVELOPE_BYTES and decode_envelope(wire) == fitted
    full = ControlEnvelope(status="found", path="/w/c.json", size=10, control={"pad": "x" * 4000})
    assert attach_extras(full, "a" * 40, many).commit is None


def test_the_report_carries_a_new_commit_only(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    before = commit(repo, "one")
    control, fp = tmp_path / "control.json", tmp_path / "fp.json"
    assert prepare_for_main(str(control), str(fp), None, "", None, checkout=str(repo))
    assert json.loads(fp.read_text())["commit"] == before
    control.write_text('{"continue": true}')
    unchanged = decode_envelope(report_text(str(control), str(fp), checkout=str(repo)))
    assert unchanged.status == "found" and unchanged.commit is None
    after = commit(repo, "two")
    (tmp_path / "out.txt").write_text("hi")
    moved = decode_envelope(
        report_text(str(control), str(fp), checkout=str(repo), artifacts=[f"out={tmp_path / 'out.txt'}"])
    )
    assert moved.commit == after and moved.control == {"continue": True}
    assert moved.artifacts == [
        {
            "name": "out",
            "path": str(tmp_path / "out.txt"),
            "size": 2,
            "digest": "sha256:" + hashlib.sha256(b"hi").hexdigest(),
        }
    ]
