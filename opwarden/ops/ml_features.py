"""Operators: ml feature family (domain ai.onnx.ml): LabelEncoder, small selection ops,
preprocessing (Scaler, Normalizer, OneHotEncoder, Imputer, ...) and the linear models."""

from __future__ import annotations

import numpy as np

from opwarden.contract import Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import op
from opwarden.ops.ml import _STR, _TRANSFORM_NAMES, _TRANSFORMS, ML, _post_transform, _strings

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
# Preprocessing (ai.onnx.ml)
# --------------------------------------------------------------------------------------------


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
