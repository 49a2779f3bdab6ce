"""Samples (`opwarden check`) for the ai.onnx.ml feature and linear operators of ml_features.py,
whose inputs the schema alone cannot make (indices in range, category lists, coefficient
counts that fit the features), as sklearn converters write them."""

from __future__ import annotations

import numpy as np

from opwarden.ops.base import Sample
from opwarden.ops.ml import _strings
from opwarden.ops.ml_features import (
    ArrayFeatureExtractor,
    FeatureVectorizer,
    Imputer,
    LabelEncoder_1,
    LabelEncoder_2,
    LabelEncoder_4,
    LinearClassifier,
    LinearRegressor,
    OneHotEncoder,
)

F32 = np.float32


@ArrayFeatureExtractor.samples
def _afe_samples(rng):
    x = rng.standard_normal((3, 5)).astype(F32)
    yield Sample([x, np.array([0, 4, 2], np.int64)], label="columns of a matrix")
    yield Sample([x[0], np.array([1], np.int64)], label="vector input")
    yield Sample([rng.integers(-9, 9, (2, 2, 4)).astype(np.int64), np.array([3, 3], np.int64)],
                 label="int64, 3-D, repeated index")
    yield Sample([_strings(["a", "b", "c"]).reshape(1, 3), np.array([2, 0], np.int64)],
                 label="strings")


@FeatureVectorizer.samples
def _fv_samples(rng):
    a, b = rng.standard_normal((4, 3)).astype(F32), rng.standard_normal((4, 2)).astype(F32)
    yield Sample([a, b], {"inputdimensions": [3, 2]}, label="two float inputs")
    yield Sample([a, b], {"inputdimensions": [2, 4]}, label="cut and zero-padded")
    ints = [rng.integers(-5, 5, (4, 2)).astype(np.int64) for _ in range(2)]
    yield Sample(ints, {"inputdimensions": [2, 1]}, label="int64 inputs")
    yield Sample([a[:, 0].copy()], {"inputdimensions": [1]}, label="1-D input")


@Imputer.samples
def _imputer_samples(rng):
    x = rng.standard_normal((4, 3)).astype(F32)
    x[1, 2] = x[3, 0] = np.nan
    yield Sample([x], {"imputed_value_floats": [0.5, -1.0, 2.0],
                       "replaced_value_float": float("nan")}, label="NaN per feature")
    x2 = x.copy()
    x2[0, 1] = 0.0
    yield Sample([np.nan_to_num(x2)], {"imputed_value_floats": [7.0]}, label="zeros, one value")
    xi = rng.integers(-3, 3, (5, 2)).astype(np.int64)
    yield Sample([xi], {"imputed_value_int64s": [9, 8], "replaced_value_int64": 0},
                 label="int64")


@LabelEncoder_1.samples
def _label_encoder_1_samples(rng):
    classes = ["cat", "dog", "emu"]
    yield Sample([_strings(["dog", "emu", "yak", "cat"]).reshape(2, 2)],
                 {"classes_strings": classes}, label="strings to indices, one unknown")
    yield Sample([np.array([2, 0, 5, -1], np.int64)], {"classes_strings": classes,
                                                       "default_string": "?"},
                 label="indices to strings, out of range")


@LabelEncoder_2.samples
def _label_encoder_2_samples(rng):
    yield Sample([_strings(["b", "a", "z"])],
                 {"keys_strings": ["a", "b"], "values_int64s": [10, 20], "default_int64": -7},
                 label="strings to int64")
    yield Sample([np.array([1, 5, 3], np.int64)],
                 {"keys_int64s": [1, 3], "values_strings": ["one", "three"]},
                 label="int64 to strings")
    yield Sample([np.array([0.5, 1.5, -2.0], F32)],
                 {"keys_floats": [0.5, -2.0], "values_floats": [5.0, -20.0],
                  "default_float": 0.25}, label="floats to floats")


@OneHotEncoder.samples
def _ohe_samples(rng):
    yield Sample([np.array([[3, 1], [2, 7]], np.int64)], {"cats_int64s": [1, 2, 3]},
                 label="int64, one unknown (zeros=1)")
    yield Sample([_strings(["b", "a", "b"])], {"cats_strings": ["a", "b"]}, label="strings")
    yield Sample([np.array([1.0, 2.0], F32)], {"cats_int64s": [2, 1], "zeros": 0},
                 label="floats cast to int, zeros=0")


def _coefs(rng, n_out, n_feat):
    return (rng.standard_normal(n_out * n_feat) * 0.5).astype(F32).tolist()


@LinearRegressor.samples
def _linreg_samples(rng):
    x = rng.standard_normal((5, 4)).astype(F32)
    yield Sample([x], {"coefficients": _coefs(rng, 1, 4), "intercepts": [0.3]},
                 label="one target")
    yield Sample([x], {"coefficients": _coefs(rng, 3, 4), "intercepts": [0.1, -0.2, 0.0],
                       "targets": 3}, label="three targets")
    yield Sample([x], {"coefficients": _coefs(rng, 2, 4), "targets": 2,
                       "post_transform": "SOFTMAX"}, label="softmax")
    yield Sample([x[0].copy()], {"coefficients": _coefs(rng, 1, 4)}, label="one row (1-D)")


@LinearClassifier.samples
def _lincls_samples(rng):
    x = rng.standard_normal((6, 3)).astype(F32)
    for transform in ("NONE", "LOGISTIC", "SOFTMAX"):
        yield Sample([x], {"coefficients": _coefs(rng, 3, 3), "intercepts": [0.1, 0.0, -0.1],
                           "classlabels_ints": [4, 5, 6], "post_transform": transform},
                     noutputs=2, label=f"3 classes, {transform}")
    yield Sample([x], {"coefficients": _coefs(rng, 1, 3), "intercepts": [0.2],
                       "classlabels_strings": ["no", "yes"]}, noutputs=2,
                 label="binary, one coefficient row, string labels")
    yield Sample([x.astype(np.int64)], {"coefficients": _coefs(rng, 2, 3),
                                        "intercepts": [0.0, 0.1], "classlabels_ints": [0, 1],
                                        "post_transform": "LOGISTIC"}, noutputs=2,
                 label="int64 features, two rows")


@LabelEncoder_4.samples
def _label_encoder_4_samples(rng):
    yield from _label_encoder_2_samples(rng)
    yield Sample([np.array([3, 4, 9], np.int64)],
                 {"keys_tensor": np.array([3, 9], np.int64),
                  "values_tensor": np.array([0.5, -1.5], F32),
                  "default_tensor": np.array([2.5], F32)}, label="tensor keys and values")
