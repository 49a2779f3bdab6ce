"""Signal, random, loss and string operators: cases beyond the ONNX node tests, against
onnxruntime where it implements them, else against NumPy facts."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from opwarden.dtypes import onnx_type
from opwarden.errors import KernelError
from opwarden.ops import REGISTRY

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(0)


def ours(op_type, opset, inputs, attrs=None):
    opdef, sch = REGISTRY.resolve(op_type, "", opset)
    kw = {k: a.default for k, a in sch.attrs.items() if a.has_default}
    kw.update(attrs or {})
    out = opdef.reference(*inputs, **kw)
    return list(out) if isinstance(out, tuple) else [out]


def theirs(op_type, opset, inputs, attrs=None, n_out=1):
    names = [f"i{k}" if x is not None else "" for k, x in enumerate(inputs)]
    outs = [f"o{k}" for k in range(n_out)]
    node = helper.make_node(op_type, names, outs, **(attrs or {}))
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, onnx_type(x.dtype), x.shape)
         for n, x in zip(names, inputs) if x is not None],
        [onnx.ValueInfoProto(name=o) for o in outs],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    feeds = {n: x for n, x in zip(names, inputs) if x is not None}
    return ort.InferenceSession(model.SerializeToString()).run(None, feeds)


def check(op_type, opset, inputs, attrs=None, n_out=1, rtol=1e-4, atol=1e-4):
    a = ours(op_type, opset, inputs, attrs)[:n_out]
    b = theirs(op_type, opset, inputs, attrs, n_out)
    for x, y in zip(a, b):
        assert isinstance(x, np.ndarray)
        assert x.dtype == y.dtype and x.shape == y.shape, (x.dtype, x.shape, y.dtype, y.shape)
        if x.dtype == object:
            assert x.tolist() == y.tolist()
        else:
            np.testing.assert_allclose(x.astype(np.float64), y.astype(np.float64),
                                       rtol=rtol, atol=atol)


# --- DFT / STFT ------------------------------------------------------------------------------

@pytest.mark.parametrize("last", [1, 2])
@pytest.mark.parametrize("n", [None, 6, 13])
@pytest.mark.parametrize("axis", [1, 2, -2, -3])
def test_dft20_lengths_axes(last, n, axis):
    x = RNG.standard_normal((2, 8, 5, last)).astype(np.float32)
    dl = None if n is None else np.array(n, np.int64)
    check("DFT", 20, [x, dl, np.array(axis, np.int64)])
    check("DFT", 20, [x, dl, np.array(axis, np.int64)], {"inverse": 1})


def test_dft_onesided_matches_numpy_rfft():
    x = RNG.standard_normal((3, 10, 1))
    y = ours("DFT", 17, [x, np.array(7)], {"onesided": 1})[0]
    ref = np.fft.rfft(x[..., 0], n=7, axis=1)
    assert y.dtype == np.float64 and y.shape == (3, 4, 2)
    np.testing.assert_allclose(y[..., 0] + 1j * y[..., 1], ref, atol=1e-12)


def test_dft_bad_axis():
    with pytest.raises(KernelError, match="axis"):
        ours("DFT", 20, [np.zeros((2, 4, 1), np.float32), None, np.array(-1)])


@pytest.mark.parametrize("onesided", [0, 1])
def test_stft_against_ort(onesided):
    x = RNG.standard_normal((2, 64, 1)).astype(np.float32)
    w = np.hanning(16).astype(np.float32)
    check("STFT", 17, [x, np.array(5, np.int64), w], {"onesided": onesided})
    check("STFT", 17, [x, np.array(8, np.int64), None, np.array(12, np.int64)],
          {"onesided": onesided})


def test_stft_complex_signal():
    x = RNG.standard_normal((1, 40, 2)).astype(np.float32)
    check("STFT", 17, [x, np.array(4, np.int64), None, np.array(10, np.int64)], {"onesided": 0})


# --- windows and mel -------------------------------------------------------------------------

@pytest.mark.parametrize("op_type", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("dt", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_windows_against_ort(op_type, periodic, dt):
    check(op_type, 17, [np.array(11, np.int64)], {"periodic": periodic, "output_datatype": dt})


def test_windows_numpy_facts():
    np.testing.assert_allclose(ours("HannWindow", 17, [np.array(9)], {"periodic": 0})[0],
                               np.hanning(9), atol=1e-7)
    np.testing.assert_allclose(ours("BlackmanWindow", 17, [np.array(9)], {"periodic": 0})[0],
                               np.blackman(9), atol=1e-7)
    assert ours("HammingWindow", 17, [np.array(0)])[0].shape == (0,)


@pytest.mark.parametrize("args", [(8, 16, 8192, 0.0, 4096.0), (20, 512, 16000, 20.0, 7600.0),
                                  (10, 64, 8000, 100.0, 3000.0)])
def test_melweightmatrix_against_ort(args):
    nmel, nfft, rate, lo, hi = args
    ins = [np.array(nmel, np.int64), np.array(nfft, np.int64), np.array(rate, np.int64),
           np.array(lo, np.float32), np.array(hi, np.float32)]
    check("MelWeightMatrix", 17, ins)


# --- random ----------------------------------------------------------------------------------

def test_random_shapes_dtypes_and_seed():
    a = ours("RandomNormal", 22, [], {"shape": [2, 3], "seed": 3.0, "dtype": 11})[0]
    b = ours("RandomNormal", 22, [], {"shape": [2, 3], "seed": 3.0, "dtype": 11})[0]
    assert a.dtype == np.float64 and a.shape == (2, 3) and np.array_equal(a, b)
    u = ours("RandomUniform", 1, [], {"shape": [1000], "low": 2.0, "high": 3.0, "dtype": 10})[0]
    assert u.dtype == np.float16 and 2.0 <= u.min() and u.max() <= 3.0
    x = np.zeros((4, 5), np.float64)
    assert ours("RandomNormalLike", 1, [x])[0].dtype == np.float64
    assert ours("RandomUniformLike", 1, [x], {"dtype": 1})[0].dtype == np.float32
    with pytest.raises(KernelError):
        ours("RandomUniformLike", 1, [np.zeros(3, np.int32)])


def test_bernoulli_and_multinomial():
    p = np.array([0.0, 1.0, 0.0, 1.0], np.float32)
    y = ours("Bernoulli", 15, [p], {"dtype": TensorProto.INT64})[0]
    assert y.dtype == np.int64 and y.tolist() == [0, 1, 0, 1]
    assert ours("Bernoulli", 22, [p.astype(np.float64)])[0].dtype == np.float64
    logits = np.log(np.array([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]], np.float32) + 1e-30)
    m = ours("Multinomial", 7, [logits], {"sample_size": 50, "seed": 1.0})[0]
    assert m.dtype == np.int32 and m.shape == (2, 50)
    assert set(m[0].tolist()) == {1} and set(m[1].tolist()) <= {0, 2}
    m2 = ours("Multinomial", 22, [logits], {"sample_size": 50, "seed": 1.0, "dtype": 7})[0]
    assert m2.dtype == np.int64 and np.array_equal(m, m2)


# --- loss ------------------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ii", [None, -1, 2])
def test_losses_against_ort(reduction, weighted, ii):
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    t = RNG.integers(0, 4, (3, 5)).astype(np.int64)
    if ii is not None:
        t[0, :2] = ii
    w = RNG.random(4).astype(np.float32) if weighted else None
    attrs = {"reduction": reduction}
    if ii is not None:
        attrs["ignore_index"] = ii
    check("SoftmaxCrossEntropyLoss", 13, [x, t, w], attrs, n_out=2)
    check("NegativeLogLikelihoodLoss", 13, [x, t, w], attrs)


def test_loss_errors_and_half():
    x = np.zeros((2, 3), np.float16)
    out = ours("SoftmaxCrossEntropyLoss", 12, [x, np.array([0, 2])])
    assert out[0].dtype == np.float16 and out[0].shape == ()
    np.testing.assert_allclose(float(out[0]), np.log(3), rtol=1e-3)
    with pytest.raises(KernelError, match="target values"):
        ours("NegativeLogLikelihoodLoss", 12, [x, np.array([0, 3])])


# --- strings ---------------------------------------------------------------------------------

def _s(*v):
    return np.array(list(v), dtype=object)


@pytest.mark.parametrize("attrs,expected", [
    ({"case_change_action": "LOWER", "stopwords": ["the", "A"]}, ["cat", "sat", "mat"]),
    ({"case_change_action": "UPPER", "stopwords": ["the", "A"], "is_case_sensitive": 1},
     ["THE", "CAT", "SAT", "A", "MAT"]),
    ({"stopwords": ["The", "a", "Cat", "sat", "MAT"]}, [""]),
])
def test_stringnormalizer(attrs, expected):
    # onnxruntime's kernel needs an installed en_US.UTF-8 locale, so these are hand-checked.
    x = _s("The", "cat", "sat", "a", "mat")
    y = ours("StringNormalizer", 10, [x], attrs)[0]
    assert y.dtype == object and y.tolist() == expected
    y2 = ours("StringNormalizer", 10, [x.reshape(1, 5)], attrs)[0]
    assert y2.tolist() == [expected]


def test_string_split_and_regex():
    y, z = ours("StringSplit", 20, [_s("a  b c", "", " x ")], {})
    assert y.tolist() == [["a", "b", "c"], ["", "", ""], ["x", "", ""]] and z.tolist() == [3, 0, 1]
    y, z = ours("StringSplit", 20, [_s("a,,b,c")], {"delimiter": ",", "maxsplit": 2})
    assert y.tolist() == [["a", "", "b,c"]] and z.tolist() == [3]
    r = ours("RegexFullMatch", 20, [_s("ab12", "ab", "x").reshape(3, 1)], {"pattern": r"ab\d*"})
    assert r[0].dtype == bool and r[0].tolist() == [[True], [True], [False]]
    c = ours("StringConcat", 20, [_s("a", "b"), np.array("!", dtype=object)])[0]
    assert c.dtype == object and c.tolist() == ["a!", "b!"]


TFIDF_CASES = [
    {"mode": "TF", "min_gram_length": 1, "max_gram_length": 2, "max_skip_count": 2},
    {"mode": "IDF", "min_gram_length": 2, "max_gram_length": 3, "max_skip_count": 1,
     "weights": [0.5, 2.0, 1.5, 3.0, 1.0, 0.25, 4.0, 2.5]},
    {"mode": "TFIDF", "min_gram_length": 1, "max_gram_length": 3, "max_skip_count": 3,
     "weights": [0.5, 2.0, 1.5, 3.0, 1.0, 0.25, 4.0, 2.5]},
]


@pytest.mark.parametrize("attrs", TFIDF_CASES)
@pytest.mark.parametrize("strings", [False, True])
def test_tfidf_against_ort(attrs, strings):
    X = RNG.integers(0, 4, (3, 12)).astype(np.int32)
    pool = [0, 1, 2, 0, 1, 1, 3, 2, 0, 1, 2, 3, 3, 0, 1]  # 3 unigrams, 3 bigrams, 2 trigrams
    attrs = {**attrs, "ngram_counts": [0, 3, 9], "ngram_indexes": [0, 1, 2, 3, 4, 5, 6, 2]}
    if strings:
        X = np.vectorize(lambda v: f"w{v}", otypes=[object])(X)
        attrs["pool_strings"] = [f"w{v}" for v in pool]
    else:
        attrs["pool_int64s"] = pool
    check("TfIdfVectorizer", 9, [X], attrs)
    check("TfIdfVectorizer", 9, [X[0]], attrs)
