"""Operators: ml family (domain ai.onnx.ml) and training optimizers (ai.onnx.preview.training)."""

from __future__ import annotations

from math import erf, pi, sqrt

import numpy as np

from opwarden.contract import Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import op

ML = "ai.onnx.ml"
TRAINING = "ai.onnx.preview.training"

_STR = np.dtype(object)


def _strings(values) -> np.ndarray:
    """A 1-D object array of Python str (how the runtime represents string tensors)."""
    out = np.empty(len(values), dtype=object)
    out[:] = [str(v) for v in values]
    return out


# --------------------------------------------------------------------------------------------
# LabelEncoder
# --------------------------------------------------------------------------------------------


def _lookup(X: np.ndarray, keys: np.ndarray, values: np.ndarray, default) -> np.ndarray:
    """Map each element of X through keys -> values; a missing key maps to `default`.

    A repeated key maps to its last value; NaN keys match NaN inputs.
    """
    out_dtype = values.dtype
    if X.dtype == _STR or keys.dtype == _STR:
        table = dict(zip(keys.tolist(), values.tolist()))
        flat = [table.get(x, default) for x in X.ravel().tolist()]
        out = np.empty(len(flat), dtype=out_dtype)
        out[:] = flat
        return out.reshape(X.shape)
    keys = keys.astype(X.dtype)
    out = np.full(X.shape, default, dtype=out_dtype)
    if keys.dtype.kind == "f":
        nan_keys = np.flatnonzero(np.isnan(keys))
        if nan_keys.size:
            out[np.isnan(X)] = values[nan_keys[-1]]
        finite = ~np.isnan(keys)
        keys, values = keys[finite], values[finite]
    if keys.size == 0:
        return out
    # Keep the last occurrence of each key: unique on the reversed list keeps first-of-reversed.
    uniq, idx = np.unique(keys[::-1], return_index=True)
    vals = values[::-1][idx]
    pos = np.clip(np.searchsorted(uniq, X), 0, len(uniq) - 1)
    hit = uniq[pos] == X
    out[hit] = vals[pos[hit]]
    return out


def _first_set(what: str, **candidates):
    """The one attribute among `candidates` that is set (not None), as (name, value)."""
    given = [(k, v) for k, v in candidates.items() if v is not None]
    if len(given) != 1:
        names = ", ".join(candidates)
        raise KernelError(f"LabelEncoder needs exactly one of {names} ({what}), got {len(given)}")
    return given[0]


def _encoder_default(values: np.ndarray, default_tensor, default_int64, default_float,
                     default_string):
    """The default output for a missing key, of the values' type."""
    if default_tensor is not None:
        return np.asarray(default_tensor).reshape(-1)[0]
    if values.dtype == _STR:
        return default_string
    if values.dtype.kind in "iu":
        return default_int64
    return default_float


@op("LabelEncoder", since=1, domain=ML, contract=Contract(nan="none"))
def LabelEncoder_1(X, *, classes_strings=None, default_int64=-1, default_string="_Unused"):
    """Strings -> class index, or index -> string (ai.onnx.ml LabelEncoder-1)."""
    classes = list(classes_strings or [])
    if X.dtype == _STR:
        table = {c: i for i, c in enumerate(classes)}
        flat = [table.get(x, default_int64) for x in X.ravel().tolist()]
        return np.asarray(flat, dtype=np.int64).reshape(X.shape)
    flat = [classes[i] if 0 <= i < len(classes) else default_string for i in X.ravel().tolist()]
    return _strings(flat).reshape(X.shape)


@op("LabelEncoder", since=2, domain=ML, contract=Contract(nan="propagate"))
def LabelEncoder_2(X, *, default_float=-0.0, default_int64=-1, default_string="_Unused",
                   keys_floats=None, keys_int64s=None, keys_strings=None, values_floats=None,
                   values_int64s=None, values_strings=None):
    """Map keys_* to values_* elementwise, with a typed default (ai.onnx.ml LabelEncoder-2)."""
    return LabelEncoder_4(
        X, default_float=default_float, default_int64=default_int64,
        default_string=default_string, keys_floats=keys_floats, keys_int64s=keys_int64s,
        keys_strings=keys_strings, values_floats=values_floats, values_int64s=values_int64s,
        values_strings=values_strings,
    )


@op("LabelEncoder", since=4, domain=ML, contract=Contract(nan="propagate"))
def LabelEncoder_4(X, *, default_float=-0.0, default_int64=-1, default_string="_Unused",
                   default_tensor=None, keys_floats=None, keys_int64s=None, keys_strings=None,
                   keys_tensor=None, values_floats=None, values_int64s=None,
                   values_strings=None, values_tensor=None):
    """Map keys to values elementwise; keys/values may be tensors (ai.onnx.ml LabelEncoder-4)."""
    kname, keys = _first_set("keys", keys_floats=keys_floats, keys_int64s=keys_int64s,
                             keys_strings=keys_strings, keys_tensor=keys_tensor)
    vname, values = _first_set("values", values_floats=values_floats,
                               values_int64s=values_int64s, values_strings=values_strings,
                               values_tensor=values_tensor)
    keys = _as_typed(kname, keys)
    values = _as_typed(vname, values)
    if keys.size != values.size:
        raise KernelError(f"LabelEncoder has {keys.size} keys but {values.size} values")
    default = _encoder_default(values, default_tensor, default_int64, default_float,
                               default_string)
    return _lookup(X, keys.reshape(-1), values.reshape(-1), default)


def _as_typed(name: str, value) -> np.ndarray:
    """An attribute list as a typed 1-D array (floats: float32, ints: int64, strings: str)."""
    if name.endswith("_strings"):
        return _strings(value)
    if name.endswith("_int64s"):
        return np.asarray(value, dtype=np.int64)
    if name.endswith("_floats"):
        return np.asarray(value, dtype=np.float32)
    arr = np.asarray(value)
    return _strings(arr.reshape(-1).tolist()) if arr.dtype.kind in "USO" else arr


# --------------------------------------------------------------------------------------------
# Small elementwise / selection ops
# --------------------------------------------------------------------------------------------


@op("ArrayFeatureExtractor", since=1, domain=ML, contract=Contract(nan="propagate"))
def ArrayFeatureExtractor(X, Y):
    """Pick entries of X's last axis by the indices Y (ai.onnx.ml ArrayFeatureExtractor-1)."""
    idx = np.asarray(Y, dtype=np.int64).reshape(-1)
    n = X.shape[-1] if X.ndim else 1
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise KernelError(f"ArrayFeatureExtractor index out of range [0, {n}): {idx.tolist()}")
    if X.ndim <= 1:
        # A vector is treated as a single row, as ONNX Runtime does.
        return np.take(X.reshape(1, -1), idx, axis=-1)
    return np.take(X, idx, axis=-1)


@op("Binarizer", since=1, domain=ML, contract=Contract(nan="suppress"))
def Binarizer(X, *, threshold=0.0):
    """1 where X > threshold, else 0, in X's dtype (ai.onnx.ml Binarizer-1)."""
    return (X > threshold).astype(X.dtype)


# --------------------------------------------------------------------------------------------
# Trees
# --------------------------------------------------------------------------------------------

# Node comparison modes of TreeEnsemble-5 (and the string names the v3 ops use).
_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)
_MODE_NAMES = {"BRANCH_LEQ": _LEQ, "BRANCH_LT": _LT, "BRANCH_GTE": _GTE, "BRANCH_GT": _GT,
               "BRANCH_EQ": _EQ, "BRANCH_NEQ": _NEQ, "BRANCH_MEMBER": _MEMBER}


def _compare(mode: np.ndarray, x: np.ndarray, split: np.ndarray) -> np.ndarray:
    """The branch condition for each (sample, tree) given its node's mode (MEMBER excluded)."""
    with np.errstate(invalid="ignore"):
        return np.select(
            [mode == _LEQ, mode == _LT, mode == _GTE, mode == _GT, mode == _EQ, mode == _NEQ],
            [x <= split, x < split, x >= split, x > split, x == split, x != split],
            default=False,
        )


def _member_sets(modes: np.ndarray, membership_values) -> dict[int, np.ndarray]:
    """node index -> its BRANCH_MEMBER set; the sets are NaN-delimited, in node order."""
    member_nodes = np.flatnonzero(modes == _MEMBER)
    if member_nodes.size == 0:
        return {}
    if membership_values is None:
        raise KernelError("BRANCH_MEMBER nodes need the membership_values attribute")
    vals = np.asarray(membership_values, dtype=np.float64).reshape(-1)
    cuts = np.flatnonzero(np.isnan(vals))
    groups = np.split(vals, cuts)
    groups = [g[~np.isnan(g)] for g in groups]
    if len(groups) < member_nodes.size:
        raise KernelError(
            f"membership_values holds {len(groups)} sets for {member_nodes.size} "
            "BRANCH_MEMBER nodes"
        )
    return {int(n): groups[i] for i, n in enumerate(member_nodes)}


def _walk_trees(X, roots, featureids, modes, splits, true_ids, true_leaf, false_ids, false_leaf,
                missing_true, members) -> np.ndarray:
    """Leaf index reached by every (sample, tree): shape (N, n_trees).

    All samples and trees descend together one level per step, so the loop runs once per level.
    """
    n = X.shape[0]
    node = np.broadcast_to(np.asarray(roots, dtype=np.int64), (n, len(roots))).copy()
    leaf = np.full(node.shape, -1, dtype=np.int64)
    active = np.ones(node.shape, dtype=bool)
    rows = np.broadcast_to(np.arange(n)[:, None], node.shape)
    for _ in range(len(featureids) + 1):
        if not active.any():
            return leaf
        r, nd = rows[active], node[active]
        x = X[r, featureids[nd]].astype(np.float64)
        cond = _compare(modes[nd], x, splits[nd])
        for m, values in members.items():
            at = nd == m
            if at.any():
                cond[at] = np.isin(x[at], values)
        nan = np.isnan(x)
        cond[nan] = missing_true[nd[nan]]
        nxt = np.where(cond, true_ids[nd], false_ids[nd])
        is_leaf = np.where(cond, true_leaf[nd], false_leaf[nd])
        leaf_now = leaf[active]
        leaf_now[is_leaf] = nxt[is_leaf]
        leaf[active] = leaf_now
        node_now = node[active]
        node_now[~is_leaf] = nxt[~is_leaf]
        node[active] = node_now
        active[active] = ~is_leaf
    raise KernelError("tree ensemble contains a cycle")


def _aggregate(leaves, leaf_targets, leaf_weights, n_targets, agg: int, n: int) -> np.ndarray:
    """Combine the leaf values of every tree per target: AVERAGE 0, SUM 1, MIN 2, MAX 3."""
    tgt = leaf_targets[leaves]  # (N, trees)
    w = leaf_weights[leaves].astype(np.float64)
    rows = np.broadcast_to(np.arange(n)[:, None], tgt.shape)
    if agg in (0, 1):
        out = np.zeros((n, n_targets), dtype=np.float64)
        np.add.at(out, (rows, tgt), w)
        if agg == 0:
            out /= leaves.shape[1]
        return out
    fill = np.inf if agg == 2 else -np.inf
    out = np.full((n, n_targets), fill, dtype=np.float64)
    (np.minimum if agg == 2 else np.maximum).at(out, (rows, tgt), w)
    out[np.isinf(out) & (out == fill)] = 0.0  # targets no tree voted for
    return out


def _post_transform(scores: np.ndarray, kind: int) -> np.ndarray:
    """NONE 0, SOFTMAX 1, LOGISTIC 2, SOFTMAX_ZERO 3, PROBIT 4 (row-wise where it applies)."""
    if kind == 0:
        return scores
    if kind == 1:
        e = np.exp(scores - scores.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if kind == 2:
        return 1.0 / (1.0 + np.exp(-scores))
    if kind == 3:
        # Softmax over the nonzero entries only; zeros stay zero.
        nz = scores != 0
        m = np.max(np.where(nz, scores, -np.inf), axis=1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        e = np.where(nz, np.exp(scores - m), 0.0)
        s = e.sum(axis=1, keepdims=True)
        return np.where(s > 0, e / np.where(s > 0, s, 1.0), 0.0)
    if kind == 4:
        return _probit(scores)
    raise KernelError(f"unknown post_transform {kind}")


def _probit(p: np.ndarray) -> np.ndarray:
    """sqrt(2) * erfinv(2p - 1), the inverse of the standard normal CDF."""
    return np.sqrt(2.0) * _erfinv(2.0 * p - 1.0)


def _erfinv(y: np.ndarray) -> np.ndarray:
    """Inverse error function: Giles' single-precision approximation refined by Newton steps."""
    y = np.asarray(y, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _erfinv_in_domain(y)


def _erfinv_in_domain(y: np.ndarray) -> np.ndarray:
    """erfinv for |y| < 1; |y| = 1 gives +-inf and |y| > 1 gives NaN (PROBIT can make NaN)."""
    w = -np.log((1.0 - y) * (1.0 + y))
    small = w < 5.0
    ws = w - 2.5
    wl = np.sqrt(np.where(small, 5.0, w)) - 3.0
    ps = np.polyval([2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                     0.00021858087, -0.00125372503, -0.00417768164, 0.246640727,
                     1.50140941], ws)
    pl = np.polyval([-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
                     0.00573950773, -0.0076224613, 0.00943887047, 1.00167406,
                     2.83297682], wl)
    x = np.where(small, ps, pl) * y
    verf = np.vectorize(erf, otypes=[np.float64])
    for _ in range(2):
        x = x - (verf(x) - y) / (2.0 / sqrt(pi) * np.exp(-x * x))
    return x


@op("TreeEnsemble", since=5, domain=ML, contract=Contract(
    nan="produce",  # PROBIT of a score outside (0, 1)
    allowed={"aggregate_function": one_of(0, 1, 2, 3), "post_transform": one_of(0, 1, 2, 3, 4)}))
def TreeEnsemble(X, *, aggregate_function=1, leaf_targetids=None, leaf_weights=None,
                 membership_values=None, n_targets=None, nodes_falseleafs=None,
                 nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                 nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_splits=None,
                 nodes_trueleafs=None, nodes_truenodeids=None, post_transform=0,
                 tree_roots=None):
    """Evaluate a forest; leaves add into targets (ai.onnx.ml TreeEnsemble-5)."""
    if X.ndim == 1:
        X = X.reshape(1, -1)
    if X.ndim != 2:
        raise KernelError(f"TreeEnsemble input must be [N, F], got shape {X.shape}")
    featureids = np.asarray(nodes_featureids, dtype=np.int64)
    if featureids.size and featureids.max() >= X.shape[1]:
        raise KernelError(f"feature id {featureids.max()} out of range for {X.shape[1]} features")
    modes = np.asarray(nodes_modes, dtype=np.int64).reshape(-1)
    nnodes = len(featureids)
    missing = (np.zeros(nnodes, bool) if nodes_missing_value_tracks_true is None
               else np.asarray(nodes_missing_value_tracks_true, dtype=bool))
    leaf_t = np.asarray(leaf_targetids, dtype=np.int64)
    n_out = int(n_targets) if n_targets else int(leaf_t.max()) + 1
    if leaf_t.size and (leaf_t.min() < 0 or leaf_t.max() >= n_out):
        raise KernelError(f"leaf_targetids out of range [0, {n_out})")
    leaves = _walk_trees(
        X, np.asarray(tree_roots, dtype=np.int64), featureids, modes,
        np.asarray(nodes_splits, dtype=np.float64).reshape(-1).astype(X.dtype).astype(np.float64),
        np.asarray(nodes_truenodeids, dtype=np.int64), np.asarray(nodes_trueleafs, dtype=bool),
        np.asarray(nodes_falsenodeids, dtype=np.int64), np.asarray(nodes_falseleafs, dtype=bool),
        missing, _member_sets(modes, membership_values),
    )
    weights = np.asarray(leaf_weights).reshape(-1)
    scores = _aggregate(leaves, leaf_t, weights, n_out, int(aggregate_function), X.shape[0])
    return _post_transform(scores, int(post_transform)).astype(X.dtype)


# --------------------------------------------------------------------------------------------
# Training optimizers (domain ai.onnx.preview.training)
# --------------------------------------------------------------------------------------------


def _groups(tensors: tuple, k: int, opname: str) -> list[tuple]:
    """Split the variadic inputs [X1..Xn, G1..Gn, ...] (k groups) into per-tensor tuples."""
    if not tensors or len(tensors) % k:
        raise KernelError(f"{opname} expects {k} groups of equal size, got {len(tensors)} tensors")
    n = len(tensors) // k
    return [tuple(tensors[g * n + i] for g in range(k)) for i in range(n)]


def _scalar(x, opname: str, what: str) -> float:
    a = np.asarray(x)
    if a.size != 1:
        raise KernelError(f"{opname}: {what} must be a scalar, got shape {a.shape}")
    return a.reshape(()).item()


@op("Adagrad", since=1, domain=TRAINING, contract=Contract(nan="produce"))
def Adagrad(R, T, *inputs, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
    """One ADAGRAD step for each (X, G, H) (ai.onnx.preview.training Adagrad-1)."""
    r = _scalar(R, "Adagrad", "R") / (1.0 + _scalar(T, "Adagrad", "T") * decay_factor)
    xs, hs = [], []
    for X, G, H in _groups(inputs, 3, "Adagrad"):
        g = norm_coefficient * X + G
        h_new = H + g * g
        xs.append((X - r * g / (np.sqrt(h_new) + epsilon)).astype(X.dtype))
        hs.append(h_new.astype(H.dtype))
    return tuple(xs + hs)


@op("Adam", since=1, domain=TRAINING, contract=Contract(nan="produce"))
def Adam(R, T, *inputs, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0,
         norm_coefficient_post=0.0):
    """One Adam step for each (X, G, V, H) (ai.onnx.preview.training Adam-1)."""
    r, t = _scalar(R, "Adam", "R"), _scalar(T, "Adam", "T")
    if t > 0:
        r = r * np.sqrt(1.0 - beta**t) / (1.0 - alpha**t)
    xs, vs, hs = [], [], []
    for X, G, V, H in _groups(inputs, 4, "Adam"):
        g = norm_coefficient * X + G
        v_new = alpha * V + (1.0 - alpha) * g
        h_new = beta * H + (1.0 - beta) * g * g
        x_new = X - r * v_new / (np.sqrt(h_new) + epsilon)
        xs.append(((1.0 - norm_coefficient_post) * x_new).astype(X.dtype))
        vs.append(v_new.astype(V.dtype))
        hs.append(h_new.astype(H.dtype))
    return tuple(xs + vs + hs)


@op("Momentum", since=1, domain=TRAINING, contract=Contract(
    nan="propagate", allowed={"mode": one_of("standard", "nesterov")}))
def Momentum(R, T, *inputs, alpha=None, beta=None, mode=None, norm_coefficient=None):
    """One SGD-with-momentum step, standard or Nesterov (ai.onnx.preview.training Momentum-1)."""
    if None in (alpha, beta, mode, norm_coefficient):
        raise KernelError("Momentum needs the alpha, beta, mode and norm_coefficient attributes")
    r = _scalar(R, "Momentum", "R")
    b = beta if _scalar(T, "Momentum", "T") > 0 else 1.0  # the first step uses the raw gradient
    xs, vs = [], []
    for X, G, V in _groups(inputs, 3, "Momentum"):
        g = norm_coefficient * X + G
        v_new = alpha * V + b * g
        step = g + alpha * v_new if mode == "nesterov" else v_new
        xs.append((X - r * step).astype(X.dtype))
        vs.append(v_new.astype(V.dtype))
    return tuple(xs + vs)


# --------------------------------------------------------------------------------------------
# Preprocessing (ai.onnx.ml)
# --------------------------------------------------------------------------------------------

_TRANSFORMS = {"NONE": 0, "SOFTMAX": 1, "LOGISTIC": 2, "SOFTMAX_ZERO": 3, "PROBIT": 4}
_TRANSFORM_NAMES = one_of(*_TRANSFORMS)


def _rows(X: np.ndarray) -> np.ndarray:
    """[N, F] view of X: a vector is one row (as the ml ops treat 1-D inputs)."""
    return X.reshape(1, -1) if X.ndim <= 1 else X.reshape(-1, X.shape[-1])


def _per_feature(values, n: int, what: str) -> np.ndarray:
    """A per-feature attribute of length 1 (broadcast) or n."""
    v = np.asarray(values if values is not None else [], dtype=np.float64)
    if v.size not in (1, n):
        raise KernelError(f"{what} has {v.size} values; expected 1 or {n} (one per feature)")
    return v


@op("Scaler", since=1, domain=ML, contract=Contract(nan="propagate"))
def Scaler(X, *, offset=None, scale=None):
    """(X - offset) * scale per feature, as float (ai.onnx.ml Scaler-1)."""
    n = X.shape[-1] if X.ndim else 1
    off = _per_feature(offset if offset is not None else [0.0], n, "offset")
    sc = _per_feature(scale if scale is not None else [1.0], n, "scale")
    y = (X.astype(np.float32) - off.astype(np.float32)) * sc.astype(np.float32)
    return y.reshape(X.shape).astype(np.float32)  # a rank-0 input stays rank 0


@op("Normalizer", since=1, domain=ML, contract=Contract(
    nan="propagate", allowed={"norm": one_of("MAX", "L1", "L2")}))
def Normalizer(X, *, norm="MAX"):
    """Row-wise X / max, X / sum|X| or X / ||X||_2; 0 divisor keeps X (ai.onnx.ml Normalizer-1)."""
    x = _rows(X).astype(np.float32)
    if x.size == 0:
        return x.reshape(X.shape)
    if norm == "MAX":
        d = x.max(axis=1, keepdims=True)
    elif norm == "L1":
        d = np.abs(x).sum(axis=1, keepdims=True)
    else:
        d = np.sqrt(np.square(x).sum(axis=1, keepdims=True))
    y = x / np.where(d == 0, np.float32(1), d)
    return y.reshape(X.shape).astype(np.float32)


@op("OneHotEncoder", since=1, domain=ML, contract=Contract(nan="none"))
def OneHotEncoder(X, *, cats_int64s=None, cats_strings=None, zeros=1):
    """One float one-hot row per element over the category list (ai.onnx.ml OneHotEncoder-1)."""
    if (cats_int64s is None) == (cats_strings is None):
        raise KernelError("OneHotEncoder needs exactly one of cats_int64s, cats_strings")
    cats = list(cats_strings if cats_strings is not None else cats_int64s)
    table = {c: i for i, c in enumerate(cats)}
    if X.dtype == _STR:
        flat = X.ravel().tolist()
    else:
        # Numeric inputs are cast to integers before the lookup.
        flat = X.astype(np.int64).ravel().tolist()
    idx = np.array([table.get(v, -1) for v in flat], dtype=np.int64)
    if not zeros and (idx < 0).any():
        missing = flat[int(np.flatnonzero(idx < 0)[0])]
        raise KernelError(f"OneHotEncoder: category {missing!r} not in the list (zeros=0)")
    out = np.zeros((idx.size, len(cats)), dtype=np.float32)
    hit = idx >= 0
    out[np.flatnonzero(hit), idx[hit]] = 1.0
    return out.reshape(X.shape + (len(cats),))


@op("Imputer", since=1, domain=ML, contract=Contract(nan="suppress"))
def Imputer(X, *, imputed_value_floats=None, imputed_value_int64s=None,
            replaced_value_float=0.0, replaced_value_int64=0):
    """Replace elements equal to the replaced value (NaN matches NaN) (ai.onnx.ml Imputer-1)."""
    n = X.shape[-1] if X.ndim else 1
    if X.dtype.kind == "f":
        if imputed_value_floats is None:
            raise KernelError("Imputer on floats needs imputed_value_floats")
        fill = _per_feature(imputed_value_floats, n, "imputed_value_floats").astype(X.dtype)
        r = replaced_value_float
        hit = np.isnan(X) if np.isnan(r) else X == X.dtype.type(r)
    else:
        if imputed_value_int64s is None:
            raise KernelError("Imputer on integers needs imputed_value_int64s")
        fill = np.asarray(imputed_value_int64s, dtype=np.int64)
        fill = _per_feature(fill, n, "imputed_value_int64s").astype(np.int64).astype(X.dtype)
        hit = X == replaced_value_int64
    return np.where(hit, np.broadcast_to(fill, X.shape), X).astype(X.dtype)


@op("FeatureVectorizer", since=1, domain=ML, contract=Contract(nan="propagate"))
def FeatureVectorizer(*X, inputdimensions=None):
    """Concatenate [N, C_i] inputs along features, each cut or zero-padded to
    inputdimensions[i] (ai.onnx.ml FeatureVectorizer-1)."""
    dims = list(inputdimensions) if inputdimensions is not None else [_rows(x).shape[1] for x in X]
    if len(dims) != len(X):
        raise KernelError(f"inputdimensions has {len(dims)} entries for {len(X)} inputs")
    rows = [_rows(x).astype(np.float32) for x in X]
    n = rows[0].shape[0]
    parts = []
    for x, d in zip(rows, dims):
        if x.shape[0] != n:
            raise KernelError(f"FeatureVectorizer inputs have {x.shape[0]} and {n} rows")
        part = np.zeros((n, d), dtype=np.float32)
        k = min(d, x.shape[1])
        part[:, :k] = x[:, :k]
        parts.append(part)
    return np.concatenate(parts, axis=1)


@op("CategoryMapper", since=1, domain=ML, contract=Contract(nan="none"))
def CategoryMapper(X, *, cats_int64s=None, cats_strings=None, default_int64=-1,
                   default_string="_Unused"):
    """Strings <-> integers through two parallel lists (ai.onnx.ml CategoryMapper-1)."""
    ints, strs = list(cats_int64s or []), list(cats_strings or [])
    if len(ints) != len(strs):
        raise KernelError(f"cats_int64s has {len(ints)} entries, cats_strings {len(strs)}")
    if X.dtype == _STR:
        return _lookup(X, _strings(strs), np.asarray(ints, dtype=np.int64), default_int64)
    return _lookup(X, np.asarray(ints, dtype=np.int64), _strings(strs), default_string)


@op("ZipMap", since=1, domain=ML, contract=Contract(nan="propagate"))
def ZipMap(X, *, classlabels_int64s=None, classlabels_strings=None):
    """One {label: score} map per row of X (ai.onnx.ml ZipMap-1)."""
    labels = classlabels_strings if classlabels_strings is not None else classlabels_int64s
    if labels is None or (classlabels_strings is not None and classlabels_int64s is not None):
        raise KernelError("ZipMap needs exactly one of classlabels_strings, classlabels_int64s")
    x = _rows(X)
    if x.shape[1] != len(labels):
        raise KernelError(f"ZipMap: {x.shape[1]} columns for {len(labels)} labels")
    return [dict(zip(labels, row)) for row in x.astype(np.float32).tolist()]


@op("DictVectorizer", since=1, domain=ML, contract=Contract(nan="propagate"))
def DictVectorizer(X, *, int64_vocabulary=None, string_vocabulary=None):
    """A map's values placed by key position in the vocabulary (ai.onnx.ml DictVectorizer-1)."""
    vocab = string_vocabulary if string_vocabulary is not None else int64_vocabulary
    if vocab is None:
        raise KernelError("DictVectorizer needs int64_vocabulary or string_vocabulary")
    index = {k: i for i, k in enumerate(vocab)}
    vals = list(X.values())
    sample = np.asarray(vals[:1])
    dtype = _STR if sample.dtype.kind in "USO" else (sample.dtype if vals else np.float32)
    out = np.zeros((1, len(vocab)), dtype=dtype)
    if dtype == _STR:
        out[:] = ""
    for k, v in X.items():
        if k in index:
            out[0, index[k]] = v
    return out


# --------------------------------------------------------------------------------------------
# Linear models
# --------------------------------------------------------------------------------------------


def _linear_scores(X, coefficients, intercepts, n_out: int) -> np.ndarray:
    x = _rows(X).astype(np.float32)
    w = np.asarray(coefficients, dtype=np.float32)
    if w.size != n_out * x.shape[1]:
        raise KernelError(
            f"{w.size} coefficients do not fit {n_out} outputs x {x.shape[1]} features"
        )
    scores = x @ w.reshape(n_out, x.shape[1]).T
    if intercepts is not None and len(intercepts):
        b = np.asarray(intercepts, dtype=np.float32)
        if b.size != n_out:
            raise KernelError(f"{b.size} intercepts for {n_out} outputs")
        scores = scores + b
    return scores


@op("LinearRegressor", since=1, domain=ML, contract=Contract(
    nan="produce",  # PROBIT of a score outside (0, 1)
    allowed={"post_transform": _TRANSFORM_NAMES}))
def LinearRegressor(X, *, coefficients=None, intercepts=None, post_transform="NONE", targets=1):
    """X @ coefficients^T + intercepts, then post_transform (ai.onnx.ml LinearRegressor-1)."""
    scores = _linear_scores(X, coefficients, intercepts, int(targets))
    return _post_transform(scores.astype(np.float64), _TRANSFORMS[post_transform]).astype(
        np.float32
    )


@op("LinearClassifier", since=1, domain=ML, contract=Contract(
    nan="produce",  # PROBIT of a score outside (0, 1)
    allowed={"post_transform": _TRANSFORM_NAMES, "multi_class": one_of(0, 1)}))
def LinearClassifier(X, *, classlabels_ints=None, classlabels_strings=None, coefficients=None,
                     intercepts=None, multi_class=0, post_transform="NONE"):
    """Per-class linear scores and the top label (ai.onnx.ml LinearClassifier-1).

    With one coefficient row and two labels (binary), the row scores the second label: the
    label is chosen by score > 0 and the scores become [1 - s, s] untransformed, or
    transform([-s, s]) (ONNX Runtime's convention).
    """
    labels = classlabels_strings if classlabels_strings is not None else classlabels_ints
    if labels is None:
        raise KernelError("LinearClassifier needs classlabels_ints or classlabels_strings")
    nf = _rows(X).shape[1]
    n_rows = len(coefficients) // nf if nf else 0
    scores = _linear_scores(X, coefficients, intercepts, n_rows).astype(np.float64)
    lab = _strings(labels) if classlabels_strings is not None else np.asarray(labels, np.int64)
    if n_rows == 1 and len(labels) == 2:
        s = scores[:, 0]
        pick = (s > 0).astype(np.int64)
        if post_transform == "NONE":
            scores = np.stack([1.0 - s, s], axis=1)
        else:
            scores = _post_transform(np.stack([-s, s], axis=1), _TRANSFORMS[post_transform])
        return lab[pick], scores.astype(np.float32)
    if n_rows != len(labels):
        raise KernelError(f"{n_rows} coefficient rows for {len(labels)} class labels")
    pick = np.argmax(scores, axis=1)
    scores = _post_transform(scores, _TRANSFORMS[post_transform])
    return lab[pick], scores.astype(np.float32)


# --------------------------------------------------------------------------------------------
# TreeEnsembleRegressor / TreeEnsembleClassifier (v1, v3): node lists keyed by (tree, node)
# --------------------------------------------------------------------------------------------

_AGGREGATES = {"AVERAGE": 0, "SUM": 1, "MIN": 2, "MAX": 3}
_V3_MODES = one_of("LEAF", *_MODE_NAMES)


def _attr_values(plain, as_tensor, what: str, dtype=np.float32) -> np.ndarray | None:
    """A float list attribute or its *_as_tensor twin (which keeps its own dtype)."""
    if plain is not None and as_tensor is not None:
        raise KernelError(f"set only one of {what} and {what}_as_tensor")
    if as_tensor is not None:
        return np.asarray(as_tensor).reshape(-1)
    return None if plain is None else np.asarray(plain, dtype=dtype).reshape(-1)


def _forest(X, treeids, nodeids, featureids, modes, values, truenodeids, falsenodeids,
            missing_true, opname: str):
    """Index the nodes and walk every sample through every tree.

    Returns (leaf node index per (sample, tree) [N, n_trees], node key -> index map).
    """
    tids = np.asarray(treeids, dtype=np.int64)
    nids = np.asarray(nodeids, dtype=np.int64)
    n = tids.size
    key = {(int(t), int(i)): k for k, (t, i) in enumerate(zip(tids.tolist(), nids.tolist()))}
    if len(key) != n:
        raise KernelError(f"{opname}: repeated (tree id, node id) pairs among the nodes")
    mode_names = list(modes)
    bad = sorted({m for m in mode_names if m != "LEAF" and m not in _MODE_NAMES})
    if bad or len(mode_names) != n:
        raise KernelError(f"{opname}: nodes_modes must list one known mode per node, got {bad}")
    is_leaf = np.array([m == "LEAF" for m in mode_names], dtype=bool)
    code = np.array([_MODE_NAMES.get(m, _LEQ) for m in mode_names], dtype=np.int64)
    feats = np.asarray(featureids, dtype=np.int64)
    nf = X.shape[1]
    if (feats[~is_leaf] >= nf).any() or (feats[~is_leaf] < 0).any():
        raise KernelError(f"{opname}: feature id out of range for {nf} features")

    def child(ids, what):
        out = np.zeros(n, dtype=np.int64)
        for k, (t, c) in enumerate(zip(tids.tolist(), np.asarray(ids, np.int64).tolist())):
            if is_leaf[k]:
                continue
            if (t, c) not in key:
                raise KernelError(f"{opname}: {what} {c} of tree {t} is not a node")
            out[k] = key[(t, c)]
        return out

    true_ids = child(truenodeids, "true node")
    false_ids = child(falsenodeids, "false node")
    missing = (np.zeros(n, bool) if not missing_true
               else np.asarray(missing_true, dtype=bool).reshape(-1))
    # A tree's root is its node that no other node points to; trees are ordered by id.
    pointed = np.zeros(n, dtype=bool)
    pointed[true_ids[~is_leaf]] = True
    pointed[false_ids[~is_leaf]] = True
    roots = []
    for t in sorted(set(tids.tolist())):
        cands = np.flatnonzero((tids == t) & ~pointed)
        if cands.size == 0:
            raise KernelError(f"{opname}: tree {t} has no root (a cycle)")
        roots.append(int(cands[np.argmin(nids[cands])]))
    roots = np.asarray(roots, dtype=np.int64)
    # Integer inputs compare as float32 against the float thresholds, as ONNX Runtime does.
    x = X if X.dtype.kind == "f" else X.astype(np.float32)
    leaves = np.broadcast_to(roots, (X.shape[0], roots.size)).copy()
    inner = ~is_leaf[roots]
    if inner.any():
        leaves[:, inner] = _walk_trees(
            x, roots[inner], np.where(is_leaf, 0, feats), code,
            np.asarray(values).astype(np.float64), true_ids, is_leaf[true_ids],
            false_ids, is_leaf[false_ids], missing, {},
        )
    return leaves, key


def _leaf_table(key, treeids, nodeids, ids, weights, n_out: int, agg: int, opname: str):
    """Per node: the combined weight for each target/class and whether any was given."""
    n = len(key)
    fill = {2: np.inf, 3: -np.inf}.get(agg, 0.0)
    table = np.full((n, n_out), fill, dtype=np.float64)
    has = np.zeros((n, n_out), dtype=bool)
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= n_out):
        raise KernelError(f"{opname}: target/class id out of range [0, {n_out})")
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    for t, nd, j, v in zip(np.asarray(treeids).tolist(), np.asarray(nodeids).tolist(),
                           ids.tolist(), w.tolist()):
        k = key.get((int(t), int(nd)))
        if k is None:
            raise KernelError(f"{opname}: weight for missing node {nd} of tree {t}")
        if agg == 2:
            table[k, j] = min(table[k, j], v)
        elif agg == 3:
            table[k, j] = max(table[k, j], v)
        else:
            table[k, j] += v
        has[k, j] = True
    return table, has


def _combine(leaves, table, has, agg: int):
    """Scores [N, n_out] over the trees' leaves, and whether each got any weight."""
    got = has[leaves]  # (N, trees, out)
    vals = table[leaves]
    any_ = got.any(axis=1)
    if agg == 2:
        return np.where(any_, np.where(got, vals, np.inf).min(axis=1), 0.0), any_
    if agg == 3:
        return np.where(any_, np.where(got, vals, -np.inf).max(axis=1), 0.0), any_
    s = np.where(got, vals, 0.0).sum(axis=1)
    return (s / leaves.shape[1] if agg == 0 else s), any_


def _tree_input(X, opname: str) -> np.ndarray:
    if X.ndim == 1:
        return X.reshape(1, -1)
    if X.ndim != 2:
        raise KernelError(f"{opname} input must be [N, F], got shape {X.shape}")
    return X


def _tree_regressor(X, *, aggregate_function, base_values, n_targets, nodes_falsenodeids,
                    nodes_featureids, nodes_missing_value_tracks_true, nodes_modes,
                    nodes_nodeids, nodes_treeids, nodes_truenodeids, nodes_values,
                    post_transform, target_ids, target_nodeids, target_treeids,
                    target_weights):
    X = _tree_input(X, "TreeEnsembleRegressor")
    if not n_targets:
        raise KernelError("TreeEnsembleRegressor needs n_targets")
    agg = _AGGREGATES[aggregate_function]
    leaves, key = _forest(X, nodes_treeids, nodes_nodeids, nodes_featureids, nodes_modes,
                          nodes_values, nodes_truenodeids, nodes_falsenodeids,
                          nodes_missing_value_tracks_true, "TreeEnsembleRegressor")
    table, has = _leaf_table(key, target_treeids, target_nodeids, target_ids, target_weights,
                             int(n_targets), agg, "TreeEnsembleRegressor")
    scores, got = _combine(leaves, table, has, agg)
    base = np.asarray(base_values if base_values is not None else [], np.float64).reshape(-1)
    post = _TRANSFORMS[post_transform]
    if int(n_targets) == 1:
        # ONNX Runtime: one target always gets its base value and only PROBIT applies.
        scores = scores + (base[0] if base.size == 1 else 0.0)
        return (_probit(scores) if post == _TRANSFORMS["PROBIT"] else scores).astype(np.float32)
    # Several targets: base values (one per target) go only to targets some leaf scored;
    # a target no leaf scored stays 0 before the transform, as in ONNX Runtime.
    if base.size == int(n_targets):
        scores = scores + base
    scores = np.where(got, scores, 0.0)
    return _post_transform(scores, post).astype(np.float32)


def _classifier_finalize(S, has, base, binary_case: bool, all_positive: bool, post: int):
    """Labels (class indices) and scores from summed class weights, following ONNX Runtime.

    More than two classes: base values are added and the label is the best class that got
    a weight. Two classes follow ORT's binary rules: one score column is completed into two
    (1 - s, s) or (-s, s), and the label comes from the positive-class score.
    """
    n, c = S.shape
    S, has = S.copy(), has.copy()
    if c != 2:
        if base.size:
            S[:, :base.size] += base
            has[:, :base.size] = True
        pick = np.argmax(np.where(has, S, -np.inf), axis=1)
        return pick, _post_transform(S, post)
    s0, s1, h0, h1 = S[:, 0], S[:, 1], has[:, 0], has[:, 1]
    add = np.full(n, -1)
    if base.size >= 2:
        # ORT: with a class-1 score, class 1 gets base[1] + s0 and class 0 its negation.
        s1 = np.where(h1, base[1] + s0, s1 + base[1])
        s0 = np.where(h1, -s1, s0 + base[0])
        two = np.ones(n, dtype=bool)
    else:
        if base.size == 1:
            s0 = s0 + base[0]
        else:
            add[:] = 3
        two = h1.copy()
    pos = np.where(two & h1, s1, np.where(h0, s0, 0.0))
    if binary_case:
        cut = 0.5 if all_positive else 0.0
        pick = (pos > cut).astype(np.int64)
        add = np.where(pick == 1, 0, 1) if all_positive else np.where(pick == 1, 2, 3)
    else:
        pick = (pos > 0).astype(np.int64)
    Z = np.zeros((n, 2), dtype=np.float64)
    if two.any():
        # A class no leaf scored reports 0 before the transform (ORT), base value or not.
        pair = np.stack([np.where(h0, s0, 0.0), np.where(h1 | (base.size >= 2), s1, 0.0)], 1)
        pair[~h1 & (base.size >= 2), 1] = 0.0
        Z[two] = _post_transform(pair[two], post)
    one = ~two
    if one.any():
        s, a = s0[one], add[one]
        z = np.zeros((s.size, 2))
        if post == _TRANSFORMS["PROBIT"]:
            z[:, 0] = _probit(s)
        else:
            pos_form = (a == 0) | (a == 1)
            neg_form = (a == 2) | (a == 3)
            if post == _TRANSFORMS["LOGISTIC"]:
                # Both forms become (logistic(-s), logistic(s)).
                pair = 1.0 / (1.0 + np.exp(-np.stack([-s, s], axis=1)))
                z[pos_form | neg_form] = pair[pos_form | neg_form]
            else:
                z[pos_form] = np.stack([1.0 - s, s], axis=1)[pos_form]
                z[neg_form] = np.stack([-s, s], axis=1)[neg_form]
            z[a == -1, 0] = s[a == -1]
        Z[one] = z
    return pick, Z


def _tree_classifier(X, *, base_values, class_ids, class_nodeids, class_treeids,
                     class_weights, classlabels_int64s, classlabels_strings,
                     nodes_falsenodeids, nodes_featureids, nodes_missing_value_tracks_true,
                     nodes_modes, nodes_nodeids, nodes_treeids, nodes_truenodeids,
                     nodes_values, post_transform):
    X = _tree_input(X, "TreeEnsembleClassifier")
    if (classlabels_int64s is None) == (classlabels_strings is None):
        raise KernelError("TreeEnsembleClassifier needs exactly one of classlabels_int64s, "
                          "classlabels_strings")
    strings = classlabels_strings is not None
    labels = _strings(classlabels_strings) if strings else np.asarray(classlabels_int64s,
                                                                      np.int64)
    leaves, key = _forest(X, nodes_treeids, nodes_nodeids, nodes_featureids, nodes_modes,
                          nodes_values, nodes_truenodeids, nodes_falsenodeids,
                          nodes_missing_value_tracks_true, "TreeEnsembleClassifier")
    table, has = _leaf_table(key, class_treeids, class_nodeids, class_ids, class_weights,
                             labels.size, 1, "TreeEnsembleClassifier")
    S, got = _combine(leaves, table, has, 1)
    ids = np.asarray(class_ids, dtype=np.int64).reshape(-1)
    w = np.asarray(class_weights, dtype=np.float64).reshape(-1)
    binary_case = labels.size == 2 and np.unique(ids).size == 1
    base = np.asarray(base_values if base_values is not None else [], np.float64).reshape(-1)
    pick, Z = _classifier_finalize(S, got, base, binary_case, bool((w >= 0).all()),
                                   _TRANSFORMS[post_transform])
    if labels.size == 2 and not binary_case and not strings:
        # ORT reports the raw 0/1 decision here rather than a label from the list.
        return pick.astype(np.int64), Z.astype(np.float32)
    return labels[pick], Z.astype(np.float32)


_TREE_ALLOWED = {"post_transform": _TRANSFORM_NAMES, "aggregate_function": one_of(*_AGGREGATES)}


@op("TreeEnsembleRegressor", since=3, domain=ML, contract=Contract(
    nan="produce",  # PROBIT of a score outside (0, 1)
    allowed=_TREE_ALLOWED))
def TreeEnsembleRegressor(X, *, aggregate_function="SUM", base_values=None,
                          base_values_as_tensor=None, n_targets=None, nodes_falsenodeids=None,
                          nodes_featureids=None, nodes_hitrates=None,
                          nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=None,
                          nodes_modes=None, nodes_nodeids=None, nodes_treeids=None,
                          nodes_truenodeids=None, nodes_values=None,
                          nodes_values_as_tensor=None, post_transform="NONE", target_ids=None,
                          target_nodeids=None, target_treeids=None, target_weights=None,
                          target_weights_as_tensor=None):
    """Forest regression; thresholds/weights may come as tensors
    (ai.onnx.ml TreeEnsembleRegressor-3)."""
    return _tree_regressor(
        X, aggregate_function=aggregate_function,
        base_values=_attr_values(base_values, base_values_as_tensor, "base_values"),
        n_targets=n_targets, nodes_falsenodeids=nodes_falsenodeids,
        nodes_featureids=nodes_featureids,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_nodeids=nodes_nodeids, nodes_treeids=nodes_treeids,
        nodes_truenodeids=nodes_truenodeids,
        nodes_values=_attr_values(nodes_values, nodes_values_as_tensor, "nodes_values"),
        post_transform=post_transform, target_ids=target_ids, target_nodeids=target_nodeids,
        target_treeids=target_treeids,
        target_weights=_attr_values(target_weights, target_weights_as_tensor,
                                    "target_weights"),
    )


@op("TreeEnsembleRegressor", since=1, domain=ML, contract=Contract(
    nan="produce", allowed=_TREE_ALLOWED))
def TreeEnsembleRegressor_1(X, *, aggregate_function="SUM", base_values=None, n_targets=None,
                            nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                            nodes_missing_value_tracks_true=None, nodes_modes=None,
                            nodes_nodeids=None, nodes_treeids=None, nodes_truenodeids=None,
                            nodes_values=None, post_transform="NONE", target_ids=None,
                            target_nodeids=None, target_treeids=None, target_weights=None):
    """Forest regression with float attributes (ai.onnx.ml TreeEnsembleRegressor-1)."""
    return TreeEnsembleRegressor(
        X, aggregate_function=aggregate_function, base_values=base_values,
        n_targets=n_targets, nodes_falsenodeids=nodes_falsenodeids,
        nodes_featureids=nodes_featureids, nodes_hitrates=nodes_hitrates,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_nodeids=nodes_nodeids, nodes_treeids=nodes_treeids,
        nodes_truenodeids=nodes_truenodeids, nodes_values=nodes_values,
        post_transform=post_transform, target_ids=target_ids, target_nodeids=target_nodeids,
        target_treeids=target_treeids, target_weights=target_weights,
    )


@op("TreeEnsembleClassifier", since=3, domain=ML, contract=Contract(
    nan="produce", allowed={"post_transform": _TRANSFORM_NAMES}))
def TreeEnsembleClassifier(X, *, base_values=None, base_values_as_tensor=None, class_ids=None,
                           class_nodeids=None, class_treeids=None, class_weights=None,
                           class_weights_as_tensor=None, classlabels_int64s=None,
                           classlabels_strings=None, nodes_falsenodeids=None,
                           nodes_featureids=None, nodes_hitrates=None,
                           nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=None,
                           nodes_modes=None, nodes_nodeids=None, nodes_treeids=None,
                           nodes_truenodeids=None, nodes_values=None,
                           nodes_values_as_tensor=None, post_transform="NONE"):
    """Forest classification: labels and per-class scores
    (ai.onnx.ml TreeEnsembleClassifier-3)."""
    return _tree_classifier(
        X, base_values=_attr_values(base_values, base_values_as_tensor, "base_values"),
        class_ids=class_ids, class_nodeids=class_nodeids, class_treeids=class_treeids,
        class_weights=_attr_values(class_weights, class_weights_as_tensor, "class_weights"),
        classlabels_int64s=classlabels_int64s, classlabels_strings=classlabels_strings,
        nodes_falsenodeids=nodes_falsenodeids, nodes_featureids=nodes_featureids,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_nodeids=nodes_nodeids, nodes_treeids=nodes_treeids,
        nodes_truenodeids=nodes_truenodeids,
        nodes_values=_attr_values(nodes_values, nodes_values_as_tensor, "nodes_values"),
        post_transform=post_transform,
    )


@op("TreeEnsembleClassifier", since=1, domain=ML, contract=Contract(
    nan="produce", allowed={"post_transform": _TRANSFORM_NAMES}))
def TreeEnsembleClassifier_1(X, *, base_values=None, class_ids=None, class_nodeids=None,
                             class_treeids=None, class_weights=None, classlabels_int64s=None,
                             classlabels_strings=None, nodes_falsenodeids=None,
                             nodes_featureids=None, nodes_hitrates=None,
                             nodes_missing_value_tracks_true=None, nodes_modes=None,
                             nodes_nodeids=None, nodes_treeids=None, nodes_truenodeids=None,
                             nodes_values=None, post_transform="NONE"):
    """Forest classification with float attributes (ai.onnx.ml TreeEnsembleClassifier-1)."""
    return TreeEnsembleClassifier(
        X, base_values=base_values, class_ids=class_ids, class_nodeids=class_nodeids,
        class_treeids=class_treeids, class_weights=class_weights,
        classlabels_int64s=classlabels_int64s, classlabels_strings=classlabels_strings,
        nodes_falsenodeids=nodes_falsenodeids, nodes_featureids=nodes_featureids,
        nodes_hitrates=nodes_hitrates,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_nodeids=nodes_nodeids, nodes_treeids=nodes_treeids,
        nodes_truenodeids=nodes_truenodeids, nodes_values=nodes_values,
        post_transform=post_transform,
    )
