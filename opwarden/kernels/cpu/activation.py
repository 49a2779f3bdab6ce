"""Float32 activations (Elu, Selu, Celu, Softplus, Mish, Softsign, ThresholdedRelu, HardSigmoid,
HardSwish, Sigmoid, Swish; com.microsoft Gelu, BiasGelu, FastGelu, QuickGelu) as chunked passes
into the planned buffer.

The reference kernels compute on whole tensors with masked selects (np.where) and, for Softplus
and Mish, NumPy's scalar logaddexp loop: 3-18 ns an element on 128x3072 floats, 3-7x ONNX
Runtime. Here each activation is a few plain ufunc passes over chunks that stay in cache
(util.chunked), with selects replaced by max/min against zero (or, for ThresholdedRelu, a bit
mask), which give the same values:

- max(x, 0) + f(min(x, 0)) is x for x >= 0 and f(x) below whenever f(0) = 0 and f(x) is finite
  for x <= 0: Elu/Selu/Celu's alpha * expm1(.) (sums with 0 and products with 1 round nothing;
  NaN stays NaN through max and min).
- Softplus is max(x, 0) + log1p(e^-|x|), the form NumPy's logaddexp(0, x) takes; NumPy's float32
  log1p is a scalar libm loop (~5 ns an element), so log1p(u) is log(w) - ((w - 1) - u) / w with
  w = 1 + u rounded: the correction is exact to first order in w's rounding error (so tiny u,
  where w = 1, gives u), a few float32 ulp in all (tests/kernels/test_activation.py measures it
  against float64).

Attributes outside what these forms assume (a non-finite alpha or gamma) go to the reference.
"""

from __future__ import annotations

import math

import numpy as np

from opwarden import native
from opwarden.kernels.cpu.blas_split import share
from opwarden.kernels.cpu.elementwise import _chunk_workspace
from opwarden.kernels.cpu.elementwise import erf as elementwise_erf
from opwarden.kernels.cpu.elementwise import gelu as onnx_gelu
from opwarden.kernels.cpu.util import (
    _ONE,
    CHUNK_TEMPS,
    GELU_BLOCK,
    _hardswish_chunk,
    _sigmoid_chunk,
    chunked,
    chunked_into,
    chunked_workspace,
    gelu_chunk,
    gelu_native,
    native_pair,
    one_chunk,
    output,
    zero_chunk,
)
from opwarden.ops import activation as _reference
from opwarden.ops.base import REGISTRY


def _reference_into(fn, X, out, **attrs) -> np.ndarray:
    y = fn(np.asarray(X), **attrs)
    if out is None:
        return y
    np.copyto(out, y)
    return out


def _finite(*values: float) -> bool:
    return all(math.isfinite(float(v)) for v in values)


# -- Elu, Selu, Celu -------------------------------------------------------------------------


def _expm1_tail(scale: np.float32):
    """Chunk function: y = max(x, 0) + scale * expm1(min(x, 0))."""

    def run(x, y, t):
        np.minimum(x, zero_chunk(x), out=t)
        np.expm1(t, out=t)
        t *= scale
        np.maximum(x, zero_chunk(x), out=y)
        y += t

    return run


def elu(X, *, alpha=1.0, out=None):
    """X for X >= 0, alpha * expm1(X) below, chunked (see the module docstring)."""
    if not _finite(alpha):
        return _reference_into(_reference.Elu, X, out, alpha=alpha)
    return chunked_into(_expm1_tail(np.float32(alpha)), X, out, 1)


def selu(X, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875, out=None):
    """gamma * X for X > 0, gamma * alpha * expm1(X) otherwise, chunked."""
    if not _finite(alpha, gamma):
        return _reference_into(_reference.Selu, X, out, alpha=alpha, gamma=gamma)
    tail = _expm1_tail(np.float32(alpha))
    g = np.float32(gamma)

    def run(x, y, t):
        tail(x, y, t)
        y *= g

    return chunked_into(run, X, out, 1)


def celu(X, *, alpha=1.0, out=None):
    """max(0, X) + min(0, alpha * expm1(X / alpha)), chunked: the reference's own passes."""
    if alpha == 0 or not _finite(alpha):
        return _reference_into(_reference.Celu, X, out, alpha=alpha)  # (names alpha = 0)
    a = np.float32(alpha)

    def run(x, y, t):
        np.divide(x, a, out=t)
        np.expm1(t, out=t)
        t *= a
        np.minimum(t, zero_chunk(x), out=t)
        np.maximum(x, zero_chunk(x), out=y)
        y += t

    return chunked_into(run, X, out, 1)


# -- Softplus, Mish --------------------------------------------------------------------------


def _log1p_exp_neg_abs(x, w, u, d) -> None:
    """w = log1p(e^-|x|) (u, d scratch): w = 1 + u rounded, then log(w) less its rounding
    error's first-order effect ((w - 1) - u, exact) / w."""
    np.negative(x, out=u)
    np.minimum(x, u, out=u)  # -|x| (NaN stays NaN)
    np.exp(u, out=u)
    np.add(u, _ONE, out=w)
    np.subtract(w, _ONE, out=d)
    d -= u
    d /= w
    np.log(w, out=w)
    w -= d


def _softplus_chunk(x, y, w, u, d) -> None:
    """y = max(x, 0) + log1p(e^-|x|) (y may be x)."""
    _log1p_exp_neg_abs(x, w, u, d)
    np.maximum(x, zero_chunk(x), out=y)
    y += w


def _mish_chunk(x, y, w, u, d) -> None:
    """y = x tanh(softplus(x)) (y may be x)."""
    _log1p_exp_neg_abs(x, w, u, d)
    np.maximum(x, zero_chunk(x), out=u)
    u += w
    np.tanh(u, out=u)
    np.multiply(x, u, out=y)


def softplus(X, *, out=None):
    """ln(1 + e^X) as max(X, 0) + log1p(e^-|X|), chunked (see the module docstring)."""
    return chunked_into(_softplus_chunk, X, out, 3)


def mish(X, *, out=None):
    """X tanh(softplus(X)), chunked."""
    return chunked_into(_mish_chunk, X, out, 3)


# -- Softsign, ThresholdedRelu, HardSigmoid, HardSwish, Sigmoid -------------------------------


def _softsign_chunk(x, y, t) -> None:
    np.abs(x, out=t)
    t += _ONE
    np.divide(x, t, out=y)


def softsign(X, *, out=None):
    """X / (1 + |X|), chunked: the reference's own passes."""
    return chunked_into(_softsign_chunk, X, out, 1)


def thresholded_relu(X, *, alpha=1.0, out=None):
    """X where X > alpha, else +0 (NaN too), chunked: the comparison as an all-ones or zero
    bit mask ANDed into X's bits (exact; a masked select costs ~6 ns an element)."""
    a = np.float32(alpha)

    def run(x, y, t):
        m = t.view(np.int32)
        np.greater(x, a, out=m)
        np.negative(m, out=m)
        np.bitwise_and(x.view(np.int32), m, out=y.view(np.int32))

    return chunked_into(run, X, out, 1)


def hard_sigmoid(X, *, alpha=0.2, beta=0.5, out=None):
    """max(0, min(1, alpha X + beta)), chunked (NaN stays NaN, as np.clip keeps it)."""
    a, b = np.float32(alpha), np.float32(beta)

    def run(x, y):
        np.multiply(x, a, out=y)
        y += b
        np.minimum(y, one_chunk(y), out=y)
        np.maximum(y, zero_chunk(y), out=y)

    return chunked_into(run, X, out, 0)


def hard_swish(X, *, out=None):
    """X max(0, min(1, X/6 + 1/2)), chunked: the reference's own passes (util's chunk, the
    FusedConv epilogue's too)."""
    return chunked_into(_hardswish_chunk, X, out, 1)


def sigmoid(X, *, out=None):
    """1 / (1 + e^-X), chunked (the same passes whole-tensor took 3x ORT's time: each pass
    re-read the tensor from memory)."""
    return chunked_into(_sigmoid_chunk, X, out, 0)


_HALF = np.float32(0.5)
SWISH_TEMPS = 3


def _swish_chunk(alpha: np.float32):
    """Chunk function: y = x sigmoid(alpha x) (y may be x: x is read last). With t = alpha x
    and q = e^-|t| / (1 + e^-|t|), sigmoid(t) is q below 0 and 1 - q above, chosen by sign(t)
    as (1/2 + sign/2) - sign q: e^-|t| never overflows, so a large negative t keeps its tiny
    sigmoid (x sigmoid(x) near -88 is a normal float32 where 1/(1 + e^-t) flushes to 0)."""

    def run(x, y, t, u, d):
        np.multiply(x, alpha, out=t)
        np.abs(t, out=u)
        np.negative(u, out=u)
        np.exp(u, out=u)
        np.add(u, _ONE, out=d)
        np.divide(u, d, out=u)  # q
        np.sign(t, out=t)
        np.multiply(t, u, out=u)  # sign q
        t *= _HALF
        t += _HALF
        t -= u
        np.multiply(x, t, out=y)

    return run


def swish(X, *, alpha=1.0, out=None):
    """X sigmoid(alpha X) (Swish-24, SiLU for alpha 1), chunked (see _swish_chunk)."""
    return chunked_into(_swish_chunk(np.float32(alpha)), X, out, SWISH_TEMPS)


def quick_gelu(X, *, alpha=1.702, out=None):
    """X sigmoid(alpha X) (com.microsoft QuickGelu-1), Swish's passes."""
    return chunked_into(_swish_chunk(np.float32(alpha)), X, out, SWISH_TEMPS)


# -- com.microsoft Gelu, BiasGelu, FastGelu ----------------------------------------------------


def ms_gelu(X, *, out=None):
    """x/2 (1 + erf(x / sqrt 2)) in float32 (util's erf, within 8 ulp), chunked."""
    fn, ntemps = gelu_chunk(False)
    return chunked_into(fn, X, out, ntemps)


def _bias_gelu(X, bias, out, tanh: bool):
    """Gelu(X + bias) for a bias row over X's last axis: the sum written once into the
    output, then Gelu in place chunk by chunk; None where the bias is not such a row (the
    reference says why)."""
    x = np.asarray(X)
    b = np.asarray(bias)
    if b.ndim != 1 or x.ndim == 0 or b.shape[0] != x.shape[-1] or b.dtype != x.dtype:
        return None
    y = output(out, x.shape, x.dtype, strided_ok=True)
    fn, ntemps = gelu_chunk(tanh)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        np.add(x, b, out=y)
        return chunked(fn, y, y, ntemps)


def bias_gelu(A, B, *, out=None):
    """Gelu(A + B), B a bias over A's last axis (com.microsoft BiasGelu-1): see _bias_gelu."""
    y = _bias_gelu(A, B, out, False)
    return y if y is not None else _reference_into(_MS["BiasGelu"], A, out, B=B)


def fast_gelu(X, bias=None, *, out=None):
    """The tanh form of Gelu of X (+ bias) (com.microsoft FastGelu-1), chunked."""
    if bias is None:
        fn, ntemps = gelu_chunk(True)
        return chunked_into(fn, X, out, ntemps)
    y = _bias_gelu(X, bias, out, True)
    return y if y is not None else _reference_into(_MS["FastGelu"], X, out, bias=bias)


# -- Gelu on the compiled loop (util.gelu_native: native/gelu.c) ---------------------------------
# Named variants above the NumPy ones, for the ONNX Gelu and com.microsoft Gelu, BiasGelu,
# FastGelu; operands the compiled loop does not take (strided, another dtype, a bias that is
# not a row) run the NumPy kernel (whose chunk workspace they declare too).


def _native_when(x, *rest, **_attrs) -> bool:
    """Extension loaded, X float32 and each further input float32 or absent."""
    return (native.available() and x.dtype == "float32"
            and all(f is None or f.dtype in (None, "float32") for f in rest))


def _gelu_into(x: np.ndarray, bias, out, tanh: bool) -> np.ndarray | None:
    """Gelu(x + bias) on the compiled loop into the planned buffer (a new one where it does
    not fit); None: nothing written."""
    y = output(out, x.shape, x.dtype)
    return y if gelu_native(x, y, tanh, bias) else None


def native_onnx_gelu(X, *, approximate="none", out=None):
    """Gelu-20 (gelu.cpu.native); see _gelu_into, else gelu.cpu.out."""
    x = np.asarray(X)
    y = _gelu_into(x, None, out, approximate == "tanh") if approximate in ("none", "tanh") \
        else None
    return y if y is not None else onnx_gelu(X, approximate=approximate, out=out)


def native_ms_gelu(X, *, out=None):
    """com.microsoft Gelu-1 (gelu.ms.cpu.native); see _gelu_into, else ms_gelu."""
    y = _gelu_into(np.asarray(X), None, out, False)
    return y if y is not None else ms_gelu(X, out=out)


def native_bias_gelu(A, B, *, out=None):
    """com.microsoft BiasGelu-1 (biasgelu.ms.cpu.native): the bias row added in the same
    pass; see _gelu_into, else bias_gelu."""
    y = _gelu_into(np.asarray(A), np.asarray(B), out, False)
    return y if y is not None else bias_gelu(A, B, out=out)


def native_fast_gelu(X, bias=None, *, out=None):
    """com.microsoft FastGelu-1 (fastgelu.ms.cpu.native); see _gelu_into, else fast_gelu."""
    y = _gelu_into(np.asarray(X), None if bias is None else np.asarray(bias), out, True)
    return y if y is not None else fast_gelu(X, bias, out=out)


ERF_COST = 16  # multiply-adds an element (over_rows' unit): Gelu's polynomial, no division


def native_erf(X, *, out=None):
    """Erf (erf.cpu.native) on native.erf, the erf of the compiled Gelu (within 1e-6 relative,
    as the NumPy chunks' 8 ulp), for C-contiguous float32 X into a buffer apart from it (or X
    itself); else erf.cpu.out. Exported BERTs whose Gelu constants are not exactly sqrt 2
    (float16 models) keep their Erf node: it was ~1 ms of NumPy passes on 128x3072."""
    x = np.asarray(X)
    if native.available() and x.dtype == np.float32 and x.flags.c_contiguous:
        y = output(out, x.shape, x.dtype)
        if native_pair(x, y):
            n = x.size
            share(n, GELU_BLOCK, n * ERF_COST,
                  lambda span, threads: native.erf(x, y, span, n_threads=threads))
            return y
    return elementwise_erf(X, out=out)


_MS: dict = {}


def _chunked_rule(ntemps: int):
    """Workspace of a chunked kernel with `ntemps` float32 temporaries over X's elements."""

    def rule(x, *_, **__) -> int:
        if not all(isinstance(d, int) for d in x):
            return 0
        return chunked_workspace(ntemps, int(np.prod(x, dtype=np.int64)))

    return rule


# -- registration ----------------------------------------------------------------------------

# op type -> (kernel, float32 temporaries of one chunk each)
KERNELS = {
    "Elu": (elu, 1), "Selu": (selu, 1), "Celu": (celu, 1), "Softplus": (softplus, 3),
    "Mish": (mish, 3), "Softsign": (softsign, 1), "ThresholdedRelu": (thresholded_relu, 1),
    "HardSigmoid": (hard_sigmoid, 0), "HardSwish": (hard_swish, CHUNK_TEMPS["HardSwish"]),
    "Sigmoid": (sigmoid, CHUNK_TEMPS["Sigmoid"]), "Swish": (swish, SWISH_TEMPS),
}
MS = "com.microsoft"
# com.microsoft op type -> (kernel, float32 temporaries of one chunk each)
MS_KERNELS = {
    "Gelu": (ms_gelu, gelu_chunk(False)[1]), "BiasGelu": (bias_gelu, gelu_chunk(False)[1]),
    "FastGelu": (fast_gelu, gelu_chunk(True)[1]), "QuickGelu": (quick_gelu, SWISH_TEMPS),
}


def register() -> None:
    """Register the variants on every version of each operator (float32, cpu, into `out`;
    a strided out, a slice of a Concat's output, is fine: chunked walks its rows)."""
    kw = {"device": "cpu", "dtypes": ["float32"], "priority": 10, "accepts_out": True,
          "strided_out": True}
    for op_type, (fn, ntemps) in KERNELS.items():
        for opdef in REGISTRY.versions(op_type):
            opdef.kernel(name=f"{op_type.lower()}.cpu.out",
                         workspace_bytes=_chunk_workspace(ntemps), **kw)(fn)
    for op_type, (fn, ntemps) in MS_KERNELS.items():
        for opdef in REGISTRY.versions(op_type, MS):
            _MS[op_type] = opdef.reference
            opdef.kernel(name=f"{op_type.lower()}.ms.cpu.out",
                         workspace_bytes=_chunked_rule(ntemps), **kw)(fn)
    # The compiled Gelu variants (taken where the extension loaded: `when`), contiguous out.
    nkw = {"device": "cpu", "dtypes": ["float32"], "priority": 11, "accepts_out": True,
           "when": _native_when}
    for opdef in REGISTRY.versions("Gelu"):
        opdef.kernel(name="gelu.cpu.native", workspace_bytes=_chunk_workspace(
            CHUNK_TEMPS["Gelu"]), **nkw)(native_onnx_gelu)
    for opdef in REGISTRY.versions("Erf"):
        opdef.kernel(name="erf.cpu.native", workspace_bytes=_chunk_workspace(
            CHUNK_TEMPS["Erf"]), **nkw)(native_erf)
    for op_type, fn in (("Gelu", native_ms_gelu), ("BiasGelu", native_bias_gelu),
                        ("FastGelu", native_fast_gelu)):
        for opdef in REGISTRY.versions(op_type, MS):
            opdef.kernel(name=f"{op_type.lower()}.ms.cpu.native",
                         workspace_bytes=_chunked_rule(MS_KERNELS[op_type][1]), **nkw)(fn)
