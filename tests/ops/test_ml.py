"""ai.onnx.ml and training-optimizer kernels against NumPy formulas and onnxruntime."""

from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from opwarden.dtypes import onnx_type
from opwarden.errors import KernelError
from opwarden.ops import REGISTRY

ML = "ai.onnx.ml"
RNG = np.random.default_rng(1)


def ours(op_type, inputs, attrs=None, opset=3, domain=ML):
    opdef, sch = REGISTRY.resolve(op_type, domain, opset)
    kw = {k: a.default for k, a in sch.attrs.items() if a.has_default}
    kw.update(attrs or {})
    res = opdef.reference(*inputs, **kw)
    return list(res) if isinstance(res, tuple) else [res]


def theirs(op_type, inputs, attrs=None, n_out=1, opset=3):
    ort = pytest.importorskip("onnxruntime")
    names = [f"i{k}" for k in range(len(inputs))]
    outs = [f"o{k}" for k in range(n_out)]
    node = helper.make_node(op_type, names, outs, domain=ML, **(attrs or {}))
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, onnx_type(x.dtype), x.shape)
         for n, x in zip(names, inputs)],
        [onnx.ValueInfoProto(name=o) for o in outs],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid(ML, opset)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, dict(zip(names, inputs)))


def same(a, b, rtol=1e-5, atol=1e-6):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    if a.dtype == object:
        assert a.tolist() == b.tolist()
    else:
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol,
                                   atol=atol)


def both(op_type, inputs, attrs=None, n_out=1, opset=3, **tol):
    got = ours(op_type, inputs, attrs, opset)
    ref = theirs(op_type, inputs, attrs, n_out, opset)
    for a, b in zip(got[:n_out], ref):
        same(a, b, **tol)
    return got


def test_scaler():
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    (y,) = both("Scaler", [x], {"offset": [1.0, 2.0, 3.0], "scale": [0.5, 2.0, -1.0]})
    same(y, ((x - [1, 2, 3]) * [0.5, 2, -1]).astype(np.float32))
    both("Scaler", [x.astype(np.int64)], {"offset": [1.0], "scale": [2.0]})


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_normalizer(norm):
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    x[2] = 0
    both("Normalizer", [x], {"norm": norm})


def test_one_hot_encoder():
    x = np.array([[1, 5], [3, 9]], np.int64)
    (y,) = both("OneHotEncoder", [x], {"cats_int64s": [1, 3, 5]})
    assert y.shape == (2, 2, 3) and y[1, 1].sum() == 0
    xs = np.array(["a", "z", "b"], dtype=object)
    both("OneHotEncoder", [xs], {"cats_strings": ["a", "b"]})
    with pytest.raises(KernelError):
        ours("OneHotEncoder", [x], {"cats_int64s": [1, 3, 5], "zeros": 0})


def test_imputer():
    x = np.array([[1.0, np.nan, 3.0], [np.nan, 5.0, np.nan]], np.float32)
    (y,) = both("Imputer", [x], {"imputed_value_floats": [7.0, 8.0, 9.0],
                                 "replaced_value_float": float("nan")})
    same(y, np.array([[1, 8, 3], [7, 5, 9]], np.float32))
    xi = np.array([[1, -1], [-1, 4]], np.int64)
    both("Imputer", [xi], {"imputed_value_int64s": [0], "replaced_value_int64": -1})


def test_feature_vectorizer():
    a = RNG.standard_normal((2, 3)).astype(np.float32)
    b = np.array([[1, 2], [3, 4]], np.float32)
    both("FeatureVectorizer", [a, b], {"inputdimensions": [3, 2]})
    both("FeatureVectorizer", [b.astype(np.int64)], {"inputdimensions": [2]})
    (y,) = ours("FeatureVectorizer", [a, b], {"inputdimensions": [2, 3]})
    same(y, np.array([[a[0, 0], a[0, 1], 1, 2, 0], [a[1, 0], a[1, 1], 3, 4, 0]], np.float32))


def test_category_mapper():
    attrs = {"cats_int64s": [1, 2, 3], "cats_strings": ["a", "b", "c"]}
    both("CategoryMapper", [np.array(["b", "x", "c"], dtype=object)], attrs)
    both("CategoryMapper", [np.array([[3, 9]], np.int64)], dict(attrs, default_string="?"))


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
def test_linear_regressor(post):
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    attrs = {"coefficients": list(RNG.standard_normal(6)), "intercepts": [0.5, -0.5],
             "targets": 2, "post_transform": post}
    both("LinearRegressor", [x], attrs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
@pytest.mark.parametrize("nclass", [3, 2])
def test_linear_classifier(post, nclass):
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    attrs = {"coefficients": list(RNG.standard_normal(4 * nclass)),
             "intercepts": list(RNG.standard_normal(nclass)),
             "classlabels_ints": list(range(10, 10 + nclass)), "post_transform": post}
    both("LinearClassifier", [x], attrs, n_out=2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC"])
def test_linear_classifier_binary(post):
    x = RNG.standard_normal((6, 4)).astype(np.float32)
    attrs = {"coefficients": list(RNG.standard_normal(4)), "intercepts": [0.1],
             "classlabels_strings": ["no", "yes"], "post_transform": post}
    both("LinearClassifier", [x], attrs, n_out=2, rtol=1e-5, atol=1e-5)


def test_zipmap_and_dict_vectorizer():
    x = np.array([[0.25, 0.75]], np.float32)
    (z,) = ours("ZipMap", [x], {"classlabels_strings": ["a", "b"]}, opset=1)
    assert z == [{"a": 0.25, "b": 0.75}]
    (y,) = ours("DictVectorizer", [{"a": 4.0, "c": 8.0}],
                {"string_vocabulary": ["a", "c", "b", "z"]}, opset=1)
    same(y, np.array([[4, 8, 0, 0]], np.float64))


def test_label_encoder_float_keys_nan_and_last_wins():
    x = np.array([1.0, np.nan, 2.0, 3.0], np.float32)
    (y,) = ours("LabelEncoder", [x], {"keys_floats": [1.0, float("nan"), 1.0],
                                      "values_int64s": [5, 6, 7]}, opset=4)
    same(y, np.array([7, 6, -1, -1], np.int64))


def test_label_encoder_v1():
    (y,) = ours("LabelEncoder", [np.array(["b", "q"], dtype=object)],
                {"classes_strings": ["a", "b"]}, opset=1)
    same(y, np.array([1, -1], np.int64))
    (y,) = ours("LabelEncoder", [np.array([0, 5], np.int64)],
                {"classes_strings": ["a", "b"]}, opset=1)
    assert y.tolist() == ["a", "_Unused"]


@pytest.mark.parametrize("agg,post", [(0, 0), (1, 2), (2, 0), (3, 1), (1, 4)])
def test_tree_ensemble_aggregates(agg, post):
    # Two stumps on feature 0 and 1, each leaf voting into one of two targets.
    attrs = dict(
        aggregate_function=agg, post_transform=post, n_targets=2, tree_roots=[0, 1],
        nodes_featureids=[0, 1], nodes_modes=np.array([0, 3], np.uint8),
        nodes_splits=np.array([0.0, 0.5], np.float32),
        nodes_truenodeids=[0, 2], nodes_trueleafs=[1, 1],
        nodes_falsenodeids=[1, 3], nodes_falseleafs=[1, 1],
        leaf_targetids=[0, 1, 0, 1], leaf_weights=np.array([1.0, 2.0, 0.5, 0.25], np.float32),
    )
    x = np.array([[-1.0, 1.0], [1.0, 0.0], [0.0, 0.5]], np.float32)
    (y,) = ours("TreeEnsemble", [x], attrs, opset=5)
    leaves = [[0, 2], [1, 3], [0, 3]]  # leaf per (row, tree)
    w, t = attrs["leaf_weights"], attrs["leaf_targetids"]
    raw = np.zeros((3, 2))
    for r, ls in enumerate(leaves):
        votes = {0: [], 1: []}
        for leaf in ls:
            votes[t[leaf]].append(float(w[leaf]))
        for k, v in votes.items():
            if v:
                raw[r, k] = {0: np.mean(v) * len(v) / 2, 1: sum(v), 2: min(v), 3: max(v)}[agg]
    if post == 1:
        raw = np.exp(raw - raw.max(1, keepdims=True))
        raw /= raw.sum(1, keepdims=True)
    elif post == 2:
        raw = 1 / (1 + np.exp(-raw))
    elif post == 4:
        from statistics import NormalDist

        raw = np.vectorize(lambda p: NormalDist().inv_cdf(p) if 0 < p < 1 else np.nan)(raw)
    same(y, raw.astype(np.float32), rtol=1e-4, atol=1e-5)


def test_training_momentum_nesterov_formula():
    r, t = np.array(0.1, np.float32), np.array(1, np.int64)
    x, g, v = (RNG.standard_normal(3).astype(np.float32) for _ in range(3))
    attrs = {"alpha": 0.9, "beta": 0.5, "mode": "nesterov", "norm_coefficient": 0.01}
    xn, vn = ours("Momentum", [r, t, x, g, v], attrs, opset=1, domain="ai.onnx.preview.training")
    gr = 0.01 * x + g
    want_v = 0.9 * v + 0.5 * gr
    same(vn, want_v.astype(np.float32))
    same(xn, (x - 0.1 * (gr + 0.9 * want_v)).astype(np.float32))


# ---------------------------------------------------------------------------- tree ensembles


def _forest(n_trees=3, depth=3, F=4, n_out=1, per_leaf=1, neg=True, missing=False, seed=0,
            modes=("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT")):
    """Random trees as v1/v3 node attributes plus leaf (tree, node, id, weight) entries.

    Nodes are listed depth-first with the false child right after its parent (ORT requires
    that layout)."""
    rng = np.random.default_rng(seed)
    nodes, leaves = [], []
    for t in range(n_trees):
        counter = [0]

        def build(d, t=t, counter=counter):
            me = counter[0]
            counter[0] += 1
            if d == 0 or (d < depth and rng.random() < 0.3):
                nodes.append((t, me, 0, "LEAF", 0.0, 0, 0, 0))
                leaves.append((t, me))
                return me
            at = len(nodes)
            nodes.append(None)
            fa = build(d - 1)
            tr = build(d - 1)
            nodes[at] = (t, me, int(rng.integers(F)), str(rng.choice(modes)),
                         float(np.round(rng.standard_normal(), 1)), tr, fa,
                         int(missing and rng.random() < 0.5))
            return me

        build(depth)
    cols = list(zip(*nodes))
    attrs = {"nodes_treeids": list(cols[0]), "nodes_nodeids": list(cols[1]),
             "nodes_featureids": list(cols[2]), "nodes_modes": list(cols[3]),
             "nodes_values": list(cols[4]), "nodes_truenodeids": list(cols[5]),
             "nodes_falsenodeids": list(cols[6])}
    if missing:
        attrs["nodes_missing_value_tracks_true"] = list(cols[7])
    entries = []
    for t, nd in leaves:
        for j in rng.choice(n_out, min(per_leaf, n_out), replace=False):
            w = rng.standard_normal() if neg else rng.random()
            entries.append((t, nd, int(j), float(w)))
    return attrs, [list(c) for c in zip(*entries)]


def _regressor_attrs(n_out=1, per_leaf=1, base=False, seed=0, **kw):
    attrs, (tids, nids, ids, ws) = _forest(n_out=n_out, per_leaf=per_leaf, seed=seed)
    attrs.update(n_targets=n_out, target_treeids=tids, target_nodeids=nids, target_ids=ids,
                 target_weights=ws, **kw)
    if base:
        attrs["base_values"] = [0.25 * (k + 1) for k in range(n_out)]
    return attrs


_X_TREES = RNG.standard_normal((25, 4)).astype(np.float32)


@pytest.mark.parametrize("opset", [1, 3])
@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("n_out,per_leaf,base", [(1, 1, False), (1, 1, True), (3, 2, False),
                                                 (3, 2, True)])
def test_tree_ensemble_regressor(opset, agg, post, n_out, per_leaf, base):
    attrs = _regressor_attrs(n_out, per_leaf, base, aggregate_function=agg,
                             post_transform=post)
    (y,) = both("TreeEnsembleRegressor", [_X_TREES], attrs, opset=opset)
    assert y.shape == (25, n_out)


@pytest.mark.parametrize("n_out", [1, 2])
def test_tree_ensemble_regressor_probit(n_out):
    # Scores inside (0, 1); ORT's erfinv is an approximation good to ~2e-3.
    attrs = _regressor_attrs(n_out, 1, post_transform="PROBIT")
    attrs["target_weights"] = [abs(w) / 10 for w in attrs["target_weights"]]
    x = RNG.random((20, 4)).astype(np.float32)
    both("TreeEnsembleRegressor", [x], attrs, rtol=5e-3, atol=1e-3)


def test_tree_ensemble_regressor_missing_values_double_and_tensors():
    attrs, (tids, nids, ids, ws) = _forest(n_out=2, per_leaf=2, missing=True, seed=3)
    attrs.update(n_targets=2, target_treeids=tids, target_nodeids=nids, target_ids=ids,
                 target_weights=ws, base_values=[0.5, -0.5])
    x = _X_TREES.copy()
    x[::3, 1] = np.nan
    both("TreeEnsembleRegressor", [x], attrs)
    both("TreeEnsembleRegressor", [x.astype(np.float64)], attrs)
    for dt in (np.float32, np.float64):
        tensors = {"nodes_values_as_tensor": np.array(attrs["nodes_values"], dt),
                   "target_weights_as_tensor": np.array(ws, dt),
                   "base_values_as_tensor": np.array([0.5, -0.5], dt)}
        plain = {k: v for k, v in attrs.items()
                 if k not in ("nodes_values", "target_weights", "base_values")}
        got = ours("TreeEnsembleRegressor", [x.astype(dt)], {**plain, **tensors})
        ref = theirs("TreeEnsembleRegressor", [x.astype(dt)],
                     {**plain, **{k: numpy_helper.from_array(v) for k, v in tensors.items()}})
        same(got[0], ref[0])


def test_tree_ensemble_regressor_single_leaf_tree_and_errors():
    attrs = _regressor_attrs(1, 1, False)
    # A one-node tree (its root is a leaf) next to the others.
    attrs["nodes_treeids"].append(7)
    attrs["nodes_nodeids"].append(0)
    for k, v in (("nodes_featureids", 0), ("nodes_modes", "LEAF"), ("nodes_values", 0.0),
                 ("nodes_truenodeids", 0), ("nodes_falsenodeids", 0)):
        attrs[k].append(v)
    for k, v in (("target_treeids", 7), ("target_nodeids", 0), ("target_ids", 0),
                 ("target_weights", 2.5)):
        attrs[k].append(v)
    both("TreeEnsembleRegressor", [_X_TREES], attrs)
    bad = dict(attrs, nodes_featureids=[9] * len(attrs["nodes_featureids"]))
    with pytest.raises(KernelError, match="feature id"):
        ours("TreeEnsembleRegressor", [_X_TREES], bad)
    bad = dict(attrs, target_ids=[5] * len(attrs["target_ids"]))
    with pytest.raises(KernelError, match="out of range"):
        ours("TreeEnsembleRegressor", [_X_TREES], bad)


@pytest.mark.parametrize("opset", [1, 3])
@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("n_cls,per_leaf,ids,base", [
    (3, 3, "all", 0), (3, 2, "all", 3), (4, 2, "all", 0),   # multiclass
    (2, 2, "all", 0), (2, 2, "all", 2),                      # two classes, both scored
    (2, 1, "one1", 0), (2, 1, "one1", 1), (2, 1, "one1", 2),  # binary: one class scored
    (2, 1, "one0", 0), (2, 1, "one0", 1), (2, 1, "one0", 2),
])
@pytest.mark.parametrize("neg", [True, False])
@pytest.mark.parametrize("labels", ["int", "str"])
def test_tree_ensemble_classifier(opset, post, n_cls, per_leaf, ids, base, neg, labels):
    seed = zlib.crc32(repr((post, n_cls, ids, base, neg)).encode()) % 1000
    attrs, (tids, nids, cids, ws) = _forest(n_out=n_cls, per_leaf=per_leaf, neg=neg, seed=seed)
    if ids != "all":
        cids = [int(ids[-1])] * len(cids)
    attrs.update(post_transform=post, class_treeids=tids, class_nodeids=nids, class_ids=cids,
                 class_weights=ws)
    if labels == "int":
        attrs["classlabels_int64s"] = [10 * (k + 1) for k in range(n_cls)]
    else:
        attrs["classlabels_strings"] = [f"c{k}" for k in range(n_cls)]
    if base:
        attrs["base_values"] = [0.25, 0.5, -0.25, 0.1][:base]
    lab, z = both("TreeEnsembleClassifier", [_X_TREES], attrs, n_out=2, opset=opset)
    assert z.shape == (25, n_cls) and lab.shape == (25,)
