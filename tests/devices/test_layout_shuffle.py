"""Layout pass: channel shuffles (Reshape -> Transpose -> Reshape over the channel axis) in NHWC."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opwarden as ow
from opwarden import zoo
from opwarden.kernels.cpu.fused import fused_conv_nhwc
from opwarden.ops import REGISTRY
from opwarden.place.layout import LayoutPass

ort = pytest.importorskip("onnxruntime")


def _f(rng, *shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def shuffle_model(
    c: int = 12,
    spatial: tuple[int, ...] = (5, 6),
    factors: tuple[int, ...] = (3, 4),
    perm: tuple[int, ...] = (0, 2, 1),
    batch: int | str = 2,
    *,
    opset: int = 13,
    tail_output: bool = False,
    extra_use: bool = False,
    seed: int = 0,
) -> onnx.ModelProto:
    """conv -> conv -> relu -> shuffle -> depthwise conv -> conv (-> y).

    The shuffle splits the channels into `factors` and transposes them by `perm` (axis 0 is N).
    """
    rng = np.random.default_rng(seed)
    ns = len(spatial)
    k = len(factors)
    ones = [1] * ns
    split = [0 if isinstance(batch, str) else batch, *factors, *spatial]
    full_perm = [*perm, *range(1 + k, 1 + k + ns)]
    inits = [
        numpy_helper.from_array(_f(rng, c, 3, *ones), "w0"),
        numpy_helper.from_array(_f(rng, c, c, *ones), "w1"),
        numpy_helper.from_array(_f(rng, c), "b1"),
        numpy_helper.from_array(_f(rng, c, 1, *([3] * ns)), "w2"),
        numpy_helper.from_array(_f(rng, c, c, *ones), "w3"),
        numpy_helper.from_array(np.array(split, dtype=np.int64), "s1"),
        numpy_helper.from_array(np.array([split[0], c, *spatial], dtype=np.int64), "s2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["a0"], name="c0"),
        helper.make_node("Conv", ["a0", "w1", "b1"], ["a"], name="c1"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "s1"], ["r5"], name="split"),
        helper.make_node("Transpose", ["r5"], ["t5"], perm=full_perm, name="shuffle"),
        helper.make_node("Reshape", ["t5", "s2"], ["sh"], name="merge"),
        helper.make_node(
            "Conv", ["sh", "w2"], ["d"], group=c, pads=[1] * (2 * ns), name="dw"
        ),
        helper.make_node("Conv", ["d", "w3"], ["y"], name="c3"),
    ]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if tail_output:
        outs.append(helper.make_tensor_value_info("sh", TensorProto.FLOAT, None))
    if extra_use:
        nodes.append(helper.make_node("ReduceSum", ["t5"], ["extra"], keepdims=0, name="rs"))
        outs.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT, None))
    g = helper.make_graph(
        nodes, "shuffle",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, *spatial])],
        outs, initializer=inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _x(model: onnx.ModelProto, batch: int = 2, seed: int = 1) -> np.ndarray:
    dims = model.graph.input[0].type.tensor_type.shape.dim
    shape = [batch if d.dim_param else d.dim_value for d in dims]
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _transposes(sess) -> int:
    """Transpose nodes that run (inserted or the model's)."""
    return sum(r["op_type"] == "Transpose" for r in sess.explain())


def _shuffles(sess) -> int:
    """Channel shuffles the layout pass kept in NHWC (from the placement report)."""
    return sess.placements.report["channel_shuffles_nhwc"]


def _run(model, x, mode: str = "new", providers=None):
    """A cpu session: mode "new" (this pass), "old" (shuffles not rewritten), "nchw" (no NHWC)."""
    with pytest.MonkeyPatch.context() as mp:
        if mode in ("old", "nchw"):
            mp.setattr(LayoutPass, "find_shuffles", lambda self: None)
        if mode == "nchw":
            mp.setattr(LayoutPass, "_cost", lambda self, nodes: 10**9)
        sess = ow.InferenceSession(model.SerializeToString(), providers=providers)
    return sess, sess.run(None, {"x": x})


def _tol(ref: np.ndarray, loose: bool = False) -> float:
    # edge-npu emulates reduced-precision numerics: compare it the way the device tests do.
    return (1e-2 if loose else 1e-4) * float(np.abs(ref).max()) + (1e-3 if loose else 1e-5)


NPU = ["edge-npu", "cpu"]  # cpu has no 1-D/3-D NHWC convolution; the profile device prefers NHWC
CASES = {
    "2d-shuffle": ({}, None),
    "3-factors": ({"c": 12, "factors": (2, 3, 2), "perm": (0, 3, 1, 2)}, None),
    "symbolic-batch": ({"batch": "N"}, None),
    "opset9": ({"opset": 9}, None),
    "conv1d": ({"c": 8, "spatial": (7,), "factors": (2, 4)}, NPU),
    "conv3d": ({"c": 6, "spatial": (3, 4, 5), "factors": (2, 3), "batch": 1}, NPU),
}


@pytest.mark.parametrize("case", list(CASES))
def test_shuffle_runs_in_nhwc_and_matches(case):
    kw, providers = CASES[case]
    model = shuffle_model(**kw)
    x = _x(model)
    sess, got = _run(model, x, providers=providers)
    _, old = _run(model, x, "old", providers)
    _, nchw = _run(model, x, "nchw")
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    rows = {r["name"]: r for r in sess.explain()}
    # Two factors on cpu: one ChannelShuffle node (one copy into a planned buffer); otherwise
    # (three factors, or a device without that kernel) the rewritten Reshape/Transpose chain.
    one_node = providers is None and len(kw.get("factors", (3, 4))) == 2
    if one_node:
        # ... which is then folded into its depthwise consumer (FusedConv input_shuffle).
        assert "dw" in rows and not {"split", "shuffle", "merge/shuffle"} & set(rows)
        assert rows["dw"]["op_type"] == "FusedConv"
        assert sess.placements.report["channel_shuffles_folded"] == 1
        summary = sess.explain_summary()
        assert summary["channel_shuffles_folded"] == 1
        assert "1 channel shuffle(s) kept in NHWC (1 folded" in summary["text"]
    else:
        assert {"split", "shuffle", "merge", "dw"} <= set(rows)
    assert all(r["layout"] == "NHWC" for r in rows.values() if not r["inserted"])
    # One conversion in, one out; the model's own Transpose is the only other one.
    assert sess.explain_summary()["transposes_inserted"] == 2
    assert _shuffles(sess) == 1
    assert _transposes(sess) == (2 if one_node else 3)
    for a, b, c, w in zip(got, old, nchw, want, strict=True):
        assert a.shape == w.shape
        np.testing.assert_array_equal(a, b)  # same kernels, only the shuffle moved
        assert np.abs(a - c).max() <= _tol(c, providers is not None)
        assert np.abs(a - w).max() <= _tol(w, providers is not None)


def test_shuffle_before_rewrite_cost_two_more_transposes():
    model = shuffle_model()
    x = _x(model)
    new, _ = _run(model, x)
    old, _ = _run(model, x, mode="old")
    # Before: NHWC -> NCHW for the shuffle and back, 5 in all; now 2 (in, out) and the shuffle
    # is one ChannelShuffle node.
    assert (_transposes(old), _transposes(new)) == (5, 2)


@pytest.mark.parametrize(
    "kw",
    [
        {"tail_output": True},  # the shuffled tensor is also a graph output (NCHW there)
        {"batch": 1, "factors": (3, 4), "perm": (0, 2, 1)},
        {"batch": "N", "factors": (6, 2)},  # run with 3 rows: the NHWC shapes copy N
    ],
)
def test_shuffle_variants_match_onnxruntime(kw):
    model = shuffle_model(**kw)
    x = _x(model, batch=model.graph.input[0].type.tensor_type.shape.dim[0].dim_value or 3)
    sess, got = _run(model, x)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    for a, w in zip(got, want, strict=True):
        assert a.shape == w.shape and np.abs(a - w).max() <= _tol(w)
    assert _shuffles(sess) == 1


def test_not_a_channel_shuffle_is_left_alone():
    # The transpose moves a spatial axis: not a channel permutation.
    model = shuffle_model(c=12, spatial=(4, 4), factors=(3, 4), perm=(0, 2, 1))
    t = next(n for n in model.graph.node if n.name == "shuffle")
    t.attribute[0].ints[:] = [0, 1, 2, 4, 3]
    x = _x(model)
    sess, got = _run(model, x)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    assert _shuffles(sess) == 0
    assert np.abs(got[0] - want[0]).max() <= _tol(want[0])


def test_intermediate_with_another_reader_is_left_alone():
    model = shuffle_model(extra_use=True)
    x = _x(model)
    sess, got = _run(model, x)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    assert _shuffles(sess) == 0
    for a, w in zip(got, want, strict=True):
        assert np.abs(a - w).max() <= _tol(w)


def test_intermediates_are_not_tagged_nhwc():
    model = shuffle_model(c=12, factors=(2, 3, 2), perm=(0, 3, 1, 2))  # kept as three nodes
    sess, _ = _run(model, _x(model))
    vals = sess.model.graph.values
    mid = [v for v in vals.values() if v.name.startswith(("r5", "t5"))]
    assert mid and all(v.layout is None for v in mid)
    sh = [v for v in vals.values() if v.name.startswith("sh")]
    assert [v.layout for v in sh] == ["NHWC"] and sh[0].fact.shape == (2, 5, 6, 12)
    # Two factors: one ChannelShuffle node (kept: its output is also a graph output), and its
    # former intermediates are gone.
    model = shuffle_model(tail_output=True)
    sess, _ = _run(model, _x(model))
    vals = sess.model.graph.values
    assert not [v for v in vals.values() if v.name.startswith(("r5", "t5"))]
    sh = [v for v in vals.values() if v.name.startswith("sh__")]
    assert [v.layout for v in sh] == ["NHWC"] and sh[0].fact.shape == (2, 5, 6, 12)
    assert [r["op_type"] for r in sess.explain() if r["name"] == "merge/shuffle"] == [
        "ChannelShuffle"
    ]
    assert sess.placements.report["channel_shuffles_folded"] == 0


def test_shuffle_folds_into_depthwise_and_survives_a_faulting_kernel():
    """The folded shuffle runs in the depthwise kernel's padding copy; when that kernel faults
    the node reruns on the reference FusedConv, which applies input_shuffle itself."""
    model = shuffle_model()
    x = _x(model)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    sess, got = _run(model, x)
    rows = {r["name"]: r for r in sess.explain()}
    assert rows["dw"]["op_type"] == "FusedConv"
    node = next(p.node for p in sess.placements if p.node.name == "dw")
    assert node.attrs["input_shuffle"] == 3
    assert np.abs(got[0] - want[0]).max() <= _tol(want[0])

    calls = []

    def bad(X, W, B=None, Z=None, **attrs):
        calls.append(attrs.get("input_shuffle"))
        if attrs.get("input_shuffle"):
            raise RuntimeError("simulated kernel failure")
        return fused_conv_nhwc(X, W, B, Z, **attrs)

    fused = REGISTRY.versions("FusedConv", "opwarden")[0]
    before = list(fused.variants)
    fused.kernel(device="cpu", layout="NHWC", dtypes=["float32"], priority=100,
                 name="fusedconv.cpu.bad")(bad)
    try:
        sess = ow.InferenceSession(model.SerializeToString())
        (got,) = sess.run(None, {"x": x})
    finally:
        fused.variants = before
    assert 3 in calls and sess.faults
    assert np.abs(got - want[0]).max() <= _tol(want[0])


def test_shufflenet_keeps_its_shuffles_in_nhwc():
    data = zoo.build("shufflenet", seed=0)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    name = data.graph.input[0].name
    sess = ow.InferenceSession(data.SerializeToString())
    s = sess.explain_summary()
    assert s["transposes_inserted"] == 1  # only the input, NCHW -> NHWC
    assert _shuffles(sess) == 16
    got = sess.run(None, {name: x})[0]
    want = ort.InferenceSession(data.SerializeToString()).run(None, {name: x})[0]
    assert np.abs(got - want).max() <= _tol(want)
