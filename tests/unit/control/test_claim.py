"""The Job claim that keeps a duplicate pod of a Job from running `main` (docs/concepts.md#exactly-once):
the pure file rule, and `agentrun reporter report --before-main --claim-dir` run for real as a pod runs it."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun_devcluster.podrunner.ownership import set_volume_ownership
from agentrun_operator.control.claim import (
    PRUNE_AFTER_SECONDS,
    Claim,
    Report,
    claim_job,
    prune_claims,
    read_report,
    report_text,
)
from agentrun_operator.jobs.reporter_container import ready_hook

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


def test_the_claim_s_outcome_is_reported_for_the_operator() -> None:
    """The claim report the reporter's envelope carries, read back from the pod status."""
    text = report_text(
        Claim("unavailable", "cannot create /w/x: Permission denied"), "work", "/w/.agentrun-claims"
    )
    assert read_report(text) == Report(
        "unavailable", "work", "/w/.agentrun-claims", "cannot create /w/x: Permission denied"
    )
    assert read_report(report_text(Claim("claimed"), "work", "/w/c")) == Report("claimed", "work", "/w/c", "")
    huge = report_text(Claim("unavailable", "x" * 100_000), "v" * 1000, "/" + "d" * 5000)
    assert len(huge.encode()) < 4096  # fits a termination message


@pytest.mark.parametrize(
    "message",
    [
        None,
        "",
        "not json",
        '{"v":1,"status":"found"}',
        '{"v":2,"claim":"claimed"}',
        '{"v":1,"claim":"maybe"}',
        '["claim"]',
        '{"v":1,"claim":"claimed","volume":7}',
    ],
)
def test_anything_else_in_the_message_is_no_report(message: str | None) -> None:
    report = read_report(message)
    assert report is None or (report.outcome, report.volume) == ("claimed", "")


def test_legacy_the_fingerprint_command_writes_the_claim_s_outcome_to_its_termination_log(
    tmp_path: Path,
) -> None:
    """`agentrun reporter fingerprint`: the init container of Jobs made by builds before the reporter
    did the claim itself. Kept, with this one test, until the release after 0.1.0 removes it
    (docs/operations.md#earlier-pods); the current path is `report --before-main`, tested below."""
    log = tmp_path / "termination-log"
    args = ["fingerprint", "--path", str(tmp_path / "c.json"), "--out", str(tmp_path / "fp.json")]
    args += ["--claim-dir", str(tmp_path / "claims"), "--job-uid", "job-1", "--pod-uid", "pod-a"]
    args += ["--claim-volume", "work", "--termination-log", str(log)]
    subprocess.run([sys.executable, "-m", MODULE, *args], check=True, capture_output=True, timeout=60)
    assert json.loads(log.read_text())["claim"] == "claimed"
    assert (tmp_path / "fp.json").is_file()


# -------------------------------------------------------------- a helper uid on a root-owned volume

HELPER_UID = 10001
FS_GROUP = 4242


def _claim_as(uid: int, groups: list[int], claim_dir: Path, job: str) -> str:
    """`claim_job` in a child process of `uid` with supplemental `groups` (as a pod's container runs)."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            os.setgroups(groups)
            os.setgid(groups[0] if groups else uid)
            os.setuid(uid)
            result = claim_job(str(claim_dir), job, f"pod-of-{uid}")
            os.write(write, f"{result.outcome}:{result.detail}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as handle:
        said = handle.read()
    os.waitpid(child, 0)
    return said


@pytest.fixture
def root_owned_volume() -> Iterator[Path]:
    """A volume as a typical provisioner makes it: root's, 0755 (under a directory others can reach)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as other users")
    with tempfile.TemporaryDirectory(dir="/tmp") as base:
        os.chmod(base, 0o755)
        volume = Path(base) / "pv"
        volume.mkdir(mode=0o755)
        os.chown(volume, 0, 0)
        yield volume


def test_the_helper_uid_cannot_claim_on_a_root_owned_0755_volume(root_owned_volume: Path) -> None:
    said = _claim_as(HELPER_UID, [HELPER_UID], root_owned_volume / ".agentrun-claims", "job-1")
    assert said.startswith("unavailable:") and "Permission denied" in said


def test_with_the_pod_s_fs_group_applied_the_helper_claims(root_owned_volume: Path) -> None:
    """What the kubelet does for a pod with `fsGroup` (chgrp, g+rwx, setgid) is enough for the claim;
    the claims directory stays group-writable, so a helper of another uid in the group claims too."""
    set_volume_ownership(root_owned_volume, FS_GROUP, "OnRootMismatch")
    claims = root_owned_volume / ".agentrun-claims"
    assert _claim_as(HELPER_UID, [HELPER_UID, FS_GROUP], claims, "job-1") == "claimed:"
    info = claims.stat()
    assert info.st_gid == FS_GROUP and stat.S_IMODE(info.st_mode) & 0o2070 == 0o2070
    assert _claim_as(20002, [20002, FS_GROUP], claims, "job-2") == "claimed:"
    assert _claim_as(20002, [20002, FS_GROUP], claims, "job-1") == f"taken:pod-of-{HELPER_UID}"


# ----------------------------------------------- the reporter before main, and its postStart hook


def _before_main(
    tmp_path: Path, pod_uid: str, claims: Path | None = None
) -> tuple[str, subprocess.Popen[str]]:
    """`report --before-main` as the sidecar runs it (uids from its environment); returns what its
    ready file says once written, and the process (waiting for SIGTERM)."""
    ready = tmp_path / f"ready-{pod_uid}"
    args = ["report", "--path", str(tmp_path / "c.json"), "--fingerprint", str(tmp_path / f"fp-{pod_uid}")]
    args += ["--termination-log", str(tmp_path / f"term-{pod_uid}"), "--wait-for-signal"]
    args += ["--ready-file", str(ready), "--before-main", "--claim-dir", str(claims or tmp_path / "claims")]
    args += ["--claim-volume", "work", "--claim-report", str(tmp_path / f"claim-{pod_uid}.json")]
    env = dict(os.environ, AGENTRUN_JOB_UID="job-uid-1", AGENTRUN_POD_UID=pod_uid)
    proc = subprocess.Popen(
        [sys.executable, "-m", MODULE, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 60
    while not (ready.exists() and ready.read_text()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return ready.read_text(), proc


def _end(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)  # the kubelet, once main has ended (or the hook failed)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err


def test_the_reporter_claims_and_fingerprints_before_saying_ready_and_a_duplicate_says_taken(
    tmp_path: Path,
) -> None:
    """docs/design.md#fingerprint-hook: the ready file the postStart hook waits for is written only
    after the claim and the fingerprint; a duplicate pod's says `taken` (its hook fails, so its main
    never starts), and its envelope carries the claim's outcome."""
    said, first = _before_main(tmp_path, "pod-a")
    assert said.isdigit()  # its pid: ready
    assert (tmp_path / "fp-pod-a").is_file()
    assert read_report((tmp_path / "claim-pod-a.json").read_text()) == Report(
        "claimed", "work", str(tmp_path / "claims"), ""
    )
    said, duplicate = _before_main(tmp_path, "pod-b")
    assert said == "taken"
    assert not (tmp_path / "fp-pod-b").exists()
    err = _end(duplicate)
    assert "this pod is a duplicate" in err and "never runs main" in err
    envelope = json.loads((tmp_path / "term-pod-b").read_text())
    assert envelope["claim"]["claim"] == "taken" and envelope["claim"]["detail"] == "pod-a"
    _end(first)
    assert '"claim"' not in (tmp_path / "term-pod-a").read_text()  # claimed as expected: no news


def test_a_claim_that_cannot_be_taken_lets_main_run_and_rides_in_the_envelope(tmp_path: Path) -> None:
    """No claims directory can be made (here a file is in its way): `main` still runs (ready with the
    reporter's pid), the reporter says why, and the envelope carries `unavailable` for the operator."""
    (tmp_path / "blocked").write_text("a file")
    said, proc = _before_main(tmp_path, "pod-a", claims=tmp_path / "blocked" / "claims")
    assert said.isdigit()
    assert (tmp_path / "fp-pod-a").is_file()
    err = _end(proc)
    assert "no claim of Job job-uid-1 on volume 'work'" in err
    envelope = json.loads((tmp_path / "term-pod-a").read_text())
    report = read_report(json.dumps(envelope["claim"]))
    assert report is not None and (report.outcome, report.volume) == ("unavailable", "work")


def test_a_reporter_restarted_in_its_pod_keeps_the_fingerprint_taken_before_main(tmp_path: Path) -> None:
    """A restarted sidecar must not fingerprint again: main may have written the file since, which
    would then look stale. The claim is still its own."""
    said, first = _before_main(tmp_path, "pod-a")
    assert said.isdigit()  # its pid: ready
    _end(first)
    before = (tmp_path / "fp-pod-a").read_text()
    (tmp_path / "c.json").write_text('{"continue": false}')  # main wrote it meanwhile
    (tmp_path / "ready-pod-a").unlink()
    said, again = _before_main(tmp_path, "pod-a")
    assert said.isdigit()  # its pid: ready
    assert (tmp_path / "fp-pod-a").read_text() == before
    _end(again)
    assert json.loads((tmp_path / "term-pod-a").read_text())["status"] == "found"


@pytest.mark.parametrize(("content", "code"), [("4242", 0), ("taken", 1), (None, 1)])
def test_the_post_start_hook_shuts_the_gate_waits_for_ready_and_opens_it_only_for_a_pid(
    tmp_path: Path, content: str | None, code: int
) -> None:
    """The hook is a shell loop (it starts in milliseconds); here with 3 polls instead of 1500. It
    shuts main's gate first (a symlink out of the volume, which the kubelet refuses to mount), opens
    it (an empty directory) only for a reporter that holds the claim, and then, as its last act,
    writes the namespace's last PID and its own (docs/design.md#reporter-first)."""
    ready, gate, done_file = tmp_path / "ready", tmp_path / "gate", tmp_path / "hook-done"
    failed = tmp_path / "hook-failed"
    if content is not None:
        ready.write_text(content)
    command = ready_hook()
    command[-5:] = [str(ready), "3", str(gate), str(done_file), str(failed)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == code, done.stderr
    if code:
        assert "agentrun:" in done.stderr
        assert gate.is_symlink() and os.readlink(gate) == "/"
        assert not done_file.exists()
        # It says why in hook-failed too: the reporter then knows it failed on purpose, not lost.
        assert failed.read_text().strip() in done.stderr
    else:
        assert not failed.exists()
        assert gate.is_dir() and not gate.is_symlink() and not any(gate.iterdir())
        watermark, pid = done_file.read_text().split()
        assert done_file.read_text().endswith("\n") and int(watermark) >= int(pid) > 1


def test_the_hook_opens_a_gate_the_reporter_shut_first(tmp_path: Path) -> None:
    """The reporter shuts a missing gate as its first act (control/gate.py), perhaps while the hook
    shuts it too: the hook takes the reporter's symlink for its own and opens it for a pid."""
    ready, gate, done_file = tmp_path / "ready", tmp_path / "gate", tmp_path / "hook-done"
    ready.write_text("4242")
    gate.symlink_to("/")
    command = ready_hook()
    command[-5:] = [str(ready), "3", str(gate), str(done_file), str(tmp_path / "hook-failed")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert gate.is_dir() and not gate.is_symlink() and done_file.read_text().endswith("\n")
