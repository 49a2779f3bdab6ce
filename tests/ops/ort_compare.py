"""Shared helper for family tests: run one node on our reference kernel and on onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from opwarden.dtypes import onnx_type
from opwarden.ops import REGISTRY

ort = pytest.importorskip("onnxruntime")


def run_both(op_type, opset, inputs, attrs=None, n_out=1):
    """(ours, onnxruntime's) outputs of one node at `opset`; None inputs are omitted."""
    attrs = attrs or {}
    names = [f"i{k}" if x is not None else "" for k, x in enumerate(inputs)]
    outs = [f"o{k}" for k in range(n_out)]
    node = helper.make_node(op_type, names, outs, **attrs)
    g = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(n, onnx_type(x.dtype), x.shape)
            for n, x in zip(names, inputs)
            if x is not None
        ],
        [onnx.ValueInfoProto(name=o) for o in outs],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    feeds = {n: x for n, x in zip(names, inputs) if x is not None}
    theirs = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    opdef, sch = REGISTRY.resolve(op_type, "", opset)
    kw = {k: a.default for k, a in sch.attrs.items() if a.has_default}
    kw.update(attrs)
    if "noutputs" in opdef.reference.__code__.co_varnames:
        kw["noutputs"] = n_out
    ours = opdef.reference(*inputs, **kw)
    ours = list(ours) if isinstance(ours, tuple) else [ours]
    return ours[:n_out], theirs


def check(op_type, opset, inputs, attrs=None, n_out=1, rtol=1e-5):
    ours, theirs = run_both(op_type, opset, inputs, attrs, n_out)
    for a, b in zip(ours, theirs):
        assert isinstance(a, np.ndarray)
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        # Near zero a relative tolerance means nothing: allow one unit of the output dtype's
        # precision there (float16: 1e-3), never less than 1e-6.
        atol = max(1e-6, float(np.finfo(b.dtype).eps)) if b.dtype.kind == "f" else 1e-6
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol)
