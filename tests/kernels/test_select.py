"""TopK by selection (kernels.select) against the reference's full stable sort."""

from __future__ import annotations

import numpy as np
import pytest

from opwarden.kernels.cpu import select
from opwarden.ops.reduce import TopK as ref_topk


def _both(x, k, largest, axis=-1):
    K = np.array([k], np.int64)
    want = ref_topk(x, K, axis=axis, largest=largest)
    got = select._topk(x, k, axis, bool(largest))
    return got, want


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
def test_selection_equals_the_sort_exactly(largest, dtype):
    rng = np.random.default_rng(0)
    for rows, n, k, hi in ((50, 300, 7, 1000), (40, 64, 16, 6), (9, 33, 1, 3), (3, 4096, 50, 40)):
        x = rng.integers(-hi, hi, (rows, n)).astype(dtype)  # small ranges: many ties
        got, want = _both(x, k, largest)
        assert got is not None
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        assert got[1].dtype == np.int64


def test_ties_straddling_the_kth_place_take_the_lowest_indices():
    x = np.array([[5, 1, 5, 2, 5, 5, 0, 5] + [0] * 40], np.float32)
    got, want = _both(x, 3, 1)
    np.testing.assert_array_equal(got[1], [[0, 2, 4]])
    np.testing.assert_array_equal(got[1], want[1])
    mixed = np.vstack([x, np.arange(48, dtype=np.float32)[None]])  # one row ties, one not
    got, want = _both(mixed, 3, 1)
    np.testing.assert_array_equal(got[1], want[1])


def test_signed_zeros_and_infinities():
    x = np.array([[0.0, -0.0, np.inf, -np.inf, 1.0] * 10], np.float32)
    for largest in (1, 0):
        got, want = _both(x, 8, largest)
        np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("case", ["nan", "big k", "axis", "k=0"])
def test_declines_where_the_reference_must_run(case):
    x = np.random.default_rng(1).standard_normal((4, 40)).astype(np.float32)
    if case == "nan":
        x[2, 3] = np.nan
        assert select._topk(x, 3, -1, True) is None
    elif case == "big k":
        assert select._topk(x, 11, -1, True) is None
    elif case == "axis":
        assert select._topk(x, 1, 0, True) is None
    else:
        assert select._topk(x, 0, -1, True) is None


def test_registered_kernel_falls_back_with_the_same_results():
    from opwarden.ops import REGISTRY

    opdef = REGISTRY.versions("TopK")[-1]
    kernel = [v for v in opdef.variants if v.name == "topk.cpu.select"][0].fn
    x = np.random.default_rng(2).standard_normal((3, 20)).astype(np.float32)
    x[0, 0] = np.nan
    K = np.array([4], np.int64)
    for args in ((x, K), (x[:, :3], np.array([3], np.int64))):
        got, want = kernel(*args, axis=-1), ref_topk(*args, axis=-1)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
