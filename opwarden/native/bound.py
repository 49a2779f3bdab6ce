"""Compiled NHWC convolution calls with every argument but X fixed (for prepared steps, see
kernels.cpu.conv_prepared).

`grouped_nhwc_call` and `depthwise_nhwc_call` return f(x) -> bool: False (nothing done) for
an x that is not a C-contiguous float32 array, which the caller copies first. Otherwise the
first call goes through the checked wrapper (opwarden.native.grouped_nhwc / depthwise_nhwc),
which validates the fixed arguments together with x and raises as it would; later calls with
an x of the first call's shape pass the argument tuple it accepted straight to the extension
(another shape goes through the wrapper again). No residual here: the callers keep those
calls on the wrapper. The thread count is read on every call, as the wrappers read it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import opwarden.native as native
from opwarden.blas import blas_thread_count

_F32 = np.dtype(np.float32)
_EMPTY = np.empty(0, np.float32)  # (an absent bias or residual)


def _geometry(strides, dilations, pads_begin) -> tuple[int, ...]:
    return (int(strides[0]), int(strides[1]), int(dilations[0]), int(dilations[1]),
            int(pads_begin[0]), int(pads_begin[1]))


def _bound(checked: Callable[[np.ndarray], None], fixed: Callable[[np.ndarray], tuple],
           raw_name: str) -> Callable[[np.ndarray], bool]:
    """f(x): False for a strided or non-float32 x; checked(x) on the first call and for an x of
    another shape; else the extension's `raw_name` with (x, *fixed(x), threads)."""
    state: list = []

    def call(x: np.ndarray) -> bool:
        if x.dtype is not _F32 or not x.flags.c_contiguous:
            return False
        if state and x.shape == state[0]:
            state[2](x, *state[1], max(1, blas_thread_count()))
            return True
        checked(x)  # raises for anything the wrapper rejects
        if not state:
            state[:] = [x.shape, fixed(x), getattr(native._LIB, raw_name)]
        return True

    return call


def grouped_nhwc_call(wp: np.ndarray, bias: np.ndarray | None, y: np.ndarray, group: int,
                      kernel, strides, dilations, pads_begin, activation: str, params,
                      pair: bool) -> Callable[[np.ndarray], bool]:
    """f(x) = native.grouped_nhwc(x, wp, bias, None, y, group, kernel, strides, dilations,
    pads_begin, activation, params, pair=pair) on OpenBLAS's thread count."""
    kh, kw = (int(k) for k in kernel)

    def checked(x: np.ndarray) -> None:
        native.grouped_nhwc(x, wp, bias, None, y, group, (kh, kw), strides, dilations,
                            pads_begin, activation, params, None, None, pair)

    def fixed(x: np.ndarray) -> tuple:
        n, h, w, c = x.shape
        oh, ow, m = y.shape[1:]
        act = native.dw_act_code(activation, params)
        b = bias if bias is not None else _EMPTY
        return (wp, b, _EMPTY, y, bias is not None, False, bool(pair), n, h, w, c, oh, ow, m,
                group, c // group, m // group, kh, kw, *_geometry(strides, dilations, pads_begin),
                *act, 0, n * oh)

    return _bound(checked, fixed, "grouped_nhwc")


def depthwise_nhwc_call(taps: np.ndarray, bias: np.ndarray | None, y: np.ndarray, strides,
                        dilations, pads_begin, activation: str,
                        params) -> Callable[[np.ndarray], bool]:
    """f(x) = native.depthwise_nhwc(x, taps, bias, None, y, strides, dilations, pads_begin,
    activation, params) on OpenBLAS's thread count."""

    def checked(x: np.ndarray) -> None:
        native.depthwise_nhwc(x, taps, bias, None, y, strides, dilations, pads_begin,
                              activation, params, None)

    def fixed(x: np.ndarray) -> tuple:
        n, h, w, c = x.shape
        kh, kw = taps.shape[:2]
        oh, ow = y.shape[1:3]
        act = native.dw_act_code(activation, params)
        b = bias if bias is not None else _EMPTY
        return (taps, b, _EMPTY, y, bias is not None, False, n, h, w, c, oh, ow, kh, kw,
                *_geometry(strides, dilations, pads_begin), *act, 0, n * oh)

    return _bound(checked, fixed, "depthwise_nhwc")


def conv_epilogue_call(y: np.ndarray, bias: np.ndarray | None, activation: str,
                       params) -> Callable[..., None]:
    """f(z=None) = native.conv_epilogue(y, bias, z, activation, params) over the fixed y, on
    OpenBLAS's thread count; the first call of each kind (with z, without) through the checked
    wrapper. A z the caller passes is y's shape, C-contiguous float32 and apart from y's
    memory (it checks that once per residual view it sees)."""
    state: dict = {}

    def call(z: np.ndarray | None = None) -> None:
        threads = max(1, blas_thread_count())
        has_z = z is not None
        head = state.get(has_z)
        if head is not None:
            native._LIB.conv_epilogue(y, head[0], z if has_z else _EMPTY, *head[1:], threads)
            return
        native.conv_epilogue(y, bias, z, activation, params, threads)
        cols = y.shape[-1] if y.ndim else 1
        act = native.epilogue_act_code(activation, params)
        state[has_z] = (bias if bias is not None else _EMPTY, bias is not None, has_z,
                        y.size // cols if cols else 0, cols, *act)

    return call
