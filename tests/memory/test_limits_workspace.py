"""memory_limit_bytes counts kernel scratch, not only outputs: a node whose outputs fit but whose
kernel's temporaries (Resize's per-axis intermediates, OneHot's mask, TopK's sort order,
float16 Einsum's float32 copies, Tile's repeats, Erf's Python floats, the recurrent ops' work
copies, the FFTs' complex copies, Cast's widened and rounded copies, the quantizers' float64 and
int64 copies, float16 elementwise ops' float32 copies, the string ops' Python strs and lists)
would not is refused before its kernel runs, at run time where the sizes come from data and
when the plan is made where they do not. The scratch rules (plan.scratch.SCRATCH) are checked
against what tracemalloc measures."""

from __future__ import annotations

import tracemalloc

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import opwarden
from opwarden.errors import MemoryLimitError
from opwarden.ops.base import REGISTRY
from opwarden.plan.scratch import SCRATCH
from tests.models import graph_model

LIMIT = 64 << 20
MiB = 1 << 20
F, F16, I64 = T.FLOAT, T.FLOAT16, T.INT64
R = np.random.default_rng(0)


def _i64(*v):
    return np.array(v, np.int64)


def _f32(*shape):
    return R.random(shape, dtype=np.float32)


# -- the rules bound what the reference kernels hold ------------------------------------------

def _measure(fn, args, attrs):
    """Bytes the call held at its peak beyond the outputs it returned (tracemalloc)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out = fn(*args, **attrs)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    outs = out if isinstance(out, tuple) else (out,)
    held = sum(o.nbytes for o in outs if isinstance(o, np.ndarray)
               and not any(isinstance(a, np.ndarray) and np.shares_memory(a, o) for a in args))
    return peak - held


def _words(n, k, sep):
    """n strings of k words each (mixed lengths and scripts), joined by sep."""
    words = np.array(["a", "word", "longerword", "ünïcode", "日本語の", "x" * 40], object)
    return np.array([sep.join(R.choice(words, k).tolist()) for _ in range(n)], object)


_HALF = np.float16
SCRATCH_CASES = {
    "resize nearest 4x4000 -> 4000x4": (
        "Resize", [_f32(1, 1, 4, 4000), None, None, _i64(1, 1, 4000, 4)], {"mode": "nearest"}),
    "resize linear 4x4000 -> 4000x4": (
        "Resize", [_f32(1, 1, 4, 4000), None, None, _i64(1, 1, 4000, 4)], {"mode": "linear"}),
    "resize cubic 4x2000 -> 2000x2000": (
        "Resize", [_f32(1, 1, 4, 2000), None, None, _i64(1, 1, 2000, 2000)], {"mode": "cubic"}),
    "resize linear uint8 scales": (
        "Resize", [np.ones((1, 1, 4, 2000), np.uint8), None,
                   np.array([1, 1, 500, 0.5], np.float32)], {"mode": "linear"}),
    "resize linear antialias 2000^2 -> 100^2": (
        "Resize", [_f32(1, 1, 2000, 2000), None, None, _i64(1, 1, 100, 100)],
        {"mode": "linear", "antialias": 1}),
    "resize crop": (
        "Resize", [_f32(1, 1, 4, 4000), np.array([0, 0, .1, .1, 1, 1, .9, .9], np.float32),
                   None, _i64(1, 1, 4000, 4)],
        {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}),
    "upsample linear x2": (
        "Upsample", [_f32(1, 1, 1000, 1000), np.array([1, 1, 2, 2], np.float32)],
        {"mode": "linear"}),
    "onehot float32": ("OneHot", [_i64(*range(1000)), _i64(10000), np.array([0, 1], np.float32)],
                       {}),
    "onehot uint8": ("OneHot", [_i64(*range(1000)), _i64(10000), np.array([0, 1], np.uint8)], {}),
    "range float32": ("Range", [np.array(0, np.float32), np.array(4e6, np.float32),
                                np.array(1, np.float32)], {}),
    "range int32": ("Range", [np.array(0, np.int32), np.array(4000000, np.int32),
                              np.array(1, np.int32)], {}),
    "nonzero": ("NonZero", [np.ones((1000, 2000), np.float32)], {}),
    "tile 2x2": ("Tile", [_f32(1000, 2000), _i64(2, 2)], {}),
    "tile 3x1x2": ("Tile", [_f32(200, 100, 100), _i64(3, 1, 2)], {}),
    "cumsum exclusive reverse": ("CumSum", [_f32(1000, 2000), np.array(1)],
                                 {"exclusive": 1, "reverse": 1}),
    "cumsum float16": ("CumSum", [_f32(1000, 2000).astype(_HALF), np.array(0)], {}),
    "cumsum reverse": ("CumSum", [_f32(1000, 2000), np.array(0)], {"reverse": 1}),
    "topk last axis": ("TopK", [_f32(2000, 1000), _i64(10)], {}),
    "topk inner axis": ("TopK", [_f32(1000, 2000), _i64(1000)], {"axis": 0}),
    "unique": ("Unique", [(R.random(2000000) * 1000).astype(np.int64)], {}),
    "gather int32 indices": ("Gather", [_f32(10, 4), (np.arange(2000000) % 10).astype(np.int32)],
                             {}),
    "gather elements": ("GatherElements",
                        [_f32(1000, 1000), (np.arange(1000000) % 1000).reshape(1000, 1000)], {}),
    "gather nd": ("GatherND", [_f32(1000, 1000), (np.arange(2000000) % 1000).reshape(1000000, 2)],
                  {}),
    "scatter elements": ("ScatterElements",
                         [_f32(1000, 1000), (np.arange(1000000) % 1000).reshape(1000, 1000),
                          _f32(1000, 1000)], {}),
    "matmul float16 broadcast": ("MatMul", [_f32(32, 1, 128, 64).astype(_HALF),
                                            _f32(1, 32, 64, 128).astype(_HALF)], {}),
    "einsum float16": ("Einsum", [_f32(1000, 1000).astype(_HALF), _f32(1000, 1000).astype(_HALF)],
                       {"equation": "ij,jk->ik"}),
    "einsum three operands": ("Einsum", [_f32(2000000)] * 3, {"equation": "i,i,i->"}),
    "einsum chain": ("Einsum", [_f32(1500, 1500)] * 3, {"equation": "ij,jk,kl->il"}),
    "erf": ("Erf", [_f32(1000, 500)], {}),
    "erf float16": ("Erf", [_f32(1000, 500).astype(_HALF)], {}),
    "gelu exact": ("Gelu", [_f32(1000, 500)], {}),
    "gelu tanh": ("Gelu", [_f32(1000, 1000)], {"approximate": "tanh"}),
    "lstm bidirectional": ("LSTM", [_f32(200, 64, 32), _f32(2, 256, 32), _f32(2, 256, 64)],
                           {"hidden_size": 64, "direction": "bidirectional"}),
    "gru reverse layout 1": ("GRU", [_f32(64, 200, 32), _f32(1, 192, 32), _f32(1, 192, 64)],
                             {"hidden_size": 64, "direction": "reverse", "layout": 1}),
    "rnn float16": ("RNN", [_f32(200, 64, 128).astype(_HALF), _f32(1, 64, 128).astype(_HALF),
                            _f32(1, 64, 64).astype(_HALF)], {"hidden_size": 64}),
    "dft real": ("DFT", [_f32(512, 1000, 1), None, _i64(1).reshape(())], {}),
    "dft complex inverse": ("DFT", [_f32(512, 1000, 2), None, _i64(1).reshape(())],
                            {"inverse": 1}),
    "dft one-sided padded": ("DFT", [_f32(512, 1000, 1), _i64(2000).reshape(()),
                                     _i64(1).reshape(())], {"onesided": 1}),
    "dft numpy scalar length": ("DFT", [_f32(256, 1000, 1), np.int64(4000), np.int64(1)], {}),
    "dft irfft": ("DFT", [_f32(1024, 501, 2), None, _i64(1).reshape(())],
                  {"onesided": 1, "inverse": 1}),
    "dft-17 rank 4 default axis padded": ("DFT-17", [_f32(8, 4000, 4, 1), _i64(8000).reshape(())],
                                          {}),
    "stft window": ("STFT", [_f32(4, 64000, 1), _i64(64).reshape(()), _f32(256)], {}),
    "stft two-sided frame_length": ("STFT", [_f32(4, 64000, 1), _i64(128).reshape(()), None,
                                             _i64(256).reshape(())], {"onesided": 0}),
    "cast float16 to e8m0": ("Cast", [_f32(1 << 20).astype(_HALF)],
                             {"to": T.FLOAT8E8M0, "round_mode": "nearest"}),
    "cast float64 to float8": ("Cast", [_f32(1 << 20).astype(np.float64)],
                               {"to": T.FLOAT8E4M3FN}),
    "cast int32 to float4": ("Cast", [np.arange(1 << 20, dtype=np.int32)], {"to": T.FLOAT4E2M1}),
    "cast bfloat16 to uint4": ("Cast", [_f32(1 << 20).astype(ml_dtypes.bfloat16)],
                               {"to": T.UINT4}),
    "cast float32 to uint8 out of range": ("Cast", [_f32(1 << 20) * 600 - 300], {"to": T.UINT8}),
    "quantize uint8": ("QuantizeLinear", [_f32(512, 1024), np.array(0.01, np.float32),
                                          np.array(3, np.uint8)], {}),
    "quantize int16 numpy scalars": ("QuantizeLinear", [_f32(512, 1024), np.float32(0.01),
                                                        np.int16(0)], {}),
    "pow numpy scalar exponent": ("Pow", [_f32(512, 1024), np.float32(3)], {}),
    "quantize float4 blocked": ("QuantizeLinear", [_f32(256, 1024),
                                                   np.full((256, 32), .1, np.float32),
                                                   np.zeros((256, 32), ml_dtypes.float4_e2m1fn)],
                                {"block_size": 32}),
    "quantize float8 float64": ("QuantizeLinear", [_f32(256, 1024).astype(np.float64),
                                                   np.array(0.01)], {"output_dtype": T.FLOAT8E5M2}),
    "dequantize int4 to bfloat16": ("DequantizeLinear", [np.ones((512, 1024), ml_dtypes.int4),
                                                         np.array(0.5, ml_dtypes.bfloat16)], {}),
    "dequantize int8 blocked float64": ("DequantizeLinear", [np.ones((512, 1024), np.int8),
                                                             np.full((512, 64), 0.5)],
                                        {"block_size": 16}),
    "dynamic quantize float16": ("DynamicQuantizeLinear", [_f32(512, 1024).astype(_HALF) - .5], {}),
    "matmul integer zero points": ("MatMulInteger", [np.ones((2048, 512), np.int8),
                                                     np.ones((512, 256), np.int8),
                                                     np.array(3, np.int8), np.array(1, np.int8)],
                                   {}),
    "matmul integer wide": ("MatMulInteger", [np.ones((4, 512, 64), np.uint8),
                                              np.ones((64, 2048), np.uint8)], {}),
    "qlinear matmul": ("QLinearMatMul", [np.ones((512, 64), np.uint8), np.array(.1, np.float32),
                                         np.array(3, np.uint8), np.ones((64, 2048), np.uint8),
                                         np.array(.1, np.float32), np.array(1, np.uint8),
                                         np.array(.2, np.float32), np.array(5, np.uint8)], {}),
    "sigmoid float16": ("Sigmoid", [_f32(1024, 1024).astype(_HALF)], {}),
    "swish float64": ("Swish", [_f32(512, 1024).astype(np.float64)], {"alpha": 2.0}),
    "swiglu bfloat16": ("SwiGLU", [_f32(1024, 1024).astype(ml_dtypes.bfloat16),
                                   _f32(1024, 1024).astype(ml_dtypes.bfloat16)], {}),
    "celu bfloat16": ("Celu", [_f32(1024, 1024).astype(ml_dtypes.bfloat16) - .5], {}),
    "isinf float16": ("IsInf", [_f32(1024, 1024).astype(_HALF)], {}),
    "mod float16 broadcast": ("Mod", [_f32(1024, 1024).astype(_HALF),
                                      _f32(1024).astype(_HALF) + 1], {"fmod": 1}),
    "pow float32 broadcast": ("Pow", [_f32(1024, 1024), _f32(1024)], {}),
    "pow int64 float exponent": ("Pow", [np.full((512, 1024), 3), np.array(2.0)], {}),
    "rms normalization float64 stash": ("RMSNormalization", [_f32(1024, 1024), _f32(1024)],
                                        {"stash_type": T.DOUBLE}),
    "instance normalization float16": ("InstanceNormalization",
                                       [_f32(4, 16, 128, 128).astype(_HALF), _f32(16), _f32(16)],
                                       {}),
    "bernoulli float32": ("Bernoulli", [_f32(1024, 1024)], {"seed": 1.0}),
    "reverse sequence rank 3": ("ReverseSequence", [_f32(64, 1024, 16), np.full(64, 700)],
                                {"batch_axis": 0, "time_axis": 1}),
    "bitshift right int8 broadcast": ("BitShift", [np.full((1024, 1024), -7, np.int8),
                                                   np.arange(1024).astype(np.int8) % 9],
                                      {"direction": "RIGHT"}),
    "bitshift left uint64": ("BitShift", [np.ones((512, 1024), np.uint64),
                                          np.full((512, 1024), 3, np.uint64)],
                             {"direction": "LEFT"}),
    "string split whitespace": ("StringSplit", [_words(50000, 20, " ")], {}),
    "string split delimiter maxsplit": ("StringSplit", [_words(50000, 20, ",")],
                                        {"delimiter": ",", "maxsplit": 8}),
    "string split short bytes": ("StringSplit", [np.array([b"a b c d e f"] * 100000, object)],
                                 {}),
    "string normalizer lower stopwords": ("StringNormalizer", [_words(200000, 1, "")],
                                          {"case_change_action": "LOWER", "stopwords": ["a"]}),
    "tfidf int64 trigrams": ("TfIdfVectorizer", [R.integers(0, 1000, (1, 100000))],
                             {"mode": "TF", "min_gram_length": 1, "max_gram_length": 3,
                              "max_skip_count": 0, "ngram_counts": [0, 4, 8],
                              "ngram_indexes": list(range(8)),
                              "pool_int64s": [2, 3, 5, 4, 5, 6, 7, 8, 6, 7, 1, 2, 3, 4]}),
    "tfidf strings skip": ("TfIdfVectorizer", [np.array(_words(1, 100000, " ")[0].split(), object)],
                           {"mode": "TFIDF", "min_gram_length": 2, "max_gram_length": 2,
                            "max_skip_count": 2, "ngram_counts": [0, 0],
                            "ngram_indexes": [0, 1], "weights": [.5, 2.],
                            "pool_strings": ["a", "word", "word", "a"]}),
    "affine grid 2d": ("AffineGrid", [_f32(16, 2, 3), _i64(16, 3, 256, 256)], {}),
    "affine grid 3d float16": ("AffineGrid", [_f32(1, 3, 4).astype(_HALF), _i64(1, 3, 64, 64, 64)],
                               {"align_corners": 1}),
    "det float32 small matrices": ("Det", [_f32(100000, 4, 4)], {}),
    "det float16": ("Det", [_f32(64, 128, 128).astype(_HALF)], {}),
    "castlike float16 to int4": ("CastLike", [_f32(1 << 20).astype(_HALF) * 20,
                                              np.zeros(0, ml_dtypes.int4)], {}),
    "castlike float16 to int2": ("CastLike", [_f32(1 << 20).astype(_HALF) * 4,
                                              np.zeros(0, ml_dtypes.int2)], {"saturate": 0}),
}


@pytest.mark.parametrize("case", list(SCRATCH_CASES))
def test_scratch_rule_bounds_the_reference_kernel(case):
    op_type, args, attrs = SCRATCH_CASES[case]
    name, _, since = op_type.partition("-")  # "DFT-17": the rule of that version
    fn = (REGISTRY.resolve(name, "", int(since))[0] if since else REGISTRY.latest(name)).reference
    measured = _measure(fn, args, attrs)
    declared = SCRATCH[op_type](*args, **attrs)
    assert measured >= 4 * MiB, f"{case}: too small to show scratch ({measured} bytes)"
    # an upper bound of what the kernel holds, and not a wild one
    assert measured <= declared + MiB, f"{case}: measured {measured}, rule {declared}"
    assert declared <= 2.5 * measured + MiB, f"{case}: measured {measured}, rule {declared}"


# -- sessions: refused before allocating, and the same results below the limit ----------------

def _model(nodes, inputs, outputs, inits=(), opset=19) -> onnx.ModelProto:
    return graph_model(nodes, inputs, outputs, inits, opset, name="scratch")


def resize_through_intermediate():
    # 4x4000 -> 4000x4: 64 KiB out, but the first axis resampled makes 4000x4000 (61 MiB),
    # three of them at once while the linear taps are summed
    m = _model(
        [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="resize", mode="linear")],
        [("x", F, [1, 1, 4, 4000]), ("sizes", I64, [4])],
        [("y", F, None)],
    )
    x = _f32(1, 1, 4, 4000)
    return m, {"x": x, "sizes": _i64(1, 1, 4000, 4)}, {"x": x, "sizes": _i64(1, 1, 40, 4)}


def one_hot_big_depth():
    # 12000 classes for 1000 indices: a 46 MiB output, with its mask and uncast copy 103 MiB
    values = numpy_helper.from_array(np.array([0, 1], np.float32), "values")
    m = _model(
        [helper.make_node("OneHot", ["idx", "depth", "values"], ["y"], name="onehot")],
        [("idx", I64, [1000]), ("depth", I64, [1])],
        [("y", F, None)],
        inits=[values], opset=11,
    )
    idx = _i64(*(np.arange(1000) % 7))
    return m, {"idx": idx, "depth": _i64(12000)}, {"idx": idx, "depth": _i64(9)}


def einsum_float16():
    # three float16 vectors of 8M: 16 MiB each, contracted in float32 copies (96 MiB) and a
    # float32 intermediate; the output is a scalar
    m = _model(
        [helper.make_node("Einsum", ["a", "b", "c"], ["y"], name="einsum", equation="i,i,i->")],
        [("a", F16, ["n"]), ("b", F16, ["n"]), ("c", F16, ["n"])],
        [("y", F16, None)],
    )

    def feeds(n):
        return {k: (R.random(n) / 4).astype(np.float16) for k in "abc"}

    return m, feeds(8 << 20), feeds(1000)


def top_k_sort_order():
    # TopK's outputs are at most its input; its stable sort holds two int64 orders of it
    m = _model(
        [helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk")],
        [("x", F, ["n", 1000]), ("k", I64, [1])],
        [("v", F, None), ("i", I64, None)],
    )
    return m, {"x": _f32(6000, 1000), "k": _i64(5)}, {"x": _f32(3, 1000), "k": _i64(5)}


def tile_intermediate():
    # 2x2 repeats of 15 MiB: a 61 MiB output after a 31 MiB intermediate
    m = _model(
        [helper.make_node("Tile", ["x", "reps"], ["y"], name="tile")],
        [("x", F, [2000, 2000]), ("reps", I64, [2])],
        [("y", F, None)],
    )
    x = _f32(2000, 2000)
    return m, {"x": x, "reps": _i64(2, 2)}, {"x": x, "reps": _i64(1, 1)}


CASES = {f.__name__: f for f in (resize_through_intermediate, one_hot_big_depth,
                                 einsum_float16, top_k_sort_order, tile_intermediate)}


def _output_bytes(m, feeds):
    out = opwarden.InferenceSession(m.SerializeToString()).run(None, feeds)
    return sum(o.nbytes for o in out)


@pytest.mark.parametrize("case", list(CASES))
def test_scratch_past_the_limit_is_refused_before_allocating(case):
    m, big, small = CASES[case]()
    assert _output_bytes(m, big) < LIMIT  # the outputs alone fit
    sess = opwarden.InferenceSession(m.SerializeToString(), memory_limit_bytes=LIMIT)
    tracemalloc.start()
    try:
        with pytest.raises(MemoryLimitError) as err:
            sess.run(None, big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    msg = str(err.value)
    node = m.graph.node[0].name
    assert f"'{node}'" in msg and "scratch" in msg and "64.0 MiB" in msg, msg
    assert peak < 8 * MiB, f"{peak / MiB:.1f} MiB traced"  # nothing of size was allocated
    # below the limit: the same results as without one
    free = opwarden.InferenceSession(m.SerializeToString())
    for got, want in zip(sess.run(None, small), free.run(None, small)):
        np.testing.assert_array_equal(got, want)


def test_resize_under_the_limit_matches_the_onnx_reference():
    from onnx.reference import ReferenceEvaluator

    m, _, small = resize_through_intermediate()
    small = dict(small, sizes=_i64(1, 1, 1000, 4))  # a 15 MiB intermediate fits
    sess = opwarden.InferenceSession(m.SerializeToString(), memory_limit_bytes=LIMIT)
    (want,) = ReferenceEvaluator(m).run(None, small)
    np.testing.assert_allclose(sess.run(None, small)[0], want, rtol=1e-5, atol=1e-6)


def test_static_scratch_is_checked_when_the_plan_is_made():
    """Sizes no data sets: no per-run check; a node past the limit is refused at load."""
    sizes = numpy_helper.from_array(_i64(1, 1, 4000, 4), "sizes")
    m = _model(
        [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="resize", mode="linear")],
        [("x", F, [1, 1, 4, 4000])],
        [("y", F, [1, 1, 4000, 4])],
        inits=[sizes],
    )
    with pytest.raises(MemoryLimitError, match="'resize'.*scratch"):
        opwarden.InferenceSession(m.SerializeToString(), memory_limit_bytes=LIMIT)
    sess = opwarden.InferenceSession(m.SerializeToString(), memory_limit_bytes=4 * LIMIT)
    (st,) = sess.program.steps
    assert not hasattr(st.fn, "refuse")  # checked once, with the plan
    x = _f32(1, 1, 4, 4000)
    assert sess.run(None, {"x": x})[0].shape == (1, 1, 4000, 4)


def test_scratch_by_signature_is_checked_per_plan():
    """A symbolic dim: each new signature's plan checks the scratch, no per-run wrapper."""
    m, big, small = top_k_sort_order()
    sess = opwarden.InferenceSession(m.SerializeToString(), memory_limit_bytes=LIMIT)
    assert not any(hasattr(st.fn, "refuse") for st in sess.program.steps)
    with pytest.raises(MemoryLimitError, match=r"'topk'.*input dims \{'n': 6000\}"):
        sess.run(None, big)
    v, i = sess.run(None, small)
    want = np.sort(small["x"], axis=1)[:, ::-1][:, :5]
    np.testing.assert_array_equal(v, want)
    assert i.shape == (3, 5)


def test_nodes_without_scratch_are_not_wrapped():
    """The default path's cost: static nodes with no scratch rule call their kernel directly."""
    m = _model(
        [helper.make_node("Relu", ["x"], ["r"]),
         helper.make_node("Einsum", ["r", "r"], ["y"], equation="ij,kj->ik")],
        [("x", F, ["n", 8])],
        [("y", F, None)],
    )
    sess = opwarden.InferenceSession(m.SerializeToString(), memory_limit_bytes=LIMIT)
    for st in sess.program.steps:
        assert not hasattr(st.fn, "refuse"), st.placement.node.label
