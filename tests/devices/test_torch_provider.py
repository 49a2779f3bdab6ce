"""The torch provider: every variant agrees with the reference kernel, NHWC ones on transposed
data, and the nine light models run on providers ["torch", "cpu"] as ONNX Runtime does."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import opwarden as ow  # noqa: E402
from opwarden import zoo  # noqa: E402
from opwarden.devices import devices, get_device  # noqa: E402
from opwarden.errors import KernelError, OptionsError  # noqa: E402
from opwarden.kernels.torch import conv as tconv  # noqa: E402
from opwarden.kernels.torch import conv_plan as tconv_plan  # noqa: E402
from opwarden.kernels.torch import pool as tpool  # noqa: E402
from opwarden.kernels.torch import provider as tp  # noqa: E402
from opwarden.memory.constants import mark as mark_constant  # noqa: E402
from opwarden.ops import REGISTRY  # noqa: E402

tp.register()


@pytest.fixture(autouse=True)
def _one_thread():
    # Test workers share the cores: one torch thread avoids OpenMP barriers stalling on a
    # descheduled sibling thread (results do not depend on the thread count).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def variant(op_type: str, name: str, since: int | None = None, domain: str = ""):
    versions = REGISTRY.versions(op_type, domain)
    o = versions[-1] if since is None else next(v for v in versions if v.since == since)
    return o, next(v for v in o.variants if v.name == name)


def nhwc(x):
    return np.ascontiguousarray(np.moveaxis(x, 1, -1))


def nchw(x):
    return np.moveaxis(x, -1, 1)


def close(got, want, rtol=1e-4):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    tol = rtol * (np.abs(want).max() if want.size else 0) + 1e-5
    assert np.abs(got.astype(np.float64) - want).max() <= tol


def rand(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ------------------------------------------------------------------------------- device


def test_device_is_listed_with_its_capabilities():
    dev = get_device("torch")
    assert dev in devices() and get_device("pytorch") is dev
    assert dev.kind == "torch" and dev.preferred_layout == "NHWC" and not dev.concurrent
    assert "PyTorch" in dev.description


def test_register_is_idempotent():
    tp.register()
    names = [v.name for v in REGISTRY.versions("Conv")[-1].variants]
    assert names.count("conv.torch.nhwc") == 1 and names.count("conv.torch.nchw") == 1


@pytest.mark.parametrize(
    "op_type",
    ["Conv", "Relu", "MaxPool", "AveragePool", "GlobalAveragePool", "BatchNormalization", "LRN",
     "Concat", "Gemm", "MatMul", "Add", "Sum", "Mul", "Flatten", "Reshape", "Softmax",
     "Dropout", "Transpose", "Clip", "Sigmoid", "Unsqueeze"],
)
def test_every_version_has_a_torch_variant(op_type):
    for o in REGISTRY.versions(op_type):
        assert any(v.device == "torch" for v in o.variants), o


# ------------------------------------------------------------------------ convolution

CONV_CASES = [
    dict(x=(2, 4, 9, 9), w=(6, 4, 3, 3), pads=[1, 1, 1, 1]),
    dict(x=(1, 4, 9, 8), w=(6, 4, 3, 3), pads=[0, 1, 2, 1], strides=[2, 1]),
    dict(x=(1, 6, 10, 10), w=(6, 2, 3, 3), group=3, dilations=[2, 2]),
    dict(x=(1, 8, 7, 7), w=(8, 1, 3, 3), group=8, auto_pad="SAME_UPPER", strides=[2, 2]),
    dict(x=(1, 3, 8, 8), w=(5, 3, 2, 2), auto_pad="SAME_LOWER"),
    dict(x=(1, 3, 8, 8), w=(5, 3, 1, 1), bias=False),
    dict(x=(2, 3, 11), w=(4, 3, 3), pads=[2, 1], strides=[2]),
    dict(x=(1, 2, 5, 6, 7), w=(3, 2, 2, 3, 2), pads=[1, 0, 1, 0, 1, 1]),
]


def _conv_inputs(case):
    x = rand(*case["x"], seed=1)
    w = rand(*case["w"], seed=2)
    b = None if case.get("bias") is False else rand(case["w"][0], seed=3)
    attrs = {k: v for k, v in case.items() if k not in ("x", "w", "bias")}
    attrs.setdefault("auto_pad", "NOTSET")
    return x, w, b, attrs


@pytest.mark.parametrize("case", CONV_CASES, ids=range(len(CONV_CASES)))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("const", [False, True], ids=["w", "const-w"])
def test_conv_matches_reference(case, layout, const):
    x, w, b, attrs = _conv_inputs(case)
    if const:  # read-only weights are constants: NHWC 2-D convs take oneDNN's prepacked path
        mark_constant(w)
    o, v = variant("Conv", f"conv.torch.{layout.lower()}")
    assert v.layout == layout and v.device == "torch"
    want = o.reference(x, w, b, **attrs)
    if layout == "NCHW":
        close(v.fn(x, w, b, **attrs), want)
    else:
        got = v.fn(nhwc(x), w, b, **attrs)
        assert got.flags.c_contiguous
        close(nchw(got), want)


def test_conv_works_on_read_only_weights_and_odd_strides():
    x, w, b, attrs = _conv_inputs(CONV_CASES[0])
    mark_constant(w)
    _, v = variant("Conv", "conv.torch.nchw")
    want = REGISTRY.versions("Conv")[-1].reference(x, w, b, **attrs)
    close(v.fn(x, w, b, **attrs), want)
    xr = np.ascontiguousarray(x[:, :, ::-1])[:, :, ::-1]  # a negative-stride view
    close(v.fn(xr, w, b, **attrs), want)


def test_conv_errors_come_from_the_reference():
    _, v = variant("Conv", "conv.torch.nhwc")
    with pytest.raises(KernelError, match="kernel_shape"):
        v.fn(nhwc(rand(1, 3, 5, 5)), rand(2, 3, 3, 3), None, kernel_shape=[2, 2])


# ---------------------------------------------------------------------------- pooling

POOL_CASES = [
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1]),
    dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    dict(kernel_shape=[2, 3], strides=[2, 2], pads=[1, 0, 1, 2], ceil_mode=1),
    dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2]),
    dict(kernel_shape=[2, 2], auto_pad="SAME_LOWER"),
    dict(kernel_shape=[3, 3], pads=[2, 2, 2, 2]),
]


@pytest.mark.parametrize("case", POOL_CASES, ids=range(len(POOL_CASES)))
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("cip", [0, 1])
def test_pool_matches_reference(case, op_type, layout, cip):
    if op_type == "MaxPool" and cip:
        pytest.skip("count_include_pad is an AveragePool attribute")
    x = rand(2, 3, 9, 10, seed=4)
    attrs = dict(case)
    if op_type == "AveragePool":
        attrs["count_include_pad"] = cip
    o, v = variant(op_type, f"{op_type.lower()}.torch.{layout.lower()}")
    want = o.reference(x, **attrs)
    got = v.fn(x, **attrs) if layout == "NCHW" else nchw(v.fn(nhwc(x), **attrs))
    close(got, want)


@pytest.mark.parametrize("separable", [True, False])
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_max_pool_end_pads_as_ceil_mode_match_reference(separable, data):
    """NHWC 2-D max pools, separable (taps that would read padding left out) or through
    F.max_pool2d: with pads with more at the end than at the start (TF's SAME) torch's
    symmetric padding plus ceil_mode where that gives the same windows (no padded copy), else
    the -inf padded copy. The reference's values and shape either way, NaN and -Inf included."""
    k = [data.draw(st.integers(1, 4)) for _ in range(2)]
    s = [data.draw(st.integers(1, 3)) for _ in range(2)]
    dil = [data.draw(st.integers(1, 2)) for _ in range(2)]
    begin = [data.draw(st.integers(0, 2)) for _ in range(2)]
    end = [b + data.draw(st.integers(0, 3)) for b in begin]
    hw = [data.draw(st.integers((kk - 1) * dd + 1, 12)) for kk, dd in zip(k, dil)]
    ceil_mode = data.draw(st.sampled_from([0, 1]))
    attrs = dict(kernel_shape=k, strides=s, dilations=dil, pads=begin + end, ceil_mode=ceil_mode)
    x = rand(1, 3, *hw, seed=5)
    x.reshape(-1)[::7] = np.nan
    x.reshape(-1)[3::11] = -np.inf
    o, v = variant("MaxPool", "maxpool.torch.nhwc")
    try:
        want = o.reference(x, **attrs)
    except KernelError:
        return  # a geometry the operator rejects (e.g. a pad not smaller than the window)
    saved, tpool._SEPARABLE_MAXPOOL = tpool._SEPARABLE_MAXPOOL, separable
    try:
        got = nchw(v.fn(nhwc(x), **attrs))
    finally:
        tpool._SEPARABLE_MAXPOOL = saved
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("cip", [0, 1])
def test_average_pool_with_pads_as_large_as_the_window_is_the_references(cip):
    """A window wholly in the padding averages nothing (the reference's NaN with
    count_include_pad off); such pads go to the reference, not torch's mask division."""
    x = rand(1, 2, 8, 3, seed=7)
    attrs = dict(kernel_shape=[1, 3], strides=[1, 2], pads=[2, 2, 2, 2], count_include_pad=cip)
    o, v = variant("AveragePool", "averagepool.torch.nhwc")
    np.testing.assert_array_equal(nchw(v.fn(nhwc(x), **attrs)), o.reference(x, **attrs))


def test_max_pool_dilated_with_pads_over_half_the_kernel_size():
    """torch refuses padding over half the (undilated) kernel size, even where the dilated
    window is wider: such pads take the padded copy."""
    x = rand(1, 2, 7, 5, seed=8)
    attrs = dict(kernel_shape=[3, 1], dilations=[2, 1], pads=[2, 0, 2, 0])
    o, v = variant("MaxPool", "maxpool.torch.nhwc")
    np.testing.assert_array_equal(nchw(v.fn(nhwc(x), **attrs)), o.reference(x, **attrs))


def test_max_pool_end_pads_take_the_ceil_path_for_tf_same():
    x = rand(1, 4, 112, 112, seed=6)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])
    plan = tp._pool_plan(nhwc(x), attrs, True, "max")
    assert plan[7] == "ceil"
    o, v = variant("MaxPool", "maxpool.torch.nhwc")
    saved, tpool._SEPARABLE_MAXPOOL = tpool._SEPARABLE_MAXPOOL, False
    try:
        np.testing.assert_array_equal(nchw(v.fn(nhwc(x), **attrs)), o.reference(x, **attrs))
    finally:
        tpool._SEPARABLE_MAXPOOL = saved


@pytest.mark.parametrize(
    "shape,attrs",
    [
        ((1, 64, 111, 111), dict(kernel_shape=[3, 3], strides=[2, 2])),  # SqueezeNet
        ((1, 64, 112, 112), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
        ((2, 32, 28, 28), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),  # Inception, stride 1
        ((1, 16, 12, 12), dict(kernel_shape=[2, 2], strides=[2, 2])),  # VGG
        ((1, 8, 9, 9), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
        ((1, 8, 9, 10), dict(kernel_shape=[1, 3], strides=[2, 1], pads=[0, 2, 0, 2])),
        ((1, 8, 9, 10), dict(kernel_shape=[3, 2], strides=[1, 3], dilations=[2, 2])),
    ],
)
def test_separable_max_pool_is_the_reference(shape, attrs):
    """The separable NHWC max pool (folded along H, then W; no padded copy) against the
    reference, NaN and -Inf included, and against torch's own pool."""
    x = rand(*shape, seed=9)
    x.reshape(-1)[::13] = np.nan
    x.reshape(-1)[5::17] = -np.inf
    plan = tp._pool_plan(nhwc(x), attrs, True, "max")
    assert len(plan) == 9  # the separable plan is there
    o, v = variant("MaxPool", "maxpool.torch.nhwc")
    want = o.reference(x, **attrs)
    got = nchw(v.fn(nhwc(x), **attrs))
    np.testing.assert_array_equal(got, want)
    saved, tpool._SEPARABLE_MAXPOOL = tpool._SEPARABLE_MAXPOOL, False
    try:
        np.testing.assert_array_equal(nchw(v.fn(nhwc(x), **attrs)), got)
    finally:
        tpool._SEPARABLE_MAXPOOL = saved


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pool_1d_3d_dilated_and_indices(layout):
    conv = nhwc if layout == "NHWC" else (lambda a: a)
    back = nchw if layout == "NHWC" else (lambda a: a)
    suffix = layout.lower()
    o, v = variant("MaxPool", f"maxpool.torch.{suffix}")
    x1, x3 = rand(2, 3, 11, seed=5), rand(1, 2, 5, 6, 7, seed=6)
    for x, attrs in (
        (x1, dict(kernel_shape=[3], strides=[2], pads=[1, 0])),
        (x3, dict(kernel_shape=[2, 2, 3], pads=[1, 0, 1, 0, 1, 1], dilations=[1, 2, 1])),
    ):
        close(back(v.fn(conv(x), **attrs)), o.reference(x, **attrs))
    # A second output (Indices) runs the reference; Y keeps the variant's layout.
    x = rand(1, 3, 6, 6, seed=7)
    y, idx = v.fn(conv(x), kernel_shape=[2, 2], strides=[2, 2], noutputs=2)
    ry, ridx = o.reference(x, kernel_shape=[2, 2], strides=[2, 2], noutputs=2)
    close(back(y), ry)
    np.testing.assert_array_equal(idx, ridx)
    o, v = variant("AveragePool", f"averagepool.torch.{suffix}")
    attrs = dict(kernel_shape=[2, 2], dilations=[2, 1], pads=[1, 1, 0, 0])
    close(back(v.fn(conv(x), **attrs)), o.reference(x, **attrs))


@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (2, 3, 7), (1, 2, 3, 4, 5)])
def test_global_pools(op_type, shape):
    x = rand(*shape, seed=8)
    o, v = variant(op_type, f"{op_type.lower()}.torch.nchw")
    close(v.fn(x), o.reference(x))
    _, v = variant(op_type, f"{op_type.lower()}.torch.nhwc")
    close(nchw(v.fn(nhwc(x))), o.reference(x))


# ---------------------------------------------------------------------- normalization


@pytest.mark.parametrize("since", [1, 7, 14])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_batchnorm_inference(since, layout):
    x = rand(2, 5, 4, 3, seed=9)
    scale, b, mean = rand(5, seed=10), rand(5, seed=11), rand(5, seed=12)
    var = np.abs(rand(5, seed=13)) + 0.5
    o, v = variant("BatchNormalization", f"batchnormalization.torch.{layout.lower()}", since)
    kw = {"epsilon": 1e-3}
    if since == 1:
        kw["is_test"] = 1
    if since < 14:
        kw["noutputs"] = 1
    want = o.reference(x, scale, b, mean, var, **kw)
    if layout == "NCHW":
        close(v.fn(x, scale, b, mean, var, **kw), want)
    else:
        close(nchw(v.fn(nhwc(x), scale, b, mean, var, **kw)), want)


def test_batchnorm_training_runs_the_reference_in_either_layout():
    x = rand(4, 3, 5, 5, seed=14)
    scale, b, mean, var = rand(3), rand(3, seed=1), rand(3, seed=2), np.ones(3, np.float32)
    o, v = variant("BatchNormalization", "batchnormalization.torch.nhwc", 14)
    got = v.fn(nhwc(x), scale, b, mean, var, training_mode=1, epsilon=1e-5, momentum=0.9)
    want = o.reference(x, scale, b, mean, var, training_mode=1, epsilon=1e-5, momentum=0.9)
    close(nchw(got[0]), want[0])
    for g, w in zip(got[1:], want[1:]):
        close(g, w)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_lrn_window_matches_onnx(size, layout):
    x = rand(2, 7, 4, 5, seed=15)
    attrs = dict(alpha=0.01, beta=0.75, bias=1.5, size=size)
    o, v = variant("LRN", f"lrn.torch.{layout.lower()}")
    got = v.fn(x, **attrs) if layout == "NCHW" else nchw(v.fn(nhwc(x), **attrs))
    close(got, o.reference(x, **attrs))


# ----------------------------------------------------------------- linear and pointwise


@pytest.mark.parametrize("since", [1, 7])
@pytest.mark.parametrize(
    "cfg",
    [dict(transB=1, c=(6,)), dict(transA=1, alpha=0.5, beta=2.0, c=(4, 6)), dict(c=(1,)),
     dict(c=None), dict(beta=0.0, c=(6,))],
)
def test_gemm(since, cfg):
    cfg = dict(cfg)
    cshape = cfg.pop("c")
    if since == 1 and cshape is None:
        pytest.skip("Gemm-1 requires C")
    a = rand(*((3, 4) if cfg.get("transA") else (4, 3)), seed=16)
    b = rand(*((6, 3) if cfg.get("transB") else (3, 6)), seed=17)
    c = None if cshape is None else rand(*cshape, seed=18)
    if since == 1:
        cfg["broadcast"] = 1
    o, v = variant("Gemm", "gemm.torch", since)
    want = o.reference(a, b, c, **cfg)
    close(v.fn(a, b, c, **cfg), want)
    out = np.empty_like(want)
    assert v.fn(a, b, c, out=out, **cfg) is out
    close(out, want)


def test_gemm_shape_errors_are_the_references():
    _, v = variant("Gemm", "gemm.torch")
    with pytest.raises(KernelError, match="inner dimensions"):
        v.fn(rand(2, 3), rand(4, 5))
    _, v1 = variant("Gemm", "gemm.torch", 1)
    with pytest.raises(KernelError, match="broadcast=0"):
        v1.fn(rand(2, 3), rand(3, 4), rand(4))


@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((2, 3, 4), (4,)), ((4,), (2, 4, 3)),
                                    ((2, 1, 3, 4), (5, 4, 2))])
def test_matmul(shapes):
    a, b = rand(*shapes[0], seed=19), rand(*shapes[1], seed=20)
    o, v = variant("MatMul", "matmul.torch")
    close(v.fn(a, b), o.reference(a, b))


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_binary_broadcast_and_out(op_type, dtype):
    if op_type == "Div" and dtype == np.int64:
        pytest.skip("integer Div stays on cpu")
    a = (rand(2, 3, 4, seed=21) * 10).astype(dtype)
    b = (rand(3, 1, seed=22) * 10).astype(dtype)
    if op_type == "Div":
        b = np.where(b == 0, 1, b)
    o, v = variant(op_type, f"{op_type.lower()}.torch")
    want = o.reference(a, b)
    close(v.fn(a, b), want)
    out = np.empty_like(want)
    assert v.fn(a, b, out=out) is out
    close(out, want)
    # may_alias: the planned buffer may be input 0 itself.
    a2 = a.copy()
    assert v.fn(a2, b, out=a2) is a2
    close(a2, want)


def test_legacy_add_broadcast_axis_uses_the_reference():
    a, b = rand(2, 3, 4), rand(3, seed=1)
    o, v = variant("Add", "add.torch", 6)
    close(v.fn(a, b, broadcast=1, axis=1), o.reference(a, b, broadcast=1, axis=1))
    close(v.fn(a, a, broadcast=0), a + a)


def test_sum_variadic_broadcast_and_out():
    xs = [rand(3, 4, seed=23), rand(4, seed=24), rand(1, 4, seed=25), rand(2, 3, 4, seed=26)]
    o, v = variant("Sum", "sum.torch")
    for k in (1, 2, 3, 4):
        want = o.reference(*xs[:k])
        close(v.fn(*xs[:k]), want)
        out = np.empty_like(want)
        assert v.fn(*xs[:k], out=out) is out
        close(out, want)
    single = v.fn(xs[0])
    assert single is not xs[0]


@pytest.mark.parametrize(
    "op_type,attrs",
    [("Relu", {}), ("Sigmoid", {}), ("Tanh", {}), ("LeakyRelu", {"alpha": 0.2}),
     ("HardSwish", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("Elu", {"alpha": 0.7}),
     ("Gelu", {"approximate": "none"}), ("Gelu", {"approximate": "tanh"})],
)
def test_activations(op_type, attrs):
    x = rand(3, 17, seed=27) * 4
    o, v = variant(op_type, f"{op_type.lower()}.torch")
    close(v.fn(x, **attrs), o.reference(x, **attrs))
    if v.accepts_out:
        out = np.empty_like(x)
        assert v.fn(x, out=out, **attrs) is out
        close(out, o.reference(x, **attrs))


def test_clip_versions():
    x = rand(4, 5, seed=28) * 3
    o, v = variant("Clip", "clip.torch", 6)
    close(v.fn(x, min=-1.0, max=0.5), o.reference(x, min=-1.0, max=0.5))
    o, v = variant("Clip", "clip.torch", 11)
    lo, hi = np.float32(-0.5), np.float32(1.0)
    for args in ((lo, hi), (None, hi), (lo, None), (None, None), (hi, lo)):
        close(v.fn(x, *args), o.reference(x, *args))
    xi = np.arange(-5, 5, dtype=np.int64)
    np.testing.assert_array_equal(v.fn(xi, np.int64(-2), np.int64(3)),
                                  o.reference(xi, np.int64(-2), np.int64(3)))


@pytest.mark.parametrize("since,axis", [(1, 1), (1, 2), (1, 0), (1, -1), (13, -1), (13, 1)])
def test_softmax(since, axis):
    x = rand(2, 3, 4, seed=29) * 5
    o, v = variant("Softmax", "softmax.torch", since)
    close(v.fn(x, axis=axis), o.reference(x, axis=axis))


def test_concat_transpose_and_views():
    xs = [rand(2, 3, 4, seed=s) for s in range(3)]
    o, v = variant("Concat", "concat.torch")
    for axis in (0, 1, -1):
        want = o.reference(*xs, axis=axis)
        close(v.fn(*xs, axis=axis), want)
        out = np.empty_like(want)
        assert v.fn(*xs, axis=axis, out=out) is out
        close(out, want)
    o, v = variant("Transpose", "transpose.torch")
    for perm in ([0, 2, 1], None):
        got = v.fn(xs[0], perm=perm)
        assert got.flags.c_contiguous
        close(got, o.reference(xs[0], perm=perm))
    ints = np.arange(6, dtype=np.int64)
    np.testing.assert_array_equal(
        variant("Concat", "concat.torch")[1].fn(ints, ints, axis=0), np.concatenate([ints, ints])
    )


@pytest.mark.parametrize("shape,perm,gather", [
    ((2, 5, 6, 4, 7), [0, 1, 2, 4, 3], True),  # channel shuffle: gathered via a cached index
    ((4, 8, 3, 5, 2), [0, 1, 4, 2, 3], True),  # a 3-axis trailing block
    ((1, 3, 10, 12), [0, 2, 3, 1], False),     # NCHW -> NHWC: torch's permuted copy
    ((3, 1, 5, 1), [0, 3, 2, 1], False),       # moves unit axes only: still a fresh array
    ((2, 3), [0, 1], False),                   # identity
])
def test_transpose_paths_agree_with_the_reference_and_never_alias(shape, perm, gather):
    x = rand(*shape, seed=31)
    x.flags.writeable = False
    o, v = variant("Transpose", "transpose.torch")
    got = v.fn(x, perm=perm)
    np.testing.assert_array_equal(got, o.reference(x, perm=perm))
    assert got.flags.c_contiguous and not np.shares_memory(got, x)
    assert (tp._inner_gather(shape, perm) is not None) == gather


@pytest.mark.parametrize("min_cin", [1, 8])
def test_few_input_channels_and_the_packed_convolution(min_cin, monkeypatch):
    # RGB stems and depthwise convolutions take the packed kernel from _PACK_MIN_CIN input
    # channels per group on; either way the results match the reference.
    monkeypatch.setattr(tconv_plan, "_PACK_MIN_CIN", min_cin)
    monkeypatch.setattr(tconv_plan, "_CONV_PLANS", {})
    pw = tp._POINTWISE is not None
    x3 = np.zeros((1, 32, 32, 3), np.float32)
    w3 = np.zeros((16, 3, 3, 3), np.float32)
    assert tp._conv_plan(x3, w3, {"pads": [1, 1, 1, 1]}, True).packed == (pw and min_cin <= 3)
    xd = np.zeros((1, 32, 32, 16), np.float32)
    wd = np.zeros((16, 1, 3, 3), np.float32)
    dw = {"pads": [1, 1, 1, 1], "group": 16}
    assert tp._conv_plan(xd, wd, dw, True).packed == (pw and min_cin <= 1)
    x = np.zeros((1, 32, 32, 16), np.float32)
    w = np.zeros((16, 16, 3, 3), np.float32)
    assert tp._conv_plan(x, w, {"pads": [1, 1, 1, 1]}, True).packed == pw
    b = rand(16, seed=5)
    o, v = variant("Conv", "conv.torch.nhwc")
    for xx, ww, attrs in (
        (rand(1, 3, 9, 9, seed=6), w3 + rand(16, 3, 3, 3, seed=8), {"pads": [1, 1, 1, 1]}),
        (rand(1, 16, 9, 9, seed=7), wd + rand(16, 1, 3, 3, seed=9), dict(dw, strides=[2, 2])),
        (rand(1, 16, 9, 9, seed=7), w + 1, {"pads": [1, 1, 1, 1]}),
    ):
        mark_constant(ww)
        close(nchw(v.fn(nhwc(xx), ww, b, **attrs)), o.reference(xx, ww, b, **attrs))


# ------------------------------------------------------------------------ fused ops


def _fused_present(op_type):
    if not REGISTRY.versions(op_type, "opwarden"):
        pytest.skip(f"{op_type} is not defined yet")


ACTS = [("", []), ("Relu", []), ("Clip", [0.0, 6.0]), ("Clip", [-1.0]), ("LeakyRelu", [0.1]),
        ("Sigmoid", []), ("HardSwish", []), ("Gelu", []), ("Gelu", [1.0]), ("Tanh", [])]


@pytest.mark.parametrize("act,params", ACTS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", [0, 1, 5], ids=["3x3", "asym-pads", "1x1"])
def test_fused_conv(act, params, layout, case):
    _fused_present("FusedConv")
    x, w, b, attrs = _conv_inputs(CONV_CASES[case])
    mark_constant(w)
    o, v = variant("FusedConv", f"fusedconv.torch.{layout.lower()}", domain="opwarden")
    conv = REGISTRY.versions("Conv")[-1].reference(x, w, b, **attrs)
    z = rand(*conv.shape, seed=30)
    for zz in (None, z):
        kw = dict(attrs, activation=act, activation_params=params)
        want = o.reference(x, w, b, zz, **kw)
        if layout == "NCHW":
            got = v.fn(x, w, b, zz, **kw)
        else:
            got = nchw(v.fn(nhwc(x), w, b, None if zz is None else nhwc(zz), **kw))
        close(got, want)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("nonfinite, outside", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("cin", [4, tp._BRANCH_SPLIT_MIN_C])
def test_fused_conv_branches(layout, nonfinite, outside, cin, monkeypatch):
    # Few input channels: one convolution over W with finite inputs; the reference (branch by
    # branch) otherwise, so NaN stays where the separate convolutions put it. Many (NHWC): one
    # convolution per branch, exact either way. `outside`: W has values outside the 1x1
    # branch's centre tap, which FusedConv never reads (not one convolution over W then).
    _fused_present("FusedConv")
    if cin > 4 and layout == "NHWC":
        monkeypatch.setattr(tconv, "_whole_ok", None)  # the branch-apart path never asks
    rng = np.random.default_rng(40)
    x = rng.standard_normal((1, cin, 6, 7)).astype(np.float32)
    if nonfinite:
        x[0, 1, 3, 3] = np.nan
    w = np.zeros((7, cin, 3, 3), np.float32)
    w[:3, :, 1, 1] = rng.standard_normal((3, cin))
    w[3:] = rng.standard_normal((4, cin, 3, 3))
    if outside:
        w[:3, :, 0, :] = 1.0
    mark_constant(w)
    b = rng.standard_normal(7).astype(np.float32)
    o, v = variant("FusedConv", f"fusedconv.torch.{layout.lower()}", domain="opwarden")
    kw = dict(pads=[1, 1, 1, 1], branches=[3, 1, 1, 4, 3, 3], activation="Relu")
    for bb in (b, None):
        want = o.reference(x, w, bb, None, **kw)
        got = v.fn(x, w, bb, None, **kw) if layout == "NCHW" else nchw(v.fn(nhwc(x), w, bb,
                                                                              None, **kw))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        close(np.nan_to_num(got), np.nan_to_num(want))


def _bound(op_type, kw, domain=""):
    """The NHWC variant's kernel bound to a node with these attributes (Variant.specialize)."""
    o, v = variant(op_type, f"{op_type.lower()}.torch.nhwc", domain=domain)
    assert v.specialize is not None
    return o, v, v.specialize(dict(kw))


@pytest.mark.parametrize("act,params", ACTS)
@pytest.mark.parametrize("case", [0, 1, 5], ids=["3x3", "asym-pads", "1x1"])
def test_bound_fused_conv_is_the_generic_kernel(act, params, case):
    """A node-bound FusedConv prepares on its first call and then runs the prepared plan: every
    call (first, prepared, prepared again) gives the generic kernel's result bit for bit,
    with and without the residual, NaN propagated through the activation."""
    _fused_present("FusedConv")
    x, w, b, attrs = _conv_inputs(CONV_CASES[case])
    x = x.copy()
    x.reshape(-1)[::17] = np.nan
    mark_constant(w)
    mark_constant(b)
    conv = REGISTRY.versions("Conv")[-1].reference(x, w, b, **attrs)
    z = nhwc(rand(*conv.shape, seed=30))
    kw = dict(attrs, activation=act, activation_params=params)
    for zz in (None, z):
        o, v, bound = _bound("FusedConv", kw, domain="opwarden")
        want = v.fn(nhwc(x), w, b, zz, **kw)
        ref = nhwc(o.reference(x, w, b, None if zz is None else nchw(zz), **kw))
        for _ in range(3):
            got = bound(nhwc(x), w, b, zz, **kw)
            assert got.flags.c_contiguous and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        close(np.nan_to_num(got), np.nan_to_num(ref))


def test_bound_conv_leaves_other_calls_to_the_generic_kernel():
    """Another input shape, other weights, a strided or read-only input, a missing residual:
    each call's result is the generic kernel's (a new shape or weights prepare again)."""
    x, w, b, attrs = _conv_inputs(CONV_CASES[0])
    mark_constant(w)
    mark_constant(b)
    o, v, bound = _bound("Conv", attrs)
    xs = nhwc(x)
    np.testing.assert_array_equal(bound(xs, w, b, **attrs), v.fn(xs, w, b, **attrs))
    wider = nhwc(rand(x.shape[0], x.shape[1], x.shape[2] + 2, x.shape[3] + 1, seed=3))
    w2 = mark_constant(w + 1)
    ro = xs.copy()
    ro.flags.writeable = False
    # a channel slice of a wider NHWC map (a Split's output): not C-contiguous
    strided = np.concatenate([xs, xs[..., :1]], axis=-1)[..., : xs.shape[-1]]
    for xx, ww in ((xs, w), (wider, w), (xs, w2), (xs, w), (ro, w), (strided, w), (xs, w)):
        got = bound(xx, ww, b, **attrs)
        np.testing.assert_array_equal(got, v.fn(xx, ww, b, **attrs))
        close(nchw(got), o.reference(nchw(xx), ww, b, **attrs))
    fo, fv, fused = _bound("FusedConv", dict(attrs, activation="Relu"), domain="opwarden")
    z = np.ones((1, 3, 4, 5), np.float32)
    want = fv.fn(xs, w, b, None, **attrs, activation="Relu")
    fused(xs, w, b, None, **attrs, activation="Relu")  # prepared without a residual
    with pytest.raises(KernelError, match="residual Z"):
        fused(xs, w, b, z, **attrs, activation="Relu")  # the generic kernel's check
    np.testing.assert_array_equal(fused(xs, w, b, None, **attrs, activation="Relu"), want)


@pytest.mark.parametrize("kind", ["grouped-1x1", "depthwise-shuffled", "branches", "branches-1x1"])
def test_bound_fused_conv_paths(kind):
    """The prepared GEMM (grouped), the folded channel shuffle and the branches-apart paths
    give the generic kernel's results on every call, and the reference's."""
    _fused_present("FusedConv")
    rng = np.random.default_rng(41)
    c = tp._BRANCH_SPLIT_MIN_C
    x = rng.standard_normal((1, 12, 12, 2 * c)).astype(np.float32)
    if kind == "grouped-1x1":
        w = rng.standard_normal((4 * c, c // 2, 1, 1)).astype(np.float32)
        kw = dict(group=4, activation="Relu")
    elif kind == "depthwise-shuffled":
        w = rng.standard_normal((2 * c, 1, 3, 3)).astype(np.float32)
        kw = dict(group=2 * c, pads=[1, 1, 1, 1], input_shuffle=4, activation="")
    else:
        w = np.zeros((24, 2 * c, 3, 3), np.float32)
        w[:8, :, 1, 1] = rng.standard_normal((8, 2 * c))
        w[8:] = rng.standard_normal((16, 2 * c, 3, 3))
        kw = dict(pads=[1, 1, 1, 1], branches=[8, 1, 1, 16, 3, 3], activation="Relu")
        if kind == "branches-1x1":
            kw["branches"] = [8, 1, 1, 16, 1, 1]
            w = np.ascontiguousarray(w[:, :, 1:2, 1:2])
            kw["pads"] = [0, 0, 0, 0]
    mark_constant(w)
    b = mark_constant(rng.standard_normal(w.shape[0]).astype(np.float32))
    o, v, bound = _bound("FusedConv", kw, domain="opwarden")
    want = v.fn(x, w, b, None, **kw)
    close(nchw(want), o.reference(nchw(x), w, b, None, **kw))
    for _ in range(3):
        np.testing.assert_array_equal(bound(x, w, b, None, **kw), want)


def test_fused_conv_rejects_a_wrong_residual():
    _fused_present("FusedConv")
    x, w, b, attrs = _conv_inputs(CONV_CASES[0])
    _, v = variant("FusedConv", "fusedconv.torch.nhwc", domain="opwarden")
    with pytest.raises(KernelError, match="residual Z"):
        v.fn(nhwc(x), w, b, rand(1, 2, 3, 4), **attrs)


@pytest.mark.parametrize("act,params", ACTS[:4])
def test_fused_gemm_and_matmul(act, params):
    _fused_present("FusedGemm")
    a, b, c = rand(4, 3, seed=31), rand(6, 3, seed=32), rand(6, seed=33)
    o, v = variant("FusedGemm", "fusedgemm.torch", domain="opwarden")
    kw = dict(transB=1, alpha=0.5, beta=2.0, activation=act, activation_params=params)
    close(v.fn(a, b, c, **kw), o.reference(a, b, c, **kw))
    o, v = variant("FusedMatMul", "fusedmatmul.torch", domain="opwarden")
    a3 = rand(2, 4, 3, seed=34)
    bt = np.ascontiguousarray(b.T)
    for cc in (None, c):
        kw = dict(activation=act, activation_params=params)
        close(v.fn(a3, bt, cc, **kw), o.reference(a3, bt, cc, **kw))


# ------------------------------------------------------------------- whole models


def _providers(monkeypatch):
    from opwarden import session

    try:
        session.normalize_providers(["torch", "cpu"])
    except OptionsError:  # the session does not know devices yet: name ours
        monkeypatch.setitem(session._PROVIDER_ALIASES, "torch", "torch")
    return ["torch", "cpu"]


@pytest.mark.parametrize("name", zoo.LIGHT_MODELS)
def test_light_models_on_torch_match_onnxruntime(name, monkeypatch):
    ort = pytest.importorskip("onnxruntime")
    model = zoo.build(name, seed=0)
    data = model.SerializeToString()
    sess = ow.InferenceSession(data, providers=_providers(monkeypatch))
    # Only what the torch device defers to the host runs there (each with its reason, or for
    # the input's layout conversion the inserted node's), and no copies: both hold host arrays.
    for p in sess.placements:
        assert p.node.op_type != "DeviceCopy"
        if p.device != "torch":
            assert tp._defers(p.node) is not None, f"{name}: {p.node.label} on {p.device}"
            assert p.inserted or p.reason.startswith("deferred to cpu: "), p.reason
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    peer = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    feeds = zoo.feeds_for(model, seed=1)
    first = sess.run(None, feeds)
    for g, w in zip(first, peer.run(None, feeds)):
        assert g.shape == w.shape and g.dtype == w.dtype
        tol = 1e-3 * np.abs(w).max() + 1e-5
        err = np.abs(g - w).max()
        assert err <= tol, f"{name}: max|torch-ort| = {err:.3g} > {tol:.3g}"
    # Later runs take the node-bound kernels' prepared plans: the same results, bit for bit.
    for g, f in zip(sess.run(None, feeds), first):
        np.testing.assert_array_equal(g, f)


def test_configure_sets_threads():
    tp.configure(3)
    assert torch.get_num_threads() == 3
    tp.configure(0)  # 0: leave torch's choice alone
    assert torch.get_num_threads() == 3


# ------------------------------------------------------------- thread count per op


def test_small_work_runs_on_one_thread_and_restores_the_count():
    torch.set_num_threads(2)
    seen = []
    with tp._Mode(True):
        seen.append(torch.get_num_threads())
        assert torch.is_inference_mode_enabled()
    with tp._Mode(False):
        seen.append(torch.get_num_threads())
    assert seen == [1, 2] and torch.get_num_threads() == 2
    assert not torch.is_inference_mode_enabled()
    with pytest.raises(KernelError), tp._Mode(True):
        raise KernelError("inside")
    assert torch.get_num_threads() == 2 and not torch.is_inference_mode_enabled()


def test_conv_plan_counts_flops_and_picks_the_gemm_only_below_its_bound():
    x = np.zeros((1, 13, 13, 64), np.float32)
    w = np.zeros((256, 64, 3, 3), np.float32)
    plan = tp._conv_plan(x, w, {"pads": [1, 1, 1, 1]}, True)
    assert plan.flops == 2 * 13 * 13 * 256 * 64 * 9 and not plan.gemm
    w1 = np.zeros((16, 64, 1, 1), np.float32)
    assert tp._conv_plan(x, w1, {}, True).gemm  # 2.2 MFLOP: one GEMM
    big = np.zeros((1, 56, 56, 256), np.float32)
    w2 = np.zeros((512, 256, 1, 1), np.float32)
    p2 = tp._conv_plan(big, w2, {}, True)
    assert p2.flops >= tp._GEMM_MAX_FLOPS and p2.gemm == (not p2.packed)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape,wshape", [
    ((1, 8, 9, 9), (16, 8, 3, 3)),      # tiny: serial under passive waiting, packed 3x3
    ((1, 64, 30, 30), (128, 64, 3, 3)),  # ~80 MFLOP: parallel, packed 3x3
    ((1, 32, 20, 20), (48, 32, 1, 1)),  # GEMM 1x1
    ((1, 256, 28, 28), (128, 256, 1, 1)),  # parallel oneDNN 1x1
])
def test_fused_conv_same_on_either_side_of_the_serial_bound(threads, shape, wshape, monkeypatch):
    _fused_present("FusedConv")
    monkeypatch.setattr(tconv, "_SERIAL_FLOPS", 40e6)  # the passive-waiting bound
    torch.set_num_threads(threads)
    x, w, b = rand(*shape, seed=40), rand(*wshape, seed=41), rand(wshape[0], seed=42)
    mark_constant(w)
    mark_constant(b)
    k = wshape[-1]
    attrs = dict(pads=[k // 2] * 4, strides=[1, 1], group=1)
    o, v = variant("FusedConv", "fusedconv.torch.nhwc", domain="opwarden")
    z = rand(shape[0], wshape[0], *shape[2:], seed=43)
    for zz in (None, z):
        kw = dict(attrs, activation="Relu", activation_params=[])
        want = o.reference(x, w, b, zz, **kw)
        got = nchw(v.fn(nhwc(x), w, b, None if zz is None else nhwc(zz), **kw))
        close(got, want)
        assert torch.get_num_threads() == threads


@pytest.mark.parametrize(
    "program,shapes",
    [
        ("t0=mul(x0,x1);t1=add(t0,x2);t2=relu(t1)", [(2, 5, 4, 3), (3,), (3,)]),
        ("t0=add(x0,x1);t1=clip(t0,0.0,6.0)", [(2, 3, 4), (2, 3, 4)]),
        ("t0=sigmoid(x0);t1=mul(x0,t0);t2=sub(t1,x1)", [(4, 6), (6,)]),
        ("t0=mul(x1,x0);t1=max(x0,t0);t2=hardswish(t1);t3=leakyrelu(t2,0.2)", [(3, 4), (3, 4)]),
        ("t0=abs(x0);t1=add(t0,t0);t2=sqrt(t1);t3=log(t2);t4=exp(t3);t5=reciprocal(t4);"
         "t6=neg(t5);t7=tanh(t6);t8=hardsigmoid(t7,0.3,0.4);t9=div(t8,x0);t10=min(t9,x0)",
         [(5, 7)]),
        ("t0=relu(x0)", [(3, 3)]),
        # mul + add as one addcmul: the product added from either side, broadcast both ways
        ("t0=mul(x0,x1);t1=add(x2,t0);t2=relu(t1)", [(4, 1), (1, 5), (4, 5)]),
        # ... but not when the product is read again
        ("t0=mul(x0,x1);t1=add(t0,x2);t2=add(t1,t0)", [(2, 3), (3,), (2, 3)]),
    ],
)
def test_fused_elementwise(program, shapes):
    _fused_present("FusedElementwise")
    xs = [rand(*s, seed=40 + i) for i, s in enumerate(shapes)]
    o, v = variant("FusedElementwise", "fusedelementwise.torch", domain="opwarden")
    got = v.fn(*xs, program=program)
    close(got, o.reference(*xs, program=program))
    assert all(got is not x for x in xs)


def test_fused_elementwise_bad_program_is_the_references_error():
    _fused_present("FusedElementwise")
    _, v = variant("FusedElementwise", "fusedelementwise.torch", domain="opwarden")
    with pytest.raises(KernelError, match="unknown op"):
        v.fn(rand(2), program="t0=frobnicate(x0)")


# ------------------------------------------------------------- waiting policy, deferral


POOLS = ["AveragePool", "Concat", "GlobalAveragePool", "GlobalMaxPool", "LRN", "MaxPool"]


@pytest.mark.parametrize("env,spin,serial,deferred", [
    ({}, "30000", 0.0, ["LRN"]),
    ({"OMP_WAIT_POLICY": "PASSIVE"}, None, 40e6, POOLS),
    ({"GOMP_SPINCOUNT": "0"}, "0", 40e6, POOLS),
    ({"GOMP_SPINCOUNT": "5000"}, "5000", 0.0, ["LRN"]),
])
def test_openmp_waiting_defaults_to_a_short_spin_and_user_settings_win(env, spin, serial,
                                                                       deferred):
    import json
    import os
    import subprocess
    import sys

    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    code = (
        "import json, os; from opwarden.kernels.torch import provider as tp; "
        "print(json.dumps([os.environ.get('GOMP_SPINCOUNT'), tp._SERIAL_FLOPS, "
        "sorted(tp._HOST_FASTER)]))"
    )
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, check=True,
                         capture_output=True, text=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [spin, serial, deferred]


def _conv_lrn_conv():
    from onnx import TensorProto, helper, numpy_helper

    w1 = numpy_helper.from_array(rand(16, 8, 3, 3, seed=60), "w1")
    w2 = numpy_helper.from_array(rand(8, 16, 3, 3, seed=61), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("LRN", ["r"], ["p"], size=3),
        helper.make_node("Conv", ["p", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12, 12])], [w1, w2],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_torch_defers_what_the_host_runs_faster_with_no_copies_or_transposes(monkeypatch):
    model = _conv_lrn_conv()
    x = rand(1, 8, 12, 12, seed=62)
    want = ow.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    sess = ow.InferenceSession(model.SerializeToString(), providers=_providers(monkeypatch))
    by_op = {p.node.op_type: p for p in sess.placements if not p.inserted}
    assert by_op["LRN"].device == "cpu"
    assert by_op["LRN"].reason == "deferred to cpu: " + tp._HOST_FASTER["LRN"]
    assert by_op["LRN"].layout == "NHWC"
    assert "DeviceCopy" not in by_op  # host arrays on both sides: no copies
    assert {p.device for p in sess.placements if p.node.op_type == "FusedConv"} == {"torch"}
    # NHWC from the input conversion to the output conversion: no transposes at the copies.
    assert sum(p.node.op_type == "Transpose" for p in sess.placements) <= 2
    close(sess.run(None, {"x": x})[0], want)
    # With no host device after it in the list, torch keeps the node.
    alone = ow.InferenceSession(model.SerializeToString(), providers=["torch"])
    assert {p.device for p in alone.placements if p.node.op_type == "LRN"} == {"torch"}
    close(alone.run(None, {"x": x})[0], want)


def test_channel_shuffle_and_a_folded_input_shuffle_on_torch():
    _fused_present("ChannelShuffle")
    x = rand(1, 6, 5, 12, seed=70)  # NHWC
    o, v = variant("ChannelShuffle", "channelshuffle.torch", domain="opwarden")
    out = np.empty_like(x)
    assert v.fn(x, group=3, out=out) is out
    close(out, o.reference(x, group=3))
    # A depthwise FusedConv carrying the shuffle (the layout pass folds it there).
    w, b = rand(12, 1, 3, 3, seed=71), rand(12, seed=72)
    mark_constant(w)
    kw = dict(pads=[1, 1, 1, 1], group=12, activation="Relu", activation_params=[])
    of, vf = variant("FusedConv", "fusedconv.torch.nhwc", domain="opwarden")
    want = of.reference(nchw(x), w, b, None, input_shuffle=3, **kw)
    close(nchw(vf.fn(x, w, b, None, input_shuffle=3, **kw)), want)


def test_mul_then_add_compiles_to_one_addcmul_only_when_the_product_dies():
    _fused_present("FusedElementwise")
    from opwarden.ops.fused_elementwise import parse_program

    plan = tp._ew_compile("t0=mul(x0,x1);t1=add(x2,t0);t2=relu(t1)", parse_program)
    assert [(p[0], p[1]) for p in plan[:1]] == [("t1", torch.addcmul)] and len(plan) == 2
    assert plan[0][3] == ("x2", "x0", "x1")
    kept = tp._ew_compile("t0=mul(x0,x1);t1=add(t0,x2);t2=add(t1,t0)", parse_program)
    assert all(p[1] is not torch.addcmul for p in kept) and len(kept) == 3


@pytest.mark.parametrize("const", [True, False])
@pytest.mark.parametrize("hw", [(7, 6), (12, 13)])  # under / over _GROUPED_OUT_MIN_ROWS pixels
def test_grouped_pointwise_conv_is_one_batched_gemm(const, hw):
    _fused_present("FusedConv")
    assert 7 * 6 < tp._GROUPED_OUT_MIN_ROWS <= 12 * 13  # both paths are covered
    x, w, b = rand(1, 24, *hw, seed=80), rand(32, 6, 1, 1, seed=81), rand(32, seed=82)
    z = rand(1, 32, *hw, seed=83)
    if const:
        mark_constant(w)
    plan = tp._conv_plan(nhwc(x), w, {"group": 4}, True)
    assert plan.gemm and plan.groups == 4
    o, v = variant("FusedConv", "fusedconv.torch.nhwc", domain="opwarden")
    for bb, zz in ((b, None), (None, z), (b, z)):
        kw = dict(group=4, activation="Relu", activation_params=[])
        want = o.reference(x, w, bb, zz, **kw)
        close(nchw(v.fn(nhwc(x), w, bb, None if zz is None else nhwc(zz), **kw)), want)
    oc, vc = variant("Conv", "conv.torch.nhwc")
    close(nchw(vc.fn(nhwc(x), w, b, group=4)), oc.reference(x, w, b, group=4))


@pytest.mark.parametrize("act,params", [("Relu", []), ("Clip", [0.0, 6.0])])
@pytest.mark.parametrize("residual", [False, True])
def test_packed_conv_propagates_nan_through_fused_relu_and_clip(act, params, residual):
    # oneDNN's fused relu / clip turn NaN into 0 / a bound; FusedConv's contract propagates
    # it, so a non-finite input takes the unfused activation.
    _fused_present("FusedConv")
    x, w, b = rand(1, 16, 6, 7, seed=90), rand(8, 16, 3, 3, seed=91), rand(8, seed=92)
    z = rand(1, 8, 6, 7, seed=93) if residual else None
    mark_constant(w)
    o, v = variant("FusedConv", "fusedconv.torch.nhwc", domain="opwarden")
    kw = dict(pads=[1, 1, 1, 1], activation=act, activation_params=params)
    for bad in ("x", "z") if residual else ("x",):
        xx, zz = x.copy(), None if z is None else z.copy()
        (xx if bad == "x" else zz)[0, 1, 3, 3] = np.nan
        want = o.reference(xx, w, b, zz, **kw)
        got = nchw(v.fn(nhwc(xx), w, b, None if zz is None else nhwc(zz), **kw))
        assert np.isnan(want).any()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        close(np.nan_to_num(got), np.nan_to_num(want))


@pytest.mark.parametrize("shape,g", [((1, 56, 56, 112), 4), ((1, 28, 28, 136), 4),
                                     ((2, 7, 7, 12), 3), ((64, 1024), 8)])
def test_channel_shuffle_in_torch_equals_the_host_kernel(shape, g):
    """Large shuffles run as one torch copy (into the planned buffer or a fresh array), small or
    strided ones as the host kernel: the same values either way, NaN included."""
    from opwarden.kernels.cpu.shuffle import channel_shuffle

    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[::97] = np.nan
    want = channel_shuffle(x, group=g)
    np.testing.assert_array_equal(tp._channel_shuffle(x, group=g), want)
    out = np.full_like(x, 7.0)
    assert tp._channel_shuffle(x, group=g, out=out) is out
    np.testing.assert_array_equal(out, want)
    strided = np.zeros(shape[:-1] + (shape[-1] * 2,), np.float32)[..., ::2]
    strided[...] = x
    np.testing.assert_array_equal(tp._channel_shuffle(strided, group=g), want)
    with pytest.raises(KernelError, match="divisible"):
        tp._channel_shuffle(x[..., :-1], group=g)


@pytest.mark.parametrize("op", ["Conv", "opwarden::FusedConv"])
def test_convolution_samples_pass_every_check_on_torch(op):
    # Found by the samples declared constant: oneDNN's packed convolution read a strided W (the
    # reorder) and a strided bias as if they were contiguous.
    import opwarden.verify

    report = opwarden.verify.check(op, device="torch")
    assert report.ok, report.failures
    assert {v.variant for v in report.variants} >= {op.split("::")[-1].lower() + ".torch.nhwc"}


def test_check_validates_the_node_bound_kernel(monkeypatch):
    """`opwarden check` runs a variant's node-bound kernel (Variant.specialize) too, through
    a prepared call: a prepared plan that computes something else fails numerics."""
    import opwarden.verify

    _fused_present("FusedConv")
    _, v = variant("FusedConv", "fusedconv.torch.nhwc", domain="opwarden")
    assert opwarden.verify.check(v, checks=["numerics"], quick=True).ok
    real = tconv._conv_runner

    def off_by_one(*args, **kw):
        run = real(*args, **kw)
        return None if run is None else (lambda X, Z: run(X, Z) + 1.0)

    monkeypatch.setattr(tconv, "_conv_runner", off_by_one)
    report = opwarden.verify.check(v, checks=["numerics"], quick=True)
    assert not report.ok
    assert "node-bound kernel, prepared call" in str(report.failures)
