"""CPU time NumPy's OpenBLAS workers burn after a threaded GEMM, with and without opwarden.

OpenBLAS's workers busy-wait for OPENBLAS_THREAD_TIMEOUT (2^28 cycles, ~0.1 s, by default)
after every call; opwarden sets 2^20 (~0.4 ms) and restarts the workers when NumPy was imported
first. Each figure is the CPU milliseconds a process spends during 0.3 s of sleep right after a
512x512 GEMM (the median of 5 fresh processes, each the minimum of 3 sleeps).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/blas_spin.py
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

SPIN = """
import resource, time
{imports}
a = numpy.ones((512, 512), numpy.float32)
def spun():
    a @ a
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(0.3)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1e3
spun()
print(min(spun() for _ in range(3)))
"""

CASES = [
    ("numpy alone", "import numpy", {}),
    ("numpy, then opwarden", "import numpy\nimport opwarden", {}),
    ("opwarden, then numpy", "import opwarden\nimport numpy", {}),
    ("numpy, then opwarden, user's OPENBLAS_THREAD_TIMEOUT=28", "import numpy\nimport opwarden",
     {"OPENBLAS_THREAD_TIMEOUT": "28"}),
]


def spun_ms(imports: str, extra: dict[str, str]) -> float:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_THREAD_TIMEOUT", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    env.update(extra)
    out = subprocess.run([sys.executable, "-c", SPIN.format(imports=imports)], env=env,
                         capture_output=True, text=True, check=True, timeout=120)
    return float(out.stdout.strip())


def main() -> None:
    for label, imports, extra in CASES:
        runs = [spun_ms(imports, extra) for _ in range(5)]
        print(f"{label:58s} {statistics.median(runs):7.1f} ms CPU spun (median of 5)")


if __name__ == "__main__":
    main()
