"""The compiled pieces of the float-BLAS quantized kernels (native/quantize.c) against their
NumPy paths bit for bit:
- the one-pass requantization (`quant_linear.requantize_into`): float32 and float64
  accumulators near their exact bounds, int32 biases at their extremes, per-tensor and
  per-channel (a convolution's NCHW axis, a matmul's rows and columns) and non-finite
  multipliers, both 8-bit types;
- QLinearConv's centered, padded im2col columns, over random geometries (strides, dilations,
  asymmetric pads, groups, both 8-bit types, zero points inside their ranges)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opwarden import native
from opwarden.errors import KernelError, OpwardenError
from opwarden.kernels.cpu import quant
from opwarden.kernels.cpu import quant_linear as ql

pytestmark = pytest.mark.skipif(not native.available(), reason="compiled kernels not built")

F32 = np.float32


def numpy_path(monkeypatch, *args):
    with monkeypatch.context() as m:
        m.setattr(native, "_LIB", None)
        return ql.requantize_into(*args)


def case(rng, shape, axis, f64, per_channel, bias, special):
    acc = rng.integers(-(2**40 if f64 else 2**24), 2**40 if f64 else 2**24, shape)
    acc = acc.astype(np.float64 if f64 else F32)
    mshape = [1] * len(shape)
    if per_channel:
        mshape[axis] = shape[axis]
    mult = (rng.random(mshape) * 10.0 ** rng.integers(-9, 1)).astype(F32)
    if special is not None:
        mult.reshape(-1)[0] = special
    b = None
    if bias:
        bshape = [1] * len(shape)
        bshape[axis] = shape[axis]
        b = rng.integers(-2**31, 2**31, bshape).astype(np.int32)
    return acc, mult, b


def _counting(fn, calls):
    def wrapped(*a, **k):
        calls.append(1)
        return fn(*a, **k)
    return wrapped


@pytest.mark.parametrize("f64", [False, True])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("shape,axis", [((2, 5, 3, 7), 1), ((9, 33), 1), ((9, 33), 0),
                                        ((4, 1, 1), 0), ((3, 70000 // 3), 1)])
def test_compiled_requantize_matches_numpy_path(monkeypatch, f64, per_channel, bias, dtype,
                                                shape, axis):
    rng = np.random.default_rng(hash((f64, per_channel, bias, shape, axis)) % 2**32)
    for special in (None, np.nan, np.inf, -np.inf, 0.0):
        acc, mult, b = case(rng, shape, axis, f64, per_channel, bias, special)
        zy = dtype(rng.integers(0, 128))
        want = numpy_path(monkeypatch, acc.copy(), mult, zy, None, b)
        calls: list[int] = []
        with monkeypatch.context() as m:
            m.setattr(native, "requantize", _counting(native.requantize, calls))
            got = ql.requantize_into(acc.copy(), mult, zy, None, b)
        assert calls, "the compiled path was not taken"
        assert got.dtype == want.dtype and np.array_equal(got, want), special


def test_two_varying_axes_take_the_numpy_path(monkeypatch):
    acc = np.arange(12, dtype=F32).reshape(3, 4)
    mult = (np.arange(1, 4, dtype=F32).reshape(3, 1) * np.arange(1, 5, dtype=F32)) / 7
    monkeypatch.setattr(native, "requantize", lambda *a, **k: pytest.fail("not compiled"))
    got = ql.requantize_into(acc.copy(), mult, np.uint8(2))
    want = np.clip(np.rint(acc * mult) + 2, 0, 255).astype(np.uint8)
    assert np.array_equal(got, want)


def test_into_a_given_output():
    acc = np.full((2, 3, 4), 100.0, F32)
    out = np.zeros((2, 3, 4), np.int8)
    got = ql.requantize_into(acc, np.full((3, 1), 0.5, F32), np.int8(-3), out)
    assert got is out and (out == 47).all()


@pytest.mark.parametrize("bad", ["out_shape", "out_dtype", "mult_size", "bias_size", "axis"])
def test_bad_arguments_raise_kernel_errors(bad):
    acc = np.zeros((2, 3), F32)
    out = np.zeros((2, 3), np.uint8)
    mult, bias, axis = np.ones(3, F32), None, 1
    if bad == "out_shape":
        out = np.zeros((3, 2), np.uint8)
    elif bad == "out_dtype":
        out = np.zeros((2, 3), np.int32)
    elif bad == "mult_size":
        mult = np.ones(2, F32)
    elif bad == "bias_size":
        bias = np.ones(2, np.int32)
    else:
        axis = 5
    with pytest.raises(KernelError) as e:
        native.requantize(acc, mult, bias, 0, out, axis)
    assert isinstance(e.value, OpwardenError) and "requantize" in str(e.value)


@st.composite
def conv_cases(draw):
    group = draw(st.sampled_from([1, 1, 2, 3]))
    cg, mg = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    kh, kw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    s = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    d = [draw(st.integers(1, 3)), draw(st.integers(1, 2))]
    pads = [draw(st.integers(0, 3)) for _ in range(4)]
    h = draw(st.integers(max(1, d[0] * (kh - 1) + 1 - pads[0] - pads[2]), 20))
    w = draw(st.integers(max(1, d[1] * (kw - 1) + 1 - pads[1] - pads[3]), 20))
    n = draw(st.integers(1, 2))
    xt = draw(st.sampled_from([np.uint8, np.int8]))
    info = np.iinfo(xt)
    xz = draw(st.integers(int(info.min), int(info.max)))
    seed = draw(st.integers(0, 2**16))
    return (n, group * cg, h, w), (group * mg, cg, kh, kw), \
        {"group": group, "strides": s, "dilations": d, "pads": pads}, xt, xz, seed


@settings(max_examples=150, deadline=None)
@given(conv_cases())
def test_compiled_im2col_conv_matches_numpy_path(case):
    xs, ws, attrs, xt, xz, seed = case
    rng = np.random.default_rng(seed)
    x = rng.integers(np.iinfo(xt).min, int(np.iinfo(xt).max) + 1, xs).astype(xt)
    w = rng.integers(-128, 128, ws).astype(np.int8)
    m = ws[0]
    args = [x, np.asarray(0.03, F32), np.asarray(xz, xt), w,
            rng.uniform(0.001, 0.01, m).astype(F32), np.asarray(0, np.int8),
            np.asarray(0.1, F32), np.asarray(3, xt), rng.integers(-900, 900, m).astype(np.int32)]
    got = quant.qlinear_conv_im2col(*args, **attrs)
    lib = native._LIB
    try:
        native._LIB = None
        want = quant.qlinear_conv_im2col(*args, **attrs)
    finally:
        native._LIB = lib
    assert np.array_equal(got, want)


def test_compiled_im2col_rejects_bad_arguments():
    x = np.zeros((1, 2, 4, 4), np.uint8)
    cols = np.empty((2 * 9, 16), F32)
    with pytest.raises(KernelError, match="channels"):
        native.qconv_im2col(x, 0, 0, 3, (3, 3), (1, 1), (1, 1), (1, 1), (4, 4), 0, cols)
    with pytest.raises(KernelError, match="cols"):
        native.qconv_im2col(x, 0, 0, 2, (3, 3), (1, 1), (1, 1), (1, 1), (4, 5), 0, cols)
    with pytest.raises(KernelError, match="8-bit"):
        native.qconv_im2col(x.astype(np.int32), 0, 0, 2, (3, 3), (1, 1), (1, 1), (1, 1),
                            (4, 4), 0, cols)
