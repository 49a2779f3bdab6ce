"""Operators: sequences and optionals (SequenceConstruct ... SplitToSequence, Optional*)."""

from __future__ import annotations

import numpy as np

from opwarden.contract import Contract
from opwarden.errors import KernelError
from opwarden.ops.base import op

SEQ = Contract(nan="propagate")
# Optionals hold their value as is: the output is the input.
HOLDER = Contract(nan="propagate", must_alias=((0, 0),))


def _position(seq: list, position, insert: bool) -> int:
    n = len(seq)
    if position is None:
        return n if insert else n - 1
    p = int(np.asarray(position).reshape(-1)[0])
    hi = n if insert else n - 1
    if not -n <= p <= hi:
        raise KernelError(f"sequence position {p} is out of range for length {n}")
    return p + n if p < 0 else p


@op("SequenceConstruct", since=11, contract=SEQ)
def SequenceConstruct(*inputs):
    """A sequence of the input tensors (ONNX SequenceConstruct-11)."""
    return list(inputs)


@op("SequenceEmpty", since=11, contract=SEQ)
def SequenceEmpty(*, dtype=None):
    """An empty sequence (ONNX SequenceEmpty-11)."""
    return []


@op("SequenceAt", since=11, contract=SEQ)
def SequenceAt(input_sequence, position):
    """The tensor at `position` (negative counts from the back) (ONNX SequenceAt-11)."""
    return input_sequence[_position(input_sequence, position, insert=False)]


@op("SequenceInsert", since=11, contract=SEQ)
def SequenceInsert(input_sequence, tensor, position=None):
    """A copy of the sequence with `tensor` inserted (ONNX SequenceInsert-11)."""
    out = list(input_sequence)
    out.insert(_position(out, position, insert=True), tensor)
    return out


@op("SequenceErase", since=11, contract=SEQ)
def SequenceErase(input_sequence, position=None):
    """A copy of the sequence without the element at `position` (ONNX SequenceErase-11)."""
    out = list(input_sequence)
    del out[_position(out, position, insert=False)]
    return out


@op("SequenceLength", since=11, contract=SEQ)
def SequenceLength(input_sequence):
    """Number of tensors in the sequence, as an int64 scalar (ONNX SequenceLength-11)."""
    return np.array(len(input_sequence), dtype=np.int64)


@op("ConcatFromSequence", since=11, contract=SEQ)
def ConcatFromSequence(input_sequence, *, axis=None, new_axis=0):
    """Concatenate (or stack, with new_axis) the sequence's tensors (ONNX ConcatFromSequence-11)."""
    if not input_sequence:
        raise KernelError("ConcatFromSequence of an empty sequence")
    if new_axis:
        return np.stack(input_sequence, axis=axis)
    return np.concatenate(input_sequence, axis=axis)


@op("SplitToSequence", since=11, contract=SEQ)
def SplitToSequence(input, split=None, *, axis=0, keepdims=1):
    """Split a tensor into a sequence of chunks (ONNX SplitToSequence-11)."""
    n = input.shape[axis]
    if split is None:
        parts = [np.take(input, [i], axis=axis) for i in range(n)]
        return parts if keepdims else [np.squeeze(p, axis=axis) for p in parts]
    s = np.asarray(split).astype(np.int64)
    if s.ndim == 0:
        k = int(s)
        if k <= 0:
            raise KernelError(f"split must be positive, got {k}")
        bounds = list(range(k, n, k))
    else:
        if int(s.sum()) != n:
            raise KernelError(f"split sizes {s.tolist()} do not sum to dimension {n}")
        bounds = np.cumsum(s)[:-1].tolist()
    return list(np.split(input, bounds, axis=axis))


@op("SequenceMap", since=17, contract=SEQ)
def SequenceMap(input_sequence, *additional_inputs, body=None):
    """Apply `body` to each element (and to matching elements of other sequences) (ONNX 17)."""
    n = len(input_sequence)
    for a in additional_inputs:
        if isinstance(a, list) and len(a) != n:
            raise KernelError(f"SequenceMap sequences differ in length ({len(a)} vs {n})")
    results: list[list] = []
    for i in range(n):
        args = [input_sequence[i]] + [a[i] if isinstance(a, list) else a for a in additional_inputs]
        outs = body(*args)
        if not results:
            results = [[] for _ in outs]
        for acc, v in zip(results, outs):
            acc.append(v)
    if not results:
        results = [[] for _ in body.output_names]
    return tuple(results)


@op("Optional", since=15, contract=HOLDER)
def Optional(input=None, *, type=None):
    """An optional holding `input`, or an empty optional (ONNX Optional-15)."""
    return input


@op("OptionalHasElement", since=15, contract=SEQ)
def OptionalHasElement(input=None):
    """True when the optional holds a value (ONNX OptionalHasElement-15/18)."""
    return np.array(input is not None)


@op("OptionalGetElement", since=15, contract=HOLDER)
def OptionalGetElement(input):
    """The value inside an optional; error when empty (ONNX OptionalGetElement-15/18)."""
    if input is None:
        raise KernelError("OptionalGetElement of an empty optional")
    return input
