"""The whole pipeline on the light CNNs: every pass on agrees with level 0 and ONNX Runtime, and
the graphs shrink as expected.

AlexNet, VGG-19 and ZFNet-512 are left out here (building their 230-550 MiB of seeded weights
takes most of a minute on the CI machine, and tests/test_zoo.py runs them with every pass on
against ONNX Runtime); their patterns (Conv+Relu, Gemm+Relu, Dropout) are unit-tested.
"""

from __future__ import annotations

import numpy as np
import pytest

import opwarden as ow
from opwarden import zoo

ort = pytest.importorskip("onnxruntime")

# Nodes after all passes (before placement), from 24/910/144/509/176/203/66/46/22.
# (Inception: each group of sibling 1x1 convolutions becomes one FusedConv and a Split,
# 9 groups of 3 in v1 (85 -> 76), 8 of 3 and 2 of 2 in v2 (95 -> 87). SqueezeNet: each fire
# module's two expand convolutions and their Concat become one FusedConv, 8 x 3 -> 1. Each
# Relu fused into a convolution that feeds a MaxPool moves after the pool as its own node:
# one in AlexNet, DenseNet, Inception v1, ResNet, ShuffleNet and ZFNet, two in Inception v2,
# three in SqueezeNet, five in VGG. Inception v2's seven pool projections run their 1x1
# convolution first, each Relu then its own node after the pool: +7.)
EXPECTED_NODES = {"bvlc_alexnet": 16, "densenet121": 247, "inception_v1": 77,
                  "inception_v2": 96, "resnet50": 59, "shufflenet": 112, "squeezenet": 26,
                  "vgg19": 31, "zfnet512": 16}


@pytest.mark.parametrize("name", ["densenet121", "inception_v1", "inception_v2", "resnet50",
                                  "shufflenet", "squeezenet"])
def test_optimized_zoo_matches_level0_and_onnxruntime(name):
    model = zoo.build(name, seed=0)
    data = model.SerializeToString()
    fast = ow.InferenceSession(data)
    plain = ow.InferenceSession(data, ow.SessionOptions(optimization_level=0))
    peer = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    total = fast.pass_report[-1]
    assert total["nodes_after"] == EXPECTED_NODES[name], fast.pass_report
    feeds = zoo.feeds_for(model, seed=1)
    want = peer.run(None, feeds)
    for got in (fast.run(None, feeds), plain.run(None, feeds)):
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            tol = 1e-3 * np.abs(w).max() + 1e-5
            assert np.abs(g - w).max() <= tol
