"""opwarden makes NumPy's OpenBLAS stop busy-waiting soon after a run (see opwarden/__init__.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CODE = "import os, opwarden, numpy; print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"


@pytest.mark.parametrize("given, want", [(None, "20"), ("26", "26")])
def test_openblas_thread_timeout_default_and_override(given, want):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if given is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = given
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == want


# CPU time the process burns in 0.3 s of sleep right after a threaded GEMM: OpenBLAS's worker
# spinning out its timeout (2^28 cycles, ~0.1 s, by default; 2^20, ~0.4 ms, under opwarden).
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
b = a @ a
assert float(b[0, 0]) == 512.0 and float(b.sum()) == 512.0 ** 3
"""


def _spun_ms(imports: str, **env_extra: str) -> float:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_THREAD_TIMEOUT", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", SPIN.format(imports=imports)], env=env,
                         capture_output=True, text=True, check=True, timeout=120)
    return float(out.stdout.strip())


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS runs one thread on one core")
def test_numpy_imported_first_still_stops_spinning():
    from opwarden.kernels._util import openblas_symbol

    if openblas_symbol("openblas_read_env") is None:
        pytest.skip("NumPy's BLAS is not an OpenBLAS that exports openblas_read_env")
    # NumPy alone: the default timeout, ~100 ms of a worker spinning.
    assert _spun_ms("import numpy") > 40
    # NumPy first, then opwarden: the workers were restarted with the short timeout; GEMMs
    # still right (the asserts in SPIN).
    assert _spun_ms("import numpy\nimport opwarden") < 20
    # The user's own setting wins, also when NumPy came first.
    assert _spun_ms("import numpy\nimport opwarden", OPENBLAS_THREAD_TIMEOUT="28") > 40
