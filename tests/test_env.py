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


# Whether the workers were restarted is what opwarden decides; how long they then spin is
# OpenBLAS's business and a timing, measured by benchmarks/blas_spin.py, not asserted here.
RESTART = """
import os
{imports}
import opwarden
a = numpy.ones((512, 512), numpy.float32)
b = a @ a
assert float(b[0, 0]) == 512.0 and float(b.sum()) == 512.0 ** 3
print(opwarden._BLAS_RESTARTED, os.environ["OPENBLAS_THREAD_TIMEOUT"])
"""


def _restart(imports: str, **env_extra: str) -> str:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_THREAD_TIMEOUT", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", RESTART.format(imports=imports)], env=env,
                         capture_output=True, text=True, check=True, timeout=120)
    return out.stdout.strip()


def test_numpy_imported_first_restarts_blas_workers():
    from opwarden.blas import openblas_symbol

    if openblas_symbol("openblas_read_env") is None:
        pytest.skip("NumPy's BLAS is not an OpenBLAS that exports openblas_read_env")
    # NumPy first: its OpenBLAS read the environment before opwarden set the short timeout,
    # so its workers are restarted to read it again; threaded GEMMs still right afterwards.
    assert _restart("import numpy") == "True 20"
    # The user's own setting wins, also when NumPy came first: nothing to restart.
    assert _restart("import numpy", OPENBLAS_THREAD_TIMEOUT="28") == "False 28"
    # opwarden first: NumPy's OpenBLAS reads our setting when it loads.
    assert _restart("import opwarden\nimport numpy") == "False 20"
