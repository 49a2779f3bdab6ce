"""Elementwise arithmetic on the torch device: Add/Sub/Mul/Div, Sum, and FusedElementwise.

FusedElementwise runs the passes' elementwise programs (ops.fused) one torch call per statement;
a temporary read for the last time by a statement is overwritten by it (in place), so a linear
chain allocates one tensor, and a mul whose product only an add reads is one addcmul. A program
is compiled once (`_ew_compile`: dest, out-of-place and in-place function, arguments per
statement) and cached by its text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name

from opwarden.errors import KernelError
from opwarden.kernels.torch.runtime import FLOATS, INTS, _add, _add_simple, _each, _Mode, _small
from opwarden.kernels.torch.tensors import _np, _out_t, _ret, _t
from opwarden.ops.fused_elementwise import last_reads, parse_program


def _binary(torch_fn: Callable[..., torch.Tensor], ref: Callable[..., Any], legacy: bool):
    """Add/Sub/Mul/Div; opset-6 `broadcast`/`axis` attributes go to the reference kernel."""

    def kernel(A, B, *, out=None, **attrs):
        if legacy and (attrs.get("broadcast") or attrs.get("axis") is not None):
            return ref(A, B, **attrs)
        with _Mode(_small(A, B)):
            o = _out_t(out)
            if o is not None:
                torch_fn(_t(A), _t(B), out=o)
                return out
            return _ret(torch_fn(_t(A), _t(B)), out)

    return kernel


def _sum(*data, out=None):
    with _Mode(_small(*data)):
        ts = [_t(d) for d in data]
        if len(ts) == 1:
            return _ret(ts[0].clone(), out)
        o = _out_t(out)
        # out= only when the first pair already has the final shape (torch would resize it).
        if o is not None and torch.broadcast_shapes(ts[0].shape, ts[1].shape) == o.shape:
            y = torch.add(ts[0], ts[1], out=o)
        else:
            y = torch.add(ts[0], ts[1])
        for t in ts[2:]:
            if torch.broadcast_shapes(y.shape, t.shape) == y.shape:
                y.add_(t)
            else:
                y = y + t
        if o is not None and y is o:
            return out
        return _ret(y, out)


_EW_OUT: dict[str, Callable[..., torch.Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "max": torch.maximum, "min": torch.minimum, "neg": torch.neg, "abs": torch.abs,
    "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "reciprocal": torch.reciprocal,
    "tanh": torch.tanh, "relu": torch.relu, "sigmoid": torch.sigmoid, "hardswish": F.hardswish,
    "leakyrelu": lambda x, a: F.leaky_relu(x, a),
    "clip": lambda x, lo, hi: torch.clamp(x, lo, hi),
    "hardsigmoid": lambda x, a, b: x.mul(a).add_(b).clamp_(0.0, 1.0),
}
_EW_INPLACE: dict[str, Callable[..., torch.Tensor]] = {
    "add": torch.Tensor.add_, "sub": torch.Tensor.sub_, "mul": torch.Tensor.mul_,
    "div": torch.Tensor.div_, "max": lambda a, b: torch.maximum(a, b, out=a),
    "min": lambda a, b: torch.minimum(a, b, out=a), "neg": torch.Tensor.neg_,
    "abs": torch.Tensor.abs_, "exp": torch.Tensor.exp_, "log": torch.Tensor.log_,
    "sqrt": torch.Tensor.sqrt_, "reciprocal": torch.Tensor.reciprocal_,
    "tanh": torch.Tensor.tanh_, "relu": torch.Tensor.relu_, "sigmoid": torch.Tensor.sigmoid_,
    "hardswish": lambda x: F.hardswish(x, inplace=True),
    "leakyrelu": lambda x, a: F.leaky_relu_(x, a),
    "clip": lambda x, lo, hi: x.clamp_(lo, hi),
    "hardsigmoid": lambda x, a, b: x.mul_(a).add_(b).clamp_(0.0, 1.0),
}
_COMMUTATIVE = {"add", "mul", "max", "min"}
_EW_PROGRAMS: dict[str, tuple] = {}


def _ew_compile(program: str, parse: Callable[[str], Any]) -> tuple:
    """(dest, out-of-place fn, in-place fn or None, tensor args, number args) per statement."""
    plan = _EW_PROGRAMS.get(program)
    if plan is not None:
        return plan
    stmts = parse(program)
    last = last_reads(stmts)
    out = []
    fused = -1
    for k, (dest, name, args) in enumerate(stmts):
        if k == fused:
            continue
        mad = _mul_add(stmts, k, last)
        if mad is not None:
            # mul then add of its product: one addcmul pass instead of two.
            out.append((stmts[k + 1][0], torch.addcmul, None, mad, ()))
            fused = k + 1
            continue
        tensors = [a for a in args if isinstance(a, str)]
        numbers = tuple(a for a in args if not isinstance(a, str))
        inplace = None
        if tensors and tensors[0][0] == "t" and last[tensors[0]] == k:
            inplace = _EW_INPLACE[name]
        elif (len(tensors) == 2 and name in _COMMUTATIVE and tensors[1][0] == "t"
              and last[tensors[1]] == k and tensors[0] != tensors[1]):
            tensors = [tensors[1], tensors[0]]
            inplace = _EW_INPLACE[name]
        out.append((dest, _EW_OUT[name], inplace, tuple(tensors), numbers))
    plan = tuple(out)
    if len(_EW_PROGRAMS) > 1024:
        _EW_PROGRAMS.clear()
    _EW_PROGRAMS[program] = plan
    return plan


def _mul_add(stmts, k: int, last: dict[str, int]) -> tuple[str, str, str] | None:
    """(c, a, b) when statement k is t = mul(a, b) and statement k + 1 is add(t, c) or
    add(c, t), the only read of t, with a, b and c tensors; else None."""
    dest, name, args = stmts[k]
    if name != "mul" or k + 1 >= len(stmts) or last.get(dest) != k + 1:
        return None
    _, name2, args2 = stmts[k + 1]
    if name2 != "add" or not all(isinstance(a, str) for a in (*args, *args2)):
        return None
    if len(args) != 2 or len(args2) != 2 or list(args2).count(dest) != 1:
        return None
    c = args2[1] if args2[0] == dest else args2[0]
    return (c, args[0], args[1])


def _fused_elementwise_kernel(ref: Callable[..., Any], parse: Callable[[str], Any]):
    def kernel(*inputs, program=""):
        try:
            plan = _ew_compile(str(program), parse)
        except (KernelError, KeyError):
            return ref(*inputs, program=program)  # names the problem
        if not inputs:
            return ref(*inputs, program=program)
        with _Mode(_small(*inputs)):
            env: dict[str, torch.Tensor] = {f"x{i}": _t(x) for i, x in enumerate(inputs)}
            y = None
            for dest, fn, inplace, tensors, numbers in plan:
                try:
                    vals = [env[a] for a in tensors]
                except KeyError:
                    return ref(*inputs, program=program)
                y = None
                if inplace is not None:
                    try:
                        y = inplace(*vals, *numbers)
                    except RuntimeError:  # a temporary smaller than the broadcast result
                        y = None
                if y is None:
                    y = fn(*vals, *numbers)
                env[dest] = y
            return _np(y)

    return kernel


def register() -> None:
    """Add the elementwise variants to the torch device."""
    _add_simple({"Sum": (_sum, FLOATS + INTS, True)})
    binary = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div}
    for op_type, tfn in binary.items():
        dts = FLOATS if op_type == "Div" else FLOATS + INTS
        for o in _each(op_type):
            fn = _binary(tfn, o.reference, legacy=o.since < 7)
            _add(o, fn, f"{op_type.lower()}.torch", dtypes=dts, accepts_out=True)
    for o in _each("FusedElementwise", "opwarden"):
        _add(o, _fused_elementwise_kernel(o.reference, parse_program), "fusedelementwise.torch")
