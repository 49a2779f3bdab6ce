"""The compiled float32 <-> float16 conversion (native.cast_f16, native/cast.c) and its
variants: every path this CPU has (scalar, F16C, AVX512F) bit for bit against NumPy's astype
on all 65536 float16 patterns and a float32 sweep (every sign/exponent/top-10-mantissa with
the rounding ties and their neighbours in the dropped bits, the subnormal-half exponents with
every tie position, overflow, infinities, quiet and signalling NaNs); spans and threads;
bad calls refused; cast.cpu.native (strided inputs, the planned buffer, other casts falling
back) and layernormalization.cpu.half, in sessions against onnxruntime, and under
OPWARDEN_NATIVE=0 (a subprocess) the reference with the same bits."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow
from opwarden import native
from opwarden.errors import OpwardenError
from opwarden.kernels.cpu import cast as cast_kernel
from opwarden.kernels.cpu import norm
from opwarden.ops.base import REGISTRY, Sample
from opwarden.ops.cast import cast_array

DISABLED = os.environ.get("OPWARDEN_NATIVE", "1") == "0" or not native.available()
needs_native = pytest.mark.skipif(DISABLED, reason="compiled path off")
ISAS = list(range(native.cast_f16_isa() + 1)) if not DISABLED else []

ALL_F16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
SPECIAL_BITS = np.array([
    0x00000000, 0x80000000, 0x3f800000, 0x477fe000, 0x477fefff, 0x477ff000, 0x477ff001,
    0x47800000, 0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001,
    0x7f800001, 0xff800001, 0x7fa00000, 0x7f801fff, 0x7f802000, 0x7fffffff, 0x38800000,
    0x387fffff, 0x387ff000, 0x387fefff, 0x33800000, 0x33000000, 0x33000001, 0x32ffffff,
    0x00000001, 0x807fffff, 0x3f801000, 0x3f803000, 0x3f801001, 0x38801000, 0xb3c00000,
], np.uint32)


def _astype(x, dt):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (overflow to inf)
        return x.astype(dt)


def _f32_sweep() -> np.ndarray:
    """float32 bit patterns: every (sign, exponent, top 10 mantissa bits) with dropped-bit
    patterns at and around the tie; the exponents whose half is subnormal (or just normal)
    with the tie at each shift position, its neighbours, and random mantissas; specials."""
    hi = np.arange(1 << 19, dtype=np.uint32) << 13
    low = np.array([0, 1, 0x7ff, 0x800, 0xfff, 0x1000, 0x1001, 0x17ff, 0x1800, 0x1fff],
                   np.uint32)
    parts = [(hi[:, None] | low[None, :]).reshape(-1)]
    rng = np.random.default_rng(0)
    for e in range(98, 115):
        for sign in (0, 0x80000000):
            base = np.uint32(sign | (e << 23))
            ties = []
            for k in range(24):
                t = 1 << k
                ties += [t, t - 1, t + 1, t | (1 << min(k + 1, 22)), (t << 1) - 1]
            m = np.array([v & 0x7fffff for v in ties], np.uint32)
            r = rng.integers(0, 1 << 23, 4096, dtype=np.uint32)
            parts.append(base | np.concatenate([m, r]))
    parts.append(SPECIAL_BITS)
    parts.append(rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32))
    return np.concatenate(parts)


@pytest.fixture(scope="module")
def sweep():
    return _f32_sweep().view(np.float32)


def _bits_equal(a, b) -> bool:
    width = np.uint16 if a.dtype == np.float16 else np.uint32
    return a.dtype == b.dtype and np.array_equal(a.view(width), b.view(width))


# ---------------------------------------------------------------- the compiled loop ----------

@needs_native
@pytest.mark.parametrize("isa", ISAS)
def test_f16_to_f32_every_pattern(isa):
    y = native.cast_f16(ALL_F16, np.empty(65536, np.float32), isa=isa)
    assert _bits_equal(y, _astype(ALL_F16, np.float32))


@needs_native
@pytest.mark.parametrize("isa", ISAS)
def test_f32_to_f16_sweep(isa, sweep):
    y = native.cast_f16(sweep, np.empty(sweep.size, np.float16), isa=isa)
    want = _astype(sweep, np.float16)
    bad = np.flatnonzero(y.view(np.uint16) != want.view(np.uint16))
    assert bad.size == 0, [(hex(int(sweep.view(np.uint32)[i])), hex(int(y.view(np.uint16)[i])),
                            hex(int(want.view(np.uint16)[i]))) for i in bad[:5]]


@needs_native
def test_specials_by_value():
    """The cases that matter, spelled out: ties to even, overflow, subnormals, -0, NaNs."""
    f = np.array([65504.0, 65519.99, 65520.0, -65520.0, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0001,
                  2.0**-14, 2.0**-14 * (1 - 2.0**-11), 1 + 2.0**-11, 1 + 3 * 2.0**-11, -0.0,
                  np.inf, -np.inf, 1e-40] + [0.0] * 9, np.float32)
    h = native.cast_f16(f, np.empty(f.size, np.float16))
    want = [0x7bff, 0x7bff, 0x7c00, 0xfc00, 0x0001, 0x0000, 0x0001, 0x0400, 0x0400, 0x3c00,
            0x3c02, 0x8000, 0x7c00, 0xfc00, 0x0000]
    assert [int(v) for v in h.view(np.uint16)[:15]] == want
    # NaN payloads as NumPy moves them: the top 10 bits, 0x7c01 where they are all zero (a
    # signalling NaN stays one), and back shifted up without the quiet bit
    nan = np.array([0x7f800001, 0xffc00000, 0x7fa00000, 0x7f802000], np.uint32)
    got = native.cast_f16(nan.view(np.float32), np.empty(4, np.float16)).view(np.uint16)
    assert [hex(v) for v in got] == ["0x7c01", "0xfe00", "0x7d00", "0x7c01"]
    back = native.cast_f16(got.view(np.float16), np.empty(4, np.float32)).view(np.uint32)
    assert [hex(v) for v in back] == ["0x7f802000", "0xffc00000", "0x7fa00000", "0x7f802000"]


@needs_native
@pytest.mark.parametrize("to_half", [True, False])
def test_spans_threads_and_tails(to_half, sweep):
    """Threads, spans and the vector tails change no bit."""
    x = sweep[: (1 << 18) + 13] if to_half else np.resize(ALL_F16, (1 << 18) + 13)
    dt = np.float16 if to_half else np.float32
    want = _astype(x, dt)
    assert _bits_equal(native.cast_f16(x, np.empty(x.size, dt), n_threads=2), want)
    y = np.zeros(x.size, dt)
    for a, b in [(0, 7), (7, 5000), (5000, 70001), (70001, x.size)]:
        native.cast_f16(x, y, span=(a, b))
    assert _bits_equal(y, want)
    for n in range(0, 40):
        assert _bits_equal(native.cast_f16(x[:n], np.empty(n, dt)), want[:n])


@needs_native
def test_bad_calls_refused():
    x = np.ones(10, np.float32)
    for args in [(x, np.empty(10, np.float64)), (x, np.empty(9, np.float16)),
                 (x[::2], np.empty(5, np.float16)), (x.astype(np.float16), np.empty(10, np.int16)),
                 (x, x.view(np.float16)[:10])]:
        with pytest.raises(OpwardenError):
            native.cast_f16(*args)
    with pytest.raises(OpwardenError):
        native.cast_f16(x, np.empty(10, np.float16), span=(3, 11))
    ro = np.empty(10, np.float16)
    ro.flags.writeable = False
    with pytest.raises(OpwardenError):
        native.cast_f16(x, ro)


# ---------------------------------------------------------------- the variants ---------------

def _variant(name, op="Cast"):
    for opdef in REGISTRY.versions(op):
        for v in opdef.variants:
            if v.name == name:
                return opdef, v
    return None, None


@needs_native
def test_cast_variant_strided_out_and_fallback(sweep):
    x = sweep[: 300 * 200].reshape(300, 200)
    for xin, to in [(x, 10), (x.T, 10), (x[:3, :4], 10), (x[::2, 1::3], 10)]:
        want = _astype(xin, np.float16)
        got = cast_kernel.cast_native(xin, to=to)
        assert _bits_equal(got, want)
        back = cast_kernel.cast_native(got.T, to=1)
        assert _bits_equal(back, _astype(want.T, np.float32))
    out = np.empty(x.shape, np.float16)
    assert cast_kernel.cast_native(x, to=10, out=out) is out
    assert _bits_equal(out, _astype(x, np.float16))
    small = np.empty((3, 4), np.float16)
    assert cast_kernel.cast_native(x[:3, :4], to=10, out=small) is small
    assert _bits_equal(small, _astype(x[:3, :4], np.float16))
    # a planned buffer that does not fit is not written
    wrong = np.zeros((200, 300), np.float16)
    assert cast_kernel.cast_native(x, to=10, out=wrong) is not wrong and not wrong.any()
    # every other cast is the reference's
    for xin, to in [(x.astype(np.float64), 10), (x, 11), (np.arange(100, dtype=np.int64), 10),
                    (ALL_F16, 7), (x, "FLOAT16"), (ALL_F16, "FLOAT")]:
        got = cast_kernel.cast_native(xin, to=to)
        want = cast_array(xin, cast_kernel.to_target_dtype(to))
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)
    with pytest.raises(OpwardenError):
        cast_kernel.cast_native(x, to=12345)


@needs_native
def test_cast_when_and_every_version():
    from opwarden.contract import TensorFact
    f32, f16, f64 = (TensorFact(d, (4,)) for d in ("float32", "float16", "float64"))
    w = cast_kernel.cast_when
    assert w(f32, to=10) and w(f16, to=1) and w(f32, to="FLOAT16") and w(f16, to=b"FLOAT")
    assert not any([w(f64, to=10), w(f32, to=1), w(f16, to=10), w(f32, to=11),
                    w(TensorFact(None, None), to=10), w(f32, to=None)])
    assert all(any(v.name == "cast.cpu.native" for v in o.variants)
               for o in REGISTRY.versions("Cast"))


def _cast_samples(rng, since):
    to16, to32 = ("FLOAT16", "FLOAT") if since < 6 else (10, 1)
    x = (rng.standard_normal((7, 300)) * 1e3).astype(np.float32)
    x.reshape(-1)[:SPECIAL_BITS.size] = SPECIAL_BITS.view(np.float32)
    return [Sample([x], {"to": to16}), Sample([x.T], {"to": to16}),
            Sample([x[:2, :5]], {"to": to16}), Sample([ALL_F16.reshape(256, 256)], {"to": to32}),
            Sample([ALL_F16[::-3]], {"to": to32})]


@needs_native
def test_check_harness_on_cast_samples(monkeypatch):
    """`opwarden check`'s contract checks on inputs that reach the variant (the node suite's
    few smallest Cast cases are other types). (grad left out: it would differentiate the
    narrowing cast itself, in float64.)"""
    from opwarden.verify import harness
    for opdef in REGISTRY.versions("Cast"):
        monkeypatch.setattr(opdef, "samples_fn",
                            lambda rng, since=opdef.since: _cast_samples(rng, since))
    checks = ["numerics", "boundary", "mutation", "alias", "workspace", "concurrency"]
    rep = harness.check("cast.cpu.native", checks=checks)
    assert len(rep.variants) == len(REGISTRY.versions("Cast"))
    for v in rep.variants:
        assert v.checks["numerics"] == "pass" and not v.failures, (v.since, v.checks, v.failures)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m.SerializeToString()


def _cast_model(opset):
    vi = helper.make_tensor_value_info
    return _model([helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
                   helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT)],
                  [vi("x", TensorProto.FLOAT, [64, 3072])],
                  [vi("h", TensorProto.FLOAT16, [64, 3072]), vi("y", TensorProto.FLOAT,
                                                               [64, 3072])], opset=opset)


def _cast_feed(sweep):
    return {"x": np.ascontiguousarray(sweep[-64 * 3072:].reshape(64, 3072))}


def _ln_model():
    vi = helper.make_tensor_value_info
    rng = np.random.default_rng(1)
    s = numpy_helper.from_array((rng.standard_normal(768) * 0.5 + 1).astype(np.float16), "s")
    b = numpy_helper.from_array((rng.standard_normal(768) * 0.1).astype(np.float16), "b")
    return _model([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"],
                                    epsilon=1e-12)],
                  [vi("x", TensorProto.FLOAT16, [128, 768])],
                  [vi("y", TensorProto.FLOAT16, [128, 768])], [s, b])


def _ln_feed():
    rng = np.random.default_rng(2)
    return {"x": (rng.standard_normal((128, 768)) * 3 + 0.5).astype(np.float16)}


@needs_native
@pytest.mark.parametrize("opset", [6, 13, 19, 24])
def test_cast_sessions_against_onnxruntime(opset, sweep):
    ort = pytest.importorskip("onnxruntime")
    data, feed = _cast_model(opset), _cast_feed(sweep)
    s = ow.InferenceSession(data)
    ours = s.run(None, feed)
    assert {r["variant"] for r in s.explain()} == {"cast.cpu.native"}
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feed)
    # (onnxruntime quiets signalling NaNs; NumPy and we keep their bits)
    for a, b in zip(ours, theirs):
        assert np.array_equal(a, b, equal_nan=True)
        assert _bits_equal(a, _astype(feed["x"], a.dtype) if a.dtype == np.float16
                           else _astype(_astype(feed["x"], np.float16), np.float32))


def _f16_ulps(a, b):
    ai, bi = (v.view(np.int16).astype(np.int32) for v in (a, b))
    ai, bi = (np.where(v < 0, -32768 - v, v) for v in (ai, bi))
    return np.abs(ai - bi)


@needs_native
def test_layernorm_half_against_onnxruntime_and_reference():
    ort = pytest.importorskip("onnxruntime")
    data, feed = _ln_model(), _ln_feed()
    s = ow.InferenceSession(data)
    ours = s.run(None, feed)[0]
    assert [r["variant"] for r in s.explain()] == ["layernormalization.cpu.half"]
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert ours.dtype == np.float16 and _f16_ulps(ours, theirs).max() <= 1
    x, sc, b = feed["x"], *(np.random.default_rng(1).standard_normal(768) for _ in "12")
    sc, b = (sc * 0.5 + 1).astype(np.float16), (b * 0.1).astype(np.float16)
    ref = REGISTRY.versions("LayerNormalization")[-1].reference
    for xin, scale, bias in [(x, sc, b), (x[::2], sc, None), (x.reshape(4, 32, 768), sc, b),
                             (x[:, :5], sc[:5], b[:5])]:
        want = ref(xin, scale, bias, epsilon=1e-5)
        got = norm.layernorm_half(xin, scale, bias, epsilon=1e-5)
        assert got[0].dtype == np.float16 and got[0].shape == want[0].shape
        assert _f16_ulps(got[0], want[0]).max() <= 1
        for g, w in zip(got[1:], want[1:]):
            assert g.dtype == w.dtype == np.float32
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    out = np.empty(x.shape, np.float16)
    assert norm.layernorm_half(x, sc, b, out=out)[0] is out


def test_reference_when_disabled(tmp_path):
    """OPWARDEN_NATIVE=0: the sessions take the references, with the same bits (written here
    by a subprocess)."""
    code = (
        "import sys, numpy as np, opwarden as ow\n"
        "from opwarden import native\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from test_native_cast import _cast_model, _cast_feed, _f32_sweep, _ln_model, _ln_feed\n"
        "feed = _cast_feed(_f32_sweep().view(np.float32))\n"
        "s = ow.InferenceSession(_cast_model(19))\n"
        "for i, y in enumerate(s.run(None, feed)):\n"
        "    np.save(f'{sys.argv[2]}/cast{i}.npy', y)\n"
        "l = ow.InferenceSession(_ln_model())\n"
        "np.save(f'{sys.argv[2]}/ln.npy', l.run(None, _ln_feed())[0])\n"
        "print(sorted({r['variant'] for r in s.explain() + l.explain()}))\n"
        "print(native.status()['active'])\n"
    )
    env = dict(os.environ, OPWARDEN_NATIVE="0")
    out = subprocess.run([sys.executable, "-c", code, os.path.dirname(__file__), str(tmp_path)],
                         capture_output=True, text=True, env=env, check=True,
                         timeout=300).stdout
    assert out.rstrip().endswith("numpy") and "cast.ref" in out and ".native" not in out, out
    assert "layernormalization.cpu.half" not in out, out
    feed = _cast_feed(_f32_sweep().view(np.float32))
    want = [_astype(feed["x"], np.float16), _astype(_astype(feed["x"], np.float16), np.float32)]
    for i, w in enumerate(want):
        assert _bits_equal(np.load(tmp_path / f"cast{i}.npy"), w)
    if not DISABLED:
        ours = ow.InferenceSession(_ln_model()).run(None, _ln_feed())[0]
        assert _f16_ulps(ours, np.load(tmp_path / "ln.npy")).max() <= 1
