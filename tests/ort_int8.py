"""Where onnxruntime's uint8 x int8 integer products are exact on this machine.

opwarden computes the exact int32 accumulation the ONNX spec asks for (onnx.reference's).
onnxruntime does too where MLAS has a VNNI (or ARM dot-product) kernel, but its AVX2 u8 x s8
kernel adds each pair of adjacent products with the saturating int16 `vpmaddubsw`: where
|a0*b0 + a1*b1| exceeds 32767 (uint8 activations near 255 with int8 weights outside
[-64, 64]) ORT's sum is clipped. ORT's own answer is reduce_range=True in its quantizer
(7-bit weights); for int8 x int8 it shifts one operand by 128 into uint8, so the same bound
holds for the other one.

The tests that assert bit-exactness with ORT feed it operands it computes exactly here: this
module probes ORT itself (not CPU flags, which say nothing of which MLAS kernel runs) and
gives the int8 weight range and the quantizer's reduce_range to use.
"""

from __future__ import annotations

import functools

import numpy as np
from onnx import TensorProto, helper, numpy_helper

S8_FULL = (-128, 127)
# |b| <= 64 keeps 255 * (b0 + b1) within int16; [-64, 63] is what halving an int8 gives.
S8_NO_OVERFLOW = (-64, 63)


def matmul_integer_model(a: np.ndarray, b: np.ndarray, b_constant: bool = True) -> bytes:
    """A one-node MatMulInteger model of a uint8 `a` and int8 `b`, B an initializer or an input."""
    inputs = [helper.make_tensor_value_info("a", TensorProto.UINT8, list(a.shape))]
    if not b_constant:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.INT8, list(b.shape)))
    g = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "probe",
                          inputs, [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
                          [numpy_helper.from_array(b, "b")] if b_constant else [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def ort_matmul_integer(a: np.ndarray, b: np.ndarray, b_constant: bool = True) -> np.ndarray:
    """onnxruntime's MatMulInteger(a, b) of a uint8 `a` and int8 `b` (no zero points): B an
    initializer (ORT prepacks it) or a graph input."""
    import onnxruntime as ort

    sess = ort.InferenceSession(matmul_integer_model(a, b, b_constant),
                                providers=["CPUExecutionProvider"])
    feeds = {"a": a} if b_constant else {"a": a, "b": b}
    return sess.run(None, feeds)[0]


@functools.cache
def ort_int8_exact() -> bool:
    """Whether onnxruntime's uint8 x int8 MatMulInteger is exact where adjacent products' sums
    overflow int16 (255 * -128 * 2 = -65280), with B prepacked and B fed. True without
    onnxruntime (the tests that compare with it skip)."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return True
    a = np.full((2, 64), 255, np.uint8)
    b = np.full((64, 4), -128, np.int8)
    want = a.astype(np.int64) @ b.astype(np.int64)  # -2088960 everywhere
    return all(np.array_equal(ort_matmul_integer(a, b, const).astype(np.int64), want)
               for const in (True, False))


def s8_range() -> tuple[int, int]:
    """The int8 weight values (inclusive) whose products with any uint8 ORT sums exactly here."""
    return S8_FULL if ort_int8_exact() else S8_NO_OVERFLOW


def s8_weights(rng: np.random.Generator, shape) -> np.ndarray:
    """Random int8 weights from s8_range() (the full range, as before, where ORT is exact)."""
    lo, hi = s8_range()
    return rng.integers(lo, hi + 1, size=shape).astype(np.int8)


def fit_s8(x):
    """An int8 operand as ORT computes it exactly here: unchanged where it is exact, else
    halved (arithmetic shift, [-128, 127] -> [-64, 63]). Anything else passes through."""
    if ort_int8_exact() or not isinstance(x, np.ndarray) or x.dtype != np.int8:
        return x
    return (x >> 1).astype(np.int8)


def reduce_range() -> bool:
    """onnxruntime.quantization's reduce_range (7-bit weights) for models compared bit for bit
    with ORT: needed only where its int8 products saturate."""
    return not ort_int8_exact()
