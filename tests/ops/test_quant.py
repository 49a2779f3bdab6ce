"""Quantization operators: edge cases the ONNX node tests do not cover."""

import itertools

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


def test_quantize_rounds_half_to_even_and_saturates():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 1000.0, -1000.0], np.float32)
    y = ref("QuantizeLinear", 10, x, np.float32(1.0), np.int8(0))
    assert y.dtype == np.int8
    assert y.tolist() == [0, 2, 2, 0, -2, 127, -128]
    assert ref("QuantizeLinear", 13, x, np.float32(1.0)).dtype == np.uint8


def test_quantize_float16_scale_and_output_dtype():
    x = np.array([1.0, 2.0, 3.0], np.float16)
    y = ref("QuantizeLinear", 21, x, np.float16(0.5), output_dtype=T.INT16)
    assert y.dtype == np.int16 and y.tolist() == [2, 4, 6]
    with pytest.raises(KernelError):
        ref("QuantizeLinear", 21, x, np.float16(0.5), np.uint8(0), output_dtype=T.INT16)


def test_blocked_round_trip_ragged_block():
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    scale = np.array([[1.0, 2.0, 4.0], [0.5, 1.0, 2.0]], np.float32)  # ceil(5/2) blocks
    q = ref("QuantizeLinear", 21, x, scale, np.zeros((2, 3), np.int8), axis=1, block_size=2)
    expect = np.rint(x / np.repeat(scale, 2, axis=1)[:, :5])
    np.testing.assert_array_equal(q, expect.astype(np.int8))
    d = ref("DequantizeLinear", 21, q, scale, np.zeros((2, 3), np.int8), axis=1, block_size=2)
    np.testing.assert_array_equal(d, expect * np.repeat(scale, 2, axis=1)[:, :5])
    with pytest.raises(KernelError):
        ref("QuantizeLinear", 21, x, scale[:, :2], axis=1, block_size=2)


def test_dequantize_int32_and_output_dtype():
    x = np.array([-5, 0, 7], np.int32)
    y = ref("DequantizeLinear", 10, x, np.float32(0.5))
    assert y.dtype == np.float32 and y.tolist() == [-2.5, 0.0, 3.5]
    z = ref("DequantizeLinear", 23, x, np.float32(0.5), output_dtype=T.FLOAT16)
    assert z.dtype == np.float16


def test_quantize_float8_saturate_flag():
    x = np.array([1e6, -1e6, np.inf], np.float32)
    zp = np.zeros((), ml_dtypes.float8_e4m3fn)
    sat = ref("QuantizeLinear", 19, x, np.float32(1.0), zp)
    assert sat.astype(np.float32).tolist() == [448.0, -448.0, 448.0]
    nosat = ref("QuantizeLinear", 19, x, np.float32(1.0), zp, saturate=0)
    assert np.isnan(nosat.astype(np.float32)).all()


def test_dynamic_quantize_all_zero():
    y, s, z = ref("DynamicQuantizeLinear", 11, np.zeros((2, 2), np.float32))
    assert y.dtype == np.uint8 and s.dtype == np.float32 and z.dtype == np.uint8
    assert y.tolist() == [[0, 0], [0, 0]] and s.shape == () and z.shape == ()


def test_matmulinteger_per_row_and_column_zero_points():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (3, 4)).astype(np.uint8)
    b = rng.integers(-128, 128, (4, 2)).astype(np.int8)
    az = np.array([1, 2, 3], np.uint8)
    bz = np.array([-1, 5], np.int8)
    y = ref("MatMulInteger", 10, a, b, az, bz)
    expect = (a.astype(np.int64) - az[:, None]) @ (b.astype(np.int64) - bz)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, expect)


def brute_conv(x, w, group, strides, dilations, pads):
    """Direct loop convolution of int64 arrays (reference for the tests)."""
    nd = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)])
    m, cg = w.shape[:2]
    k = w.shape[2:]
    out_sz = [
        (xp.shape[2 + i] - (dilations[i] * (k[i] - 1) + 1)) // strides[i] + 1 for i in range(nd)
    ]
    y = np.zeros((x.shape[0], m, *out_sz), np.int64)
    mg = m // group
    for n, oc in itertools.product(range(x.shape[0]), range(m)):
        g = oc // mg
        for pos in itertools.product(*[range(o) for o in out_sz]):
            acc = 0
            for ic in range(cg):
                for kp in itertools.product(*[range(kk) for kk in k]):
                    idx = tuple(pos[i] * strides[i] + kp[i] * dilations[i] for i in range(nd))
                    acc += xp[(n, g * cg + ic) + idx] * w[(oc, ic) + kp]
            y[(n, oc) + pos] = acc
    return y


@pytest.mark.parametrize("nd,group", [(1, 1), (1, 2), (2, 1), (2, 3), (3, 1)])
def test_convinteger_matches_direct_loops(nd, group):
    rng = np.random.default_rng(nd * 10 + group)
    c, m = 2 * group, group
    x = rng.integers(0, 256, (1, c) + (5,) * nd).astype(np.uint8)
    w = rng.integers(0, 256, (m, c // group) + (2,) * nd).astype(np.uint8)
    strides = [1 + i % 2 for i in range(nd)]
    dilations = [2 - i % 2 for i in range(nd)]
    pads = [1] * nd + [0] * nd
    xz, wz = np.uint8(7), np.uint8(100)
    y = ref("ConvInteger", 10, x, w, np.array(xz), np.array(wz), group=group, strides=strides,
            dilations=dilations, pads=pads)
    expect = brute_conv(x.astype(np.int64) - 7, w.astype(np.int64) - 100, group, strides,
                        dilations, pads)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, expect)


def test_qlinearconv_bias_and_per_channel():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (1, 2, 4, 4)).astype(np.uint8)
    w = rng.integers(-128, 128, (3, 2, 3, 3)).astype(np.int8)
    ws = np.array([0.01, 0.02, 0.03], np.float32)
    wz = np.zeros(3, np.int8)
    bias = np.array([100, -200, 0], np.int32)
    y = ref("QLinearConv", 10, x, np.float32(0.05), np.uint8(128), w, ws, wz, np.float32(0.5),
            np.uint8(10), bias, auto_pad="SAME_UPPER")
    acc = brute_conv(x.astype(np.int64) - 128, w.astype(np.int64), 1, [1, 1], [1, 1],
                     [1, 1, 1, 1]) + bias[:, None, None]
    expect = np.clip(np.rint(acc * (np.float32(0.05) * ws[:, None, None]) / np.float32(0.5))
                     + 10, 0, 255)
    assert y.dtype == np.uint8 and y.shape == (1, 3, 4, 4)
    np.testing.assert_array_equal(y, expect.astype(np.uint8))


@pytest.mark.parametrize("zp", [np.int8(0), np.uint8(128), np.int16(5)])
def test_quantize_nan_goes_to_type_minimum_like_onnxruntime(zp):
    # ORT's static quantizer gives an attention mask's -inf an inf scale; -inf / inf is NaN,
    # which onnxruntime quantizes to the type's minimum.
    ort = pytest.importorskip("onnxruntime")
    from onnx import helper, numpy_helper
    from onnx.helper import np_dtype_to_tensor_dtype

    import opwarden

    x = np.array([-np.inf, np.inf, np.nan, -1e30, 1e30, 3.0], np.float32)
    for scale in (np.float32(np.inf), np.float32(0.05)):
        node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])
        graph = helper.make_graph(
            [node], "g", [helper.make_tensor_value_info("x", 1, None)],
            [helper.make_tensor_value_info("y", np_dtype_to_tensor_dtype(zp.dtype), None)],
            [numpy_helper.from_array(np.array(scale), "s"),
             numpy_helper.from_array(np.array(zp), "z")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        model = model.SerializeToString()
        want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
        got = opwarden.InferenceSession(model).run(None, {"x": x})
        np.testing.assert_array_equal(got[0], want[0])
