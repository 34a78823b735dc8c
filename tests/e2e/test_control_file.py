"""The loop-control file through real processes: the reporter container (listed before main, its
postStart hook, its watch for main's end) and the operator, with the file on a real (bind-mounted)
PVC directory."""

from __future__ import annotations

import json
import re

from tests.e2e.conftest import LocalDefault, step_status

LOOP = """
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
      - name: decide
        loop:
          maxIterations: 5
          condition:
            type: cel
            expression: "iteration.last.control.continue == true"
            source:
              type: file
              path: /workspace/.agentrun/loop-control.json
              onMissing: {on_missing}
              onInvalid: {on_invalid}
"""


def manifest(name: str, script: str, on_missing: str = "stop", on_invalid: str = "fail") -> str:
    body = "\n".join("        " + line for line in script.strip().splitlines())
    return LOOP.format(name=name, script=body, on_missing=on_missing, on_invalid=on_invalid)


def test_a_stale_control_file_counts_as_missing(local_default: LocalDefault) -> None:
    # Iteration 1 writes {"continue": true}; iteration 2 leaves the file alone. Were the old file
    # taken for iteration 2's answer, the loop would run all 5 iterations.
    script = """
echo "iteration $AGENTRUN_ITERATION" >> /workspace/ran.log
if [ "$AGENTRUN_ITERATION" = 1 ]; then
  mkdir -p /workspace/.agentrun
  echo '{"continue": true}' > /workspace/.agentrun/loop-control.json
fi
"""
    local_default.apply(manifest("stale", script, on_missing="fail"))
    run = local_default.wait_for_end("stale")
    assert run["status"]["phase"] == "Failed", run["status"]
    step = step_status(run)
    assert step["loop"]["stopReason"] == "LoopConditionError"
    assert step["loop"]["completedIterations"] == 2
    assert "was not rewritten by this iteration (stale)" in step["message"]
    assert "onMissing: fail" in step["message"]
    root = local_default.claim_dir("stale-workspace")
    assert (root / "ran.log").read_text().splitlines() == ["iteration 1", "iteration 2"]


def test_a_stale_control_file_with_on_missing_stop_ends_the_loop(local_default: LocalDefault) -> None:
    script = """
echo "iteration $AGENTRUN_ITERATION" >> /workspace/ran.log
if [ "$AGENTRUN_ITERATION" = 1 ]; then
  mkdir -p /workspace/.agentrun
  echo '{"continue": true}' > /workspace/.agentrun/loop-control.json
fi
"""
    local_default.apply(manifest("stale-stop", script, on_missing="stop"))
    run = local_default.wait_for_end("stale-stop")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    step = step_status(run)
    assert step["loop"]["stopReason"] == "LoopConditionFalse"
    assert step["loop"]["completedIterations"] == 2
    assert "stale" in step["message"]


def test_an_oversized_control_file_ends_per_on_invalid_with_size_and_limit(
    local_default: LocalDefault,
) -> None:
    script = """
mkdir -p /workspace/.agentrun
pad=$(head -c 5000 /dev/zero | tr '\\0' x)
printf '{"continue": true, "pad": "%s"}' "$pad" > /workspace/.agentrun/loop-control.json
"""
    local_default.apply(manifest("oversized", script, on_invalid="fail"))
    run = local_default.wait_for_end("oversized")
    assert run["status"]["phase"] == "Failed", run["status"]
    step = step_status(run)
    assert step["loop"]["stopReason"] == "LoopConditionError"
    assert step["loop"]["completedIterations"] == 1
    size = (local_default.claim_dir("oversized-workspace") / ".agentrun" / "loop-control.json").stat().st_size
    match = re.search(
        r"control file is (\d+) bytes.*at most (\d+) bytes fit in the 4096-byte termination message",
        step["message"],
    )
    assert match, step["message"]
    assert int(match.group(1)) == size
    assert int(match.group(2)) < 4096
    assert "too large" in step["message"] and "onInvalid: fail" in step["message"]


def test_an_oversized_control_file_with_on_invalid_stop_succeeds_visibly(local_default: LocalDefault) -> None:
    script = """
mkdir -p /workspace/.agentrun
pad=$(head -c 5000 /dev/zero | tr '\\0' x)
printf '{"continue": true, "pad": "%s"}' "$pad" > /workspace/.agentrun/loop-control.json
"""
    local_default.apply(manifest("oversized-stop", script, on_invalid="stop"))
    run = local_default.wait_for_end("oversized-stop")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    step = step_status(run)
    assert step["loop"]["stopReason"] == "LoopConditionError"
    assert re.search(r"control file is \d+ bytes.*at most \d+ bytes fit", step["message"]), step["message"]


def _decode_error(text: str) -> json.JSONDecodeError:
    """What Python's own JSON decoder says about `text` (the oracle, independent of the reporter)."""
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return exc
    raise AssertionError(f"{text!r} is valid JSON")


def test_invalid_json_goes_through_the_real_reporter_and_fails_per_on_invalid(
    local_default: LocalDefault,
) -> None:
    """The iteration writes a truncated JSON file; the reporter sidecar reads it from the PVC, the
    operator reads the reporter's termination message: no envelope is built by the test."""
    script = """
echo "iteration $AGENTRUN_ITERATION" >> /workspace/ran.log
mkdir -p /workspace/.agentrun
printf '{"continue": tru' > /workspace/.agentrun/loop-control.json
"""
    local_default.apply(manifest("bad-json", script, on_invalid="fail"))
    run = local_default.wait_for_end("bad-json")
    assert run["status"]["phase"] == "Failed", run["status"]
    step = step_status(run)
    assert step["loop"]["stopReason"] == "LoopConditionError"
    assert step["loop"]["completedIterations"] == 1
    root = local_default.claim_dir("bad-json-workspace")
    written = (root / ".agentrun" / "loop-control.json").read_text()
    error = _decode_error(written)
    assert "invalid JSON" in step["message"] and "onInvalid: fail" in step["message"], step["message"]
    assert f"line {error.lineno} column {error.colno}" in step["message"], (step["message"], error)
    assert (root / "ran.log").read_text().splitlines() == ["iteration 1"]


def test_invalid_json_with_on_invalid_stop_ends_the_loop_visibly(local_default: LocalDefault) -> None:
    script = """
mkdir -p /workspace/.agentrun
printf 'continue=yes' > /workspace/.agentrun/loop-control.json
"""
    local_default.apply(manifest("bad-json-stop", script, on_invalid="stop"))
    run = local_default.wait_for_end("bad-json-stop")
    assert run["status"]["phase"] == "Succeeded", run["status"]
    step = step_status(run)
    assert step["loop"]["stopReason"] == "LoopConditionError"
    assert step["loop"]["completedIterations"] == 1
    assert "invalid JSON" in step["message"] and "onInvalid: stop" in step["message"], step["message"]


def test_a_truly_missing_file_follows_on_missing(local_default: LocalDefault) -> None:
    """No iteration ever writes the file (and no earlier one did): the reporter finds nothing."""
    script = """
echo "iteration $AGENTRUN_ITERATION" >> /workspace/ran.log
"""
    local_default.apply(manifest("no-file", script, on_missing="fail"))
    local_default.apply(manifest("no-file-stop", script, on_missing="stop"))
    failed = local_default.wait_for_end("no-file")
    stopped = local_default.wait_for_end("no-file-stop")
    assert failed["status"]["phase"] == "Failed", failed["status"]
    assert step_status(failed)["loop"]["stopReason"] == "LoopConditionError"
    assert "no file at /workspace/.agentrun/loop-control.json" in step_status(failed)["message"]
    assert "onMissing: fail" in step_status(failed)["message"]
    assert stopped["status"]["phase"] == "Succeeded", stopped["status"]
    assert step_status(stopped)["loop"]["stopReason"] == "LoopConditionFalse"
    for name in ("no-file", "no-file-stop"):
        root = local_default.claim_dir(f"{name}-workspace")
        assert not (root / ".agentrun" / "loop-control.json").exists()
        assert (root / "ran.log").read_text().splitlines() == ["iteration 1"]
