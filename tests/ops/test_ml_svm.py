"""SVMClassifier and SVMRegressor against onnxruntime: random attributes (every kernel, post
transform, class count, label type) and real sklearn models converted by skl2onnx, run
through a whole session."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import opwarden
from opwarden.dtypes import onnx_type
from opwarden.errors import KernelError, OpwardenError
from opwarden.ops import REGISTRY
from opwarden.ops.ml_svm import SVMClassifier, SVMRegressor, random_svc

ort = pytest.importorskip("onnxruntime")
ML = "ai.onnx.ml"
KERNELS = ["LINEAR", "POLY", "RBF", "SIGMOID"]
POSTS = ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"]
# sklearn 1.9 deprecates SVC(probability=True), which skl2onnx still converts
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def node_model(op_type, x, attrs, n_out):
    node = helper.make_node(op_type, ["x"], [f"o{k}" for k in range(n_out)], domain=ML, **attrs)
    g = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", onnx_type(x.dtype), x.shape)],
        [onnx.ValueInfoProto(name=f"o{k}") for k in range(n_out)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(ML, 1)])
    m.ir_version = 8
    return m.SerializeToString()


def theirs(op_type, x, attrs, n_out):
    sess = ort.InferenceSession(node_model(op_type, x, attrs, n_out),
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})


def agree(got, ref, rtol=2e-5, atol=2e-6):
    for a, b in zip(got, ref):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
        if a.dtype == object or a.dtype.kind == "i":
            assert a.tolist() == b.tolist()
        else:
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)


def classify(x, attrs):
    got = SVMClassifier(x, **{"kernel_type": "LINEAR", "post_transform": "NONE", **attrs})
    ref = theirs("SVMClassifier", x, attrs, 2)
    if attrs.get("post_transform") == "PROBIT" and got[1].shape[1] == 2 and "prob_a" not in attrs:
        # ORT leaves the second column of a binary PROBIT score unwritten (whatever memory held)
        got, ref = [got[0], got[1][:, :1]], [ref[0], ref[1][:, :1]]
    agree(got, ref)
    return got


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("classes", [2, 3, 5])
@pytest.mark.parametrize("proba", [False, True])
def test_classifier_kernels(kernel, classes, proba):
    rng = np.random.default_rng(classes * 7 + KERNELS.index(kernel) + 100 * proba)
    x = rng.standard_normal((33, 6)).astype(np.float32)
    y, z = classify(x, random_svc(rng, classes, 6, kernel, proba))
    assert z.shape == (33, classes if proba else max(2, classes * (classes - 1) // 2))
    if proba:  # coupled probabilities are a distribution per row
        np.testing.assert_allclose(z.sum(axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("classes,proba", [(2, False), (2, True), (4, False), (4, True)])
def test_classifier_post_transforms(post, classes, proba):
    rng = np.random.default_rng(POSTS.index(post) * 11 + classes + 50 * proba)
    x = rng.standard_normal((20, 4)).astype(np.float32)
    classify(x, random_svc(rng, classes, 4, "RBF", proba, post=post))


@pytest.mark.parametrize("strings", [False, True])
def test_classifier_labels_and_input_types(strings):
    rng = np.random.default_rng(5)
    attrs = random_svc(rng, 3, 4, "POLY", strings=strings)
    x = rng.standard_normal((9, 4))
    for xx in (x.astype(np.float32), x, (x * 3).astype(np.int64), (x * 3).astype(np.int32)):
        y, _ = classify(xx, attrs)
        assert y.dtype == (object if strings else np.int64)
    classify(x[0].astype(np.float32), attrs)  # a 1-D X is one row
    classify(x[:0].astype(np.float32), attrs)  # no rows


@pytest.mark.parametrize("classes", [2, 3])
@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_classifier_liblinear(classes, post):
    """No support vectors: scores X W' + rho[0] and ORT's two-class thresholds (both signs of
    weights, i.e. the 0 and the 0.5 cut)."""
    rng = np.random.default_rng(classes)
    x = rng.standard_normal((40, 5)).astype(np.float32)
    for coef in (rng.standard_normal(classes * 5), rng.uniform(0, 0.3, classes * 5)):
        attrs = {"coefficients": coef.astype(np.float32).tolist(), "rho": [0.1],
                 "classlabels_ints": list(range(3, 3 + classes)),
                 "kernel_params": [0.0, 0.0, 0.0], "post_transform": post}
        classify(x, attrs)


def test_classifier_ties_vote_for_the_first_class():
    """Three classes whose pairwise decisions form a cycle: each gets one vote, the first wins
    (ORT's max_element)."""
    attrs = {"kernel_type": "LINEAR", "kernel_params": [0.0, 0.0, 0.0],
             "vectors_per_class": [1, 1, 1], "support_vectors": [1.0, 0.0, 0.0],
             "coefficients": [0.0] * 6, "rho": [1.0, -1.0, 1.0], "classlabels_ints": [7, 8, 9]}
    x = np.zeros((2, 1), np.float32)
    y, _ = classify(x, attrs)
    assert y.tolist() == [7, 7]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("one_class", [0, 1])
def test_regressor(kernel, one_class):
    rng = np.random.default_rng(KERNELS.index(kernel) + 10 * one_class)
    v = 9
    attrs = {"kernel_type": kernel, "kernel_params": [0.25, 0.5, 3.0], "n_supports": v,
             "support_vectors": rng.standard_normal(v * 5).astype(np.float32).tolist(),
             "coefficients": rng.standard_normal(v).astype(np.float32).tolist(),
             "rho": [0.2], "one_class": one_class}
    x = rng.standard_normal((17, 5)).astype(np.float32)
    agree([SVMRegressor(x, **attrs)], theirs("SVMRegressor", x, attrs, 1))
    agree([SVMRegressor(x[3], **attrs)], theirs("SVMRegressor", x[3], attrs, 1))


def test_regressor_liblinear_and_post_transform():
    """Without support vectors x . w + rho; ORT applies no post_transform to a regressor."""
    x = np.random.default_rng(2).standard_normal((6, 3)).astype(np.float32)
    for post in ("NONE", "LOGISTIC"):
        attrs = {"coefficients": [0.5, -1.0, 2.0], "rho": [0.3], "post_transform": post,
                 "kernel_params": [0.0, 0.0, 0.0]}
        agree([SVMRegressor(x, **attrs)], theirs("SVMRegressor", x, attrs, 1))


def test_bad_attributes_are_clear_errors():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    attrs = random_svc(rng, 3, 4)
    with pytest.raises(KernelError, match="support_vectors"):
        SVMClassifier(x[:, :3], **attrs)
    with pytest.raises(KernelError, match="classlabels"):
        SVMClassifier(x, **{k: v for k, v in attrs.items() if k != "classlabels_ints"})
    with pytest.raises(KernelError, match="rho"):
        SVMClassifier(x, **{**attrs, "rho": [0.0]})
    with pytest.raises(KernelError, match="coefficients"):
        SVMRegressor(x, coefficients=[1.0, 2.0], rho=[0.0])


def test_shape_rules():
    opdef = REGISTRY.latest("SVMClassifier", ML)
    from opwarden.contract import TensorFact

    y, z = opdef.infer_fn(TensorFact("float32", ("N", 4)), **random_svc(
        np.random.default_rng(0), 4, 4, strings=True))
    assert (y.dtype, y.shape, z.shape) == ("string", ("N",), ("N", 6))
    y, z = opdef.infer_fn(TensorFact("float32", (3, 4)), **random_svc(
        np.random.default_rng(0), 4, 4, proba=True))
    assert (y.dtype, z.shape) == ("int64", (3, 4))
    (r,) = [REGISTRY.latest("SVMRegressor", ML).infer_fn(TensorFact("float32", (4,)))]
    assert r.shape == (1, 1)


# --------------------------------------------------------------------------------------------
# sklearn models through skl2onnx, whole sessions against onnxruntime
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data():
    pytest.importorskip("sklearn")
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=120, n_features=6, n_informative=4, n_redundant=0,
                               n_classes=4, n_clusters_per_class=1, random_state=0)
    return x.astype(np.float32), y


def convert(model, n_features):
    skl2onnx = pytest.importorskip("skl2onnx")
    from skl2onnx.common.data_types import FloatTensorType

    onx = skl2onnx.to_onnx(model, initial_types=[("X", FloatTensorType([None, n_features]))],
                           options={id(model): {"zipmap": False}} if hasattr(model, "classes_")
                           else None, target_opset={"": 17, ML: 1})
    return onx.SerializeToString()


def both_sessions(blob, x):
    ref = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, {"X": x})
    got = opwarden.InferenceSession(blob).run(None, {"X": x})
    return got, ref


SVC_CASES = [(k, p, c) for k in ("linear", "poly", "rbf", "sigmoid") for p in (False, True)
             for c in (2, 4)]


@pytest.mark.parametrize("kernel,proba,classes", SVC_CASES)
def test_sklearn_svc(data, kernel, proba, classes):
    from sklearn.svm import SVC

    x, y = data
    y = y % classes
    model = SVC(kernel=kernel, probability=proba, gamma=0.2, coef0=0.5, degree=3,
                random_state=0).fit(x, y)
    got, ref = both_sessions(convert(model, x.shape[1]), x)
    agree(got, ref, rtol=1e-4, atol=1e-5)
    if not proba:  # and the labels are sklearn's own
        assert got[0].tolist() == model.predict(x).tolist()


@pytest.mark.parametrize("classes", [2, 3])
def test_sklearn_nusvc_strings(data, classes):
    from sklearn.svm import NuSVC

    x, y = data
    labels = np.array(["ant", "bee", "cat", "dog"])[y % classes]
    model = NuSVC(nu=0.3, probability=True, random_state=0).fit(x, labels)
    got, ref = both_sessions(convert(model, x.shape[1]), x)
    agree(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["SVR", "NuSVR", "OneClassSVM", "LinearSVR"])
def test_sklearn_regressors(data, name):
    from sklearn import svm

    x, y = data
    target = x[:, 0] * 2 - x[:, 1] + 0.1 * y
    cls = getattr(svm, name)
    if name == "OneClassSVM":
        model = cls(nu=0.2, gamma=0.3).fit(x)
    elif name == "LinearSVR":
        model = cls(random_state=0, max_iter=5000).fit(x, target)
    else:
        model = cls(kernel="rbf", C=2.0).fit(x, target)
    got, ref = both_sessions(convert(model, x.shape[1]), x)
    agree(got, ref, rtol=1e-4, atol=1e-4)
    if name == "OneClassSVM":
        assert got[0].ravel().astype(int).tolist() == model.predict(x).tolist()


def test_session_reports_a_bad_model_clearly():
    """A support-vector table that does not match X's width fails as an OpwardenError naming
    the node's operator, and the session still runs good feeds."""
    rng = np.random.default_rng(1)
    attrs = random_svc(rng, 3, 4)
    blob = node_model("SVMClassifier", np.zeros((2, 4), np.float32), attrs, 2)
    sess = opwarden.InferenceSession(blob)
    with pytest.raises(OpwardenError):
        sess.run(None, {"x": np.zeros((2, 4, 1), np.float32)})
    assert sess.run(None, {"x": np.ones((2, 4), np.float32)})[0].shape == (2,)
