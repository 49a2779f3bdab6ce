"""Cast / CastLike: edge cases the ONNX node tests do not cover (strings, tables, e8m0)."""

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as T

from opwarden.errors import KernelError
from opwarden.ops import REGISTRY


def ref(op_type, opset, *inputs, **attrs):
    """Call the op object governing `op_type` at `opset`, with schema defaults as the runtime."""
    o, sch = REGISTRY.resolve(op_type, "", opset)
    kw = {k: a.default for k, a in sch.attrs.items() if a.has_default}
    kw.update(attrs)
    return o.reference(*inputs, **kw)


def bits(a):
    return np.asarray(a).view(np.uint8).tolist()


def test_string_formatting():
    x = np.array([0.1, -2.5, np.nan, np.inf, -np.inf, 1e20, -0.0, 3.0], np.float32)
    y = ref("Cast", 21, x, to=T.STRING)
    assert y.dtype == object
    assert y.tolist() == ["0.1", "-2.5", "NaN", "INF", "-INF", "1e+20", "-0", "3"]
    assert ref("Cast", 21, np.array([True, False]), to=T.STRING).tolist() == ["1", "0"]
    assert ref("Cast", 21, np.array([-7, 300], np.int64), to=T.STRING).tolist() == ["-7", "300"]
    assert ref("Cast", 21, np.array([448], ml_dtypes.float8_e4m3fn), to=T.STRING).tolist() == [
        "448"
    ]


def test_string_parsing():
    s = np.array(["NaN", "INF", "-INF", "+inf", "nan", "1e-5", " 3.5 ", "1E8"], dtype=object)
    y = ref("Cast", 13, s, to=T.FLOAT)
    assert y.dtype == np.float32
    assert np.isnan(y[0]) and np.isnan(y[4])
    assert y[1:4].tolist() == [np.inf, -np.inf, np.inf]
    np.testing.assert_allclose(y[5:], [1e-5, 3.5, 1e8], rtol=1e-7)
    big = np.array(["9223372036854775807", "-1", "300"], dtype=object)
    assert ref("Cast", 13, big, to=T.INT64).tolist() == [2**63 - 1, -1, 300]
    assert ref("Cast", 13, big[1:], to=T.UINT8).tolist() == [255, 44]
    with pytest.raises(KernelError):
        ref("Cast", 13, np.array(["hello"], dtype=object), to=T.FLOAT)


def test_round_trip_float_string():
    x = np.random.default_rng(0).standard_normal(100).astype(np.float32) * 1e3
    s = ref("Cast", 13, x, to=T.STRING)
    np.testing.assert_array_equal(ref("Cast", 13, s, to=T.FLOAT), x)


F8 = {
    T.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn,
    T.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
    T.FLOAT8E5M2: ml_dtypes.float8_e5m2,
    T.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
}


@pytest.mark.parametrize("to", list(F8))
def test_float8_saturate_table(to):
    dt = F8[to]
    fmax = float(ml_dtypes.finfo(dt).max)
    x = np.array([np.inf, -np.inf, 1e9, -1e9, np.nan, 0.0, -0.0], np.float32)
    y = ref("Cast", 19, x, to=to, saturate=1).astype(np.float32)
    assert y[:4].tolist() == [fmax, -fmax, fmax, -fmax]
    assert np.isnan(y[4])
    z = ref("Cast", 19, x, to=to, saturate=0).astype(np.float32)
    if to == T.FLOAT8E5M2:
        assert z[:4].tolist() == [np.inf, -np.inf, np.inf, -np.inf]
    else:
        assert np.isnan(z[:4]).all()
    neg_zero_kept = to in (T.FLOAT8E4M3FN, T.FLOAT8E5M2)
    assert np.signbit(y[6]) == neg_zero_kept


def test_float8_from_double_rounds_once():
    # 1.0625 is the e4m3 midpoint between 1 and 1.125; a hair above it must round up.
    y = ref("Cast", 19, np.array([1.0625 + 1e-12, 1.0625]), to=T.FLOAT8E4M3FN)
    assert y.astype(np.float32).tolist() == [1.125, 1.0]


def test_e8m0_round_modes():
    x = np.array([0.0, 1.5, 3.0, 1.4, 1.6, np.inf, np.nan], np.float32)
    up = ref("Cast", 24, x, to=T.FLOAT8E8M0, round_mode="up").astype(np.float32)
    assert up[1:6].tolist() == [2.0, 4.0, 2.0, 2.0, 2.0**127]
    assert up[0] == 2.0**-127 and np.isnan(up[6])
    down = ref("Cast", 24, x, to=T.FLOAT8E8M0, round_mode="down").astype(np.float32)
    assert down[1:5].tolist() == [1.0, 2.0, 1.0, 1.0]
    near = ref("Cast", 24, x, to=T.FLOAT8E8M0, round_mode="nearest", saturate=0)
    near = near.astype(np.float32)
    assert np.isnan(near[0]) and np.isnan(near[5])
    assert near[1:5].tolist() == [2.0, 2.0, 1.0, 2.0]


def test_small_ints_wrap():
    x = np.array([-9, 8, 17, -3], np.int32)
    assert ref("Cast", 21, x, to=T.INT4).astype(np.int8).tolist() == [7, -8, 1, -3]
    assert ref("Cast", 21, x, to=T.UINT4).astype(np.int8).tolist() == [7, 8, 1, 13]
    assert ref("Cast", 25, x, to=T.INT2).astype(np.int8).tolist() == [-1, 0, 1, 1]


def test_cast1_string_to_and_copy():
    x = np.array([1.7, -1.7], np.float64)
    y = ref("Cast", 1, x, to="INT32")
    assert y.dtype == np.int32 and y.tolist() == [1, -1]
    same = ref("Cast", 13, x, to=T.DOUBLE)
    assert same is not x and not np.shares_memory(same, x)


def test_castlike_string_target():
    y = ref("CastLike", 21, np.array([1.5, 2.0], np.float32), np.array(["a"], dtype=object))
    assert y.tolist() == ["1.5", "2"]
