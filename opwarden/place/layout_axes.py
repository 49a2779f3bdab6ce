"""The layout vocabulary: NCHW and NHWC, the permutations between them, which tensors carry one.

A tensor of rank 3 to 5 with a known shape carries a layout (channels second, NCHW, as ONNX
writes it; or channels last, NHWC, as the layout pass may lay it out). A channels-last tensor's
physical axis j holds logical axis ``to_last(rank)[j]``; ``to_first`` is the inverse. A
transpose that moves only size-1 axes keeps the bytes in order and can be a Reshape (a view).
"""

from __future__ import annotations

from typing import Any, TypeGuard

from opwarden.ir.graph import Value

NHWC, NCHW = "NHWC", "NCHW"


def to_last(rank: int) -> tuple[int, ...]:
    """Physical axis j of a channels-last tensor holds logical axis to_last(rank)[j]."""
    return (0, *range(2, rank), 1)


def to_first(rank: int) -> tuple[int, ...]:
    """The permutation taking a channels-last tensor back to channels-first."""
    return (0, rank - 1, *range(1, rank - 1))


def tracked(v: Value | None) -> TypeGuard[Value]:
    """Does `v` carry a layout (a tensor of rank 3 to 5 with a known shape)?"""
    return (
        v is not None
        and v.kind == "tensor"
        and v.fact.shape is not None
        and 3 <= len(v.fact.shape) <= 5
    )


def dims(v: Value) -> tuple[Any, ...]:
    """The shape of a value whose shape is known (one `tracked`, or a constant)."""
    shape = v.fact.shape
    assert shape is not None, f"value {v.name!r} has no known shape"
    return shape


def rank(v: Value) -> int:
    return len(dims(v))


def size_one(v: Value) -> bool:
    s = v.fact.shape
    return s is not None and all(d == 1 for d in s)


def static(shape: Any) -> bool:
    return shape is not None and all(isinstance(d, int) and d > 0 for d in shape)


def moves_no_data(shape: tuple[Any, ...] | None, perm: tuple[int, ...]) -> bool:
    """Does transposing a tensor of `shape` by `perm` keep its bytes in the same order?"""
    if shape is None or not all(isinstance(d, int) and d > 0 for d in shape):
        return False
    big = [p for p in perm if shape[p] != 1]
    return big == sorted(big)


def perm_pads(pads: list[int], perm: tuple[int, ...]) -> list[int]:
    """ONNX pads ([begins..., ends...]) with both halves permuted by `perm`."""
    r = len(perm)
    begins, ends = pads[:r], pads[r:]
    return [int(begins[p]) for p in perm] + [int(ends[p]) for p in perm]
