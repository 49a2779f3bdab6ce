"""The node-suite judge: what the spec leaves undefined is not judged, everything else is."""

from __future__ import annotations

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from opwarden.verify import conformance as conf

X = np.array([[0.0, 2.5, -9.0, 7.0, 8.0, np.nan, -8.0]], np.float32)


def _cast(to: int) -> onnx.NodeProto:
    return helper.make_node("Cast", ["x"], ["y"], to=to)


def test_out_of_range_float_to_int4_elements_are_undefined():
    (mask,) = conf.undefined_for_node(_cast(TensorProto.INT4), [X])
    assert mask.tolist() == [[False, False, True, False, True, True, False]]
    wrapped = np.array([[0, 2, 7, 7, -8, 0, -8]], np.float32).astype(ml_dtypes.int4)
    zeroed = np.array([[0, 2, 0, 7, 0, 0, -8]], np.float32).astype(ml_dtypes.int4)
    # Both ml_dtypes 0.6's and 0.7's expected data are right where the spec defines the value.
    conf.compare(zeroed, wrapped, 0, 0, undefined=mask)
    conf.compare(wrapped, zeroed, 0, 0, undefined=mask)
    # An in-range element that differs still fails, and so would the whole without the mask.
    bad = wrapped.copy()
    bad[0, 1] = 3
    with pytest.raises(AssertionError):
        conf.compare(zeroed, bad, 0, 0, undefined=mask)
    with pytest.raises(AssertionError):
        conf.compare(zeroed, wrapped, 0, 0)


def test_castlike_and_every_fixed_point_target():
    for target in (ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2, np.int8, np.uint8):
        like = np.zeros(1, target)
        node = helper.make_node("CastLike", ["x", "like"], ["y"])
        (mask,) = conf.undefined_for_node(node, [X, like])
        lo, hi = conf._int_range(np.dtype(target))
        want = ~np.isfinite(X) | (X < lo) | (X > hi)
        assert mask.tolist() == want.tolist(), target


def test_defined_casts_are_judged_whole():
    # in range, integer -> integer (wraps by the spec), float -> float, float -> bool
    assert conf.undefined_for_node(_cast(TensorProto.INT4), [np.zeros(3, np.float32)]) == [None]
    assert conf.undefined_for_node(_cast(TensorProto.INT4), [np.arange(40, dtype=np.int32)]) == [
        None
    ]
    assert conf.undefined_for_node(_cast(TensorProto.FLOAT16), [X]) == [None]
    assert conf.undefined_for_node(_cast(TensorProto.BOOL), [X]) == [None]


def test_random_outputs_are_judged_on_dtype_and_shape_only():
    g = helper.make_graph(
        [helper.make_node("RandomUniformLike", ["x"], ["r"]),
         helper.make_node("Greater", ["r", "x"], ["b"]),
         helper.make_node("Cast", ["b"], ["y"], to=TensorProto.FLOAT),
         helper.make_node("Relu", ["x"], ["z"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
    )
    und = conf.undefined_outputs(g, {"x": np.zeros(2, np.float32)})
    assert und == {"y": conf.ALL}  # z does not depend on the random draw: judged in full
    conf.compare(np.zeros(2, np.float32), np.ones(2, np.float32), 0, 0, undefined=conf.ALL)
    with pytest.raises(AssertionError, match="shape"):
        conf.compare(np.zeros(2, np.float32), np.ones(3, np.float32), 0, 0, undefined=conf.ALL)
    with pytest.raises(AssertionError, match="dtype"):
        conf.compare(np.zeros(2, np.float32), np.ones(2, np.float64), 0, 0, undefined=conf.ALL)


def test_missing_optional_module_is_a_named_skip(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "PIL" else real(name, *a))
    (case,) = conf.load_cases(["test_image_decoder_decode_bmp_rgb"])
    r = conf.run_case(case)
    assert r.status == "skip"
    assert "opwarden[image]" in r.reason


def test_expected_list_ships_inside_the_package():
    import opwarden.verify

    path = os.path.join(os.path.dirname(opwarden.verify.__file__), "expected_failures.txt")
    assert os.path.samefile(conf.EXPECTED_FAILURES, path)
    assert isinstance(conf.read_expected(), dict)  # parsed (empty once every case passes)


def test_installed_command_judges_cast_cases_from_any_directory(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "opwarden.cli", "conformance", "--filter", "test_cast_FLOAT_to_INT",
         "--filter", "test_bernoulli", "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
