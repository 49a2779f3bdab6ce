"""Fast 2-D float32 convolution for the CPU: NHWC and NCHW, GEMM-based, into planned buffers.

NHWC: each algorithm is its own variant of Conv (and of FusedConv, kernels.cpu.fused), named
after it and chosen at placement from the node's static shapes and attributes by the same rule
the run-time dispatcher follows (_routes_nhwc), so `explain`, the trace and `opwarden check`
name and validate the algorithm that runs:

    conv.cpu.depthwise    one einsum over a strided window view (conv_depthwise)
    conv.cpu.pointwise    1x1, stride 1: one GEMM per group (conv_gemm)
    conv.cpu.winograd     F(4x4, 3x3) for large 3x3 stride-1 layers (conv_winograd)
    conv.cpu.shifted_gemm one accumulating GEMM per tap over phase planes (conv_gemm)
    conv.cpu.grouped      few channels per group, compiled direct loop (conv_grouped)
    conv.cpu.rowtap       one GEMM per kernel row over row copies (conv_rowtap)
    conv.cpu.direct       few input channels (the RGB stem), the compiled loop (conv_grouped)
    conv.cpu.stem         the same without it: transposed patch matrix (conv_stem)
    conv.cpu.fewpixel     few output pixels, large weights: transposed product (conv_gemm)
    conv.cpu.im2col       banded patch matrix, whatever else (conv_gemm)

conv.cpu.nhwc (lower priority) is the dispatcher: conv_nhwc picks the route per call, for
shapes not known at placement (dynamic dims), and it is what an algorithm falls back to at run
time (Winograd declines weights computed at run time and non-finite inputs). Shared geometry,
packing, padding and the epilogue live in conv_common. The algorithms' functions that tests
and the check's coverage read are re-exported here (`from ... import x as x`).
NCHW (conv.cpu.nchw): the patch matrix transposed (M x K) @ (K x P), weights used as they are.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden.blas import sgemm
from opwarden.kernels.cpu import conv_gemm as _gemm
from opwarden.kernels.cpu import conv_grouped as _grouped
from opwarden.kernels.cpu import conv_rowtap as _rowtap
from opwarden.kernels.cpu import conv_stem as _stem
from opwarden.kernels.cpu import conv_winograd as _wino
from opwarden.kernels.cpu.conv_common import (
    Facts,
    _band_rows,
    _branch_plan,
    _epilogue,
    _f32,
    _own,
    _prologue,
    _static_geometry,
)
from opwarden.kernels.cpu.conv_common import _phase_planes as _phase_planes
from opwarden.kernels.cpu.conv_common import geometry as geometry
from opwarden.kernels.cpu.conv_depthwise import _depthwise_nhwc as _depthwise_nhwc
from opwarden.kernels.cpu.conv_depthwise import depthwise_floats, nhwc_depthwise
from opwarden.kernels.cpu.conv_gemm import _branch_gemms as _branch_gemms
from opwarden.kernels.cpu.conv_gemm import _few_pixels_nhwc as _few_pixels_nhwc
from opwarden.kernels.cpu.conv_gemm import _shifted_nhwc as _shifted_nhwc
from opwarden.kernels.cpu.conv_prepared import prepare_nhwc
from opwarden.kernels.cpu.conv_rowtap import _rowtap_nhwc as _rowtap_nhwc
from opwarden.kernels.cpu.conv_stem import _stem_nhwc as _stem_nhwc
from opwarden.kernels.cpu.conv_stem import _stem_taps as _stem_taps
from opwarden.kernels.cpu.conv_winograd import _winograd_nhwc as _winograd_nhwc
from opwarden.kernels.cpu.conv_winograd import wino_tile as wino_tile
from opwarden.kernels.cpu.shuffle import channel_shuffle
from opwarden.kernels.cpu.util import F32, activation_workspace, packed, scratch

# ---------------------------------------------------------------------------------------------
# NHWC: the routes, the dispatcher and the named algorithms


def _routes_nhwc(x_shape, w_shape, group, s, d, begin, end, oh, ow, branched) -> tuple:
    """The path conv_nhwc takes for these shapes: (route,) or, where the first may decline at
    run time, (route, fallback). Winograd declines for weights computed at run time and for
    inputs that are not all finite. Shared by conv_nhwc, the named variants' `when` (see
    static_route) and nhwc_workspace, so the variant placed and the workspace declared are
    those of the path that runs."""
    n, h, w, c = x_shape
    m, cg, kh, kw = w_shape
    if n == 0 or oh * ow * m == 0:
        return ("empty",)
    if cg == 1 and m == group:
        return ("depthwise",)
    grouped = _grouped.grouped_takes(c, w_shape, group)
    if (kh, kw) == (1, 1) and s == [1, 1] and not any(begin) and not any(end):
        return ("grouped",) if grouped and cg <= _grouped.GROUPED_PW_MAX_CG else ("pointwise",)
    shifted = (not branched and cg >= _gemm.SHIFT_MIN_C and oh * ow >= _gemm.SHIFT_MIN_PIXELS
               and m // group <= _gemm.SHIFT_MAX_M_PER_C * cg and sgemm() is not None)
    if grouped and (cg <= _grouped.GROUPED_SHIFT_MAX_CG or not shifted):
        return ("grouped",)
    first: tuple = ()
    if (not branched and _wino.WINOGRAD and (kh, kw) == (3, 3) and s == [1, 1] and d == [1, 1]
            and group == 1 and min(*begin, *end) >= 0 and _wino.wino_tile(c, m, oh, ow)):
        first = ("winograd",)
    if shifted:
        return (*first, "shifted")
    if (_rowtap.ROWTAP and group == 1 and s[0] == 1 and kh > 1
            and kw * cg >= _rowtap.ROWTAP_MIN_RUN and oh * ow >= _rowtap.ROWTAP_MIN_PIXELS
            and sgemm() is not None):
        return (*first, "rowtap")
    if group == 1 and kw * cg <= _stem.STEM_MAX_RUN:
        return (*first, "direct" if _grouped.direct_takes(m) else "stem")
    # Per image, so that the route does not depend on the batch (static_route decides it for
    # a symbolic batch): the transposed product also wins over whole batches of such maps.
    if (group == 1 and not branched and oh * ow <= _gemm.PATCH_T_MAX_PIXELS
            and kh * kw * cg * m >= _gemm.PATCH_T_MIN_WEIGHTS):
        return (*first, "few_pixels")
    return (*first, "patch")


def _nhwc_winograd(x, W, B, s, d, begin, end, y, bias, z, activation, params, shuffle,
                   bplan) -> None:
    """Winograd where it does not decline (see conv_winograd.try_winograd), else the route
    conv_nhwc takes after it: the direct convolution."""
    if _wino.try_winograd(x, W, begin, y, bias, z, activation, params):
        return
    routes = _routes_nhwc(x.shape, W.shape, x.shape[3] // W.shape[1], s, d, begin, end,
                          y.shape[1], y.shape[2], bplan is not None)
    _RUN[routes[-1]](x, W, B, s, d, begin, end, y, bias, z, activation, params, shuffle,
                     bplan)


# route -> its algorithm: f(x, W, B, s, d, begin, end, y, bias, z, activation, params,
# input shuffle left to do, branch plan), writing y.
_RUN = {
    "depthwise": nhwc_depthwise,
    "pointwise": _gemm.nhwc_pointwise,
    "winograd": _nhwc_winograd,
    "shifted": _gemm.nhwc_shifted,
    "grouped": _grouped.nhwc_grouped,
    "rowtap": _rowtap.nhwc_rowtap,
    "direct": _grouped.nhwc_grouped,
    "stem": _stem.nhwc_stem,
    "few_pixels": _gemm.nhwc_few_pixels,
    "patch": _gemm.nhwc_im2col,
}


def _conv_nhwc(run, X, W, B, Z, auto_pad, dilations, group, kernel_shape, pads, strides,
               activation, activation_params, input_shuffle, out, branches):
    """conv_nhwc with the algorithm `run` (one of _RUN's), or the route's for None."""
    group = int(group)
    shuffle = int(input_shuffle or 0)
    # Not made contiguous here: an NHWC view of an NCHW tensor (the layout pass's transpose of
    # a graph input) is gathered once by the padding / patch copies, not twice.
    x = np.asarray(X, dtype=F32)
    if shuffle > 1 and not (W.shape[1] == 1 and W.shape[0] == group):
        # Depthwise convolutions shuffle inside their padding copy; others copy it here.
        x = channel_shuffle(x, group=shuffle, out=scratch("conv.shuffle", x.shape))
        shuffle = 0
    s, d, begin, end, y, z, bias = _prologue(
        x, W, B, Z, group, kernel_shape, strides, dilations, pads, auto_pad, out, nhwc=True
    )
    oh, ow = y.shape[1:3]
    if x.shape[0] == 0 or oh * ow * W.shape[0] == 0:
        return y
    bplan = _branch_plan(W.shape, branches) if branches and group == 1 else None
    if run is None:
        run = _RUN[_routes_nhwc(x.shape, W.shape, group, s, d, begin, end, oh, ow,
                                bplan is not None)[0]]
    run(x, W, B, s, d, begin, end, y, bias, z, activation, activation_params, shuffle, bplan)
    return y


def conv_nhwc(
    X, W, B=None, Z=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
    pads=None, strides=None, activation="", activation_params=(), input_shuffle=0, out=None,
    branches=None,
):
    """Y = act(Conv(shuffle(X), W, B) + Z) with X, Z, Y in NHWC; W stays (M, C/group, kh, kw),
    by the algorithm _routes_nhwc picks for these shapes.
    `input_shuffle` g >= 2 shuffles X's channels with group g first (see ops.fused).
    `branches` (FusedConv's, see ops.fused.branch_convs): only for finite X, W and B, whose
    products with W's structural zeros are exact zeros (kernels.fused checks); the patch-matrix
    and row-tap paths then skip those products (see conv_common._branch_plan), the others
    multiply them."""
    return _conv_nhwc(None, X, W, B, Z, auto_pad, dilations, group, kernel_shape, pads,
                      strides, activation, activation_params, input_shuffle, out, branches)


def nhwc_kernel(route: str):
    """conv_nhwc for a node placed on `route` (static_route): its algorithm, called directly."""
    run = _RUN[route]

    def kernel(X, W, B=None, Z=None, *, auto_pad="NOTSET", dilations=None, group=1,
               kernel_shape=None, pads=None, strides=None, activation="",
               activation_params=(), input_shuffle=0, out=None, branches=None):
        return _conv_nhwc(run, X, W, B, Z, auto_pad, dilations, group, kernel_shape, pads,
                          strides, activation, activation_params, input_shuffle, out,
                          branches)

    kernel.__name__ = kernel.__qualname__ = f"conv_{VARIANTS[route][0]}"
    kernel.__doc__ = VARIANTS[route][1]
    return kernel


def static_route(x, w, attrs) -> str | None:
    """The route conv_nhwc takes for an NHWC X of shape `x` and W of shape `w` with these
    attributes, or None when that is not known before running (a dim not a known int) or the
    call is malformed (the dispatcher then says why). A symbolic batch is no obstacle: the
    route is the same for every batch of at least one image (_routes_nhwc reads H, W and the
    channels; an empty batch writes nothing on any route)."""
    if len(x) == 4 and not isinstance(x[0], int) and all(isinstance(v, int) for v in x[1:]):
        x = (1, *x[1:])
    geom = _static_geometry(x, w, x[1:3], attrs.get("strides"), attrs.get("dilations"),
                            attrs.get("pads"), attrs.get("auto_pad"))
    if geom is None:
        return None
    group = int(attrs.get("group", 1) or 1)
    m, cg = w[:2]
    if group < 1 or m % group or cg * group != x[3]:
        return None
    ks = attrs.get("kernel_shape")
    if ks and tuple(int(k) for k in ks) != tuple(w[2:]):
        return None
    branches = attrs.get("branches")
    bplan = _branch_plan(tuple(w), branches) if branches and group == 1 else None
    s, d, begin, end, (oh, ow) = geom
    return _routes_nhwc(tuple(x), tuple(w), group, s, d, begin, end, oh, ow,
                        bplan is not None)[0]


# route -> its algorithm as one bound native call for a prepared step (conv_prepared)
_BIND = {"grouped": _grouped.bind_grouped, "direct": _grouped.bind_grouped,
         "pointwise": _gemm.bind_pointwise}


# route -> (variant name suffix, what the variant runs and when placement gives it a node)
VARIANTS = {
    "winograd": ("winograd", """Winograd F(4x4, 3x3) (conv_winograd): 3x3, stride 1, group 1,
    non-negative pads, enough tiles and channels. Constant weights are not a fact placement
    sees, so they stay a run-time condition: for weights computed at run time, and for inputs
    or weights with a NaN or Inf, it runs the direct route conv_nhwc takes next."""),
    "shifted": ("shifted_gemm", """Shifted GEMM (conv_gemm): k x k over a large map with at
    least SHIFT_MIN_C input channels per group, one accumulating GEMM per tap."""),
    "grouped": ("grouped", """Grouped (conv_grouped, compiled): group > 1 with
    GROUPED_MIN_CG..GROUPED_MAX_CG input channels per group and mg a multiple of 8 (or mg 4
    in pairs of groups), where the extension is built (above GROUPED_SHIFT_MAX_CG only where
    the shifted GEMM does not apply; 1x1 stride 1 up to GROUPED_PW_MAX_CG); the taps read
    from the unpadded image, a block of pixels' sums in registers."""),
    "rowtap": ("rowtap", """Row taps (conv_rowtap): group 1, row stride 1, kernel rows of at
    least ROWTAP_MIN_RUN floats, one GEMM per kernel row."""),
    "direct": ("direct", """Direct (conv_grouped's compiled loop with one group): group 1,
    kernel rows of at most STEM_MAX_RUN floats (few input channels: the RGB stem) and M a
    multiple of 8, where the extension is built; each pixel's taps read from the unpadded
    image, a block of pixels' sums in registers."""),
    "stem": ("stem", """Stem (conv_stem): group 1, kernel rows of at most STEM_MAX_RUN floats
    (few input channels), the transposed patch matrix; where the direct loop does not take
    them (no extension, M not a multiple of 8)."""),
    "depthwise": ("depthwise", """Depthwise (conv_depthwise): one channel per group, one
    einsum over a strided window view."""),
    "pointwise": ("pointwise", """Pointwise (conv_gemm): 1x1, stride 1, no padding; one GEMM
    per group."""),
    "few_pixels": ("fewpixel", """Few pixels (conv_gemm): group 1, at most PATCH_T_MAX_PIXELS
    output pixels and large weights, the transposed product over the patch matrix."""),
    "patch": ("im2col", """Banded im2col (conv_gemm): the patch matrix, band by band, for what
    no other algorithm takes."""),
}


def route_when(route: str):
    """The `when` of route's variant: float32, 4-D, and static_route gives that route."""

    def when(x, w, *rest, **attrs: Any) -> bool:
        return _conv_ok(x, w, *rest) and static_route(x.shape, w.shape, attrs) == route

    return when


# route -> the floats of scratch it takes (conv_common.Facts -> int)
_FLOATS = {
    "empty": lambda f: 0,
    "depthwise": depthwise_floats,
    "pointwise": _gemm.pointwise_floats,
    "winograd": _wino.winograd_floats,
    "shifted": _gemm.shifted_floats,
    "grouped": _grouped.grouped_floats,
    "direct": _grouped.grouped_floats,
    "rowtap": _rowtap.rowtap_floats,
    "stem": _stem.stem_floats,
    "few_pixels": _gemm.few_pixels_floats,
    "patch": _gemm.im2col_floats,
}


def _nhwc_workspace(route, x, w, b, z, auto_pad, dilations, group, pads, strides,
                    input_shuffle, branches, activation, activation_params) -> int:
    """Workspace bytes of `route`'s algorithm (with Winograd's fallback), or of the route
    _routes_nhwc picks for None."""
    geom = _static_geometry(x, w, x[1:3], strides, dilations, pads, auto_pad)
    if geom is None:
        return 0
    s, d, begin, end, (oh, ow) = geom
    group = int(group or 1)
    n, h, wd, c = x
    m, cg, kh, kw = w
    if group < 1 or m % group or cg * group != c:
        return 0
    bplan = _branch_plan(tuple(w), branches) if branches and group == 1 else None
    routes = _routes_nhwc(tuple(x), tuple(w), group, s, d, begin, end, oh, ow,
                          bplan is not None)
    if route is not None:
        routes = routes if route == routes[0] == "winograd" else (route,)
    y_floats = n * oh * ow * m
    shuffled = (n * h * wd * c if int(input_shuffle or 0) > 1 and routes[0] != "depthwise"
                else 0)
    padded = n * (h + max(begin[0], 0) + max(end[0], 0)) * (wd + max(begin[1], 0)
                                                            + max(end[1], 0)) * c
    # (an omitted optional input comes as None or as the empty shape ())
    f = Facts(tuple(x), tuple(w), s, d, begin, end, oh, ow, group, bool(b), bplan,
              y_floats if z else 0, padded)
    return (4 * (shuffled + max(_FLOATS[r](f) for r in routes))
            + activation_workspace(activation, activation_params, y_floats))


def nhwc_workspace(x, w, b=None, z=None, *, auto_pad="NOTSET", dilations=None, group=1,
                   kernel_shape=None, pads=None, strides=None, input_shuffle=0, branches=None,
                   activation="", activation_params=None, **_) -> int:
    """Workspace bytes of conv_nhwc (X and Z in NHWC): the scratch buffers of the path it takes
    for these shapes (the larger of the two where Winograd may decline), per-call packed
    weights (weights that are not initializers are packed on every call; an initializer's
    packing is cached with it, weight memory) and the residual's copy where the path writes Y
    before it reads Z (in place over Z). The `opwarden check` workspace check measures each
    path against this. Unknown shapes: 0."""
    return _nhwc_workspace(None, x, w, b, z, auto_pad, dilations, group, pads, strides,
                           input_shuffle, branches, activation, activation_params)


def route_workspace(route: str):
    """nhwc_workspace for route's variant: that algorithm's scratch (and, for Winograd, the
    larger with its fallback's)."""

    def workspace(x, w, b=None, z=None, *, auto_pad="NOTSET", dilations=None, group=1,
                  kernel_shape=None, pads=None, strides=None, input_shuffle=0, branches=None,
                  activation="", activation_params=None, **_) -> int:
        return _nhwc_workspace(route, x, w, b, z, auto_pad, dilations, group, pads, strides,
                               input_shuffle, branches, activation, activation_params)

    return workspace


# ---------------------------------------------------------------------------------------------
# NCHW


def _pad_nchw(x: np.ndarray, begin, end) -> np.ndarray:
    """x (C, H, W) (one image) zero-padded on H and W into a scratch buffer."""
    if not any(begin) and not any(end):
        return x
    c, h, w = x.shape
    x = x[:, max(-begin[0], 0):h - max(-end[0], 0), max(-begin[1], 0):w - max(-end[1], 0)]
    bt, bl = max(begin[0], 0), max(begin[1], 0)
    et, el = max(end[0], 0), max(end[1], 0)
    h, w = x.shape[1:3]
    xp = scratch("conv.pad", (c, h + bt + et, w + bl + el))
    xp[:, :bt] = 0
    xp[:, bt + h:] = 0
    xp[:, bt:bt + h, :bl] = 0
    xp[:, bt:bt + h, bl + w:] = 0
    xp[:, bt:bt + h, bl:bl + w] = x
    return xp


def _pack_nchw(w: np.ndarray, group: int) -> np.ndarray:
    """W (M, Cg, kh, kw) -> (group, M/group, Cg*kh*kw): rows of the left GEMM operand; a view of
    a C-contiguous float32 W (its rows already are those), else one copy."""
    m = w.shape[0]
    return np.ascontiguousarray(w, dtype=F32).reshape(group, m // group, -1)


def conv_nchw(
    X, W, B=None, Z=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
    pads=None, strides=None, activation="", activation_params=(), out=None,
):
    """Y = act(Conv(X, W, B) + Z) in NCHW, 2-D, float32."""
    group = int(group)
    x = _f32(X)
    s, d, begin, end, y, z, bias = _prologue(
        x, W, B, Z, group, kernel_shape, strides, dilations, pads, auto_pad, out, nhwc=False
    )
    z = _own(z, y)
    n, c, h, wd = x.shape
    m, cg, kh, kw = W.shape
    oh, ow = y.shape[2:4]
    bias = None if bias is None else bias.reshape(m, 1)
    if n == 0 or oh * ow * m == 0:
        return y
    p = oh * ow
    if cg == 1 and m == group:
        pw = packed(W, "dw_nchw", lambda w: np.ascontiguousarray(np.asarray(w, F32)[:, 0]))
        for i in range(n):
            xp = _pad_nchw(x[i], begin, end)
            acc = y[i]
            tmp = scratch("conv.dwtmp", (m, oh, ow))
            for a in range(kh):
                for b in range(kw):
                    v = xp[:, a * d[0]:a * d[0] + (oh - 1) * s[0] + 1:s[0],
                           b * d[1]:b * d[1] + (ow - 1) * s[1] + 1:s[1]]
                    wv = pw[:, a, b, None, None]
                    if a == 0 and b == 0:
                        np.multiply(v, wv, out=acc)
                    else:
                        np.multiply(v, wv, out=tmp)
                        acc += tmp
            _epilogue(y[i].reshape(m, p), bias, None if z is None else z[i].reshape(m, p),
                      activation, activation_params)
        return y
    pw = packed(W, ("nchw", group), lambda w: _pack_nchw(w, group))
    mg = m // group
    k = cg * kh * kw
    pointwise = (kh, kw) == (1, 1) and s == [1, 1] and not any(begin) and not any(end)
    cols_per_row = ow * k * group * 4
    rows = _band_rows(oh, _gemm.BAND_BYTES, cols_per_row)
    for i in range(n):
        y2 = y[i].reshape(m, p)
        if pointwise:
            a2 = x[i].reshape(c, h * wd)
            for g in range(group):
                np.matmul(pw[g], a2[g * cg:(g + 1) * cg], out=y2[g * mg:(g + 1) * mg])
            _epilogue(y2, bias, None if z is None else z[i].reshape(m, p), activation,
                      activation_params)
            continue
        xp = _pad_nchw(x[i], begin, end)
        for r0 in range(0, oh, rows):
            r1 = min(oh, r0 + rows)
            rr = r1 - r0
            cols = scratch("conv.cols", (c, kh, kw, rr, ow))
            for a in range(kh):
                h0 = r0 * s[0] + a * d[0]
                for b in range(kw):
                    w0 = b * d[1]
                    cols[:, a, b] = xp[:, h0:h0 + (rr - 1) * s[0] + 1:s[0],
                                       w0:w0 + (ow - 1) * s[1] + 1:s[1]]
            c2 = cols.reshape(c * kh * kw, rr * ow)
            yb = y2[:, r0 * ow:r1 * ow]
            for g in range(group):
                np.matmul(pw[g], c2[g * k:(g + 1) * k], out=yb[g * mg:(g + 1) * mg])
            _epilogue(yb, bias, None if z is None else z[i].reshape(m, p)[:, r0 * ow:r1 * ow],
                      activation, activation_params)
    return y


def nchw_workspace(x, w, b=None, z=None, *, auto_pad="NOTSET", dilations=None, group=1,
                   kernel_shape=None, pads=None, strides=None, activation="",
                   activation_params=None, **_) -> int:
    """Workspace bytes of conv_nchw: a contiguous copy of X when it is a strided view, one
    image's padded copy, the patch band (or the depthwise tap product), per-call packed weights
    (see nhwc_workspace) and the residual's copy when Y is written over Z. Unknown shapes: 0."""
    geom = _static_geometry(x, w, x[2:4], strides, dilations, pads, auto_pad)
    if geom is None:
        return 0
    s, d, begin, end, (oh, ow) = geom
    group = int(group or 1)
    n, c, h, wd = x
    m, cg, kh, kw = w
    if n == 0 or oh * ow * m == 0:
        return 0
    act = activation_workspace(activation, activation_params, n * m * oh * ow)
    zcopy = n * m * oh * ow if z else 0  # (omitted: None or ())
    zcopy += n * c * h * wd  # (X's contiguous copy, counted with the residual's)
    padded = c * (h + max(begin[0], 0) + max(end[0], 0)) * (wd + max(begin[1], 0)
                                                            + max(end[1], 0))
    if cg == 1 and m == group:
        return act + 4 * (zcopy + padded + m * oh * ow + m * kh * kw)
    if (kh, kw) == (1, 1) and s == [1, 1] and not any(begin) and not any(end):
        return act + 4 * (zcopy + m * cg)
    rows = _band_rows(oh, _gemm.BAND_BYTES, ow * cg * kh * kw * group * 4)
    return act + 4 * (zcopy + padded + c * kh * kw * rows * ow + m * cg * kh * kw)


# ---------------------------------------------------------------------------------------------
# Registration


def _conv_ok(x, w, *rest, **attrs: Any) -> bool:
    """2-D float32 convolutions with known ranks; anything else stays on the reference kernel."""
    if x.shape is None or w.shape is None or len(x.shape) != 4 or len(w.shape) != 4:
        return False
    return all(f is None or f.dtype in (None, "float32") for f in (x, w, *rest))


def _conv_kernel(conv, doc: str):
    """Conv's kernel over a FusedConv-shaped one (no residual input), planned output."""

    def kernel(X, W, B=None, *, out=None, **attrs):
        return conv(X, W, B, None, out=out, **attrs)

    kernel.__name__ = kernel.__qualname__ = getattr(conv, "__name__", "conv")
    kernel.__doc__ = doc
    return kernel


def register() -> None:
    """Register the fast Conv variants on every Conv version: one per NHWC algorithm (chosen
    by its `when` at placement, priority 11), the NHWC dispatcher and the NCHW kernel."""
    from opwarden.ops.base import REGISTRY

    kw = {"device": "cpu", "dtypes": ["float32"], "accepts_out": True}
    for opdef in REGISTRY.versions("Conv"):
        for route, (suffix, doc) in VARIANTS.items():
            fn = _conv_kernel(nhwc_kernel(route), doc)
            fn.prepare = prepare_nhwc(_RUN[route], fn, _BIND.get(route))  # type: ignore
            opdef.kernel(layout="NHWC", priority=11, when=route_when(route),
                         name=f"conv.cpu.{suffix}", workspace_bytes=route_workspace(route),
                         **kw)(fn)
        opdef.kernel(layout="NHWC", priority=10, when=_conv_ok, name="conv.cpu.nhwc",
                     workspace_bytes=nhwc_workspace, **kw)(
            _conv_kernel(conv_nhwc, "Conv on NHWC activations, the route picked per call."))
        opdef.kernel(layout="NCHW", priority=10, when=_conv_ok, name="conv.cpu.nchw",
                     workspace_bytes=nchw_workspace, **kw)(
            _conv_kernel(conv_nchw, "Conv on NCHW activations."))
