"""`main` of a warm pod: a shell loop around the workload's command, which the supervisor (the
reporter, control/warm.py) hands one iteration at a time (docs/design.md#warm-pod). Pure.

The loop and the supervisor meet in the `warm` directory of the pod's meta volume: the FIFO `next`
(an iteration id per line, or `stop`), and per iteration `<id>/env` (written by the supervisor) and
`<id>/exit` (written by the loop). POSIX sh, so it runs with the image's `/bin/sh` (dash, busybox).
"""

from __future__ import annotations

from typing import Final

from agentrun_operator.control.warm import DEFAULT_PORT, FIFO_NAME
from agentrun_operator.jobs.reporter_container import META_MOUNT

WARM_SUBPATH: Final = "warm"
WARM_DIR: Final = f"{META_MOUNT}/{WARM_SUBPATH}"
"""The warm directory as the reporter sees it (its `--warm-dir`)."""
WARM_MOUNT: Final = "/.agentrun-warm"
"""Where `main` mounts the meta volume's `warm` subPath (read-write: it writes the exit codes)."""
WARM_FIFO: Final = FIFO_NAME
WARM_PORT: Final = DEFAULT_PORT
WARM_MARK: Final = "agentrun-warm"
"""The loop's `$0`: how its process is known among the pod's."""

WARM_LOOP_SCRIPT: Final = (
    f"d=${{AGENTRUN_WARM_DIR:-{WARM_MOUNT}}}; f=$d/{FIFO_NAME}; child= sig= late= inside=\n"
    'forward() { if [ -z "$inside" ]; then exit "$2"; fi; if [ "$inside" = 2 ]; then late=$2; return; fi; '
    'sig=$1; [ -z "$child" ] || kill -TERM "$child" 2>/dev/null; }\n'
    "trap 'forward TERM 143' TERM\n"
    "trap 'forward INT 130' INT\n"
    "while :; do\n"
    "  id=\n"
    '  if ! { IFS= read -r id < "$f"; } 2>/dev/null && [ -z "$id" ]; then\n'
    '    [ -p "$f" ] && exit 0\n'
    '    echo "agentrun: no warm channel at $f" >&2; exit 2\n'
    "  fi\n"
    '  case $id in stop) exit 0 ;; ""|.*|*/*) continue ;; esac\n'
    '  echo "agentrun: iteration $id" >&2\n'
    "  inside=1\n"
    '  ( . "$d/$id/env" && exec "$@" ) &\n'
    "  child=$!\n"
    '  [ -z "$sig" ] || kill -TERM "$child" 2>/dev/null\n'
    '  while :; do wait "$child"; code=$?; [ -n "$sig" ] && kill -0 "$child" 2>/dev/null || break; done\n'
    "  child= inside=2\n"
    '  echo "$code" > "$d/$id/exit.tmp" && mv -f "$d/$id/exit.tmp" "$d/$id/exit"\n'
    "  inside=\n"
    '  [ -z "$late" ] || exit "$late"\n'
    '  [ -z "$sig" ] || exit "$code"\n'
    "done\n"
)
"""The loop. It reads an id from the FIFO (blocking; `stop` or the end of the file ends it with exit
code 0), writes `agentrun: iteration <id>` to stderr, runs the command in the background in a
subshell that first sources `<id>/env` (`export NAME='value'` lines), waits for it and writes its exit
code to `<id>/exit` (`exit.tmp`, then `mv`: the supervisor never reads half of it).

Why in the background: a shell runs its traps only between commands, so only a command it waits for
with `wait` can be sent the shell's SIGTERM (the kubelet signals the container's first process, the
loop). A trapped signal interrupts `wait`; while the command's process is still there (running or
not yet reaped), it waits again, so the command's own exit code is kept. SIGINT is passed on as
SIGTERM: a non-interactive shell starts background commands with SIGINT ignored (POSIX), so an INT
would never reach them. After a signal the loop ends with the command's exit code once it is
written; a signal while it waits for an id ends it at once (143, 130). A signal that comes while an
iteration starts (before the shell knows the command's pid) is remembered (`inside`) and passed on
as soon as it does, so the command never runs on unsignalled; one that comes after the command ended,
while its exit code is being written, ends the loop once it is written (143, 130), as one while it
waits for an id does. The command's stdin is `/dev/null`,
as a container's is without `stdin: true`."""


def warm_main_command(command: list[str], args: list[str] | None = None) -> list[str]:
    """`main`'s command in a warm pod: the loop around the workload's command and args."""
    return ["sh", "-c", WARM_LOOP_SCRIPT, WARM_MARK, *command, *(args or [])]
