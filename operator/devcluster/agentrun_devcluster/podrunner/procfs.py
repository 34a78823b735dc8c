"""What /proc says about a process: its start time (which tells a reused pid apart) and its children.

The leaf the pod runner's process bookkeeping stands on (adopt.py, pidns.py, process.py): it imports
nothing of the pod runner.
"""

from __future__ import annotations

from pathlib import Path


def process_start(pid: int) -> str | None:
    """The kernel's start time of `pid` (field 22 of /proc/pid/stat): tells a reused pid apart.
    None when the process is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if fields[0] == "Z":
        return None
    return fields[19]


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []
