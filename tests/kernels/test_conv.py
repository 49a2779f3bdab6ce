"""Fast Conv/FusedConv variants (NHWC and NCHW) against the reference kernel."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opwarden.errors import KernelError
from opwarden.kernels.cpu import conv as kconv
from opwarden.kernels.cpu import conv_common as kcommon
from opwarden.kernels.cpu import conv_depthwise as kdw
from opwarden.kernels.cpu import conv_gemm as kgemm
from opwarden.kernels.cpu import conv_rowtap as krowtap
from opwarden.kernels.cpu import conv_stem as kstem
from opwarden.kernels.cpu import conv_winograd as kwino
from opwarden.kernels.cpu import fused as kfused
from opwarden.kernels.cpu import util as kutil
from opwarden.kernels.cpu.conv import conv_nchw, conv_nhwc
from opwarden.kernels.cpu.util import packed, sgemm
from opwarden.memory.constants import mark as mark_constant
from opwarden.ops.base import REGISTRY
from opwarden.ops.conv import Conv
from opwarden.ops.fused import FusedConv

ACTS = ["", "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSwish", "Gelu", "Tanh"]


def nhwc(x):
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


def nchw(y):
    return y.transpose(0, 3, 1, 2)


@st.composite
def conv_case(draw):
    group = draw(st.sampled_from([1, 1, 2, 3, "dw"]))
    cg = draw(st.integers(1, 4))
    c = cg * (group if group != "dw" else 1)
    if group == "dw":
        group, cg, c = 0, 1, draw(st.integers(1, 6))
        group = c
        m = c
    else:
        m = group * draw(st.integers(1, 4))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    pads = [draw(st.integers(0, 2)) for _ in range(4)] if auto_pad == "NOTSET" else None
    h = draw(st.integers((kh - 1) * dh + 1, 11))
    w = draw(st.integers((kw - 1) * dw + 1, 11))
    n = draw(st.integers(1, 2))
    bias = draw(st.booleans())
    return dict(n=n, c=c, h=h, w=w, m=m, cg=cg, kh=kh, kw=kw, group=group, bias=bias,
                attrs=dict(group=group, strides=[sh, sw], dilations=[dh, dw], auto_pad=auto_pad,
                           pads=pads, kernel_shape=[kh, kw]))


def home(name: str):
    """The conv module that defines `name` (a tuning constant or an algorithm's function), so
    that patching it there reaches the code that reads it."""
    for mod in (kgemm, krowtap, kstem, kwino, kdw, kcommon, kconv):
        if name in vars(mod) and getattr(getattr(mod, name), "__module__", mod.__name__) in (
                mod.__name__, None):
            return mod
    raise AttributeError(name)


@contextlib.contextmanager
def nhwc_path(path):
    """Force the NHWC k x k path: "shifted" (per-tap GEMMs), "stem" (transposed patch matrix,
    group 1 only, else the general one; taps copied straight from x), "stem_planes" (the same
    through phase planes), "im2col" (patch matrix), "few_pixels" (group 1: the transposed
    product W' @ cols.T, else im2col), "rowtap" (group 1, row stride 1, kh > 1: one GEMM per
    kernel row over row copies, else im2col) or "winograd" (F(4x4, 3x3) for every 3x3 stride-1
    group-1 convolution with read-only weights, else im2col)."""
    names = ("SHIFT_MIN_C", "SHIFT_MIN_PIXELS", "SHIFT_MAX_M_PER_C", "STEM_MAX_RUN",
             "STEM_DIRECT_MAX_TAPS", "WINOGRAD", "WINO_MIN_TILES", "WINO_MIN_CM",
             "PATCH_T_MAX_PIXELS", "PATCH_T_MIN_WEIGHTS", "ROWTAP", "ROWTAP_MIN_RUN",
             "ROWTAP_MIN_PIXELS")
    old = {k: getattr(home(k), k) for k in names}
    big = 1 << 30
    off = (False, big, big)
    new = {"shifted": (1, 1, big, 0, big, False, 0, 0, 0, big, *off),
           "stem": (big, big, 0, big, big, False, 0, 0, 0, big, *off),
           "stem_planes": (big, big, 0, big, 0, False, 0, 0, 0, big, *off),
           "im2col": (big, big, 0, 0, big, False, 0, 0, 0, big, *off),
           "few_pixels": (big, big, 0, 0, big, False, 0, 0, big, 0, *off),
           "rowtap": (big, big, 0, 0, big, False, 0, 0, 0, big, True, 0, 0),
           "winograd": (big, big, 0, 0, big, True, 0, 0, 0, big, *off)}
    for k, v in zip(names, new[path]):
        setattr(home(k), k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(home(k), k, v)


PATHS = ["shifted", "stem", "stem_planes", "im2col", "few_pixels", "rowtap", "winograd"]


def _arrays(case, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((case["n"], case["c"], case["h"], case["w"]), dtype=np.float32)
    w = rng.standard_normal((case["m"], case["cg"], case["kh"], case["kw"]), dtype=np.float32)
    b = rng.standard_normal(case["m"], dtype=np.float32) if case["bias"] else None
    return x, w, b


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(conv_case())
def test_conv_variants_match_reference(case):
    x, w, b = _arrays(case)
    mark_constant(w)  # an initializer: Winograd only packs constant weights
    ref = Conv(x, w, b, **case["attrs"])
    for path in PATHS:
        with nhwc_path(path):
            y1 = conv_nhwc(nhwc(x), w, b, **case["attrs"])
        np.testing.assert_allclose(nchw(y1), ref, rtol=1e-4, atol=1e-4, err_msg=path)
    y2 = conv_nchw(x, w, b, **case["attrs"])
    np.testing.assert_allclose(y2, ref, rtol=1e-4, atol=1e-4)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(conv_case(), st.sampled_from(["", "Relu"]), st.sampled_from([0, 1 << 30]))
def test_fused_conv_in_place_over_the_residual(case, act, pw_t):
    """FusedConv's contract lets Y share Z's buffer (may_alias (3, 0)); the memory plan then
    passes out= Z itself. Every NHWC path (pointwise, grouped, depthwise, k x k, Winograd, the
    transposed few-pixel products) and the NCHW kernel must read Z before overwriting it."""
    x, w, b = _arrays(case, seed=3)
    mark_constant(w)
    ref0 = Conv(x, w, b, **case["attrs"])
    z = np.random.default_rng(4).standard_normal(ref0.shape, dtype=np.float32)
    ref = FusedConv(x, w, b, z, activation=act, **case["attrs"])
    old = kgemm.PW_T_MAX_PIXELS
    for path in PATHS:
        zy = np.array(nhwc(z), order="C")  # (a copy: z may be NHWC-contiguous already)
        kgemm.PW_T_MAX_PIXELS = pw_t
        try:
            with nhwc_path(path):
                y1 = kfused.fused_conv_nhwc(nhwc(x), w, b, zy, activation=act, out=zy,
                                            **case["attrs"])
        finally:
            kgemm.PW_T_MAX_PIXELS = old
        assert y1 is zy
        np.testing.assert_allclose(nchw(y1), ref, rtol=1e-4, atol=1e-4, err_msg=path)
    zc = z.copy()
    y2 = kfused.fused_conv_nchw(x, w, b, zc, activation=act, out=zc, **case["attrs"])
    assert y2 is zc
    np.testing.assert_allclose(y2, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(1, 64, 40, 40, 160, 1), (1, 48, 36, 36, 128, 3),
                                   (1, 96, 28, 28, 96, 3)])
def test_fused_conv_in_place_over_a_large_residual(shape):
    """In place at sizes where the bias and residual adds run on OpenBLAS's threads."""
    n, c, h, wd, m, k = shape
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, c, h, wd), dtype=np.float32)
    w = rng.standard_normal((m, c, k, k), dtype=np.float32)
    mark_constant(w)
    b = rng.standard_normal(m, dtype=np.float32)
    z = rng.standard_normal((n, m, h, wd), dtype=np.float32)
    attrs = dict(kernel_shape=[k, k], pads=[k // 2] * 4)
    ref = FusedConv(x, w, b, z, activation="Relu", **attrs)
    for path in [None, *PATHS]:
        zy = np.array(nhwc(z), order="C")  # (a copy: z may be NHWC-contiguous already)
        with contextlib.nullcontext() if path is None else nhwc_path(path):
            y = kfused.fused_conv_nhwc(nhwc(x), w, b, zy, activation="Relu", out=zy, **attrs)
        assert y is zy
        np.testing.assert_allclose(nchw(y), ref, rtol=1e-4, atol=1e-3 * k * k, err_msg=path)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(conv_case(), st.sampled_from(ACTS), st.booleans())
def test_fused_conv_variants_match_reference(case, act, residual):
    x, w, b = _arrays(case, seed=1)
    mark_constant(w)
    params = {"Clip": [-0.5, 0.7], "LeakyRelu": [0.2]}.get(act, [])
    ref0 = Conv(x, w, b, **case["attrs"])
    z = np.random.default_rng(2).standard_normal(ref0.shape, dtype=np.float32) if residual \
        else None
    ref = FusedConv(x, w, b, z, activation=act, activation_params=params, **case["attrs"])
    for path in PATHS:
        out = np.full((ref.shape[0],) + ref.shape[2:] + ref.shape[1:2], np.nan, np.float32)
        with nhwc_path(path):
            y1 = kfused.fused_conv_nhwc(nhwc(x), w, b, None if z is None else nhwc(z),
                                        activation=act, activation_params=params, out=out,
                                        **case["attrs"])
        assert y1 is out
        np.testing.assert_allclose(nchw(y1), ref, rtol=1e-4, atol=1e-4, err_msg=path)
    out2 = np.full(ref.shape, np.nan, np.float32)
    y2 = kfused.fused_conv_nchw(x, w, b, z, activation=act, activation_params=params, out=out2,
                                **case["attrs"])
    assert y2 is out2
    np.testing.assert_allclose(y2, ref, rtol=1e-4, atol=1e-4)


def test_gelu_tanh_param_matches_reference():
    case = dict(n=1, c=4, h=6, w=6, m=5, cg=4, kh=3, kw=3, group=1, bias=True,
                attrs=dict(group=1, pads=[1, 1, 1, 1]))
    x, w, b = _arrays(case)
    ref = FusedConv(x, w, b, activation="Gelu", activation_params=[1.0], **case["attrs"])
    y = kfused.fused_conv_nchw(x, w, b, activation="Gelu", activation_params=[1.0],
                               **case["attrs"])
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_large_map_uses_several_bands_and_matches():
    # A map big enough that the patch matrix is split into row bands.
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 32, 70, 70), dtype=np.float32)
    w = rng.standard_normal((16, 32, 3, 3), dtype=np.float32) * np.float32(0.1)
    attrs = dict(pads=[1, 1, 1, 1])
    ref = Conv(x, w, None, **attrs)
    np.testing.assert_allclose(nchw(conv_nhwc(nhwc(x), w, None, **attrs)), ref, rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(conv_nchw(x, w, None, **attrs), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "xs, ws, attrs",
    [
        ((1, 64, 30, 30), (48, 64, 3, 3), dict(pads=[1, 1, 1, 1])),  # many wide bands
        ((2, 32, 23, 18), (40, 32, 3, 3), dict(pads=[2, 0, 1, 2])),  # partial Winograd tiles
        ((2, 32, 17, 15), (40, 32, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
        ((1, 32, 19, 19), (24, 16, 5, 5), dict(pads=[2, 1, 0, 2], group=2, dilations=[2, 1])),
        ((1, 24, 20, 20), (32, 24, 1, 1), dict(strides=[2, 2])),
        ((1, 24, 9, 9), (32, 12, 1, 1), dict(group=2)),  # pointwise
        ((1, 16, 12, 12), (8, 16, 3, 3), dict(pads=[-1, 0, 2, -1], strides=[1, 3])),
        ((1, 3, 40, 40), (16, 3, 7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2])),
        ((2, 48, 21, 21), (48, 1, 3, 3), dict(pads=[1, 1, 1, 1], group=48)),  # depthwise
        ((1, 40, 23, 22), (40, 1, 3, 3), dict(pads=[1, 0, 1, 1], strides=[2, 2], group=40)),
    ],
)
def test_realistic_shapes_match_reference(xs, ws, attrs, path, monkeypatch):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.standard_normal(ws, dtype=np.float32) * np.float32(0.1)
    mark_constant(w)  # an initializer: exercises the packed-weight cache
    b = rng.standard_normal(ws[0], dtype=np.float32)
    ref = Conv(x, w, b, **attrs)
    # Small bands: the band loops and their offsets are exercised.
    monkeypatch.setattr(kgemm, "WIDE_BAND_BYTES", 8 << 10)
    monkeypatch.setattr(kwino, "WINO_BAND_BYTES", 8 << 10)
    with nhwc_path(path):
        # A strided NHWC view of the NCHW array, as the layout pass's input transpose gives.
        y = conv_nhwc(x.transpose(0, 2, 3, 1), w, b, **attrs)
    np.testing.assert_allclose(nchw(y), ref, rtol=1e-4, atol=1e-4)


def test_blas_binding_accumulates():
    gemm = sgemm()
    if gemm is None:
        pytest.skip("no OpenBLAS ILP64 interface in this NumPy")
    rng = np.random.default_rng(6)
    a = rng.standard_normal((7, 5), dtype=np.float32)
    b = rng.standard_normal((5, 3), dtype=np.float32)
    c = np.ones((7, 4), np.float32)
    # C[:, 1:] += A @ B with ldc 4: the leading column must be left alone.
    gemm(7, 3, 5, a.ctypes.data, 5, b.ctypes.data, 3, 1.0, c.ctypes.data + 4, 4)
    np.testing.assert_allclose(c[:, 1:], a @ b + 1, rtol=1e-5)
    np.testing.assert_array_equal(c[:, 0], 1)


def test_packed_weights_cached_only_for_declared_constants():
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    calls = []

    def pack(a):
        calls.append(1)
        return a.T.copy()

    packed(w, "t", pack)
    packed(w, "t", pack)
    assert len(calls) == 2  # writable: repacked every time (it may have changed)
    # Read-only is not constant: the executor hands intermediates on read-only, and a planned
    # buffer's view is the same object on every run with new values in it.
    w.flags.writeable = False
    packed(w, "t", pack)
    assert len(calls) == 3
    view = w.view()
    mark_constant(w)
    p1 = packed(w, "t", pack)
    p2 = packed(w, "t", pack)
    assert p1 is p2 and len(calls) == 4
    packed(view, "t", pack)  # a view of a constant is not declared constant itself
    assert len(calls) == 5


def test_packed_cache_keys_on_deps_and_on_the_arrays_shape():
    w = mark_constant(np.arange(12, dtype=np.float32).reshape(3, 4))
    b1 = mark_constant(np.ones(4, np.float32))
    b2 = mark_constant(np.ones(4, np.float32))
    calls = []

    def pack(a):
        calls.append(1)
        return a.T.copy()

    p1 = packed(w, "t", pack, deps=(b1,))
    assert packed(w, "t", pack, deps=(b1,)) is p1 and len(calls) == 1
    packed(w, "t", pack, deps=(b2,))  # another bias: another entry
    packed(w, "t", pack)  # no deps: another entry too
    assert len(calls) == 3
    packed(w, "t", pack, deps=(np.ones(4, np.float32),))  # a dep that is not constant
    assert len(calls) == 4
    w.shape = (4, 3)  # the same object reshaped in place is packed again
    assert packed(w, "t", pack).shape == (3, 4) and len(calls) == 5
    key = (id(w), "t", id(b2))
    assert key in kutil._PACKED
    del b2
    assert key not in kutil._PACKED  # the entry dies with any array it was packed from


def test_ptr_remembers_constants_only():
    a = np.zeros(8, np.float32)
    assert kutil.ptr(a) == a.ctypes.data and id(a) not in kutil._PTRS
    c = mark_constant(np.zeros(8, np.float32))
    assert kutil.ptr(c) == c.ctypes.data and id(c) in kutil._PTRS
    key = id(c)
    del c
    assert key not in kutil._PTRS  # the entry dies with the array


def test_a_residual_of_the_wrong_shape_is_named_on_every_call():
    x = np.ones((1, 4, 4, 8), np.float32)
    w = np.ones((8, 8, 1, 1), np.float32)
    conv_nhwc(x, w, kernel_shape=[1, 1])  # geometry now cached for these shapes
    for _ in range(2):
        with pytest.raises(KernelError, match=r"residual Z \(1, 4, 4, 7\) must match"):
            conv_nhwc(x, w, None, np.ones((1, 4, 4, 7), np.float32), kernel_shape=[1, 1])


def test_weights_changed_between_calls_are_seen():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 3, 5, 5), dtype=np.float32)
    w = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    conv_nhwc(nhwc(x), w, None)
    w *= 2  # writable weights are never served from the cache
    np.testing.assert_allclose(nchw(conv_nhwc(nhwc(x), w, None)), Conv(x, w), rtol=1e-5,
                               atol=1e-5)


def test_shape_errors_name_what_was_expected():
    x = np.zeros((1, 5, 4, 4), np.float32)
    w = np.zeros((4, 3, 3, 3), np.float32)
    with pytest.raises(KernelError, match="channels"):
        conv_nchw(x, w, None)
    with pytest.raises(KernelError, match="bias"):
        conv_nhwc(np.zeros((1, 4, 4, 3), np.float32), w, np.zeros(3, np.float32))


def test_variants_registered_on_every_conv_version():
    for opdef in REGISTRY.versions("Conv"):
        names = {v.name: v for v in opdef.variants}
        assert names["conv.cpu.nhwc"].layout == "NHWC"
        assert names["conv.cpu.nchw"].accepts_out
    for opdef in REGISTRY.versions("FusedConv", "opwarden"):
        assert "fusedconv.cpu.nhwc" in {v.name for v in opdef.variants}


@pytest.mark.parametrize("path", ["stem", "stem_planes"])
@pytest.mark.parametrize(
    "hw, k, attrs",
    [
        ((37, 41), 3, dict(strides=[2, 2], pads=[1, 1, 1, 1])),
        ((37, 41), 3, dict(strides=[2, 2], pads=[0, 0, 0, 0])),
        ((30, 29), 4, dict(strides=[4, 4], pads=[0, 2, 1, 0])),
        ((23, 25), 3, dict(strides=[1, 2], pads=[-1, 2, 0, -2], dilations=[2, 1])),
        ((40, 40), 7, dict(strides=[2, 2], pads=[3, 3, 3, 3])),
    ],
)
def test_stem_taps_from_strided_input_match_reference(hw, k, attrs, path, monkeypatch):
    # RGB stems read an NHWC view of the NCHW graph input; a small band size makes the band
    # loop clip each tap's rows.
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, *hw), dtype=np.float32)
    w = rng.standard_normal((8, 3, k, k), dtype=np.float32)
    b = rng.standard_normal(8, dtype=np.float32)
    ref = FusedConv(x, w, b, activation="Relu", **attrs)
    monkeypatch.setattr(kstem, "STEM_BAND_BYTES", 4 << 10)
    monkeypatch.setattr(kstem, "STEM_PLANES_BAND_BYTES", 4 << 10)
    with nhwc_path(path):
        y = kfused.fused_conv_nhwc(x.transpose(0, 2, 3, 1), w, b, activation="Relu", **attrs)
    np.testing.assert_allclose(nchw(y), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("path", ["im2col", "stem", "stem_planes"])
@pytest.mark.parametrize("strides", [[1, 1], [2, 2]])
def test_bias_row_follows_the_bias_given(path, strides):
    # The im2col and stem paths fold the bias into the weights (the phase-plane stem also
    # reorders their rows by phase); the folded copy is cached only while W and B are both
    # read-only, so another bias (or a changed writable one) is always seen.
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 16, 9, 9), dtype=np.float32)
    w = rng.standard_normal((64, 16, 3, 3), dtype=np.float32)
    mark_constant(w)
    attrs = dict(pads=[1, 1, 1, 1], strides=strides)
    b1 = rng.standard_normal(64, dtype=np.float32)
    mark_constant(b1)
    b2 = rng.standard_normal(64, dtype=np.float32)
    mark_constant(b2)
    b3 = rng.standard_normal(64, dtype=np.float32)
    with nhwc_path(path):
        for b in (b1, b2, b1, b3, None):
            y = conv_nhwc(nhwc(x), w, b, **attrs)
            np.testing.assert_allclose(nchw(y), Conv(x, w, b, **attrs), rtol=1e-4, atol=1e-4)
        b3 += 1
        y = conv_nhwc(nhwc(x), w, b3, **attrs)
    np.testing.assert_allclose(nchw(y), Conv(x, w, b3, **attrs), rtol=1e-4, atol=1e-4)


def test_stem_groups_cover_every_tap_once():
    # The phase-plane stem copies each phase's taps as one strided block; together the blocks
    # must list every tap exactly once, in the order the weights' rows follow.
    for s in ([1, 1], [2, 2], [3, 2], [4, 4], [2, 3]):
        for d in ([1, 1], [2, 2], [3, 1], [2, 3]):
            for khw in ((7, 7), (3, 3), (5, 4), (1, 3)):
                groups, order = kstem._stem_groups(tuple(s), tuple(d), khw)
                assert sorted(order) == list(range(khw[0] * khw[1]))
                pas, pbs = kcommon._plane_geometry(s, d, khw, 1, 1)[:2]
                t = 0
                for ph, qa, sa, na, qb, sb, nb in groups:
                    pa, pb = pas[ph // len(pbs)], pbs[ph % len(pbs)]
                    for u in range(na):
                        for v in range(nb):
                            a, b = divmod(order[t], khw[1])
                            assert ((a * d[0]) % s[0], (a * d[0]) // s[0]) == (pa, qa + u * sa)
                            assert ((b * d[1]) % s[1], (b * d[1]) // s[1]) == (pb, qb + v * sb)
                            t += 1
                assert t == len(order)


@pytest.mark.parametrize("cols", [8, 64, 2 * kutil.RELU_CHUNK])
def test_relu_on_contiguous_and_strided_rows(cols):
    rng = np.random.default_rng(9)
    base = rng.standard_normal((3 * kutil.RELU_CHUNK // cols + 5, cols + 3), dtype=np.float32)
    base[0, 0] = np.nan
    want = np.maximum(base, 0)
    a = base.copy()
    assert kutil.relu(a) is a  # contiguous, in place: flat chunks
    np.testing.assert_array_equal(a, want)
    b = base.copy()
    kutil.relu(b[:, :cols])  # rows with a contiguous last axis, outer axis strided
    np.testing.assert_array_equal(b[:, :cols], want[:, :cols])
    np.testing.assert_array_equal(b[:, cols:], base[:, cols:])
    # Out of place, into a fresh buffer and into a strided one; other dtypes take the plain call.
    o = np.empty_like(base)
    assert kutil.relu(base, o) is o
    np.testing.assert_array_equal(o, want)
    o2 = np.zeros((base.shape[0], cols + 7), np.float32)
    kutil.relu(base[:, :cols], o2[:, 2:cols + 2])
    np.testing.assert_array_equal(o2[:, 2:cols + 2], want[:, :cols])
    np.testing.assert_array_equal(kutil.relu(base.astype(np.float64)), want.astype(np.float64))


@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("alias", [False, True])
def test_pointwise_residual_in_or_out_of_the_output_buffer(group, alias):
    """A 1x1 convolution's residual may share the output buffer (small output, so not on the
    prefill path by size): it is folded in before the GEMM would overwrite it."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 9, 7, 12), dtype=np.float32)  # NHWC
    w = rng.standard_normal((16, 12 // group, 1, 1), dtype=np.float32)
    b = rng.standard_normal(16, dtype=np.float32)
    z = rng.standard_normal((2, 9, 7, 16), dtype=np.float32)
    want = np.maximum(
        nhwc(Conv(nchw(x), w, b, group=group)) + z, np.float32(0)
    )
    out = z.copy() if alias else np.empty_like(z)
    zin = out if alias else z
    got = conv_nhwc(x, w, b, zin, group=group, kernel_shape=[1, 1], activation="Relu", out=out)
    assert got is out
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Winograd F(4x4, 3x3)


@pytest.fixture
def spy(monkeypatch):
    """spy(name) -> the list of calls made to kernels.conv.<name> from now on (to prove a test
    took a path, or did not)."""

    def install(name: str) -> list:
        calls: list = []
        real = getattr(home(name), name)

        def wrapper(*a, **k):
            calls.append(1)
            return real(*a, **k)

        monkeypatch.setattr(home(name), name, wrapper)
        return calls

    return install


@pytest.mark.parametrize("act", ["", "Relu", "Sigmoid"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize(
    "xs, m, pads, band",
    [
        ((1, 24, 16, 16), 40, [1, 1, 1, 1], 1 << 20),  # whole tiles, one band
        ((2, 16, 21, 19), 24, [2, 1, 0, 2], 4 << 10),  # partial tiles, several bands
        ((1, 16, 9, 30), 32, [0, 0, 0, 0], 2 << 10),  # no padding, one tile row a band
    ],
)
def test_winograd_matches_reference(xs, m, pads, band, act, residual, monkeypatch, spy):
    rng = np.random.default_rng(11)
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.standard_normal((m, xs[1], 3, 3), dtype=np.float32) / np.float32(np.sqrt(9 * xs[1]))
    mark_constant(w)
    b = rng.standard_normal(m, dtype=np.float32)
    ref0 = Conv(x, w, b, pads=pads)
    z = rng.standard_normal(ref0.shape, dtype=np.float32) if residual else None
    ref = FusedConv(x, w, b, z, activation=act, pads=pads)
    monkeypatch.setattr(kwino, "WINO_BAND_BYTES", band)
    calls = spy("_winograd_nhwc")
    with nhwc_path("winograd"):
        y = kfused.fused_conv_nhwc(x.transpose(0, 2, 3, 1), w, b,
                                   None if z is None else nhwc(z), activation=act, pads=pads)
    assert calls
    np.testing.assert_allclose(nchw(y), ref, rtol=1e-4, atol=5e-5)


def test_winograd_rule_takes_the_large_layers_only():
    # VGG-19's 3x3 layers from 112x112x64->128 down to 28x28x512 (measured faster) ...
    for c, m, hw in [(64, 64, 224), (64, 128, 112), (128, 128, 112), (256, 256, 56),
                     (512, 512, 28)]:
        assert kconv.wino_tile(c, m, hw, hw) == 4
    # ... but not ResNet-50's / Inception's mid-size ones nor 14x14 and smaller maps.
    for c, m, hw in [(64, 64, 56), (64, 192, 56), (128, 128, 28), (256, 256, 14),
                     (512, 512, 14), (512, 512, 7)]:
        assert kconv.wino_tile(c, m, hw, hw) == 0


def test_winograd_keeps_direct_nan_and_inf_positions(spy):
    # The transforms would spread a NaN or Inf over its whole 4x4 tile; such inputs (and
    # non-finite weights or bias) take the direct path, so positions match the reference.
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 16, 12, 12), dtype=np.float32)
    x[0, 3, 5, 6] = np.nan
    x[0, 7, 9, 2] = np.inf
    w = rng.standard_normal((32, 16, 3, 3), dtype=np.float32)
    mark_constant(w)
    ref = Conv(x, w, None, pads=[1, 1, 1, 1])
    calls = spy("_winograd_nhwc")
    with nhwc_path("winograd"):
        y = nchw(conv_nhwc(nhwc(x), w, None, pads=[1, 1, 1, 1]))
    assert not calls
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(ref))
    w2 = w.copy()
    w2[3, 2, 1, 1] = np.nan
    mark_constant(w2)
    b = np.zeros(32, np.float32)
    b[4] = np.inf
    x = np.nan_to_num(x, nan=0.0, posinf=0.0)
    with nhwc_path("winograd"):
        y2 = nchw(conv_nhwc(nhwc(x), w2, None, pads=[1, 1, 1, 1]))
        y3 = nchw(conv_nhwc(nhwc(x), w, b, pads=[1, 1, 1, 1]))
    assert not calls
    np.testing.assert_array_equal(np.isnan(y2), np.isnan(Conv(x, w2, None, pads=[1, 1, 1, 1])))
    assert (y3[0, 4] == np.inf).all() and np.isfinite(np.delete(y3, 4, axis=1)).all()


def test_winograd_needs_constant_weights(spy):
    # Packing costs more than the convolution: weights that may change are not transformed.
    rng = np.random.default_rng(13)
    x = rng.standard_normal((1, 16, 12, 12), dtype=np.float32)
    w = rng.standard_normal((32, 16, 3, 3), dtype=np.float32)
    calls = spy("_winograd_nhwc")
    with nhwc_path("winograd"):
        y = nchw(conv_nhwc(nhwc(x), w, None, pads=[1, 1, 1, 1]))
    assert not calls
    np.testing.assert_allclose(y, Conv(x, w, None, pads=[1, 1, 1, 1]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("value, want", [(None, "True"), ("0", "False"), ("off", "False")])
def test_winograd_environment_switch(value, want):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OPWARDEN_WINOGRAD"}
    if value is not None:
        env["OPWARDEN_WINOGRAD"] = value
    code = "from opwarden.kernels.cpu import conv_winograd; print(conv_winograd.WINOGRAD)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == want


# ---------------------------------------------------------------------------------------------
# FusedConv branches (a Concat of sibling convolutions merged by the passes)


def _branch_case(seed=21, nonfinite=False):
    """A fire module: a 1x1 and a 3x3 expand of x, W the 1x1 centred in the 3x3 kernel."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 8, 9, 10), dtype=np.float32)
    if nonfinite:
        x[0, 2, 4, 4] = np.nan
        x[1, 5, 0, 9] = np.inf
    w1 = rng.standard_normal((5, 8, 1, 1), dtype=np.float32)
    w3 = rng.standard_normal((6, 8, 3, 3), dtype=np.float32)
    b = rng.standard_normal(11, dtype=np.float32)
    w = np.zeros((11, 8, 3, 3), np.float32)
    w[:5, :, 1:2, 1:2] = w1
    w[5:] = w3
    mark_constant(w)
    want = np.concatenate([Conv(x, w1, b[:5]), Conv(x, w3, b[5:], pads=[1, 1, 1, 1])], axis=1)
    return x, w, b, want


@pytest.mark.parametrize("nonfinite", [False, True])
def test_fused_conv_branches_reference_is_the_concat_of_its_convolutions(nonfinite):
    x, w, b, want = _branch_case(nonfinite=nonfinite)
    got = FusedConv(x, w, b, pads=[1, 1, 1, 1], branches=[5, 1, 1, 6, 3, 3])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    if nonfinite:  # the structural zeros were not multiplied: NaN stays where it was
        assert np.isnan(want).sum() < np.isnan(Conv(x, w, b, pads=[1, 1, 1, 1])).sum()


@pytest.mark.parametrize("branches, pads, match", [
    ([5, 1, 1, 5, 3, 3], [1, 1, 1, 1], "output channels"),
    ([5, 2, 2, 6, 3, 3], [1, 1, 1, 1], "centred"),
    ([5, 1, 1, 6, 3, 3], [0, 0, 0, 0], "cannot hold"),
    ([5, 1, 1, 6, 3], [1, 1, 1, 1], "triples"),
])
def test_fused_conv_branches_errors_name_the_problem(branches, pads, match):
    x, w, b, _ = _branch_case()
    with pytest.raises(KernelError, match=match):
        FusedConv(x, w, b, pads=pads, branches=branches)


@pytest.mark.parametrize("path, fast", [("im2col", "_branch_gemms"), ("rowtap", "_rowtap_nhwc")])
@pytest.mark.parametrize("nonfinite", [False, True])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_fused_conv_branches_fast_kernels(layout, nonfinite, path, fast, monkeypatch):
    # Finite inputs: one convolution, the 1x1 branch a GEMM over its tap's columns only (NHWC
    # patch and row-tap paths); NaN/Inf: branch by branch, so NaN and Inf positions equal the
    # reference's.
    x, w, b, want = _branch_case(nonfinite=nonfinite)
    calls: list = []
    real = getattr(home(fast), fast)

    def merged(*a, **k):
        if fast == "_branch_gemms" or a[-1] is not None:  # _rowtap_nhwc's last: the branch plan
            calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(home(fast), fast, merged)
    with nhwc_path(path):
        if layout == "NHWC":
            got = nchw(kfused.fused_conv_nhwc(nhwc(x), w, b, activation="Relu",
                                              pads=[1, 1, 1, 1], branches=[5, 1, 1, 6, 3, 3]))
        else:
            got = kfused.fused_conv_nchw(x, w, b, activation="Relu", pads=[1, 1, 1, 1],
                                         branches=[5, 1, 1, 6, 3, 3])
    ref = np.maximum(want, 0)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    assert bool(calls) == (layout == "NHWC" and not nonfinite)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_fused_conv_branches_never_read_taps_outside_them(layout, monkeypatch):
    # FusedConv's branches read only the centred part of W: a W with values outside it (not
    # built by the passes; found by the op's declared samples under `opwarden check`) runs
    # branch by branch, not as one convolution over the whole W.
    x, w, b, want = _branch_case()
    w = w.copy()
    w[:5, :, 0, :] = 1.0  # taps the 1x1 branch never reads
    mark_constant(w)
    calls: list = []
    real = kgemm._branch_gemms
    monkeypatch.setattr(kgemm, "_branch_gemms", lambda *a, **k: calls.append(1) or real(*a, **k))
    kw = dict(pads=[1, 1, 1, 1], branches=[5, 1, 1, 6, 3, 3])
    ref = FusedConv(x, w, b, **kw)
    np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-5)
    if layout == "NHWC":
        got = nchw(kfused.fused_conv_nhwc(nhwc(x), w, b, **kw))
    else:
        got = kfused.fused_conv_nchw(x, w, b, **kw)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert not calls


# ---------------------------------------------------------------------------------------------
# Few output pixels: the transposed product


@pytest.mark.parametrize("ks, strides, pads", [(3, 1, 1), (3, 2, 1), (1, 2, 0)])
def test_few_pixels_takes_the_transposed_product_and_matches(ks, strides, pads, spy):
    """ResNet-50's 7x7 layers (scaled down in channels to keep the test fast, the rule's
    weight floor lowered to match): read-only weights and bias as initializers, the bias
    cached in the packed weights and a new bias seen; no bias; a residual and an activation."""
    rng = np.random.default_rng(21)
    c, m, h = 96, 128, 14 if strides == 2 else 7
    x = rng.standard_normal((1, c, h, h), dtype=np.float32)
    w = rng.standard_normal((m, c, ks, ks), dtype=np.float32) * np.float32(0.1)
    mark_constant(w)
    attrs = dict(strides=[strides] * 2, pads=[pads] * 4, kernel_shape=[ks, ks])
    calls = spy("_few_pixels_nhwc")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kgemm, "PATCH_T_MIN_WEIGHTS", c * m)
        for seed in (1, 2):
            b = np.random.default_rng(seed).standard_normal(m, dtype=np.float32)
            mark_constant(b)
            y = conv_nhwc(nhwc(x), w, b, **attrs)
            np.testing.assert_allclose(nchw(y), Conv(x, w, b, **attrs), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(nchw(conv_nhwc(nhwc(x), w, None, **attrs)),
                                   Conv(x, w, None, **attrs), rtol=1e-4, atol=1e-4)
        ref = Conv(x, w, b, **attrs)
        z = rng.standard_normal(ref.shape, dtype=np.float32)
        got = kfused.fused_conv_nhwc(nhwc(x), w, b, nhwc(z), activation="Relu", **attrs)
        np.testing.assert_allclose(nchw(got), np.maximum(ref + z, 0), rtol=1e-4, atol=1e-4)
    assert len(calls) == 4
    # Below the weight floor (the cached small weights), the usual orientation.
    conv_nhwc(nhwc(x), w, b, **attrs)
    assert len(calls) == 4


@pytest.mark.parametrize("strides,dilations", [([1, 1], [1, 1]), ([2, 1], [2, 1]),
                                               ([1, 2], [1, 1]), ([1, 1], [1, 2])])
@pytest.mark.parametrize("bias", [False, True])
def test_depthwise_merged_rows_equal_per_channel_einsum(monkeypatch, strides, dilations, bias):
    """Depthwise with unit W stride runs (OW, C) as one axis against tiled weights; the sums
    are the per-tap products in the same order, so the result is bit-identical to the
    per-channel einsum (the other rows here take that one)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 9, 11, 24)).astype(np.float32)
    w = rng.standard_normal((24, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32) if bias else None
    attrs = dict(group=24, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=strides,
                 dilations=dilations)
    got = {}
    for merge in (0, 1 << 20):
        monkeypatch.setattr(kdw, "DW_TILED_MAX_BYTES", merge)
        got[merge] = conv_nhwc(x, w, b, **attrs)
    np.testing.assert_array_equal(got[1 << 20], got[0])
    want = nhwc(Conv(x.transpose(0, 3, 1, 2), w, b, **attrs))
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
