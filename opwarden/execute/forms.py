"""The forms a kernel may declare for its steps in the lean loop (execute.codegen): a bare
ufunc call (`direct`), or a call prepared once per step (`prepare`); and how a direct step's
constant operands are shaped.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden.ops.common import SHAPED_MAX


def direct_form(call: tuple) -> tuple[Any, tuple] | None:
    """(ufunc, constant trailing arguments) when step `call` may run as the bare call
    ``ufunc(*inputs, *constants, out=out)`` into its planned buffer (``ufunc(*inputs,
    *constants)`` without one), else None.

    A kernel declares it with a ``direct(out) -> (ufunc, constants) | None`` attribute (asked
    once, with the planned buffer or None), promising that for array inputs (all the lean
    loop passes) ``fn(*inputs, out=out)``, or ``fn(*inputs)``, is that call, up to a NumPy
    scalar for a 0-d array. Only the variant's own function qualifies (not one a session
    wrapped, bound or made tentative), and only for a node with no keyword but the planned
    out= (no attributes, workspace or subgraphs), with one output and every input present."""
    st, fn, ins, kw, _frees, _hook = call
    if type(kw) is not dict or len(kw) != ("out" in kw):
        return None
    if (st.graphs or len(st.outs) != 1 or st.outs[0] < 0 or any(s < 0 for s in ins)
            or fn is not st.placement.variant.fn):
        return None
    declare = getattr(fn, "direct", None)
    return declare(kw.get("out")) if callable(declare) else None


def prepared_form(call: tuple, consts: tuple) -> Any:
    """The callable step `call` runs as, ``prepared(*inputs, out=out)``, when its kernel
    prepares one for this step, else None.

    A kernel declares it with a ``prepare(kw, consts) -> callable | None`` attribute, asked
    once with the step's keyword arguments (its attributes and the planned buffer `out`) and
    per input its constant value (`...` for a computed input, None for an absent one). The
    callable promises the kernel's result for any inputs (it may hand them to the kernel),
    having done once what the kernel checks and derives from the rest on every call (see
    kernels.cpu.conv_prepared). As for direct_form, only the variant's own function, and only
    for a node with a planned buffer, one output and no subgraphs."""
    st, fn, _ins, kw, _frees, _hook = call
    if type(kw) is not dict or kw.get("out") is None:
        return None
    if st.graphs or len(st.outs) != 1 or st.outs[0] < 0 or fn is not st.placement.variant.fn:
        return None
    prepare = getattr(fn, "prepare", None)
    return prepare(kw, consts) if callable(prepare) else None


def shaped_operand(c: Any, shape: tuple[int, ...]) -> Any:
    """Constant operand `c` of a direct step into a buffer of `shape`, as the ufunc takes it
    fastest: of the output's shape, contiguous, read-only. NumPy runs a tiny elementwise call
    between operands of one shape on its trivial loop, but builds a broadcasting iterator for
    any other (2.4x the time of a 16-float Add; a NumPy scalar, 1.6x). Elements are those of
    the broadcast, so results are the same; a reshape when the size matches, a copy up to
    SHAPED_MAX elements, else `c` itself."""
    a = np.asarray(c)
    try:
        if np.broadcast_shapes(a.shape, shape) != tuple(shape):
            return c
    except ValueError:
        return c
    size = int(np.prod(shape, dtype=np.int64))
    if a.size == size and a.flags.c_contiguous:
        a = a.reshape(shape)  # a view
    elif size <= SHAPED_MAX:
        a = np.ascontiguousarray(np.broadcast_to(a, shape))
    elif a.ndim != 0:
        return c
    a.flags.writeable = False
    return a
