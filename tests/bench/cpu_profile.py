"""A CPU-time sampling profiler: `python -m tests.bench.cpu_profile OUT -m MODULE ARGS…`.

Every `INTERVAL` seconds of the process's CPU time (`ITIMER_PROF`: only while it runs, never while
it waits or is preempted by other processes on a shared machine) the main thread's Python stack is
recorded. OUT gets one line per distinct stack, `frame;frame;… count` (the "collapsed" format
flame graph tools read), and `top` summarises it: the share of samples in each function, itself and
with what it calls. Unlike `python -m cProfile`, which times with the wall clock and charges a cost
to every function call (so call-heavy code looks far costlier than it is), the shares here are
shares of the CPU the benchmark's "CPU per iteration" counts (docs/operator.md#performance).
"""

from __future__ import annotations

import collections
import runpy
import signal
import sys
from pathlib import Path
from types import FrameType

INTERVAL = 0.001


def _frame_name(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit("usage: python -m tests.bench.cpu_profile OUT -m MODULE [ARGS...]")
    out, module = Path(sys.argv[1]), sys.argv[3]
    sys.argv = [module, *sys.argv[4:]]
    stacks: collections.Counter[tuple[str, ...]] = collections.Counter()

    def sample(_signum: int, frame: FrameType | None) -> None:
        names = []
        while frame is not None:
            names.append(_frame_name(frame))
            frame = frame.f_back
        stacks[tuple(reversed(names))] += 1

    signal.signal(signal.SIGPROF, sample)
    signal.setitimer(signal.ITIMER_PROF, INTERVAL, INTERVAL)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        out.write_text("".join(f"{';'.join(stack)} {count}\n" for stack, count in stacks.items()))


def top(path: Path, n: int = 30, within: str = "") -> str:
    """The functions with the most samples, by their own and by inclusive share; with `within`,
    only samples whose stack passes through a function whose name contains it (e.g. `_run_once`:
    the event loop, leaving out start-up)."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        frames = stack.split(";")
        if within and not any(within in frame for frame in frames):
            continue
        count = int(count_text)
        total += count
        short = [_short(frame) for frame in frames]
        own[short[-1]] += count
        for frame in set(short):
            inclusive[frame] += count
    lines = [f"{total} samples ({INTERVAL * 1000:.0f} ms of CPU each){f' within {within}' if within else ''}"]
    for title, counter in (("own", own), ("inclusive", inclusive)):
        lines.append(f"-- by {title} samples")
        lines += [f"{100 * c / max(total, 1):5.1f}% {c:6d}  {name}" for name, c in counter.most_common(n)]
    return "\n".join(lines) + "\n"


def _short(frame: str) -> str:
    """`func (…/site-packages/pkg/mod.py:12)` -> `func (pkg/mod.py:12)`."""
    name, _, where = frame.partition(" (")
    parts = where.rstrip(")").split("/")
    return f"{name} ({'/'.join(parts[-2:])})"


if __name__ == "__main__":
    main()
