"""Real models as exporters emit them, opwarden against onnxruntime.

tests/data/real/ holds small PyTorch models exported with torch.onnx (TorchScript exporter) at
opsets 7-20, plus onnxruntime-quantized variants (dynamic, QDQ, QOperator). They were written by
benchmarks/export_real.py, which also wrote recipes.json: for each model, the seeded recipe of its
inputs and the (batch, sequence[, extra]) sizes to run. Neither torch nor the exporter is needed
here; onnxruntime is (the test is skipped without it). Where ORT's u8 x s8 kernel saturates int16
pair sums (tests/ort_int8.py), each _qdyn model is quantized afresh from its float source with
7-bit weights, which ORT computes exactly.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings

import numpy as np
import onnx
import pytest

import opwarden
from tests import ort_int8

DATA = os.path.join(os.path.dirname(__file__), "data", "real")
RECIPES = os.path.join(DATA, "recipes.json")
_recipes = json.load(open(RECIPES)) if os.path.exists(RECIPES) else {}

# Known gaps, with the reason; non-strict so that a fix shows up as XPASS.
KNOWN: dict[str, str] = {}  # file -> why it is expected to fail (none today)


def make_inputs(recipe: dict, batch: int, seq, seed: int, extra=None) -> dict:
    """Same draw as benchmarks/export_real.py make_inputs (B batch, T sequence, S extra)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in recipe["inputs"]:
        sizes = {"B": batch, "T": seq if seq is not None else recipe.get("seq", 8), "S": extra}
        shape = [sizes[d] if isinstance(d, str) else int(d) for d in spec["shape"]]
        kind, dtype = spec.get("kind", "normal"), np.dtype(spec["dtype"])
        if kind == "normal":
            x = rng.standard_normal(shape).astype(dtype) * spec.get("scale", 1.0)
        elif kind == "int":
            x = rng.integers(spec["low"], spec["high"], size=shape).astype(dtype)
        elif kind == "bool":
            x = rng.random(shape) < spec.get("p", 0.3)
            if spec.get("keep_first", False):
                x[..., 0] = False
        elif kind == "uniform":
            x = rng.uniform(spec["low"], spec["high"], size=shape).astype(dtype)
        else:
            raise ValueError(kind)
        feeds[spec["name"]] = np.asarray(x, dtype=dtype)
    return feeds


def requantized_dynamic(src: str) -> bytes:
    """The float model `src` quantized as benchmarks/export_real.py wrote its _qdyn copy, but
    with 7-bit weights (reduce_range): where ORT's u8 x s8 kernel saturates int16 pair sums
    (tests/ort_int8.py), its answer on the stored 8-bit copy is not the exact one."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pre, dst = os.path.join(tmp, "pre.onnx"), os.path.join(tmp, "q.onnx")
        try:  # as export_real.py: quantize the source itself where pre-processing fails
            quant_pre_process(src, pre, skip_symbolic_shape=True)
        except Exception:  # noqa: BLE001
            pre = src
        quantize_dynamic(pre, dst, weight_type=QuantType.QInt8, reduce_range=True)
        return open(dst, "rb").read()


def _ops(data: bytes) -> set[str]:
    return {n.op_type for n in onnx.load_from_string(data).graph.node}


def _params():
    for fname in sorted(_recipes):
        marks = [pytest.mark.xfail(reason=KNOWN[fname], strict=False)] if fname in KNOWN else []
        yield pytest.param(fname, id=fname[: -len(".onnx")], marks=marks)


@pytest.mark.parametrize("fname", list(_params()))
def test_real_model_matches_onnxruntime(fname):
    ort = pytest.importorskip("onnxruntime")
    recipe = _recipes[fname]
    data = open(os.path.join(DATA, fname), "rb").read()
    if fname.endswith("_qdyn.onnx") and ort_int8.reduce_range():
        stored = data
        data = requantized_dynamic(os.path.join(DATA, fname[:-len("_qdyn.onnx")] + ".onnx"))
        assert _ops(data) == _ops(stored)  # the same quantized operators, only 7-bit weights
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    ours = opwarden.InferenceSession(data)
    # Quantized graphs turn a one-ulp float difference before a QuantizeLinear into a whole step.
    rtol = 1e-2 if recipe["model"].endswith(("_qdq", "_qop", "_qdyn")) else 1e-3
    for i, size in enumerate(recipe["sizes"]):
        feeds = make_inputs(recipe, size[0], size[1], seed=i,
                            extra=size[2] if len(size) > 2 else None)
        want = ref.run(None, feeds)
        got = ours.run(None, feeds)
        # Again: the second run of a shape reuses its memory plan, with the buffers the
        # first run handed to each kernel and the outputs it made read-only.
        again = ours.run(None, feeds)
        assert len(got) == len(want)
        for k, (g, w) in enumerate([*zip(got, want), *zip(again, want)]):
            g = np.asarray(g)
            rerun = " (rerun)" if k >= len(want) else ""
            where = f"output {k % len(want)} at sizes {size}{rerun}"
            assert (g.dtype, g.shape) == (w.dtype, w.shape), where
            if w.dtype.kind in "iub":
                np.testing.assert_array_equal(g, w, err_msg=where)
            elif w.size:
                # Non-finite values must be the same ones in the same places; the error is
                # measured over the finite rest.
                fin = np.isfinite(w)
                np.testing.assert_array_equal(g[~fin], w[~fin], err_msg=where)
                if not fin.any():
                    continue
                scale = float(np.max(np.abs(w[fin])))
                err = float(np.max(np.abs(g[fin].astype(np.float64) - w[fin])))
                assert err <= rtol * scale + 1e-5, f"{where}: max err {err:.3g}, scale {scale:.3g}"
    # Under the default options a kernel fault in a real model is a bug the guard hid (it reran
    # the node on the reference kernel): the outputs above would still match.
    assert not ours.faults, [(f.node, f.variant, f.check, f.detail) for f in ours.faults]
