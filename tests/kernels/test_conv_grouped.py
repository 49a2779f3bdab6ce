"""The compiled grouped convolution (conv.cpu.grouped / fusedconv.cpu.grouped, native/grouped.c)
against the reference Conv / FusedConv: groups, channels per group (the pair layout at mg 4,
the 8/16/24-channel blocks, the plain loop), kernel sizes, strides, dilation, asymmetric pads,
batches, bias, residual (also in place over Y), activations, NaN; the route it takes and when
it is not taken (extension off, shapes it has no fast path for); bad calls raise. The same
loop with one group is the direct route (conv.cpu.direct, the RGB stems): tested likewise."""

from __future__ import annotations

import os

import numpy as np
import pytest

from opwarden import native
from opwarden.errors import OpwardenError
from opwarden.kernels.cpu import conv as kconv
from opwarden.kernels.cpu import conv_grouped as kgrouped
from opwarden.kernels.cpu import fused as kfused
from opwarden.memory.constants import mark as mark_constant
from opwarden.ops.base import REGISTRY
from opwarden.ops.conv import Conv
from opwarden.ops.fused import FusedConv

needs_native = pytest.mark.skipif(os.environ.get("OPWARDEN_NATIVE", "1") == "0"
                                  or not native.available(), reason="compiled path off")

_grouped_conv = kconv.nhwc_kernel("grouped")
_grouped_fused = kfused._fused_nhwc(_grouped_conv)
_direct_conv = kconv.nhwc_kernel("direct")
_direct_fused = kfused._fused_nhwc(_direct_conv)


def nhwc(x):
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


def nchw(y):
    return y.transpose(0, 3, 1, 2)


def _arrays(n, group, cg, mg, k, hw, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, group * cg, *hw), dtype=np.float32)
    w = rng.standard_normal((group * mg, cg, k, k), dtype=np.float32)
    b = rng.standard_normal(group * mg, dtype=np.float32)
    mark_constant(w)
    return x, w, b


# (group, cg, mg): pair layout (mg 4), 8 / 16 / 24 / 32-channel blocks, the plain loop
# (mg 5, mg 4 with an odd group count, cg 3 at mg 4)
SHAPES = [(2, 4, 4), (32, 4, 4), (4, 12, 4), (3, 8, 8), (2, 16, 16), (2, 8, 24), (2, 32, 32),
          (2, 3, 5), (3, 4, 4), (2, 3, 4)]
GEOMS = [  # (k, strides, dilations, pads, (H, W))
    (3, [1, 1], [1, 1], [1, 1, 1, 1], (9, 16)),
    (3, [2, 2], [1, 1], [1, 1, 1, 1], (11, 12)),
    (3, [1, 2], [2, 2], [2, 0, 1, 3], (10, 13)),
    (5, [1, 1], [1, 1], [2, 1, 0, 2], (8, 9)),
    (1, [1, 1], [1, 1], [0, 0, 0, 0], (5, 7)),
    (1, [2, 2], [1, 1], [0, 1, 1, 0], (7, 6)),
]


@needs_native
@pytest.mark.parametrize("group,cg,mg", SHAPES)
@pytest.mark.parametrize("geom", GEOMS, ids=lambda g: f"k{g[0]}s{g[1][1]}d{g[2][0]}")
@pytest.mark.parametrize("n", [1, 3])
def test_conv_matches_reference(group, cg, mg, geom, n):
    k, strides, dil, pads, hw = geom
    x, w, b = _arrays(n, group, cg, mg, k, hw, seed=group + cg + mg + k)
    attrs = dict(group=group, strides=strides, dilations=dil, pads=pads)
    ref = Conv(x, w, b, **attrs)
    out = np.full((ref.shape[0],) + ref.shape[2:] + ref.shape[1:2], np.nan, np.float32)
    y = _grouped_conv(nhwc(x), w, b, **attrs, out=out)
    assert y is out
    np.testing.assert_allclose(nchw(y), ref, rtol=1e-4, atol=1e-4 * k * k * cg)
    y2 = _grouped_conv(nhwc(x), w, None, **attrs)  # no bias
    np.testing.assert_allclose(nchw(y2), Conv(x, w, None, **attrs), rtol=1e-4,
                               atol=1e-4 * k * k * cg)


ACTS = [("", []), ("Relu", []), ("Clip", [-0.5, 0.7]), ("LeakyRelu", [0.2]),
        ("HardSwish", []), ("Sigmoid", []), ("Tanh", []), ("Gelu", []), ("Gelu", [1.0]),
        ("Swish", [1.0]), ("Swish", [1.702])]


@needs_native
@pytest.mark.parametrize("act,params", ACTS, ids=[f"{a or 'none'}{p}" for a, p in ACTS])
@pytest.mark.parametrize("group,cg,mg", [(4, 4, 4), (2, 16, 16), (3, 8, 24), (2, 3, 5)])
@pytest.mark.parametrize("residual", [False, True])
def test_fused_matches_reference(act, params, group, cg, mg, residual):
    x, w, b = _arrays(2, group, cg, mg, 3, (7, 10), seed=5)
    attrs = dict(group=group, strides=[1, 2], pads=[1, 0, 2, 1])
    z = None
    if residual:
        shape = Conv(x, w, b, **attrs).shape
        z = np.random.default_rng(6).standard_normal(shape, dtype=np.float32)
    ref = FusedConv(x, w, b, z, activation=act, activation_params=params, **attrs)
    y = _grouped_fused(nhwc(x), w, b, None if z is None else nhwc(z), activation=act,
                       activation_params=params, **attrs)
    np.testing.assert_allclose(nchw(y), ref, rtol=1e-4, atol=1e-4)


@needs_native
def test_in_place_over_residual_and_strided_x():
    x, w, b = _arrays(1, 8, 4, 4, 3, (9, 9), seed=7)
    attrs = dict(group=8, pads=[1, 1, 1, 1])
    z = np.random.default_rng(8).standard_normal(Conv(x, w, b, **attrs).shape,
                                                 dtype=np.float32)
    ref = FusedConv(x, w, b, z, activation="Relu", **attrs)
    zy = nhwc(z)
    # X as an NHWC view of the NCHW array (the layout pass's transpose of a graph input)
    y = _grouped_fused(x.transpose(0, 2, 3, 1), w, b, zy, activation="Relu", out=zy, **attrs)
    assert y is zy
    np.testing.assert_allclose(nchw(y), ref, rtol=1e-4, atol=1e-4)


@needs_native
@pytest.mark.parametrize("group,cg,mg", [(4, 4, 4), (2, 8, 16), (2, 3, 5)])
def test_nan_propagates(group, cg, mg):
    x, w, b = _arrays(1, group, cg, mg, 3, (8, 11), seed=9)
    x[0, 1, 3, 4] = np.nan  # group 0's input only
    w2 = np.array(w)
    w2[mg, 0, 1, 1] = np.inf  # group 1's first output channel, centre tap
    mark_constant(w2)
    attrs = dict(group=group, pads=[1, 1, 1, 1])
    for ww in (w, w2):
        for act in ("", "Relu", "Clip"):
            params = [0.0, 6.0] if act == "Clip" else []
            ref = FusedConv(x, ww, b, activation=act, activation_params=params, **attrs)
            y = _grouped_fused(nhwc(x), ww, b, activation=act, activation_params=params,
                               **attrs)
            got = nchw(y)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    y = nchw(_grouped_conv(nhwc(x), w, b, **attrs))
    assert np.isnan(y[0, :mg, 2:5, 3:6]).all() and not np.isnan(y[0, mg:]).any()


RESNEXT = ((1, 56, 56, 128), (128, 4, 3, 3), {"group": 32, "pads": [1, 1, 1, 1]})


def _route_without_native(monkeypatch, xs, ws, attrs, route, x_shape):
    """With the extension off (as OPWARDEN_NATIVE=0) the shape takes `route`, and the NumPy
    fallback computes a small X of `x_shape` right."""
    monkeypatch.setattr(native, "_LIB", None)
    assert kconv.static_route(xs, ws, attrs) == route
    x = np.random.default_rng(0).standard_normal(x_shape, dtype=np.float32)
    w = np.random.default_rng(1).standard_normal(ws, dtype=np.float32)
    got = kconv.conv_nhwc(nhwc(x), w, None, **attrs)
    np.testing.assert_allclose(nchw(got), Conv(x, w, None, **attrs), rtol=1e-4, atol=1e-4)


def test_route_chosen_for_resnext_shape_only_with_native(monkeypatch):
    xs, ws, attrs = RESNEXT
    want = "grouped" if native.available() else "patch"
    assert kconv.static_route(xs, ws, attrs) == want
    assert kconv.static_route(("N", *xs[1:]), ws, attrs) == want  # a symbolic batch
    _route_without_native(monkeypatch, xs, ws, attrs, "patch", (1, 128, 8, 8))


@needs_native
@pytest.mark.parametrize("xs,ws,attrs,route", [
    ((1, 28, 28, 256), (256, 8, 3, 3), {"group": 32, "strides": [2, 2], "pads": [1] * 4},
     "grouped"),
    ((1, 7, 7, 1024), (1024, 32, 3, 3), {"group": 32, "pads": [1] * 4}, "grouped"),
    ((8, 28, 28, 432), (432, 48, 3, 3), {"group": 9, "pads": [1] * 4}, "shifted"),
    ((1, 14, 14, 448), (448, 64, 3, 3), {"group": 7, "pads": [1] * 4}, "grouped"),
    ((1, 28, 28, 256), (256, 8, 1, 1), {"group": 32}, "grouped"),
    ((1, 28, 28, 240), (60, 80, 1, 1), {"group": 3}, "pointwise"),
    ((1, 14, 14, 24), (24, 2, 3, 3), {"group": 12, "pads": [1] * 4}, "patch"),  # mg 2
    ((1, 14, 14, 64), (64, 1, 3, 3), {"group": 64, "pads": [1] * 4}, "depthwise"),
    ((1, 14, 14, 64), (64, 64, 3, 3), {"pads": [1] * 4}, None),  # group 1: never grouped
])
def test_route_thresholds(xs, ws, attrs, route):
    got = kconv.static_route(xs, ws, attrs)
    if route is None:
        assert got != "grouped"
    else:
        assert got == route


def test_variants_registered():
    for opdef in REGISTRY.versions("Conv"):
        assert {"conv.cpu.grouped", "conv.cpu.direct"} <= {v.name for v in opdef.variants}
    for opdef in REGISTRY.versions("FusedConv", "opwarden"):
        assert {"fusedconv.cpu.grouped", "fusedconv.cpu.direct"} <= {
            v.name for v in opdef.variants}


# -- the direct route: one group, few input channels ----------------------------------------

# (C, M): RGB with the 8/16/24-channel blocks and M 64 (four 16-blocks), grey, RGBA, 6 and 8
DIRECT = [(3, 8), (3, 16), (3, 24), (3, 64), (1, 32), (4, 16), (6, 40), (8, 16)]
DIRECT_GEOMS = [  # (k, strides, dilations, pads, (H, W))
    (3, [2, 2], [1, 1], [1, 1, 1, 1], (23, 20)),  # the MobileNet / EfficientNet stem
    (7, [2, 2], [1, 1], [3, 3, 3, 3], (30, 27)),  # ResNet's
    (3, [2, 2], [1, 1], [0, 0, 0, 0], (19, 19)),  # Inception's, unpadded
    (4, [4, 4], [1, 1], [0, 0, 0, 0], (16, 20)),  # a ConvNeXt / Swin patchify
    (3, [1, 2], [2, 1], [2, 0, 1, 3], (12, 13)),  # dilation, asymmetric pads
    (5, [1, 1], [1, 1], [2, 2, 2, 2], (9, 8)),
]


@needs_native
@pytest.mark.parametrize("c,m", DIRECT, ids=[f"c{c}m{m}" for c, m in DIRECT])
@pytest.mark.parametrize("geom", DIRECT_GEOMS, ids=lambda g: f"k{g[0]}s{g[1][1]}d{g[2][0]}")
@pytest.mark.parametrize("n", [1, 2])
def test_direct_matches_reference(c, m, geom, n):
    k, strides, dil, pads, hw = geom
    x, w, b = _arrays(n, 1, c, m, k, hw, seed=c + m + k)
    attrs = dict(strides=strides, dilations=dil, pads=pads)
    if k * c <= kconv._stem.STEM_MAX_RUN:
        xs = (n, *hw, c)
        geo = kconv.static_route(xs, w.shape, attrs)
        assert geo == "direct", geo
    ref = Conv(x, w, b, **attrs)
    out = np.full((ref.shape[0],) + ref.shape[2:] + ref.shape[1:2], np.nan, np.float32)
    y = _direct_conv(nhwc(x), w, b, **attrs, out=out)
    assert y is out
    np.testing.assert_allclose(nchw(y), ref, rtol=1e-4, atol=1e-4 * k * k * c)
    # X as the NHWC view of the NCHW graph input, no bias
    y2 = _direct_conv(x.transpose(0, 2, 3, 1), w, None, **attrs)
    np.testing.assert_allclose(nchw(y2), Conv(x, w, None, **attrs), rtol=1e-4,
                               atol=1e-4 * k * k * c)


@needs_native
@pytest.mark.parametrize("act,params", ACTS, ids=[f"{a or 'none'}{p}" for a, p in ACTS])
@pytest.mark.parametrize("residual", [False, True])
def test_direct_fused_matches_reference(act, params, residual):
    x, w, b = _arrays(2, 1, 3, 16, 3, (15, 18), seed=11)
    attrs = dict(strides=[2, 2], pads=[1, 1, 1, 1])
    z = None
    if residual:
        z = np.random.default_rng(12).standard_normal(Conv(x, w, b, **attrs).shape,
                                                      dtype=np.float32)
    ref = FusedConv(x, w, b, z, activation=act, activation_params=params, **attrs)
    zh = None if z is None else nhwc(z)
    y = _direct_fused(nhwc(x), w, b, zh, activation=act, activation_params=params,
                      out=zh, **attrs)  # in place over the residual where there is one
    assert zh is None or y is zh
    np.testing.assert_allclose(nchw(y), ref, rtol=1e-4, atol=1e-4)


@needs_native
def test_direct_nan_and_inf_propagate():
    x, w, b = _arrays(1, 1, 3, 16, 3, (12, 12), seed=13)
    x[0, 2, 5, 6] = np.nan
    w = np.array(w)
    # At the centre tap: like the grouped and depthwise loops, the direct one skips the taps
    # that read padding, where the reference multiplies the zeros (0 * inf is NaN there).
    w[3, 1, 1, 1] = np.inf
    mark_constant(w)
    attrs = dict(strides=[2, 2], pads=[1, 1, 1, 1])
    for act in ("", "Relu"):
        ref = FusedConv(x, w, b, activation=act, **attrs)
        got = nchw(_direct_fused(nhwc(x), w, b, activation=act, **attrs))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
        fin = np.isfinite(ref)
        np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-4, atol=1e-4)


def test_direct_route_only_with_native_and_m_in_blocks(monkeypatch):
    stem = ((1, 224, 224, 3), (32, 3, 3, 3), {"strides": [2, 2], "pads": [1] * 4})
    xs, ws, attrs = stem
    assert kconv.static_route(xs, ws, attrs) == ("direct" if native.available() else "stem")
    assert kconv.static_route(xs, (36, 3, 3, 3), attrs) == "stem"  # M not in 8-blocks
    _route_without_native(monkeypatch, xs, ws, attrs, "stem", (1, 3, 20, 20))


def test_workspace_declared():
    xs, ws, attrs = RESNEXT
    got = kconv.route_workspace("grouped")(xs, ws, None, None, **attrs)
    assert got >= 4 * (np.prod(xs) + np.prod(ws))


def test_packing_layouts():
    w = np.arange(8 * 4 * 3 * 3, dtype=np.float32).reshape(8, 4, 3, 3)
    wide = kgrouped._pack_wide(2)(w)  # (group, kh, kw, cg, mg)
    assert wide.shape == (2, 3, 3, 4, 4) and wide[1, 2, 0, 3, 1] == w[4 + 1, 3, 2, 0]
    pair = kgrouped._pack_pair(2)(w)  # (group/2, kh, kw, cg, 2, 4)
    assert pair.shape == (1, 3, 3, 4, 2, 4) and pair[0, 2, 0, 3, 1, 1] == w[4 + 1, 3, 2, 0]


@needs_native
def test_bad_calls_raise():
    x = np.zeros((1, 4, 4, 8), np.float32)
    y = np.zeros((1, 4, 4, 8), np.float32)
    wp = np.zeros(8 * 4 * 9, np.float32)
    with pytest.raises(OpwardenError, match="packed weights"):
        native.grouped_nhwc(x, wp[:-1], None, None, y, 2, (3, 3), [1, 1], [1, 1], [1, 1])
    x6 = np.zeros((1, 4, 4, 6), np.float32)  # cg 3: no pair layout
    with pytest.raises(OpwardenError, match="pair layout"):
        native.grouped_nhwc(x6, np.zeros(2 * 9 * 3 * 4, np.float32), None, None, y, 2, (3, 3),
                            [1, 1], [1, 1], [1, 1], pair=True)
    with pytest.raises(OpwardenError, match="activation"):
        native.grouped_nhwc(x, wp, None, None, y, 2, (3, 3), [1, 1], [1, 1], [1, 1],
                            activation="Selu")
    with pytest.raises(OpwardenError, match="disagree"):
        native.grouped_nhwc(x, wp, None, None, y, 3, (3, 3), [1, 1], [1, 1], [1, 1])
    with pytest.raises(OpwardenError, match="rows"):
        native.grouped_nhwc(x, wp, None, None, y, 2, (3, 3), [1, 1], [1, 1], [1, 1],
                            rows=(0, 5))
