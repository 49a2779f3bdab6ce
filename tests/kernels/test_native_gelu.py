"""The compiled Gelu (native.gelu / native.erf, native/gelu.c) and its wiring: both forms
against the NumPy chunks and float64 over random, huge, tiny, NaN and infinite inputs, the
bias row in the same pass (spans starting inside a row too), threads and spans bit for bit,
bad calls refused; apply_activation's Gelu and the Gelu variants (ONNX, com.microsoft Gelu,
BiasGelu, FastGelu) on it, sessions against onnxruntime, and the NumPy variants under
OPWARDEN_NATIVE=0 (a subprocess) giving the same values within the NumPy erf's error.

Errors are counted in float32 ulps of max(|y|, |x|/2): plain ulps of y for x >= 0 (y >= x/2
there), and for x < 0, where y = x (1 + erf) / 2 is a small difference, ulps of |x|/2 (the
absolute scale the 1 + erf(.) and 1 + tanh(.) of the references round at)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow
from opwarden import native
from opwarden.errors import OpwardenError
from opwarden.kernels.cpu import blas_split, packed_gemm, util
from opwarden.ops.base import REGISTRY

DISABLED = os.environ.get("OPWARDEN_NATIVE", "1") == "0" or not native.available()
needs_native = pytest.mark.skipif(DISABLED, reason="compiled path off")
MS = "com.microsoft"

SPECIALS = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40,
                       1e-38, -1e-38, 3e38, -3e38, 1e30, -1e30, 1e10, -1e10, 5.5154, -5.5154,
                       5.52, -5.52, 6.0, -6.0, 10.0, -10.0, 30.0, -30.0, 100.0, -100.0,
                       -3.0, 3.0, -1.0, 1.0, 0.5, -0.5, 1e-7, -1e-7])


# Error bounds in ulps of max(|y|, |x|/2) (measured on 3M points: erf form 5.9 against float64
# and 6.8 against the NumPy chunks, whose own is 6.4; tanh form 2.5 and 3.0)
ULPS = {False: 8, True: 4}


def _x(shape, seed=0, scale=4.0):
    rng = np.random.default_rng(seed)
    x = np.asarray(rng.standard_normal(shape) * scale, np.float32)
    flat = x.reshape(-1)
    k = min(flat.size, SPECIALS.size)
    flat[:k] = SPECIALS[:k]
    return x


def _numpy_path(x, tanh, bias=None):
    fn, k = util.gelu_chunk(tanh)
    with np.errstate(all="ignore"):
        y = x + bias if bias is not None else x.copy()
        return util.chunked(fn, y, y, k)


_ERF = np.vectorize(math.erf, otypes=[np.float64])


def _exact(x, tanh):
    """Gelu in float64 of the float32 x (NaN where the references give NaN: -inf)."""
    d = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if tanh:
            z = math.sqrt(2 / math.pi) * (d + 0.044715 * d ** 3)
            y = d / (1 + np.exp(-2 * z))  # = d/2 (1 + tanh z), no cancellation
        else:
            y = 0.5 * d * (1 + _ERF(np.where(np.isfinite(d), d, 0) / math.sqrt(2)))
            y = np.where(np.isinf(d), d * (d > 0), y)
    return np.where(np.isneginf(d) | np.isnan(d), np.nan, y)


def _ulps(got, want, x):
    """|got - want| in float32 ulps of max(|want|, |x|/2), NaN/inf positions excluded (checked
    separately: they must agree exactly)."""
    g, w, d = (np.asarray(a, np.float64) for a in (got, want, x))
    ok = np.isfinite(w) & np.isfinite(g)
    scale = np.maximum(np.abs(w), np.abs(d) / 2)[ok]
    # ulp of a float32 of that magnitude (2^-149 for zero and the subnormals)
    ulp = np.spacing(np.minimum(scale, np.finfo(np.float32).max).astype(np.float32))
    return np.append(np.abs(g[ok] - w[ok]) / ulp.astype(np.float64), 0.0)


def _same_specials(got, want):
    """NaN where want is NaN, equal infinities, and zeros of the same sign."""
    g, w = np.asarray(got), np.asarray(want)
    assert np.array_equal(np.isnan(g), np.isnan(w))
    inf = np.isinf(w)
    assert np.array_equal(g[inf], w[inf]) and not np.isinf(g[~inf]).any()
    z = w == 0
    assert np.array_equal(np.signbit(g[z]), np.signbit(w[z])), (g[z], w[z])


@needs_native
@pytest.mark.parametrize("tanh", [False, True])
@pytest.mark.parametrize("shape", [(), (1,), (3, 37), (70, 1000), (2, 5, 3000)])
def test_values_against_numpy_path_and_float64(tanh, shape):
    x = _x(shape, seed=sum(shape))
    got = native.gelu(x, np.empty_like(x), tanh)
    ref = _numpy_path(x, tanh)
    _same_specials(got, ref)
    _same_specials(got, _exact(x, tanh).astype(np.float32))
    # the erf form shares the NumPy chunks' rational erf (FMAs here: apart by its < 8 ulps);
    # the tanh form is x sigmoid(2z), which the NumPy 1 + tanh(z) approaches to 2^-24 |x|
    assert _ulps(got, ref, x).max() <= ULPS[tanh]
    assert _ulps(got, _exact(x, tanh), x).max() <= ULPS[tanh]
    # positive inputs: plain ulps of y
    pos = np.isfinite(x) & (x > 0)
    w = _exact(x, tanh)
    assert (np.abs(got[pos] - w[pos]) / np.spacing(np.abs(w[pos]).astype(np.float32))).max(
        initial=0) <= 5


@needs_native
def test_tanh_form_keeps_the_negative_tail():
    # x sigmoid(2z) has no 1 + tanh cancellation: its tail keeps y's own relative accuracy,
    # up to the float32 z's (y's relative error ~ |2z| z's; the NumPy 1 + tanh is 15000 ulps
    # off on (-4, 0) and 1.7e8 on (-9, -4))
    x = -np.linspace(0.01, 9.5, 200_001, dtype=np.float32)
    got = native.gelu(x, np.empty_like(x), True)
    w = _exact(x, True)
    ulps = np.abs(got - w) / np.spacing(np.abs(w).astype(np.float32))
    assert ulps[x > -4].max() <= 32 and ulps.max() <= 256


@needs_native
def test_dense_grid_both_forms():
    x = np.concatenate([np.linspace(-12, 12, 400_001, dtype=np.float32),
                        np.geomspace(1e-38, 1e4, 20_001).astype(np.float32),
                        -np.geomspace(1e-38, 1e4, 20_001).astype(np.float32)])
    for tanh in (False, True):
        got = native.gelu(x, np.empty_like(x), tanh)
        assert _ulps(got, _exact(x, tanh), x).max() <= ULPS[tanh]
        assert _ulps(got, _numpy_path(x, tanh), x).max() <= ULPS[tanh]


@needs_native
def test_erf_accuracy():
    x = np.concatenate([np.linspace(-6, 6, 1_200_001, dtype=np.float32),
                        np.geomspace(1e-38, 6, 30_001).astype(np.float32)])
    x = np.concatenate([x, -x])
    got = native.erf(x, np.empty_like(x)).astype(np.float64)
    want = _ERF(x.astype(np.float64))
    assert (np.abs(got - want) / np.abs(want)).max() < 1e-6
    s = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 3.9, -3.9, 1e30, -1e30, 1e-45])
    e = native.erf(s, np.empty_like(s))
    assert np.isnan(e[0]) and e[1] == 1 and e[2] == -1 and e[5] == 1 and e[6] == -1
    assert e[3] == 0 and not np.signbit(e[3]) and np.signbit(e[4])
    assert e[7] == 1 and e[8] == -1 and abs(e[9]) <= 2e-45


@needs_native
@pytest.mark.parametrize("tanh", [False, True])
@pytest.mark.parametrize("shape", [(5, 1), (3, 37), (70, 1000), (1, 4096)])
def test_bias_row_in_one_pass(tanh, shape):
    x = _x(shape, seed=7)
    b = np.random.default_rng(8).standard_normal(shape[-1]).astype(np.float32) * 2
    got = native.gelu(x, np.empty_like(x), tanh, b)
    with np.errstate(all="ignore"):
        s = x + b  # the same float32 sum, then the same Gelu: bit for bit
    assert np.array_equal(got, native.gelu(s, np.empty_like(s), tanh), equal_nan=True)
    assert _ulps(got, _numpy_path(x, tanh, b), s).max() <= ULPS[tanh]
    # spans that start and stop inside rows (a caller sharing blocks out)
    y = np.full_like(x, 7.0)
    n = x.size
    cuts = sorted({0, n, *(int(c) for c in np.random.default_rng(9).integers(0, n, 5))})
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        native.gelu(x, y, tanh, b, span=(lo, hi))
    assert np.array_equal(y, got, equal_nan=True)
    # in place
    z = x.copy()
    assert native.gelu(z, z, tanh, b) is z
    assert np.array_equal(z, got, equal_nan=True)


@needs_native
@pytest.mark.parametrize("n", [1, 1 << 14, (1 << 16) - 1, 1 << 16, (1 << 16) + 3, 300_001])
@pytest.mark.parametrize("tanh", [False, True])
def test_threads_bit_identical_to_one(n, tanh):
    x = np.random.default_rng(n).standard_normal(n, dtype=np.float32) * 5
    x[:3] = [np.nan, np.inf, -np.inf][: min(3, n)]
    one = native.gelu(x, np.empty_like(x), tanh, n_threads=1)
    for threads in (2, 3):
        many = native.gelu(x, np.empty_like(x), tanh, n_threads=threads)
        assert np.array_equal(one, many, equal_nan=True)
    xb = x.reshape(-1, 1 if n % 3 else 3)
    b = np.linspace(-1, 1, xb.shape[1], dtype=np.float32)
    assert np.array_equal(native.gelu(xb, np.empty_like(xb), tanh, b, n_threads=1),
                          native.gelu(xb, np.empty_like(xb), tanh, b, n_threads=2),
                          equal_nan=True)


@needs_native
def test_bad_calls_raise():
    x = _x((4, 6))
    with pytest.raises(OpwardenError, match="float32"):
        native.gelu(x.astype(np.float64), np.empty((4, 6)))
    with pytest.raises(OpwardenError, match="float32"):
        native.gelu(x[:, ::2], np.empty((4, 3), np.float32))
    with pytest.raises(OpwardenError, match="values"):
        native.gelu(x, np.empty(5, np.float32))
    with pytest.raises(OpwardenError, match="overlaps"):
        native.gelu(x.reshape(-1)[1:], x.reshape(-1)[:-1])
    with pytest.raises(OpwardenError, match="bias"):
        native.gelu(x, np.empty_like(x), False, np.ones(5, np.float32))
    with pytest.raises(OpwardenError, match="bias"):
        native.gelu(x, x, False, x[0])  # the bias inside y
    with pytest.raises(OpwardenError, match="span"):
        native.gelu(x, np.empty_like(x), span=(3, 25))


# ---------------------------------------------------------------------------------------------
# The wiring: apply_activation, util.gelu_native's threads (blas_split.share), the variants.


@needs_native
@pytest.mark.parametrize("tanh", [False, True])
def test_apply_activation_runs_the_compiled_loop(monkeypatch, tanh):
    seen = []
    real = native.gelu
    monkeypatch.setattr(util.native, "gelu", lambda *a, **k: seen.append(k) or real(*a, **k))
    x = _x((40, 384), seed=3)
    want = real(x, np.empty_like(x), tanh)
    y = x.copy()
    assert util.apply_activation(y, "Gelu", [1.0] if tanh else []) is y
    assert len(seen) == 1 and np.array_equal(y, want, equal_nan=True)
    # strided: the NumPy chunks, within their erf's ulps
    view = np.repeat(x, 2, axis=1)[:, ::2]
    util.apply_activation(view, "Gelu", [1.0] if tanh else [])
    assert len(seen) == 1
    assert _ulps(view, want, x).max() <= ULPS[tanh]


@needs_native
def test_gelu_native_threads_and_split_blocks(monkeypatch):
    x = _x((300, 1000), seed=4)
    b = np.linspace(-2, 2, 1000, dtype=np.float32)
    want = native.gelu(x, np.empty_like(x), False, b)
    seen = []
    real = native.gelu
    monkeypatch.setattr(util.native, "gelu",
                        lambda *a, **k: seen.append(k.get("n_threads")) or real(*a, **k))
    monkeypatch.setattr(blas_split, "split_threads", lambda: 1)
    monkeypatch.setattr(blas_split, "blas_thread_count", lambda: 2)
    y = np.empty_like(x)
    assert util.gelu_native(x, y, False, b) and seen == [2]
    assert np.array_equal(y, want, equal_nan=True)
    # split threads: blocks of GELU_BLOCK floats (not whole rows) through over_rows
    blocks = []

    def over_rows(rows, mnk, fn):
        blocks.append(rows)
        for r0 in range(0, rows, 3):
            fn(r0, min(rows, r0 + 3))

    monkeypatch.setattr(blas_split, "split_threads", lambda: 2)
    monkeypatch.setattr(blas_split, "over_rows", over_rows)
    y = np.empty_like(x)
    assert util.gelu_native(x, y, False, b)
    assert blocks == [-(-x.size // util.GELU_BLOCK)]
    assert np.array_equal(y, want, equal_nan=True)


@needs_native
def test_gelu_native_declines():
    x = _x((8, 16))
    y = np.empty_like(x)
    assert not util.gelu_native(x[:, ::2], y[:, :8], False)
    assert not util.gelu_native(x.astype(np.float64), y, False)
    assert not util.gelu_native(x, y[:4], False)
    assert not util.gelu_native(x, y, False, np.ones(8, np.float32))  # not a row
    assert not util.gelu_native(x, y, False, np.ones((1, 16), np.float32))
    assert not util.gelu_native(x, x, False, x[0])  # bias inside y
    flat = x.reshape(-1)
    assert not util.gelu_native(flat[1:], flat[:-1], False)


def test_registered_variants():
    for op_type, domain, name in (("Gelu", "", "gelu.cpu.native"),
                                  ("Gelu", MS, "gelu.ms.cpu.native"),
                                  ("BiasGelu", MS, "biasgelu.ms.cpu.native"),
                                  ("FastGelu", MS, "fastgelu.ms.cpu.native")):
        v = {v.name: v for v in REGISTRY.latest(op_type, domain).variants}
        assert name in v and v[name].priority > v[name.replace("native", "out")].priority


@needs_native
def test_variants_direct():
    from opwarden.kernels.cpu import activation as act

    x = _x((70, 1000), seed=11)
    b = np.random.default_rng(12).standard_normal(1000).astype(np.float32)
    with np.errstate(all="ignore"):
        s = x + b
    g = native.gelu(x, np.empty_like(x), False)
    out = np.empty_like(x)
    assert act.native_onnx_gelu(x, out=out) is out and np.array_equal(out, g, equal_nan=True)
    t = act.native_onnx_gelu(x, approximate="tanh")
    assert np.array_equal(t, native.gelu(x, np.empty_like(x), True), equal_nan=True)
    assert np.array_equal(act.native_ms_gelu(x), g, equal_nan=True)
    bg = native.gelu(s, np.empty_like(s), False)
    assert np.array_equal(act.native_bias_gelu(x, b), bg, equal_nan=True)
    y = x.copy()
    assert act.native_bias_gelu(y, b, out=y) is y and np.array_equal(y, bg, equal_nan=True)
    assert np.array_equal(act.native_fast_gelu(x, b), native.gelu(s, np.empty_like(s), True),
                          equal_nan=True)
    # what the loop does not take goes to the NumPy kernels (and their reference's errors)
    with pytest.raises(OpwardenError, match="bias"):
        act.native_bias_gelu(x[:6, :6], np.ones((6, 6), np.float32))
    sx = np.repeat(x, 2, axis=1)[:, ::2]
    assert _ulps(act.native_ms_gelu(sx), g, x).max() <= ULPS[False]


# ---------------------------------------------------------------------------------------------
# Sessions: against onnxruntime, and the NumPy variants with the extension off.


def _gelu_models():
    """name -> (model, the variant it runs, its Gelu's float32 input from x)."""
    rng = np.random.default_rng(13)
    d = 384
    b = rng.standard_normal(d).astype(np.float32)
    w = (rng.standard_normal((d, d)) * 0.05).astype(np.float32)
    bias, wt = numpy_helper.from_array(b, "b"), numpy_helper.from_array(w, "w")
    xin = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 50, d])]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]

    def model(nodes, inits, ms):
        g = helper.make_graph(nodes, "g", xin, out, inits)
        ops = [helper.make_opsetid("", 20)] + ([helper.make_opsetid(MS, 1)] if ms else [])
        m = helper.make_model(g, opset_imports=ops)
        m.ir_version = 9
        return m.SerializeToString()

    def same(x):
        return x

    def plus_b(x):
        with np.errstate(all="ignore"):
            return x + b

    def affine(x):
        with np.errstate(all="ignore"):
            return x @ w + b

    return {
        "Gelu": (model([helper.make_node("Gelu", ["x"], ["y"])], [], False),
                 "gelu.cpu.native", same),
        "Gelu-tanh": (model([helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")], [],
                            False), "gelu.cpu.native", same),
        "ms-Gelu": (model([helper.make_node("Gelu", ["x"], ["y"], domain=MS)], [], True),
                    "gelu.ms.cpu.native", same),
        "BiasGelu": (model([helper.make_node("BiasGelu", ["x", "b"], ["y"], domain=MS)],
                           [bias], True), "biasgelu.ms.cpu.native", plus_b),
        "FastGelu": (model([helper.make_node("FastGelu", ["x", "b"], ["y"], domain=MS)],
                           [bias], True), "fastgelu.ms.cpu.native", plus_b),
        "MatMul-Add-Gelu": (model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                                   helper.make_node("Add", ["m", "b"], ["a"]),
                                   helper.make_node("Gelu", ["a"], ["y"])], [wt, bias], False),
                            None, affine),
    }


def _feed():
    x = (np.random.default_rng(14).standard_normal((2, 50, 384)) * 3).astype(np.float32)
    x.reshape(-1)[:7] = [np.nan, np.inf, 0.0, -0.0, 40.0, -40.0, 1e-30]
    return {"x": x}


@pytest.mark.parametrize("name", list(_gelu_models()))
def test_session_agrees_with_ort(name):
    ort = pytest.importorskip("onnxruntime")
    data, variant, pre = _gelu_models()[name]
    feed = _feed()
    sess = ow.InferenceSession(data)
    got = sess.run(None, feed)[0]
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    _same_specials(got, want)
    if "MatMul" in name:  # (two GEMMs' roundings apart before the Gelu)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    else:  # ORT's MLAS erf and tanh are float32 approximations of their own
        assert _ulps(got, want, pre(feed["x"])).max() <= ORT_ULPS, name
    if variant is not None:
        used = [r["variant"] for r in sess.explain()]
        assert (variant if not DISABLED else variant.replace("native", "out")) in used, used


ORT_ULPS = 8  # (measured: 5.0 erf form, 3.4 tanh form)


def test_numpy_variants_when_disabled(tmp_path):
    """OPWARDEN_NATIVE=0: the sessions take the NumPy variants, whose values are the
    compiled ones within the NumPy erf's few ulps (written here by a subprocess)."""
    code = (
        "import sys, numpy as np, opwarden as ow\n"
        "from opwarden import native\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from test_native_gelu import _feed, _gelu_models\n"
        "for name, (data, _, _) in _gelu_models().items():\n"
        "    s = ow.InferenceSession(data)\n"
        "    np.save(f'{sys.argv[2]}/{name}.npy', s.run(None, _feed())[0])\n"
        "    print(name, sorted({r['variant'] for r in s.explain()}))\n"
        "print(native.status()['active'])\n"
    )
    env = dict(os.environ, OPWARDEN_NATIVE="0")
    out = subprocess.run([sys.executable, "-c", code, os.path.dirname(__file__), str(tmp_path)],
                         capture_output=True, text=True, env=env, check=True,
                         timeout=300).stdout
    assert out.rstrip().endswith("numpy") and ".native" not in out, out
    for name, (data, _, pre) in _gelu_models().items():
        theirs = np.load(tmp_path / f"{name}.npy")
        ours = ow.InferenceSession(data).run(None, _feed())[0]
        _same_specials(ours, theirs)
        if "MatMul" in name and packed_gemm.available():
            # (the compiled packed GEMM and OpenBLAS round the product apart before the Gelu)
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
        else:
            assert _ulps(ours, theirs, pre(_feed()["x"])).max() <= ULPS[False], name


@needs_native
def test_erf_variant_is_native_and_falls_back():
    """erf.cpu.native runs native.erf on contiguous float32 (into the planned buffer or in
    place), and the NumPy kernel on anything else, with the same results within 1e-6."""
    from opwarden.kernels.cpu.activation import native_erf
    from opwarden.kernels.cpu.elementwise import erf as numpy_erf

    x = np.random.default_rng(3).standard_normal((130, 3072)).astype(np.float32) * 3
    want = _ERF(x.astype(np.float64))
    out = np.empty_like(x)
    got = native_erf(x, out=out)
    assert got is out and np.abs(got - want).max() < 2e-6
    y = x.copy()
    assert native_erf(y, out=y) is y and np.array_equal(y, got)
    strided = x[:, ::2]
    np.testing.assert_allclose(native_erf(strided), numpy_erf(strided), rtol=0, atol=2e-6)
    assert native_erf(x.astype(np.float64)).dtype == np.float64  # (the NumPy kernel's)
    sess = ow.InferenceSession(_erf_model())
    assert [p.variant.name for p in sess.placements] == ["erf.cpu.native"]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=0, atol=2e-6)


def _erf_model() -> bytes:
    g = helper.make_graph([helper.make_node("Erf", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3072])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3072])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()
