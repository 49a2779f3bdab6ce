"""The compiled one-pass requantization (native/quantize.c: requantize_8bit) against the NumPy
path of `quant_linear.requantize_into` bit for bit: float32 and float64 accumulators near
their exact bounds, int32 biases at their extremes, per-tensor, per-channel (a convolution's
NCHW axis, a matmul's rows and columns) and non-finite multipliers, both 8-bit types."""

from __future__ import annotations

import numpy as np
import pytest

from opwarden import native
from opwarden.errors import KernelError, OpwardenError
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
