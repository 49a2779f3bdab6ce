"""Operators: comparison, logic and bitwise families (Equal, Greater, And, BitShift, ...).

The opset < 7 versions take the legacy `broadcast`/`axis` attributes (see
elementwise.legacy_broadcast); the later ones broadcast as numpy does.
"""

import numpy as np

from opwarden.contract import Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import op
from opwarden.ops.common import apply_wide
from opwarden.ops.elementwise import legacy_broadcast

_LEGACY = {"broadcast": one_of(0, 1)}
_COMPARE = Contract(nan="none", broadcast="multidirectional")
_LEGACY_COMPARE = Contract(nan="none", broadcast="unidirectional", allowed=_LEGACY)
_BITS = Contract(may_alias=((0, 0),), nan="none", broadcast="multidirectional", overflow="wrap")


# ---------------------------------------------------------------------------------------------
# Comparison and logic


def _compare(fn, A, B):
    return apply_wide(fn, A, B, dtype=np.bool_)


@op("Equal", since=7, contract=_COMPARE)
def Equal(A, B):
    """A == B elementwise, numpy broadcasting; strings too (ONNX Equal-7/11/13/19)."""
    return _compare(np.equal, A, B)


@op("Greater", since=7, contract=_COMPARE)
def Greater(A, B):
    """A > B elementwise, numpy broadcasting (ONNX Greater-7/9/13)."""
    return _compare(np.greater, A, B)


@op("Less", since=7, contract=_COMPARE)
def Less(A, B):
    """A < B elementwise, numpy broadcasting (ONNX Less-7/9/13)."""
    return _compare(np.less, A, B)


@op("GreaterOrEqual", since=12, contract=_COMPARE)
def GreaterOrEqual(A, B):
    """A >= B elementwise, numpy broadcasting (ONNX GreaterOrEqual-12/16)."""
    return _compare(np.greater_equal, A, B)


@op("LessOrEqual", since=12, contract=_COMPARE)
def LessOrEqual(A, B):
    """A <= B elementwise, numpy broadcasting (ONNX LessOrEqual-12/16)."""
    return _compare(np.less_equal, A, B)


@op("Equal", since=1, contract=_LEGACY_COMPARE)
def Equal_1(A, B, *, broadcast=0, axis=None):
    """A == B with the legacy B-to-A `broadcast`/`axis` rule (ONNX Equal-1)."""
    return _compare(np.equal, A, legacy_broadcast(A, B, broadcast, axis))


@op("Greater", since=1, contract=_LEGACY_COMPARE)
def Greater_1(A, B, *, broadcast=0, axis=None):
    """A > B with the legacy B-to-A `broadcast`/`axis` rule (ONNX Greater-1)."""
    return _compare(np.greater, A, legacy_broadcast(A, B, broadcast, axis))


@op("Less", since=1, contract=_LEGACY_COMPARE)
def Less_1(A, B, *, broadcast=0, axis=None):
    """A < B with the legacy B-to-A `broadcast`/`axis` rule (ONNX Less-1)."""
    return _compare(np.less, A, legacy_broadcast(A, B, broadcast, axis))


@op("And", since=7, contract=_COMPARE)
def And(A, B):
    """Logical and, numpy broadcasting (ONNX And-7)."""
    return _compare(np.logical_and, A, B)


@op("Or", since=7, contract=_COMPARE)
def Or(A, B):
    """Logical or, numpy broadcasting (ONNX Or-7)."""
    return _compare(np.logical_or, A, B)


@op("Xor", since=7, contract=_COMPARE)
def Xor(A, B):
    """Logical exclusive or, numpy broadcasting (ONNX Xor-7)."""
    return _compare(np.logical_xor, A, B)


@op("And", since=1, contract=_LEGACY_COMPARE)
def And_1(A, B, *, broadcast=0, axis=None):
    """Logical and with the legacy B-to-A `broadcast`/`axis` rule (ONNX And-1)."""
    return _compare(np.logical_and, A, legacy_broadcast(A, B, broadcast, axis))


@op("Or", since=1, contract=_LEGACY_COMPARE)
def Or_1(A, B, *, broadcast=0, axis=None):
    """Logical or with the legacy B-to-A `broadcast`/`axis` rule (ONNX Or-1)."""
    return _compare(np.logical_or, A, legacy_broadcast(A, B, broadcast, axis))


@op("Xor", since=1, contract=_LEGACY_COMPARE)
def Xor_1(A, B, *, broadcast=0, axis=None):
    """Logical xor with the legacy B-to-A `broadcast`/`axis` rule (ONNX Xor-1)."""
    return _compare(np.logical_xor, A, legacy_broadcast(A, B, broadcast, axis))


# ---------------------------------------------------------------------------------------------
# Bitwise


@op("BitShift", since=11, contract=Contract(
    may_alias=((0, 0),), nan="none", broadcast="multidirectional", overflow="wrap",
    allowed={"direction": one_of("LEFT", "RIGHT")}))
def BitShift(X, Y, *, direction=None):
    """X << Y or X >> Y (arithmetic for signed); shifts outside [0, bits) give the sign fill
    (ONNX BitShift-11/28)."""
    if direction not in ("LEFT", "RIGHT"):
        raise KernelError(f"BitShift: direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    bits = X.dtype.itemsize * 8
    with np.errstate(all="ignore"):
        # NumPy (like C) leaves shifts by a negative amount or >= the width undefined: mask them.
        valid = (Y >= 0) & (Y < bits)
        amount = np.where(valid, Y, 0).astype(X.dtype)
        if direction == "LEFT":
            shifted, fill = np.left_shift(X, amount), np.zeros((), X.dtype)
        else:
            shifted = np.right_shift(X, amount)
            fill = np.where(X < 0, -1, 0).astype(X.dtype) if X.dtype.kind == "i" else 0
        return np.asarray(np.where(valid, shifted, fill), dtype=X.dtype)


@op("BitwiseAnd", since=18, contract=_BITS)
def BitwiseAnd(A, B):
    """Bitwise and, numpy broadcasting (ONNX BitwiseAnd-18)."""
    return apply_wide(np.bitwise_and, A, B)


@op("BitwiseOr", since=18, contract=_BITS)
def BitwiseOr(A, B):
    """Bitwise or, numpy broadcasting (ONNX BitwiseOr-18)."""
    return apply_wide(np.bitwise_or, A, B)


@op("BitwiseXor", since=18, contract=_BITS)
def BitwiseXor(A, B):
    """Bitwise exclusive or, numpy broadcasting (ONNX BitwiseXor-18)."""
    return apply_wide(np.bitwise_xor, A, B)


@op("BitwiseNot", since=18, contract=Contract(may_alias=((0, 0),), nan="none", overflow="wrap"))
def BitwiseNot(X):
    """Bitwise complement (ONNX BitwiseNot-18)."""
    return apply_wide(np.invert, X)
