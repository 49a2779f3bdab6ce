"""Operators: the support vector machines of ai.onnx.ml (SVMClassifier, SVMRegressor).

They follow ONNX Runtime's CPU kernels, which every sklearn SVM converted by skl2onnx is run
and checked with: float32 kernels between the rows and the support vectors (or the liblinear
weights when there are none), one-vs-one decision values with voting, Platt scaling (prob_a,
prob_b) coupled into class probabilities by Wu, Lin and Weng's iterative method in float32,
and ORT's post transforms (PROBIT by its closed-form erfinv approximation, the binary score
completed into two columns). Every step runs on all rows at once; loops go over class pairs,
classes and support-vector blocks only.
"""

from __future__ import annotations

import numpy as np

from opwarden.contract import Contract, TensorFact, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import Sample, op
from opwarden.ops.ml import _TRANSFORM_NAMES, ML, _strings

_KERNEL_NAMES = ("LINEAR", "POLY", "RBF", "SIGMOID")
_F32 = np.float32
# Elements of the (rows, support vectors, features) differences RBF builds per block.
_RBF_BLOCK = 1 << 20


def _rows(X, opname: str) -> np.ndarray:
    """X as float32 rows (ORT casts double and integer inputs to float before the kernels);
    a 1-D X is one row."""
    X = np.asarray(X)
    if X.dtype.kind not in "fiu":
        raise KernelError(f"{opname}: X must be numeric, got {X.dtype}")
    if X.ndim == 1:
        X = X.reshape(1, -1)
    if X.ndim != 2:
        raise KernelError(f"{opname}: X must be [N, C] or [C], got shape {list(X.shape)}")
    return X.astype(_F32, copy=False)


def _params(kernel_params) -> tuple[float, float, float]:
    """gamma, coef0, degree (ORT reads them as float and leaves them 0 when absent)."""
    p = np.asarray(kernel_params if kernel_params is not None else [], _F32).reshape(-1)
    if p.size == 0:
        return 0.0, 0.0, 0.0
    if p.size < 3:
        raise KernelError(f"kernel_params must hold gamma, coef0, degree; got {p.tolist()}")
    return float(p[0]), float(p[1]), float(p[2])


def _support(support_vectors, n_vectors: int, n_features: int, opname: str) -> np.ndarray:
    sv = np.asarray(support_vectors if support_vectors is not None else [], _F32).reshape(-1)
    if sv.size != n_vectors * n_features:
        raise KernelError(
            f"{opname}: support_vectors holds {sv.size} values; {n_vectors} support vectors of "
            f"the {n_features} features of X need {n_vectors * n_features}")
    return sv.reshape(n_vectors, n_features)


def _kernel(X: np.ndarray, SV: np.ndarray, kind: str, params, c: float = 0.0) -> np.ndarray:
    """[N, V] kernel values of each row against each support vector, rounded to float32 as
    ORT stores them; `c` is the constant LINEAR adds (the liblinear intercept)."""
    gamma, coef0, degree = params
    x, sv = X.astype(np.float64), SV.astype(np.float64)
    if kind == "RBF":
        out = np.empty((x.shape[0], sv.shape[0]), np.float64)
        step = max(1, _RBF_BLOCK // max(1, x.shape[0] * x.shape[1]))
        for s in range(0, sv.shape[0], step):
            d = x[:, None, :] - sv[None, s:s + step, :]
            out[:, s:s + step] = np.einsum("nvf,nvf->nv", d, d)
        return np.exp(-np.float64(_F32(gamma)) * out).astype(_F32)
    dot = x @ sv.T
    if kind == "LINEAR":
        return (dot + c).astype(_F32)
    lin = (_F32(gamma) * dot + _F32(coef0)).astype(_F32)
    with np.errstate(invalid="ignore", over="ignore"):
        if kind == "POLY":
            return np.power(lin, _F32(degree), dtype=_F32)
        return np.tanh(lin)


# --------------------------------------------------------------------------------------------
# ORT's post transforms (ml_common.h): float32, PROBIT through Winitzki's erfinv formula
# --------------------------------------------------------------------------------------------

def _logistic(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        e = (_F32(1) / (_F32(1) + np.exp(-np.abs(v)))).astype(_F32)
    return np.where(v < 0, _F32(1) - e, e).astype(_F32)


def _erfinv_approx(x: np.ndarray) -> np.ndarray:
    """The closed-form approximation (a = 0.147) ORT's PROBIT uses, in float32."""
    x = x.astype(_F32)
    sgn = np.where(x < 0, _F32(-1), _F32(1))
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = np.log((_F32(1) - x) * (_F32(1) + x))
        v = _F32(2) / (_F32(np.pi) * _F32(0.147)) + _F32(0.5) * lg
        v2 = _F32(1) / _F32(0.147) * lg
        v3 = -v + np.sqrt(v * v - v2)
        return (sgn * np.sqrt(v3)).astype(_F32)


def _probit(v: np.ndarray) -> np.ndarray:
    return (_F32(np.sqrt(2.0)) * _erfinv_approx(_F32(2) * v - _F32(1))).astype(_F32)


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(_F32)


def _softmax_zero(s: np.ndarray) -> np.ndarray:
    """ORT's SOFTMAX_ZERO: entries within 1e-7 of zero are scaled by exp(-max), not
    exponentiated, so zeros stay zero (the max still counts them)."""
    m = s.max(axis=1, keepdims=True)
    nz = (s > _F32(1e-7)) | (s < _F32(-1e-7))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        e = np.where(nz, np.exp(s - m), s * np.exp(-m))
        total = np.where(nz, e, 0).sum(axis=1, keepdims=True, dtype=_F32)
        return (e / total).astype(_F32)


def _transform_rows(s: np.ndarray, post: str) -> np.ndarray:
    """Post transform of score rows of two or more columns."""
    if post == "PROBIT":
        return _probit(s)
    if post == "LOGISTIC":
        return _logistic(s)
    if post == "SOFTMAX":
        return _softmax(s)
    if post == "SOFTMAX_ZERO":
        return _softmax_zero(s)
    return s.astype(_F32)


def _transform_binary(s: np.ndarray, post: str) -> np.ndarray:
    """One decision value per row completed into ORT's two columns: (-s, s) without a
    transform, (logistic(-s), logistic(s)) with LOGISTIC, (1 - s, s) (the raw value) with
    SOFTMAX/SOFTMAX_ZERO; PROBIT transforms the value and leaves ORT's second column unwritten
    (0 here)."""
    if post == "PROBIT":
        return np.stack([_probit(s), np.zeros_like(s)], axis=1)
    if post == "LOGISTIC":
        return np.stack([_logistic(-s), _logistic(s)], axis=1)
    first = -s if post == "NONE" else _F32(1) - s
    return np.stack([first, s], axis=1).astype(_F32)


# --------------------------------------------------------------------------------------------
# SVMClassifier
# --------------------------------------------------------------------------------------------

def _pair_decisions(K, coef, rho, counts) -> tuple[np.ndarray, np.ndarray]:
    """One-vs-one decision values [N, C(C-1)/2] (pairs (0,1), (0,2), ..., (1,2), ...) and the
    votes [N, C]: a positive value votes for the first class of its pair.

    coefficients are [C - 1, V]: the pair (i, j) reads class i's support vectors from row
    j - 1 and class j's from row i (libsvm's layout)."""
    n, c = K.shape[0], len(counts)
    start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    k64, cf = K.astype(np.float64), coef.astype(np.float64)
    dec = np.empty((n, c * (c - 1) // 2), _F32)
    votes = np.zeros((n, c), np.int64)
    rows = np.arange(n)
    idx = 0
    for i in range(c - 1):
        si = slice(start[i], start[i + 1])
        for j in range(i + 1, c):
            sj = slice(start[j], start[j + 1])
            s = k64[:, si] @ cf[j - 1, si] + k64[:, sj] @ cf[i, sj] + np.float64(rho[idx])
            dec[:, idx] = s
            np.add.at(votes, (rows, np.where(s > 0, i, j)), 1)
            idx += 1
    return dec, votes


def _pair_probabilities(dec, prob_a, prob_b, c: int) -> np.ndarray:
    """Platt-scaled pairwise probabilities r [N, C, C]: r[i, j] = P(i | i or j), clipped to
    [1e-7, 1 - 1e-7], r[j, i] = 1 - r[i, j] (float32, as ORT)."""
    n = dec.shape[0]
    r = np.zeros((n, c, c), _F32)
    idx = 0
    for i in range(c - 1):
        for j in range(i + 1, c):
            v = dec[:, idx] * _F32(prob_a[idx]) + _F32(prob_b[idx])
            p = np.clip(_F32(1) - _logistic(v.astype(_F32)), _F32(1e-7), _F32(1 - 1e-7))
            r[:, i, j], r[:, j, i] = p, _F32(1) - p
            idx += 1
    return r


def _couple(r: np.ndarray) -> np.ndarray:
    """Class probabilities [N, C] from pairwise ones by the iterative method of Wu, Lin and
    Weng (libsvm's multiclass_probability), in float32 and in ORT's order of operations so
    that each row stops after the same iteration as ORT's."""
    n, c = r.shape[0], r.shape[1]
    Q = np.zeros((n, c, c), _F32)
    for i in range(c):
        for j in range(c):
            if j != i:
                Q[:, i, i] += r[:, j, i] * r[:, j, i]
        for j in range(c):
            if j < i:
                Q[:, i, j] = Q[:, j, i]
            elif j > i:
                Q[:, i, j] = -r[:, j, i] * r[:, i, j]
    p = np.full((n, c), _F32(1) / _F32(c), _F32)
    eps = _F32(0.005) / _F32(c)
    active = np.ones(n, bool)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for _ in range(100):
            Qp, pQp = _qp(Q, p)
            active &= ~(np.abs(Qp - pQp[:, None]).max(axis=1, initial=_F32(0)) < eps)
            if not active.any():
                break
            p = np.where(active[:, None], _couple_step(Q, p, Qp, pQp), p)
    return p


def _qp(Q: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q p and p'Q p, summed in ORT's order in float32."""
    n, c = p.shape
    Qp = np.zeros((n, c), _F32)
    pQp = np.zeros(n, _F32)
    for i in range(c):
        for j in range(c):
            Qp[:, i] += Q[:, i, j] * p[:, j]
        pQp += p[:, i] * Qp[:, i]
    return Qp, pQp


def _couple_step(Q, p, Qp, pQp) -> np.ndarray:
    """One sweep over the classes: move p[i] to the minimizer, renormalize."""
    p, Qp, pQp = p.copy(), Qp.copy(), pQp.copy()
    one, two = _F32(1), _F32(2)
    for i in range(p.shape[1]):
        qii = Q[:, i, i]
        diff = (-Qp[:, i] + pQp) / qii
        p[:, i] += diff
        pQp = (pQp + diff * (diff * qii + two * Qp[:, i])) / (one + diff) / (one + diff)
        Qp = (Qp + diff[:, None] * Q[:, i, :]) / (one + diff)[:, None]
        p = p / (one + diff)[:, None]
    return p


def _classifier_labels(classlabels_ints, classlabels_strings):
    if classlabels_strings is not None and len(classlabels_strings):
        return _strings(classlabels_strings)
    if classlabels_ints is not None and len(classlabels_ints):
        return np.asarray(classlabels_ints, np.int64).reshape(-1)
    raise KernelError("SVMClassifier needs one of classlabels_strings, classlabels_ints")


def _linear_pick(scores, labels, have_proba: bool, all_positive: bool) -> np.ndarray:
    """liblinear mode: the best-scoring class; with two classes ORT's thresholds on the best
    score (0.5 with all weights non-negative, else 0) pick the second class."""
    pick = np.argmax(scores, axis=1)
    if labels.size == 2 and not have_proba:
        best = scores[np.arange(scores.shape[0]), pick]
        second = (best >= 0.5) if all_positive else (best > 0)
        pick = np.where(second, 1, pick)
    return pick


@op("SVMClassifier", since=1, domain=ML, contract=Contract(
    nan="produce",  # POLY with a fractional degree of a negative base; PROBIT outside (0, 1)
    allowed={"post_transform": _TRANSFORM_NAMES, "kernel_type": one_of(*_KERNEL_NAMES)}))
def SVMClassifier(X, *, classlabels_ints=None, classlabels_strings=None, coefficients=None,
                  kernel_params=None, kernel_type="LINEAR", post_transform="NONE", prob_a=None,
                  prob_b=None, rho=None, support_vectors=None, vectors_per_class=None):
    """Labels [N] and scores (ai.onnx.ml SVMClassifier-1): with support vectors, one-vs-one
    decision values [N, C(C-1)/2] (two columns for two classes) and the voted label, or with
    prob_a/prob_b the coupled class probabilities [N, C]; without support vectors the linear
    scores X W' + rho[0] [N, C] and the best class."""
    x = _rows(X, "SVMClassifier")
    labels = _classifier_labels(classlabels_ints, classlabels_strings)
    coef = np.asarray(coefficients if coefficients is not None else [], _F32).reshape(-1)
    rho_v = np.asarray(rho if rho is not None else [], _F32).reshape(-1)
    pa = np.asarray(prob_a if prob_a is not None else [], _F32).reshape(-1)
    pb = np.asarray(prob_b if prob_b is not None else [], _F32).reshape(-1)
    if coef.size == 0 or pa.size != pb.size:
        raise KernelError("SVMClassifier needs coefficients, and as many prob_b as prob_a "
                          f"(got {coef.size} coefficients, {pa.size} prob_a, {pb.size} prob_b)")
    counts = np.asarray(vectors_per_class if vectors_per_class is not None else [],
                        np.int64).reshape(-1)
    have_proba = pa.size > 0
    if counts.sum() == 0:
        return _linear_classifier(x, labels, coef, rho_v, have_proba, post_transform)
    v = int(counts.sum())
    sv = _support(support_vectors, v, x.shape[1], "SVMClassifier")
    K = _kernel(x, sv, kernel_type, _params(kernel_params))
    return _svc_classifier(K, labels, coef, rho_v, pa, pb, counts, post_transform)


def _linear_classifier(x, labels, coef, rho_v, have_proba: bool, post: str):
    c = labels.size
    if coef.size % c or coef.size // c != x.shape[1] or rho_v.size < 1:
        raise KernelError(
            f"SVMClassifier (linear): {coef.size} coefficients and {rho_v.size} rho do not "
            f"give {c} classes x {x.shape[1]} features of X and one rho")
    scores = _kernel(x, coef.reshape(c, -1), "LINEAR", (0.0, 0.0, 0.0), float(rho_v[0]))
    pick = _linear_pick(scores, labels, have_proba, bool((coef >= 0).all()))
    if c > 1:
        z = _transform_rows(scores, post)
    else:
        z = _probit(scores) if post == "PROBIT" else scores
    return labels[pick], z.astype(_F32)


def _svc_classifier(K, labels, coef, rho_v, pa, pb, counts, post: str):
    c, v = labels.size, K.shape[1]
    pairs = c * (c - 1) // 2
    if counts.size != c or (counts < 0).any():
        raise KernelError(f"SVMClassifier: vectors_per_class {counts.tolist()} must give a "
                          f"non-negative count for each of the {c} classes")
    if coef.size < (c - 1) * v or rho_v.size < pairs or (pa.size and pa.size < pairs):
        raise KernelError(
            f"SVMClassifier: {c} classes and {v} support vectors need {(c - 1) * v} "
            f"coefficients and {pairs} rho (and prob_a/prob_b if given); got {coef.size}, "
            f"{rho_v.size}, {pa.size}")
    dec, votes = _pair_decisions(K, coef[:(c - 1) * v].reshape(c - 1, v), rho_v, counts)
    pick = np.argmax(votes, axis=1)  # the first class with the most votes, as ORT
    if pa.size:
        z = _transform_rows(_couple(_pair_probabilities(dec, pa, pb, c)), post)
    elif c == 2:
        z = _transform_binary(dec[:, 0], post)
    elif c == 1:
        z = np.zeros((K.shape[0], 2), _F32)
    else:
        z = _transform_rows(dec, post)
    return labels[pick], z.astype(_F32)


@SVMClassifier.infer
def _svm_classifier_infer(x, *, classlabels_strings=None, classlabels_ints=None,
                          vectors_per_class=None, prob_a=None, **_):
    strings = classlabels_strings is not None and len(classlabels_strings) > 0
    y_type = "string" if strings else "int64"
    c = len(classlabels_strings) if strings else len(classlabels_ints or [])
    svc = vectors_per_class is not None and sum(int(k) for k in vectors_per_class) > 0
    if svc and not (prob_a is not None and len(prob_a)):
        cols = 2 if c <= 2 else c * (c - 1) // 2
    else:
        cols = c
    if x is None or x.shape is None or len(x.shape) not in (1, 2):
        return TensorFact(y_type, None), TensorFact("float32", None)
    n = 1 if len(x.shape) == 1 else x.shape[0]
    return TensorFact(y_type, (n,)), TensorFact("float32", (n, cols))


# --------------------------------------------------------------------------------------------
# SVMRegressor
# --------------------------------------------------------------------------------------------

@op("SVMRegressor", since=1, domain=ML, contract=Contract(
    nan="produce",  # POLY with a fractional degree of a negative base
    allowed={"post_transform": _TRANSFORM_NAMES, "kernel_type": one_of(*_KERNEL_NAMES),
             "one_class": one_of(0, 1)}))
def SVMRegressor(X, *, coefficients=None, kernel_params=None, kernel_type="LINEAR",
                 n_supports=0, one_class=0, post_transform="NONE", rho=None,
                 support_vectors=None):
    """[N, 1] (ai.onnx.ml SVMRegressor-1): sum over the support vectors of coefficient *
    kernel(x, sv) + rho[0], or without support vectors x . coefficients + rho[0]; one_class
    maps it to +1 (> 0) or -1. ORT applies no post_transform to it, and neither does this."""
    x = _rows(X, "SVMRegressor")
    coef = np.asarray(coefficients if coefficients is not None else [], _F32).reshape(-1)
    rho_v = np.asarray(rho if rho is not None else [], _F32).reshape(-1)
    v = int(n_supports or 0)
    if coef.size == 0 or rho_v.size < 1 or v < 0:
        raise KernelError(f"SVMRegressor needs coefficients, one rho and n_supports >= 0 "
                          f"(got {coef.size} coefficients, {rho_v.size} rho, n_supports {v})")
    if v > 0:
        if coef.size < v:
            raise KernelError(f"SVMRegressor: {v} support vectors need {v} coefficients, "
                              f"got {coef.size}")
        sv = _support(support_vectors, v, x.shape[1], "SVMRegressor")
        K = _kernel(x, sv, kernel_type, _params(kernel_params))
        y = (K.astype(np.float64) @ coef[:v].astype(np.float64) + rho_v[0]).astype(_F32)
    else:
        if coef.size != x.shape[1]:
            raise KernelError(f"SVMRegressor (linear): {coef.size} coefficients for the "
                              f"{x.shape[1]} features of X")
        y = _kernel(x, coef.reshape(1, -1), "LINEAR", (0.0, 0.0, 0.0), float(rho_v[0]))[:, 0]
    if one_class:
        y = np.where(y > 0, _F32(1), _F32(-1))
    return y.reshape(-1, 1).astype(_F32)


@SVMRegressor.infer
def _svm_regressor_infer(x, **_):
    if x is None or x.shape is None or len(x.shape) not in (1, 2):
        return TensorFact("float32", None)
    return TensorFact("float32", (1 if len(x.shape) == 1 else x.shape[0], 1))


# --------------------------------------------------------------------------------------------
# Samples
# --------------------------------------------------------------------------------------------

def random_svc(rng, n_classes: int, n_features: int, kernel: str = "RBF", proba: bool = False,
               strings: bool = False, post: str = "NONE", per_class: int = 3) -> dict:
    """Attributes of a random SVMClassifier with support vectors (also used by the tests)."""
    counts = [per_class + k % 2 for k in range(n_classes)]
    v, pairs = sum(counts), n_classes * (n_classes - 1) // 2
    attrs = {
        "kernel_type": kernel, "kernel_params": [0.3, 0.5, 3.0],
        "vectors_per_class": counts, "post_transform": post,
        "support_vectors": rng.standard_normal(v * n_features).astype(_F32).tolist(),
        "coefficients": rng.standard_normal((n_classes - 1) * v).astype(_F32).tolist(),
        "rho": rng.standard_normal(pairs).astype(_F32).tolist(),
    }
    if proba:
        attrs["prob_a"] = (-rng.uniform(0.5, 3.0, pairs)).astype(_F32).tolist()
        attrs["prob_b"] = rng.uniform(-0.5, 0.5, pairs).astype(_F32).tolist()
    if strings:
        attrs["classlabels_strings"] = [f"c{k}" for k in range(n_classes)]
    else:
        attrs["classlabels_ints"] = [10 * k + 1 for k in range(n_classes)]
    return attrs


@SVMClassifier.samples
def _svm_classifier_samples(rng):
    """Each kernel with 2 and 4 classes, with and without probabilities, string labels, each
    post transform, the liblinear mode, a 1-D X, an empty batch and double input."""
    x = rng.standard_normal((7, 5)).astype(_F32)
    for kernel in _KERNEL_NAMES:
        for c in (2, 4):
            for proba in (False, True):
                yield Sample([x], random_svc(rng, c, 5, kernel, proba), noutputs=2,
                             label=f"{kernel}, {c} classes, proba={proba}")
    for post in _TRANSFORM_NAMES.values:
        for c, proba in ((2, False), (3, False), (3, True)):
            yield Sample([x], random_svc(rng, c, 5, "RBF", proba, post=post), noutputs=2,
                         label=f"{post}, {c} classes, proba={proba}")
    yield Sample([x], random_svc(rng, 3, 5, "POLY", True, strings=True), noutputs=2,
                 label="string labels")
    yield Sample([x[0]], random_svc(rng, 3, 5), noutputs=2, label="1-D X")
    yield Sample([x[:0]], random_svc(rng, 3, 5), noutputs=2, label="no rows")
    yield Sample([x.astype(np.float64)], random_svc(rng, 2, 5), noutputs=2, label="double X")
    for c in (2, 3):
        lin = {"coefficients": rng.standard_normal(c * 5).astype(_F32).tolist(),
               "rho": [0.25], "classlabels_ints": list(range(c)), "kernel_params": [0.0, 0.0, 0.0]}
        yield Sample([x], lin, noutputs=2, label=f"liblinear, {c} classes")


@SVMRegressor.samples
def _svm_regressor_samples(rng):
    """Each kernel, one_class, the liblinear mode, a 1-D X, int64 input."""
    x = rng.standard_normal((6, 4)).astype(_F32)

    def attrs(kernel, one_class=0, v=5):
        return {"kernel_type": kernel, "kernel_params": [0.4, 0.2, 2.0], "n_supports": v,
                "support_vectors": rng.standard_normal(v * 4).astype(_F32).tolist(),
                "coefficients": rng.standard_normal(v).astype(_F32).tolist(),
                "rho": [0.1], "one_class": one_class}

    for kernel in _KERNEL_NAMES:
        yield Sample([x], attrs(kernel), label=kernel)
    yield Sample([x], attrs("RBF", one_class=1), label="one_class")
    yield Sample([x[1]], attrs("SIGMOID"), label="1-D X")
    yield Sample([rng.integers(-3, 3, (4, 4)).astype(np.int64)], attrs("POLY"), label="int64")
    yield Sample([x], {"coefficients": [0.5, -1.0, 2.0, 0.0], "rho": [0.3],
                       "kernel_params": [0.0, 0.0, 0.0]}, label="liblinear")
