"""Run a module under cProfile timed by CPU time: `python -m tests.bench.cpu_profile OUT -m MODULE ARGS…`.

`python -m cProfile` times with the wall clock, so on a shared machine every call that makes another
process runnable (a socket send to the API server on loopback) is charged with the time the operator
then spends preempted. `time.process_time` charges only the CPU this process used, which is what
the benchmark's "CPU per iteration" counts (docs/operator.md#performance).
"""

from __future__ import annotations

import cProfile
import runpy
import sys
import time


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit("usage: python -m tests.bench.cpu_profile OUT -m MODULE [ARGS...]")
    out, module = sys.argv[1], sys.argv[3]
    sys.argv = [module, *sys.argv[4:]]
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        profiler.disable()
        profiler.dump_stats(out)


if __name__ == "__main__":
    main()
