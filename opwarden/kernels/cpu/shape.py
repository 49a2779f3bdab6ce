"""Concat and Transpose into the planned output buffer (the references allocate each run).

Transpose: where the permutation keeps the order of the non-1 dims the plan makes the output
a view of the input (ops.shape.TRANSPOSE's view_when) and gives no out=; the other
permutations copy, straight into the planned buffer.

When the memory plan binds a Concat's inputs as slices of its output (their producers wrote
straight into them, see opwarden/memory/lifetimes.py), those inputs are already in place and
are not copied; every other input is copied into its slice.
"""

from __future__ import annotations

import numpy as np

from opwarden.errors import KernelError
from opwarden.ops.base import REGISTRY
from opwarden.ops.common import transpose_perm


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
    owner = out if out.base is None else out.base
    if not any(x.base is owner for x in inputs):
        return np.concatenate(inputs, axis=a, out=out)
    # Some inputs were written straight into their slice of out (out itself may be a strided
    # slice of an enclosing Concat): copy input by input, skipping those that already are their
    # slice (same memory and strides; the shape matches by construction).
    idx: list[slice] = [slice(None)] * r
    pos = 0
    for x in inputs:
        n = x.shape[a]
        if n:
            idx[a] = slice(pos, pos + n)
            dst = out[tuple(idx)]
            if (x.base is not owner or x.strides != dst.strides
                    or x.__array_interface__["data"][0] != dst.__array_interface__["data"][0]):
                np.copyto(dst, x)
            pos += n
    return out


# A copy whose output's last axis is this short (2..8) and comes strided from the input (the
# NCHW -> NHWC transpose of an RGB image) runs one strided copy per index of that axis: NumPy's
# own copy loops over the short axis innermost, 4-5x slower (a 3x224x224 image 573 -> 118 us).
_SHORT_LAST = 8
_SHORT_LAST_MIN = 4096


def transpose(data, *, perm=None, out=None):
    """data.transpose(perm), copied into `out` when it is given."""
    view = data.transpose() if perm is None else data.transpose(perm)
    if out is None or out.shape != view.shape or out.dtype != view.dtype:
        return view
    last = view.shape[-1] if view.ndim else 0
    if 2 <= last <= _SHORT_LAST and view.size >= _SHORT_LAST_MIN \
            and view.strides[-1] != view.itemsize:
        for i in range(last):
            np.copyto(out[..., i], view[..., i])
        return out
    np.copyto(out, view)
    return out


def _valid_perm(data, *, perm=None, **_attrs) -> bool:
    """A permutation of data's (known) rank; the plan decides view or copy per signature."""
    return data.shape is not None and transpose_perm(perm, len(data.shape)) is not None


def register() -> None:
    """Register the Concat variant on every version (layout-agnostic: the layout pass remaps
    the axis). It accepts a strided out (a slice of an enclosing Concat), so Concats nest."""
    for opdef in REGISTRY.versions("Concat"):
        opdef.kernel("cpu", dtypes=["float32"], priority=10, accepts_out=True,
                     strided_out=True, name="concat.cpu.out")(concat)
    for opdef in REGISTRY.versions("Transpose"):
        opdef.kernel("cpu", priority=10, accepts_out=True, when=_valid_perm,
                     in_place_when=lambda attrs: False, name="transpose.cpu.out")(transpose)
