"""Checkpoints of files `main` writes as another user than root, on the real node: taken over by
test_real_node.py (the pod runner runs every container as its own user and ignores images, so a
`main` that runs as its image's non-root user exists only on a kubelet).

The reporter records and restores the state volume as uid 0 with only the file capabilities
(`CHOWN`, `DAC_OVERRIDE`, `FOWNER`, `FSETID`, jobs/checkpoint_args.py). Here `main` is the operator
image's own user (uid 10001): its files are private (`0600`, a `0700` directory), read-only
(`0400`) or in a read-only directory (`0555`), and it writes its records into `.agentrun`, the
control file's directory, which the reporter's first checkpoint creates before any `main` ran
(docs/concepts.md#checkpoints).
"""

from __future__ import annotations

from pathlib import Path

from agentrun_operator.config import DEFAULT_REPORTER_IMAGE
from tests.e2e.conftest import LocalDefault, step_status
from tests.support.checkpoint_runs import checkpoint_run, hashing_script, read_record

MAIN_UID = 10001
"""The operator image's user (its Dockerfile's `USER 10001:10001`), `main`'s here."""

# The tree hash takes owners too. Iteration 1 makes private, read-only and locked files as uid
# 10001; iteration 2's first attempt changes them all (making its own way in and out again), then
# fails; the retry records the hash of what the restore left.
SCRIPT = hashing_script(
    r"""
id -u > ".agentrun/uid-i${AGENTRUN_ITERATION}-a${AGENTRUN_ATTEMPT}"
tree_hash > ".agentrun/hash-i${AGENTRUN_ITERATION}-a${AGENTRUN_ATTEMPT}"
if [ "$AGENTRUN_ITERATION" = 1 ]; then
  echo clean > readonly.txt; chmod 400 readonly.txt
  mkdir private; echo secret > private/key; chmod 600 private/key; chmod 700 private
  mkdir locked; echo inside > locked/inside; echo here > locked/gone; chmod 555 locked
  exit 0
fi
if [ "$AGENTRUN_ATTEMPT" = 1 ]; then
  chmod 600 readonly.txt; echo dirty > readonly.txt; chmod 400 readonly.txt
  echo leaked > private/key; echo new > private/new
  chmod 755 locked; echo dirty > locked/inside; rm locked/gone; echo new > locked/new; chmod 555 locked
  exit 1
fi
exit 0
""",
    "%a %u:%g",
)


def test_a_checkpoint_restore_puts_back_files_main_wrote_as_another_user(local_default: LocalDefault) -> None:
    name = "ckpt-owners"
    local_default.apply(
        checkpoint_run(
            name, SCRIPT, max_iterations=2, retries=1, on_failed="Restore", image=DEFAULT_REPORTER_IMAGE
        )
    )
    run = local_default.wait_for_end(name)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    records = {r["index"]: r for r in step_status(run)["loop"]["iterations"]}
    assert records[2]["attempts"] == 2
    assert records[2]["checkpoint"]["restored"] == f"{name}_1_2"
    root = Path(local_default.claim_dir(f"{name}-workspace"))
    assert read_record(root, "uid-i1-a1") == str(MAIN_UID)
    assert read_record(root, "hash-i2-a2") == read_record(root, "hash-i2-a1")
    for path, mode in (
        ("readonly.txt", 0o400),
        ("private", 0o700),
        ("private/key", 0o600),
        ("locked", 0o555),
        ("locked/inside", 0o644),
        ("locked/gone", 0o644),
    ):
        info = (root / path).stat()
        assert (info.st_uid, info.st_mode & 0o777) == (MAIN_UID, mode), (path, info)
    assert (root / "readonly.txt").read_text() == "clean\n"
    assert (root / "private" / "key").read_text() == "secret\n"
    assert not (root / "private" / "new").exists()
    assert (root / "locked" / "inside").read_text() == "inside\n"
    assert not (root / "locked" / "new").exists()
