"""SiLU on the compiled kernel (opwarden.native.swish): fusedelementwise.cpu.native_silu and
swish.cpu.native.

Exporters write SiLU as Sigmoid then Mul (timm's EfficientNet, RegNet, YOLO), which
elementwise_fusion turns into a FusedElementwise running the program
``t0=sigmoid(x0);t1=mul(x0,t0)``; Swish-24 is the same with an alpha. The NumPy kernels make
four or five passes per chunk (negate, exp, add, reciprocal, multiply); the C loop makes one,
with a vectorized polynomial e^x (native/silu.c, relative error below 2e-7), and blocks of
the tensor are shared out over the session's threads (blas_split.over_rows where it splits,
else OpenMP threads in the C loop, as the depthwise kernel). y is written
directly (over x where the plan puts it there); strided operands run the NumPy kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden import native
from opwarden.kernels.cpu.activation import SWISH_TEMPS
from opwarden.kernels.cpu.activation import swish as numpy_swish
from opwarden.kernels.cpu.blas_split import share
from opwarden.kernels.cpu.elementwise import _chunk_workspace
from opwarden.ops.fused_elementwise import fused_elementwise_inplace

# FusedElementwise programs that are x * sigmoid(x) (either operand order of the Mul).
SILU_PROGRAMS = frozenset({"t0=sigmoid(x0);t1=mul(x0,t0)", "t0=sigmoid(x0);t1=mul(t0,x0)"})
# Elements per block shared out; the cost weight per element (in the multiply-adds
# blas_split.over_rows thresholds on: ~16 flops of polynomial and division each).
BLOCK = 1 << 14
COST = 16


def _program(attrs: dict[str, Any]) -> str:
    p = attrs.get("program", "")
    return (p.decode() if isinstance(p, bytes) else str(p)).replace(" ", "")


def _f32(*facts) -> bool:
    return all(f is not None and f.dtype == "float32" for f in facts)


def silu_fe_when(*inputs, **attrs: Any) -> bool:
    """A FusedElementwise whose program is SiLU over one float32 input, extension built."""
    return (native.available() and len(inputs) == 1 and _f32(*inputs)
            and _program(attrs) in SILU_PROGRAMS)


def swish_when(x, **attrs: Any) -> bool:
    """Swish over float32, extension built."""
    return native.available() and _f32(x)


def _output(x: np.ndarray, out) -> np.ndarray:
    if out is not None and out.shape == x.shape and out.dtype == np.float32 \
            and out.flags.c_contiguous:
        return out
    return np.empty(x.shape, np.float32)


def _swish_into(x: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    n = x.size
    share(n, BLOCK, n * COST,
          lambda span, threads: native.swish(x, y, alpha, span, n_threads=threads))
    return y


def native_silu(*inputs, program="", out=None):
    """FusedElementwise SiLU (x * sigmoid(x)) on the compiled loop; other programs or
    operands run the NumPy in-place kernel."""
    x = inputs[0] if len(inputs) == 1 else None
    if (x is None or not isinstance(x, np.ndarray) or x.dtype != np.float32
            or not x.flags.c_contiguous or _program({"program": program}) not in SILU_PROGRAMS
            or not native.available()):
        return fused_elementwise_inplace(*inputs, program=program, out=out)
    return _swish_into(x, _output(x, out), 1.0)


def native_swish(X, *, alpha=1.0, out=None):
    """Swish-24: X * sigmoid(alpha X) on the compiled loop; a strided X runs the NumPy
    kernel (swish.cpu.out, whose chunk workspace is declared here too)."""
    x = np.asarray(X)
    if x.dtype != np.float32 or not x.flags.c_contiguous or not native.available():
        return numpy_swish(X, alpha=alpha, out=out)
    return _swish_into(x, _output(x, out), float(alpha))


def register() -> None:
    """The two variants at priority 11 (above the NumPy ones at 10)."""
    from opwarden.ops.base import REGISTRY

    kw = {"device": "cpu", "dtypes": ["float32"], "accepts_out": True, "priority": 11}
    for opdef in REGISTRY.versions("FusedElementwise", "opwarden"):
        opdef.kernel(name="fusedelementwise.cpu.native_silu", when=silu_fe_when,
                     **kw)(native_silu)
    for opdef in REGISTRY.versions("Swish"):
        opdef.kernel(name="swish.cpu.native", when=swish_when,
                     workspace_bytes=_chunk_workspace(SWISH_TEMPS), **kw)(native_swish)
