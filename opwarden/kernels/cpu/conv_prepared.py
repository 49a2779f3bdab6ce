"""Prepared NHWC convolution steps: what a convolution call checks and derives from its
constant weights, attributes and planned output, done once per step of the lean loop.

The lean loop (execute.codegen) asks a variant's `prepare(kw, consts)` once when it compiles a
step, with the step's keyword arguments (attributes and the planned buffer `out`) and, per
input, its constant value (`...` for a computed one, None for an absent one). A convolution
step of a planned signature sees the same weights, bias, attributes and output buffer on every
run; only X (and the residual Z) change, and not in shape. Yet each call of the generic kernel
went through two wrappers, conv_nhwc's prologue (the geometry cache, output and bias checks)
and the route lookup: a sizable part of a small convolution's time in Python.

The prepared call checks that X is a float32 array of the shape seen on its first call, that
W, B and the output are the very objects prepared for, and Z (if any) a C-contiguous float32
array of the output's shape; anything else goes to the generic kernel, so results never
depend on which path ran. The route's algorithm then runs as conv_nhwc would run it, or
(`bind`, the compiled loops) as one native call with every argument but X, Z and Y fixed:
the same function with the same arguments, the same bits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from opwarden.kernels.cpu.conv_common import _prologue
from opwarden.kernels.cpu.util import F32
from opwarden.memory.constants import is_constant

_ND = np.ndarray


def _preparable(kw: dict, consts: tuple, shuffles: bool) -> tuple | None:
    """(W, B, out, attributes) when a step can be prepared: a planned C-contiguous float32
    NHWC output, constant float32 4-D weights, a constant bias or none, no branches and no
    input shuffle unless the algorithm takes it (`shuffles`; else those paths stay generic)."""
    out = kw.get("out")
    if type(out) is not _ND or out.dtype != F32 or out.ndim != 4 or not out.flags.c_contiguous \
            or not out.flags.writeable or out.size == 0 or len(consts) < 2:
        return None
    w = consts[1]
    b = consts[2] if len(consts) > 2 else None
    if type(w) is not _ND or w.dtype != F32 or w.ndim != 4 or not is_constant(w):
        return None
    if b is not None and (type(b) is not _ND or not is_constant(b)):
        return None  # (also a computed bias: `...` in consts)
    attrs = {k: v for k, v in kw.items() if k != "out"}
    if (int(attrs.get("input_shuffle", 0) or 0) > 1 and not shuffles) or attrs.get("branches"):
        return None
    return w, b, out, attrs


def prepare_nhwc(run: Callable, general: Callable, bind: Callable | None = None,
                 accepts: Callable | None = None, shuffles: bool = False):
    """The `prepare(kw, consts)` of an NHWC convolution variant whose algorithm is `run` (one
    of kernels.cpu.conv's _RUN, or of that signature) and whose kernel is `general` (called as
    general(X, W, B, Z, out=..., **attrs) for anything the prepared call does not take).
    `bind(x, W, B, s, d, begin, end, y, bias, activation, params)` (optional) returns a
    callable f(x, z) running the whole algorithm for inputs like x, or None to run `run`
    instead; `accepts(attrs, W)` (optional) says whether `run` takes the step at all (what
    the kernel checks before its algorithm); `shuffles`: `run` takes the input shuffle
    (FusedConv's input_shuffle) itself, as the depthwise loop does in its copy of X."""

    def prepare(kw: dict, consts: tuple) -> Callable | None:
        got = _preparable(kw, consts, shuffles)
        if got is None:
            return None
        w0, b0, y0, attrs = got
        if accepts is not None and not accepts(attrs, w0):
            return None
        group = int(attrs.get("group", 1) or 1)
        # as conv_nhwc hands them to the algorithm
        act = attrs.get("activation", "")
        params = attrs.get("activation_params") or ()
        shuffle = int(attrs.get("input_shuffle", 0) or 0)
        state: list = []  # [x shape, the call for it] once the first call has run
        lock = threading.Lock()

        def slow(X, W, B, Z, out):
            if Z is None:  # (Conv's kernel has no Z)
                return general(X, W, B, out=out, **attrs)
            return general(X, W, B, Z, out=out, **attrs)

        def setup(x: np.ndarray) -> Callable | None:
            s, d, begin, end, y, _z, bias = _prologue(
                x, w0, b0, None, group, attrs.get("kernel_shape"), attrs.get("strides"),
                attrs.get("dilations"), attrs.get("pads"), attrs.get("auto_pad", "NOTSET"),
                y0, nhwc=True)
            if y is not y0:
                return None
            fast = (bind(x, w0, b0, s, d, begin, end, y0, bias, act, params)
                    if bind and shuffle <= 1 else None)
            if fast is not None:
                return fast

            def call(x, z):
                run(x, w0, b0, s, d, begin, end, y0, bias, z, act, params, shuffle, None)
            return call

        def prepared(X, W, B=None, Z=None, *, out=None):
            if (type(X) is not _ND or X.dtype is not F32 or W is not w0 or B is not b0
                    or out is not y0):
                return slow(X, W, B, Z, out)
            if Z is not None and (type(Z) is not _ND or Z.dtype is not F32
                                  or Z.shape != y0.shape or not Z.flags.c_contiguous):
                return slow(X, W, B, Z, out)
            if not state:
                with lock:
                    if not state:
                        state[:] = [X.shape, setup(X) if X.ndim == 4 else None]
            shape, call = state
            if call is None or X.shape != shape:
                return slow(X, W, B, Z, out)
            call(X, Z)
            return y0

        prepared.__name__ = prepared.__qualname__ = f"prepared_{general.__name__}"
        return prepared

    return prepare
