"""Elementwise and activation operators: edge cases the ONNX node tests do not cover."""

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto

from opwarden.errors import KernelError
from opwarden.ops import REGISTRY


def ref(op_type, opset, *inputs, **attrs):
    """Call the op object governing `op_type` at `opset`, with schema defaults as the runtime."""
    o, sch = REGISTRY.resolve(op_type, "", opset)
    kw = {k: a.default for k, a in sch.attrs.items() if a.has_default}
    kw.update(attrs)
    return o.reference(*inputs, **kw)


FLOAT_UNARY = (
    "Abs Neg Reciprocal Floor Ceil Round Sqrt Exp Log Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh "
    "Acosh Atanh Erf Sign Relu LeakyRelu Elu Selu Celu Sigmoid HardSigmoid HardSwish Softplus "
    "Softsign Tanh ThresholdedRelu Shrink Gelu Mish Swish"
).split()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, ml_dtypes.bfloat16])
@pytest.mark.parametrize("op_type", FLOAT_UNARY)
def test_float_unary_dtype_shape_no_alias(op_type, dtype):
    x = np.array([[-2.5, -0.5, 0.0], [0.25, 0.5, 3.0]], dtype=dtype)
    before = x.copy()
    y = ref(op_type, 24, x)
    assert isinstance(y, np.ndarray) and y.dtype == x.dtype and y.shape == x.shape
    assert y is not x
    np.testing.assert_array_equal(x, before)
    y0 = ref(op_type, 24, x[0, 0].reshape(()))  # 0-d in, 0-d ndarray out
    assert isinstance(y0, np.ndarray) and y0.shape == () and y0.dtype == x.dtype


def test_narrow_float_matches_float32_rounded():
    x = np.linspace(-3, 3, 41).astype(ml_dtypes.bfloat16)
    y = ref("Exp", 13, x)
    np.testing.assert_array_equal(y, np.exp(x.astype(np.float32)).astype(ml_dtypes.bfloat16))


def test_round_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -4.5, 2.3, -0.0], np.float32)
    np.testing.assert_array_equal(ref("Round", 22, x), [0, 2, 2, -0.0, -2, -4, 2, -0.0])


def test_isinf_flags_and_float8():
    x = np.array([np.inf, -np.inf, 1.0, np.nan], np.float32)
    assert ref("IsInf", 20, x, detect_negative=0).tolist() == [True, False, False, False]
    assert ref("IsInf", 20, x, detect_positive=0).tolist() == [False, True, False, False]
    f8 = np.array([np.inf, 1.0], np.float32).astype(ml_dtypes.float8_e5m2)
    assert ref("IsInf", 20, f8).tolist() == [True, False]
    assert ref("IsNaN", 20, np.array([np.nan, 1.0]).astype(ml_dtypes.float8_e4m3fn)).tolist() == [
        True, False]


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_int_div_truncates_and_wraps(dtype):
    a = np.array([7, -7, 7, -7, np.iinfo(dtype).min], dtype)
    b = np.array([2, 2, -2, -2, -1], dtype)
    y = ref("Div", 14, a, b)
    assert y.dtype == dtype
    assert y.tolist() == [3, -3, -3, 3, np.iinfo(dtype).min]


def test_int_div_and_mod_by_zero_raise():
    with pytest.raises(KernelError, match="division by zero"):
        ref("Div", 14, np.array([1], np.int32), np.array([0], np.int32))
    with pytest.raises(KernelError, match="modulo by zero"):
        ref("Mod", 13, np.array([1], np.int32), np.array([0], np.int32))


def test_add_int_wraps():
    a = np.array([127, -128], np.int8)
    assert ref("Add", 14, a, np.array([1, -1], np.int8)).tolist() == [-128, 127]
    assert ref("Abs", 13, np.array([-128], np.int8)).tolist() == [-128]


def test_mod_sign_rules():
    a = np.array([-4, 7, 5, -5], np.int32)
    b = np.array([3, -3, 3, -3], np.int32)
    assert ref("Mod", 13, a, b).tolist() == [2, -2, 2, -2]
    assert ref("Mod", 13, a, b, fmod=1).tolist() == [-1, 1, 2, -2]
    x = np.array([-1.0, 1.0, -0.0, np.inf, 1.0], np.float64)
    y = np.array([np.inf, -np.inf, 3.0, 2.0, 0.0], np.float64)
    r = ref("Mod", 28, x, y)
    assert r[:2].tolist() == [np.inf, -np.inf] and np.signbit(r[2]) == np.False_
    assert np.isnan(r[3:]).all()


def test_pow_types():
    base = np.array([2, -3, 1, -1, 5], np.int32)
    assert ref("Pow", 15, base, np.array([3, 3, -2, -3, -1], np.int64)).tolist() == [
        8, -27, 1, -1, 0]
    y = ref("Pow", 15, np.array([2, 3], np.int64), np.array([0.5, 2.0], np.float32))
    assert y.dtype == np.int64 and y.tolist() == [1, 9]
    y = ref("Pow", 15, np.array([2.0, 4.0], np.float16), np.array([3, -1], np.int64))
    assert y.dtype == np.float16 and y.tolist() == [8.0, 0.25]
    assert ref("Pow", 15, np.array([3], np.int8), np.array([5], np.int8)).tolist() == [-13]  # 243


def test_legacy_broadcast_rules():
    a = np.ones((2, 3, 4, 5), np.float32)
    assert ref("Add", 6, a, np.arange(5, dtype=np.float32), broadcast=1).shape == a.shape
    y = ref("Mul", 6, a, np.arange(12, dtype=np.float32).reshape(3, 4), broadcast=1, axis=1)
    assert y[1, 2, 3, 4] == 11
    y = ref("Sub", 6, a, np.arange(2, dtype=np.float32), broadcast=1, axis=0)
    assert y[1, 0, 0, 0] == 0 and y[0, 0, 0, 0] == 1
    with pytest.raises(KernelError):
        ref("Add", 6, a, np.arange(5, dtype=np.float32))  # broadcast=0: shapes must match
    with pytest.raises(KernelError):
        ref("Div", 6, a, np.arange(4, dtype=np.float32), broadcast=1)  # not a suffix
    assert ref("Pow", 6, a, np.array([2.0], np.float32), broadcast=1).shape == a.shape
    assert ref("Equal", 6, np.array([1, 2], np.int32), np.array(1, np.int32),
               broadcast=1).tolist() == [True, False]


def test_bitshift_signed_and_out_of_range():
    x = np.array([-8, -8, 1, 1, -1, 64], np.int8)
    s = np.array([1, 9, 7, -1, 8, 1], np.int8)
    assert ref("BitShift", 28, x, s, direction="RIGHT").tolist() == [-4, -1, 0, 0, -1, 32]
    assert ref("BitShift", 28, x, s, direction="LEFT").tolist() == [-16, 0, -128, 0, 0, -128]


def test_variadic_broadcast_and_copy():
    a = np.array([[1.0], [2.0]], np.float16)
    b = np.array([10.0, 20.0, 30.0], np.float16)
    assert ref("Sum", 13, a, b, a).shape == (2, 3)
    m = ref("Mean", 13, a, b)
    assert m.dtype == np.float16 and m[1, 2] == 16.0
    assert ref("Max", 13, a, b, np.array(25.0, np.float16))[0].tolist() == [25, 25, 30]
    assert np.isnan(ref("Min", 13, np.array([np.nan, 1.0]), np.array([0.0, 0.0]))[0])
    single = ref("Max", 13, a)
    assert single is not a and np.array_equal(single, a)


def test_where_strings():
    c = np.array([True, False])
    x = np.array(["a", "b"], dtype=object)
    y = np.array(["c", "d"], dtype=object)
    assert ref("Where", 16, c, x, y).tolist() == ["a", "d"]
    assert ref("Equal", 19, x, np.array("a", dtype=object)).tolist() == [True, False]


def test_bitcast_sub_byte_bool_and_width_check():
    x = np.array([-1, -8, 7], ml_dtypes.int4)
    y = ref("BitCast", 26, x, to=TensorProto.UINT4)
    assert y.dtype == ml_dtypes.uint4 and y.astype(np.int32).tolist() == [15, 8, 7]
    back = ref("BitCast", 26, y, to=TensorProto.INT4)
    assert back.astype(np.int32).tolist() == [-1, -8, 7]
    b = ref("BitCast", 26, np.array([0, 1, 2], np.uint8), to=TensorProto.BOOL)
    assert b.dtype == np.bool_ and b.tolist() == [False, True, True]
    f = ref("BitCast", 26, np.array(1.0, np.float32), to=TensorProto.INT32)
    assert f.shape == () and int(f) == 0x3F800000
    with pytest.raises(KernelError, match="bits"):
        ref("BitCast", 26, np.array([1], np.int32), to=TensorProto.INT64)


def test_clip_versions():
    x = np.array([-60000.0, -1.0, 0.5, np.nan], np.float16)
    y = ref("Clip", 6, x)  # default bounds ±FLT_MAX are ±inf in float16: no clipping
    assert y.dtype == np.float16 and y[0] == -60000 and np.isnan(y[3])
    assert ref("Clip", 6, x, min=0.0, max=0.25)[:3].tolist() == [0, 0, 0.25]
    i = np.array([-5, 0, 5, 100], np.int8)
    assert ref("Clip", 13, i, None, np.array(4, np.int8)).tolist() == [-5, 0, 4, 4]
    assert ref("Clip", 13, i, np.array(3, np.int8), np.array(1, np.int8)).tolist() == [1] * 4
    out = ref("Clip", 13, i)
    assert out is not i and out.tolist() == i.tolist()
    with pytest.raises(KernelError, match="scalar"):
        ref("Clip", 13, i, np.array([1, 2], np.int8))


def test_prelu_unidirectional():
    x = np.array([[-1.0, 2.0], [-3.0, -4.0]], np.float32)
    assert ref("PRelu", 16, x, np.array([0.5, 0.25], np.float32)).tolist() == [
        [-0.5, 2.0], [-1.5, -1.0]]
    with pytest.raises(KernelError, match="broadcast"):
        ref("PRelu", 16, x[0], np.ones((2, 2), np.float32))  # slope may not grow X
    assert ref("PRelu", 16, np.array([-4, 4], np.int32), np.array([2], np.int32)).tolist() == [
        -8, 4]


def test_shrink_integers_exact():
    x = np.array([-2**31, -3, 0, 3, 2**31 - 1], np.int32)
    assert ref("Shrink", 9, x, lambd=2.0, bias=1.0).tolist() == [-2**31 + 1, -2, 0, 2, 2**31 - 2]


def test_gelu_swish_swiglu():
    x = np.array([-1.0, 0.0, 1.0], np.float32)
    np.testing.assert_allclose(ref("Gelu", 20, x), [-0.15865526, 0.0, 0.84134474], rtol=1e-6)
    np.testing.assert_allclose(ref("Gelu", 20, x, approximate="tanh"),
                               [-0.15880801, 0.0, 0.841192], rtol=1e-5)
    np.testing.assert_allclose(ref("Swish", 24, x, alpha=2.0), x / (1 + np.exp(-2 * x)), rtol=1e-6)
    if REGISTRY.versions("SwiGLU"):
        np.testing.assert_allclose(ref("SwiGLU", 28, x, x + 1), x / (1 + np.exp(-x)) * (x + 1),
                                   rtol=1e-6)
        with pytest.raises(KernelError):
            ref("SwiGLU", 28, x, x[:2])


def test_sigmoid_softplus_extremes():
    x = np.array([-1000.0, 1000.0], np.float32)
    with np.errstate(all="raise"):
        assert ref("Sigmoid", 13, x).tolist() == [0.0, 1.0]
        assert ref("Softplus", 22, x).tolist() == [0.0, 1000.0]


BINARY = {
    "Add": 14, "Sub": 14, "Mul": 14, "Div": 14, "Pow": 15, "Mod": 13, "Equal": 19, "Greater": 13,
    "Less": 13, "GreaterOrEqual": 16, "LessOrEqual": 16, "BitwiseAnd": 18, "BitwiseOr": 18,
    "BitwiseXor": 18, "Max": 13, "Min": 13, "Sum": 13, "PRelu": 16,
}


@pytest.mark.parametrize("op_type", sorted(BINARY))
def test_binary_zero_d_gives_array(op_type):
    y = ref(op_type, BINARY[op_type], np.array(6, np.int32), np.array(4, np.int32))
    assert isinstance(y, np.ndarray) and y.shape == ()


@pytest.mark.parametrize(("op_type", "opset", "args", "attrs"), [
    ("BitShift", 11, (np.array(1, np.uint8), np.array(2, np.uint8)), {"direction": "LEFT"}),
    ("And", 7, (np.array(True), np.array(False)), {}),
    ("Where", 16, (np.array(True), np.array(1, np.int8), np.array(2, np.int8)), {}),
    ("Clip", 13, (np.array(1, np.int8), np.array(2, np.int8)), {}),
    ("BitCast", 26, (np.array(3, np.uint8),), {"to": TensorProto.BOOL}),
    ("BitCast", 26, (np.array(3, ml_dtypes.uint4),), {"to": TensorProto.INT4}),
])
def test_other_zero_d_gives_array(op_type, opset, args, attrs):
    y = ref(op_type, opset, *args, **attrs)
    assert isinstance(y, np.ndarray) and y.shape == ()
