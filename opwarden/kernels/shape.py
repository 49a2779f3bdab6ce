"""Concat into the planned output buffer (the reference allocates a fresh array each run)."""

from __future__ import annotations

import numpy as np

from ..errors import KernelError
from ..ops.base import REGISTRY


def concat(*inputs, axis=1, out=None):
    """Join tensors along `axis` (negative allowed), into `out` when it is given."""
    if not inputs:
        raise KernelError("Concat: needs at least one input")
    r = inputs[0].ndim
    if not -r <= axis < r:
        raise KernelError(f"Concat: axis {axis} is out of range for rank {r}")
    a = axis % r
    rest = inputs[0].shape[:a] + inputs[0].shape[a + 1:]
    for i, x in enumerate(inputs):
        if x.ndim != r or x.shape[:a] + x.shape[a + 1:] != rest:
            raise KernelError(
                f"Concat: input {i} has shape {x.shape}, incompatible with {inputs[0].shape} "
                f"along axis {a}"
            )
    shape = list(inputs[0].shape)
    shape[a] = sum(x.shape[a] for x in inputs)
    if out is None or list(out.shape) != shape or out.dtype != inputs[0].dtype:
        return np.concatenate(inputs, axis=a)
    return np.concatenate(inputs, axis=a, out=out)


def register() -> None:
    """Register the Concat variant on every version (layout-agnostic: the layout pass remaps
    the axis)."""
    for opdef in REGISTRY.versions("Concat"):
        opdef.kernel("cpu", dtypes=["float32"], priority=10, accepts_out=True,
                     name="concat.cpu.out")(concat)
