"""The nine light CNNs with seeded weights agree with ONNX Runtime on random inputs."""

from __future__ import annotations

import numpy as np
import pytest

import opwarden as ow
from opwarden import zoo

ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("name", zoo.LIGHT_MODELS)
def test_light_model_matches_onnxruntime(name):
    model = zoo.build(name, seed=0)
    data = model.SerializeToString()
    ours = ow.InferenceSession(data)
    peer = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    assert [i.name for i in ours.get_inputs()] == [i.name for i in peer.get_inputs()]
    for seed in (1, 2):
        feeds = zoo.feeds_for(model, seed=seed)
        got = ours.run(None, feeds)
        want = peer.run(None, feeds)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            tol = 1e-3 * np.abs(w).max() + 1e-5
            err = np.abs(g - w).max()
            assert err <= tol, f"{name}: max|ours-ort| = {err:.3g} > {tol:.3g}"


def test_zoo_weights_are_meaningful():
    """Seeded, He-scaled, calibrated: outputs are finite, not uniform, and reproducible."""
    m1, m2 = zoo.build("resnet50", seed=0), zoo.build("resnet50", seed=0)
    assert m1.SerializeToString() == m2.SerializeToString()
    assert not any(n.op_type == "ConstantOfShape" for n in m1.graph.node)
    (y,) = ow.InferenceSession(m1).run(None, zoo.feeds_for(m1, seed=3))
    assert np.isfinite(y).all()
    assert y.max() > 5 * y.min() + 1e-6  # softmax is not flat
