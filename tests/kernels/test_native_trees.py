"""The compiled tree-ensemble variants (kernels/cpu/ml.py over opwarden.native) against the
NumPy reference on random forests (every mode, NaN routing, aggregates, post transforms,
input types) and against onnxruntime on sklearn forests; the NumPy fallback with
OPWARDEN_NATIVE=0; bad forests refused with an OpwardenError."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import opwarden
from opwarden import native
from opwarden.errors import KernelError, OpwardenError
from opwarden.ops import REGISTRY
from opwarden.ops.ml_tree_samples import V3_MODES, grid_input, random_trees, te5_attrs, v3_attrs

ML = "ai.onnx.ml"
DISABLED = os.environ.get("OPWARDEN_NATIVE", "1") == "0"


def test_native_path_is_active_unless_disabled():
    # A failed build would silently leave the fallback: say so here instead.
    st = native.status()
    if DISABLED:
        assert st["active"] == "numpy" and "OPWARDEN_NATIVE=0" in st["reason"]
    else:
        assert st["active"] == "native", st["reason"]


needs_native = pytest.mark.skipif(DISABLED, reason="compiled path disabled (OPWARDEN_NATIVE=0)")


def variants(op_type: str, since: int | None = None):
    versions = REGISTRY.versions(op_type, ML)
    opdef = versions[-1] if since is None else next(o for o in versions if o.since == since)
    by_name = {v.name: v for v in opdef.variants}
    return by_name[f"{op_type.lower()}.ref"], by_name[f"{op_type.lower()}.cpu.native"]


def agree(got, ref):
    got, ref = (got, ref) if isinstance(got, tuple) else ((got,), (ref,))
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == r.dtype and g.shape == r.shape
        if r.dtype.kind == "f":
            np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-6, equal_nan=True)
        else:
            assert g.tolist() == r.tolist()


def run_both(op_type, x, attrs, since=None):
    """The reference, the native variant as given, and the native variant bound to a node
    (specialize: flattened once, reused by a second call)."""
    ref_v, nat_v = variants(op_type, since)
    ref = ref_v.fn(x, **attrs)
    agree(nat_v.fn(x, **attrs), ref)
    bound = nat_v.specialize(dict(attrs))
    agree(bound(x, **attrs), ref)
    agree(bound(x, **attrs), ref)
    return ref


@needs_native
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("agg", range(4))
def test_tree_ensemble5_random(seed, agg):
    rng = np.random.default_rng(seed)
    trees = random_trees(rng, 5, 5, 4, V3_MODES, member=True)
    attrs = te5_attrs(rng, trees, 3, aggregate_function=agg, post_transform=seed % 5)
    x = grid_input(rng, 40, 4)
    for dt in (np.float32, np.float64, np.float16):
        run_both("TreeEnsemble", x.astype(dt), attrs)


@needs_native
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("n_out", [1, 3])
def test_regressor_random(seed, agg, n_out):
    rng = np.random.default_rng(seed)
    modes = V3_MODES if seed % 2 else ("BRANCH_LT",)  # mixed modes, and the all-LT fast walk
    trees = random_trees(rng, 6, 5, 3, modes)
    post = ["NONE", "PROBIT", "SOFTMAX", "LOGISTIC"][seed]
    attrs = v3_attrs(rng, trees, n_out, aggregate_function=agg, post_transform=post,
                     base_values=list(rng.standard_normal(n_out)))
    x = grid_input(rng, 30, 3)
    for since in (1, 3):
        run_both("TreeEnsembleRegressor", x, attrs, since)
    run_both("TreeEnsembleRegressor", x.astype(np.float64), attrs)
    run_both("TreeEnsembleRegressor", rng.integers(-2, 3, (7, 3)), attrs)


@needs_native
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n_cls", [2, 3])
def test_classifier_random(seed, n_cls):
    rng = np.random.default_rng(seed)
    trees = random_trees(rng, 4, 5, 3, V3_MODES if seed % 2 else ("BRANCH_LEQ",))
    post = ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO"][seed]
    attrs = v3_attrs(rng, trees, n_cls, "classifier", post_transform=post)
    if seed == 3 and n_cls == 2:
        attrs["class_ids"] = [1] * len(attrs["class_ids"])  # the one-score-column binary case
    x = grid_input(rng, 30, 3)
    for since in (1, 3):
        run_both("TreeEnsembleClassifier", x, attrs, since)
    strings = dict(attrs, classlabels_int64s=None,
                   classlabels_strings=[f"c{i}" for i in range(n_cls)])
    run_both("TreeEnsembleClassifier", x, strings)


@needs_native
def test_single_leaf_trees_and_empty_batch():
    rng = np.random.default_rng(0)
    trees = random_trees(rng, 3, 3, 2) + [[{"leaf": True}]]
    attrs = v3_attrs(rng, trees, 2)
    run_both("TreeEnsembleRegressor", grid_input(rng, 5, 2), attrs)
    run_both("TreeEnsembleRegressor", grid_input(rng, 0, 2), attrs)
    run_both("TreeEnsembleRegressor", grid_input(rng, 1, 2)[0], attrs)


@needs_native
def test_bad_forests_are_refused():
    rng = np.random.default_rng(1)
    _, nat = variants("TreeEnsemble")
    attrs = te5_attrs(rng, random_trees(rng, 2, 3, 2), 2)
    x = grid_input(rng, 3, 2)
    looped = dict(attrs, nodes_truenodeids=[0] * len(attrs["nodes_truenodeids"]),
                  nodes_trueleafs=[0] * len(attrs["nodes_trueleafs"]))
    with pytest.raises(KernelError, match="cycle"):
        nat.fn(x, **looped)
    far = dict(attrs, nodes_falsenodeids=[10**6] * len(attrs["nodes_falsenodeids"]))
    with pytest.raises(KernelError, match="false child out of range"):
        nat.fn(x, **far)
    with pytest.raises(KernelError, match="feature id"):
        nat.fn(x[:, :1], **attrs)
    _, reg = variants("TreeEnsembleRegressor")
    a = v3_attrs(rng, random_trees(rng, 2, 3, 2), 1)
    a["nodes_truenodeids"] = [99] * len(a["nodes_truenodeids"])
    with pytest.raises(KernelError, match="true node 99"):
        reg.fn(x, **a)
    assert issubclass(KernelError, OpwardenError)


@needs_native
@pytest.mark.parametrize("rows", [1, 128])
@pytest.mark.parametrize("act", ["none", "relu", "gelu"])
def test_bias_act(rows, act):
    from math import erf

    rng = np.random.default_rng(rows)
    y = rng.standard_normal((rows, 3072)).astype(np.float32)
    b = rng.standard_normal(3072).astype(np.float32)
    z = (y + b).astype(np.float64)
    want = {"none": z, "relu": np.maximum(z, 0),
            "gelu": 0.5 * z * (1 + np.vectorize(erf)(z / np.sqrt(2)))}[act]
    np.testing.assert_allclose(native.bias_act(y, b, act, n_threads=2), want, rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(KernelError, match="bias has"):
        native.bias_act(y, b[:5], act)


# --------------------------------------------------------------------------------------------
# sklearn forests through skl2onnx: whole sessions against onnxruntime
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data():
    pytest.importorskip("sklearn")
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=200, n_features=8, n_informative=5, n_redundant=0,
                               n_classes=3, n_clusters_per_class=1, random_state=0)
    x = x.astype(np.float32)
    x[::17, 2] = np.nan  # a NaN feature value goes down the tree's missing branch
    return x, y


def _models():
    from sklearn import ensemble as e

    # (HistGradientBoosting: skl2onnx 1.20 writes its missing flags as bools, which onnx
    # 1.23 refuses, so no model to compare on; the random forests above cover NaN routing.)
    for cls in (e.RandomForestRegressor, e.ExtraTreesRegressor, e.GradientBoostingRegressor):
        yield cls.__name__, "reg", cls
    for cls in (e.RandomForestClassifier, e.ExtraTreesClassifier, e.GradientBoostingClassifier):
        for n_cls in (2, 3):
            yield f"{cls.__name__}-{n_cls}", n_cls, cls


MODELS = list(_models()) if __import__("importlib").util.find_spec("sklearn") else []


def _fit(cls, kind, x, y):
    model = cls(n_estimators=8, max_depth=5, random_state=0)
    xf = np.nan_to_num(x)  # fit without NaN; run with it
    if kind == "reg":
        return model.fit(xf, y.astype(np.float32) + xf[:, 0])
    return model.fit(xf, y % kind)


@pytest.mark.parametrize("name,kind,cls", MODELS, ids=[m[0] for m in MODELS])
@pytest.mark.parametrize("ml_opset", [3, 5])
def test_sklearn_forests_against_onnxruntime(data, name, kind, cls, ml_opset):
    ort = pytest.importorskip("onnxruntime")
    skl2onnx = pytest.importorskip("skl2onnx")
    from skl2onnx.common.data_types import FloatTensorType

    x, y = data
    model = _fit(cls, kind, x, y)
    opts = {id(model): {"zipmap": False}} if kind != "reg" else None
    onx = skl2onnx.to_onnx(model, initial_types=[("X", FloatTensorType([None, x.shape[1]]))],
                           options=opts, target_opset={"": 17, ML: ml_opset})
    blob = onx.SerializeToString()
    ref = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"X": x})
    sess = opwarden.InferenceSession(blob)
    got = sess.run(None, {"X": x})
    for g, r in zip(got, ref, strict=True):
        if r.dtype.kind == "f":
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
        else:
            assert g.tolist() == r.tolist()
    tree_rows = [r for r in sess.explain() if r["op_type"].startswith("TreeEnsemble")]
    assert tree_rows
    want = ".ref" if DISABLED else ".cpu.native"
    assert all(r["variant"].endswith(want) for r in tree_rows), tree_rows


def test_fallback_when_disabled():
    """OPWARDEN_NATIVE=0: the status says so, no compiled variant is registered, and the
    reference kernels run the trees (this file's tests in that mode: the lead's suite run)."""
    code = (
        "from opwarden import native\n"
        "from opwarden.ops import REGISTRY\n"
        "names = [v.name for o in REGISTRY.versions('TreeEnsembleRegressor', 'ai.onnx.ml')"
        " for v in o.variants]\n"
        "print(native.status()['active'], native.status()['reason'], sorted(set(names)))\n"
    )
    env = dict(os.environ, OPWARDEN_NATIVE="0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True, timeout=120).stdout
    assert out.startswith("numpy NumPy fallback: disabled by OPWARDEN_NATIVE=0"), out
    assert "treeensembleregressor.ref" in out and ".cpu.native" not in out, out
