"""The looped runs with `loop.checkpoint` that the checkpoint tests apply (tests/e2e/test_checkpoints.py,
tests/e2e/test_candidates.py, tests/node/checkpoint_owners.py), and the shell function their scripts
hash the workspace with."""

from __future__ import annotations

from pathlib import Path

from tests.support.manifests import claim_yaml

RUN = """
apiVersion: agents.proompteng.ai/v1alpha1
kind: AgentRun
metadata:
  name: {name}
spec:
  runtime:
    type: workflow
  workload:
    image: {image}
    command: [sh, -c]
    args:
      - |
{script}
    volumes:
      - name: workspace
        type: pvc
        claimName: {name}-workspace
        mountPath: /workspace
{shared}  workflow:
    steps:
      - name: work
{step_fields}        loop:
          maxIterations: {max_iterations}
          checkpoint:
            mode: Files
{on_failed}{loop_extra}"""

SHARED_VOLUME = """\
      - name: {volume}
        type: pvc
        claimName: {name}-{volume}
        mountPath: /{volume}
"""


def checkpoint_run(
    name: str,
    script: str,
    *,
    max_iterations: int,
    retries: int | None = None,
    on_failed: str | None = None,
    image: str = "busybox:1.36",
    timeout_seconds: int | None = None,
    shared: tuple[str, ...] = (),
    loop_extra: str = "",
) -> str:
    """A claim `<name>-workspace` and a run whose step `work` loops over it with checkpoints, its
    `main` being `script` (`sh -c`), with `retries` (no backoff), `onFailedAttempt` and
    `timeoutSeconds` when given; each of `shared` a claim `<name>-<volume>` mounted at `/<volume>`
    (not checkpointed), and `loop_extra` more lines of the loop (e.g. its `candidates`)."""
    body = "\n".join("        " + line for line in script.strip().splitlines())
    step_fields = (
        f"        retries: {retries}\n        retryBackoffSeconds: 0\n" if retries is not None else ""
    )
    if timeout_seconds is not None:
        step_fields += f"        timeoutSeconds: {timeout_seconds}\n"
    failed_line = f"            onFailedAttempt: {on_failed}\n" if on_failed is not None else ""
    claims = "".join(claim_yaml(f"{name}-{volume}") for volume in ("workspace", *shared))
    return claims + RUN.format(
        name=name,
        image=image,
        script=body,
        shared="".join(SHARED_VOLUME.format(name=name, volume=volume) for volume in shared),
        step_fields=step_fields,
        max_iterations=max_iterations,
        on_failed=failed_line,
        loop_extra=loop_extra,
    )


def tree_hash_function(stat_format: str = "%a") -> str:
    """`tree_hash`: one hash of the workspace tree under the current directory (each path with its
    type, `stat -c STAT_FORMAT` and content or link target), the control directory `.agentrun` and the
    Job claims left out, as every checkpoint leaves them out."""
    return rf"""tree_hash() {{
  find . -path ./.agentrun -prune -o -path ./.agentrun-claims -prune -o -print | LC_ALL=C sort |
  while read -r p; do
    if [ -L "$p" ]; then echo "l $p $(readlink "$p")";
    elif [ -f "$p" ]; then echo "f $p $(stat -c '{stat_format}' "$p") $(sha256sum < "$p")";
    else echo "d $p $(stat -c '{stat_format}' "$p")"; fi
  done | sha256sum | cut -d' ' -f1
}}"""


def hashing_script(body: str, stat_format: str = "%a") -> str:
    """`main`'s script: `set -e`, into /workspace, `tree_hash` defined (`tree_hash_function`), then `body`."""
    return f"set -e\ncd /workspace\n{tree_hash_function(stat_format)}\n{body.strip()}\n"


def read_record(root: Path, name: str) -> str:
    """A record a script left in the volume's `.agentrun` (which no checkpoint restores)."""
    return (root / ".agentrun" / name).read_text().strip()
