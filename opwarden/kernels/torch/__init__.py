"""The torch device: operators run through PyTorch (its CPU, or CUDA when present).

`provider` is the device (importing it registers it and its variants); the other modules hold
the variants by family, on what `runtime` (target, inference mode, serial bounds) and `tensors`
(NumPy <-> torch, channels-last views, the reference fallback) share:

- activation: Relu, Sigmoid, Tanh, Clip, ... and the fused epilogue activations
- elementwise: Add/Sub/Mul/Div, Sum, FusedElementwise programs
- linalg: MatMul, Gemm, Softmax, FusedGemm, FusedMatMul
- movement: Concat, Transpose, ChannelShuffle and the pure view ops
- conv: Conv and FusedConv (generic and node-bound kernels); conv_plan: how one convolution runs
- pool: MaxPool, AveragePool, global pools; normalization: BatchNormalization, LRN

This package sets the OpenMP spin default below before any of those modules imports torch
(a package's `__init__` runs before its submodules).
"""

from __future__ import annotations

import os
import sys

if "torch" not in sys.modules and not any(
    k in os.environ for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
):
    # OpenMP workers spin between parallel regions for GOMP_SPINCOUNT iterations, 300000 by
    # default: ~5 ms of a core burnt after every region, stolen from whatever runs next on a
    # small machine (the NumPy kernels' BLAS, another runtime in the process). Passive waiting
    # costs a futex wake-up per region instead, which whole models pay dearly for. 30000 spins
    # (~1 ms) keep the workers hot through a model's back-to-back operators and idle soon after
    # a run. Only a default: a policy the user set wins, and a torch imported earlier keeps its
    # own.
    os.environ["GOMP_SPINCOUNT"] = "30000"
