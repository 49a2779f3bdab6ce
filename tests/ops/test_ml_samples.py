"""The ai.onnx.ml samples of ops/ml_samples.py (what `opwarden check` runs) against
onnxruntime, each operator at the ai.onnx.ml opset of its version."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper

from opwarden.ops import REGISTRY
from tests.ops.test_ml import ML, ours, same, theirs

# (operator, version, ai.onnx.ml opset to build the model at)
CASES = [("ArrayFeatureExtractor", 1, 3), ("FeatureVectorizer", 1, 3), ("Imputer", 1, 3),
         ("LabelEncoder", 1, 1), ("LabelEncoder", 2, 2), ("LabelEncoder", 4, 4),
         ("OneHotEncoder", 1, 3), ("LinearRegressor", 1, 3), ("LinearClassifier", 1, 3)]


def _onnx_attrs(attrs):
    return {k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v
            for k, v in attrs.items()}


@pytest.mark.parametrize("op_type, since, opset", CASES)
def test_samples_match_onnxruntime(op_type, since, opset):
    opdef = next(o for o in REGISTRY.versions(op_type, ML) if o.since == since)
    samples = list(opdef.samples_fn(np.random.default_rng(3)))
    assert samples
    for s in samples:
        n_out = s.noutputs or 1
        got = ours(op_type, s.inputs, s.attrs, opset)
        ref = theirs(op_type, s.inputs, _onnx_attrs(s.attrs), n_out, opset)
        for a, b in zip(got[:n_out], ref):
            same(a, b)
