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
