"""The worked example (custom fused bias+GELU, gradcheck, ONNX model, SGD training) runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_bias_gelu.py"


def test_custom_bias_gelu_example_trains():
    # --no-check skips the contract harness (minutes); gradcheck, export and training still run.
    res = subprocess.run([sys.executable, str(EXAMPLE), "--no-check"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "gradcheck: True" in res.stdout
    assert "export keeps example.ops opset 1: True" in res.stdout
    assert "% lower" in res.stdout
