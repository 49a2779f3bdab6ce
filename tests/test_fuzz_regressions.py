"""Regressions found by the structure-aware fuzzer (opwarden.verify.fuzz), one per escape."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import opwarden as ow
from tests.models import one_node


@pytest.mark.parametrize("value", [3, -1])
def test_unique_sorted_outside_0_1_is_refused(value):
    # fuzz seed 10, examples 7226 / 8996: ONNX allows sorted in {0, 1}; other values were run
    # as "sorted" while ONNX Runtime runs them unsorted, so the outputs disagreed.
    m = one_node(
        "Unique", [("x", TensorProto.FLOAT, [4])], [("y", TensorProto.FLOAT, None)],
        opset=11, sorted=value,
    )  # fmt: skip
    with pytest.raises(ow.ModelError, match="sorted"):
        ow.InferenceSession(m.SerializeToString())


def test_unique_sorted_0_and_1_still_run():
    x = np.array([3.0, 1.0, 3.0, 2.0], np.float32)
    for value, want in ((1, [1.0, 2.0, 3.0]), (0, [3.0, 1.0, 2.0])):
        m = one_node(
            "Unique", [("x", TensorProto.FLOAT, [4])], [("y", TensorProto.FLOAT, None)],
            opset=11, sorted=value,
        )  # fmt: skip
        (y,) = ow.InferenceSession(m.SerializeToString()).run(None, {"x": x})
        np.testing.assert_array_equal(y, want)
