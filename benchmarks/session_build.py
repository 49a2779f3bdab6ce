"""Full session build time (load, passes, placement, layout, program, memory plan) of large graphs.

    python benchmarks/session_build.py [--nodes 20000] [--levels 0 3] [--repeat 1] [--profile]

Shapes (from `load_graphs.py`): a Relu chain in file order and reversed, and a wide graph (NODES
Relus of one input summed). Each is built as `InferenceSession(bytes, optimization_level=L)`;
reported: the best of REPEAT builds in seconds and the planned arena. `--profile` prints the
top cProfile entries (by cumulative time) of one build per case instead.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from load_graphs import chain, wide  # noqa: E402

import opwarden  # noqa: E402
from opwarden.options import SessionOptions  # noqa: E402


def build(data: bytes, level: int):
    return opwarden.InferenceSession(data, SessionOptions(optimization_level=level))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=20_000)
    ap.add_argument("--levels", type=int, nargs="+", default=[0, 3])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--shapes", nargs="+", default=["chain", "reversed", "wide"])
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    makers = {
        "chain": lambda n: chain(n),
        "reversed": lambda n: chain(n, reverse=True),
        "wide": lambda n: wide(n),
    }
    for shape in a.shapes:
        data = makers[shape](a.nodes)
        for level in a.levels:
            name = f"{shape} {a.nodes} level {level}"
            if a.profile:
                prof = cProfile.Profile()
                prof.enable()
                build(data, level)
                prof.disable()
                print(f"== {name}")
                pstats.Stats(prof).sort_stats("cumtime").print_stats(25)
                continue
            times = []
            for _ in range(a.repeat):
                t = time.perf_counter()
                sess = build(data, level)
                times.append(time.perf_counter() - t)
            plan = sess.memory_plan
            print(f"{name:<28} {min(times):8.2f} s  steps {len(plan.steps):>6}  "
                  f"buffers {len(plan.buffers):>6}  arena {plan.arena_bytes:>9} B", flush=True)


if __name__ == "__main__":
    main()
