"""Feed validation: what `InferenceSession.run` checks of the caller's feeds before planning.

A run's feeds are matched to the graph inputs by name (unknown and missing names refused), each
checked against its input's declared dtype, rank and static dims (a dim declared -1 is dynamic,
as in ONNX Runtime; a one-element feed for a declared scalar is taken as the scalar), symbolic
dims held equal across inputs, and handed to the kernels as read-only native-byte-order views
(the caller's array keeps its own flags). Sequence, map and optional feeds are checked against their
declared TypeProto and rebuilt as new containers of such arrays. Every refusal is an
`InputError` naming the input. The session then plans for the dims these feeds bind
(`plan.manager`) and runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from opwarden.dtypes import dtype_name, np_dtype
from opwarden.errors import InputError
from opwarden.ir.graph import Value
from opwarden.memory.constants import freeze as freeze_constant
from opwarden.memory.constants import readonly_view


def type_str(v: Value) -> str:
    """The type of a graph input or output as onnxruntime names it ("tensor(float)")."""
    if v.kind == "tensor":
        dt = v.fact.dtype
        names = {"float32": "float", "float64": "double"}
        return f"tensor({names.get(dt, dt) if dt else 'undefined'})"
    return v.kind


def output_indices(outputs: Sequence[Value], names: Sequence[str] | None) -> list[int]:
    """Indices into the graph outputs of the requested `names` (None: all of them)."""
    if names is None:
        return list(range(len(outputs)))
    if isinstance(names, str):
        raise InputError(f"output_names must be a list of names, got the string {names!r}")
    index = {v.name: i for i, v in enumerate(outputs)}
    picks = []
    for n in names:
        if n not in index:
            raise InputError(
                f"unknown output name {n!r}; the model's outputs are {list(index)}"
            )
        picks.append(index[n])
    return picks


class FastFeeds:
    """`check_feeds` for the run most callers make, in a fraction of its time: a dict of plain
    native-order NumPy arrays, one per input, each of its input's dtype, rank and static dims,
    the symbolic dims agreeing. Calling it returns the checked values as `check_feeds` would,
    or None for any other feed (another type, a conversion, a name unknown or missing, a
    mismatch): `check_feeds` then judges it, and words the refusal. Built once per graph."""

    def __init__(self, graph_inputs: Sequence[Value]) -> None:
        self.inputs: list[tuple] | None = []
        for v in graph_inputs:
            dt = _plain_dtype(v.fact.dtype) if v.kind == "tensor" else None
            if dt is None:
                self.inputs = None  # (sequences, optionals, strings, untyped: check_feeds's)
                return
            shape = v.fact.shape
            static = () if shape is None else tuple(
                (a, d) for a, d in enumerate(shape) if isinstance(d, int))
            syms = () if shape is None else tuple(
                (a, d) for a, d in enumerate(shape) if isinstance(d, str))
            rank = -1 if shape is None else len(shape)
            self.inputs.append((v.name, v, dt, rank, static, syms))

    def __call__(self, feed: Any) -> list[Any] | None:
        """The checked values for `feed`, or None when it is not the plain case."""
        if self.inputs is None or type(feed) is not dict:
            return None
        values = []
        dims: dict[str, int] = {}
        n = 0
        for name, v, dt, rank, static, syms in self.inputs:
            x = feed.get(name)
            if x is None:
                if name in feed or v.const is None:
                    return None
                values.append(freeze_constant(v.const))  # an initializer not fed
                continue
            n += 1
            # (the builtin dtypes are singletons: `is` is the test for dtype and byte order)
            if type(x) is not np.ndarray or x.dtype is not dt or rank >= 0 and x.ndim != rank:
                return None
            shape = x.shape
            for a, d in static:
                if shape[a] != d:
                    return None
            for a, d in syms:
                if dims.setdefault(d, shape[a]) != shape[a]:
                    return None
            values.append(readonly_view(x))
        return values if n == len(feed) else None


def _plain_dtype(name: str | None) -> np.dtype | None:
    """The builtin NumPy dtype an input of dtype `name` is fed as, None for any other kind."""
    if name is None:
        return None
    try:
        dt = np.dtype(name)
    except TypeError:
        return None
    return dt if dt.kind in "biufc" and dtype_name(dt) == name and dt.isnative else None


def check_feeds(graph_inputs: Sequence[Value], fed: Sequence[Value],
                feed: Mapping[str, Any]) -> list[Any]:
    """A value for every graph input, in order: each feed checked against its input's type,
    shape and the symbolic dims the feeds share (`fed`: the inputs a caller may feed that are
    not initializers, named when a name is unknown); an initializer not fed keeps its
    constant, an optional input not fed is None."""
    if not isinstance(feed, Mapping):
        raise InputError(
            f"input_feed must be a dict of name -> array, got {type(feed).__name__}"
        )
    declared = {v.name: v for v in graph_inputs}
    for name in feed:
        if name not in declared:
            raise InputError(
                f"unknown input name {name!r}; the model's inputs are "
                f"{[v.name for v in fed]}"
            )
    dims: dict[str, tuple[int, str]] = {}
    values = []
    for v in graph_inputs:
        if v.name in feed:
            values.append(check_feed(v, feed[v.name], dims))
        elif v.const is not None:
            values.append(freeze_constant(v.const))
        elif v.kind == "optional":
            values.append(None)
        else:
            raise InputError(
                f"missing feed for input {v.name!r} ({type_str(v)}, shape "
                f"{list(v.fact.shape) if v.fact.shape is not None else '?'})"
            )
    return values


def check_feed(v: Value, x: Any, dims: dict[str, tuple[int, str]]) -> Any:
    """One tensor (or sequence/map/optional) feed for input `v`, as kernels may see it; `dims`
    collects the symbolic dims bound so far (name -> (size, input that set it))."""
    if v.kind in ("sequence", "map", "optional"):
        tp = v.type_proto
        if tp is not None or v.kind != "optional":
            return _structured_feed(f"input {v.name!r}", tp, v.kind, x)
        if x is None:
            return None
    if not isinstance(x, np.ndarray):
        if isinstance(x, (np.generic, int, float, bool, list)):
            try:
                x = np.asarray(x)
            except (ValueError, TypeError) as e:  # a ragged list, say
                raise InputError(
                    f"input {v.name!r}: the {type(x).__name__} given is not a tensor: {e}"
                ) from None
        else:
            raise InputError(f"input {v.name!r} must be a numpy array, got {type(x).__name__}")
    want = v.fact.dtype
    got = _dtype_name(x.dtype)
    if want is not None and got != want:
        raise InputError(f"input {v.name!r} expects dtype {want}, got {got}")
    if got == "string" and x.dtype != object:
        x = x.astype(object)
    shape = v.fact.shape
    if shape == () and x.ndim:
        x = _as_scalar(v, x)
    if shape is not None:
        if x.ndim != len(shape):
            raise InputError(
                f"input {v.name!r} expects rank {len(shape)} (shape {list(shape)}), "
                f"got rank {x.ndim} (shape {list(x.shape)})"
            )
        for axis, (d, n) in enumerate(zip(shape, x.shape)):
            if isinstance(d, int) and d != n:
                raise InputError(
                    f"input {v.name!r} dimension {axis} must be {d}, got {n} "
                    f"(shape {list(x.shape)}, expected {list(shape)})"
                )
            if isinstance(d, str):
                seen = dims.setdefault(d, (n, v.name))
                if seen[0] != n:
                    raise InputError(
                        f"input {v.name!r} dimension {axis} ({d!r}) is {n}, but input "
                        f"{seen[1]!r} set {d!r} to {seen[0]}"
                    )
    # Kernels see the caller's memory through a read-only buffer: no kernel can make it
    # writeable, and the caller's array keeps its own flags.
    return readonly_view(_native(x))


_NAMES: dict[np.dtype, str] = {}


def _dtype_name(dt: np.dtype) -> str:
    """dtype_name, remembered per dtype (NumPy's dtype.name takes microseconds)."""
    got = _NAMES.get(dt)
    if got is None:
        got = dtype_name(dt)
        if len(_NAMES) < 256:
            _NAMES[dt] = got
    return got


def _as_scalar(v: Value, x: np.ndarray) -> np.ndarray:
    """A one-element feed ([1], [1, 1], ...) for an input declared as a scalar, viewed as the
    scalar. ONNX Runtime does not check the shape of a feed for a scalar input at all; the
    values computed from one element are the same either way (outputs that take their rank
    from it keep the declared one here). A feed of any other size is refused: the model's
    shapes are planned from the declared scalar."""
    if x.size == 1:
        return x.reshape(())
    raise InputError(
        f"input {v.name!r} is declared a scalar (shape []); got shape {list(x.shape)} "
        f"({x.size} elements); a scalar input takes one element, shaped [] or [1]"
    )


def _native(x: np.ndarray) -> np.ndarray:
    """x in the machine's byte order (values kept): kernels, and the outputs, never see a
    big-endian dtype on a little-endian machine."""
    return x if x.dtype.isnative else x.astype(x.dtype.newbyteorder("="))


_KINDS = {"sequence_type": "sequence", "map_type": "map", "optional_type": "optional",
          "tensor_type": "tensor"}


def _structured_feed(what: str, tp: Any, kind: str, x: Any) -> Any:
    """A sequence, map or optional feed checked against its declared type `tp` (None: only
    the kind is known), rebuilt as new containers of read-only native-order arrays: every
    sequence element a tensor of the declared element type, every map key and value of the
    declared key and value types."""
    if tp is not None:
        kind = _KINDS.get(tp.WhichOneof("value") or "", "unknown")
    if kind == "optional":
        return None if x is None else _structured_feed(
            what, tp.optional_type.elem_type if tp is not None else None, "unknown", x)
    if kind == "sequence":
        if not isinstance(x, (list, tuple)):
            raise InputError(f"{what} is a sequence (a list of arrays); got {type(x).__name__}")
        elem = tp.sequence_type.elem_type if tp is not None else None
        return [_structured_feed(f"{what} element {i}", elem, "tensor", a)
                for i, a in enumerate(x)]
    if kind == "map":
        if not isinstance(x, dict):
            raise InputError(f"{what} is a map (a dict); got {type(x).__name__}")
        if tp is None:
            return dict(x)
        key_dt = _elem_dtype(tp.map_type.key_type)
        val_tp = tp.map_type.value_type
        out = {}
        for k, val in x.items():
            out[_map_key(what, key_dt, k)] = _map_value(f"{what} value for key {k!r}", val_tp, val)
        return out
    if kind == "tensor":
        dt = _elem_dtype(tp.tensor_type.elem_type) if tp is not None else None
        return readonly_view(_native(_tensor_item(what, dt, x)))
    if isinstance(x, np.ndarray):  # a type onnx has no feed for (sparse): left to the kernels
        return readonly_view(_native(x))
    if isinstance(x, (list, tuple)):
        return _structured_feed(what, None, "sequence", x)
    return x


def _elem_dtype(elem_type: int) -> np.dtype | None:
    try:
        return np.dtype(np_dtype(elem_type)) if elem_type else None
    except (KeyError, TypeError):
        return None


def _tensor_item(what: str, dt: np.dtype | None, x: Any) -> np.ndarray:
    """x as a tensor of dtype `dt`: arrays must have it; Python lists and scalars are
    converted to it where the conversion keeps their kind (numbers to a numeric type, str to
    string); ragged lists and other objects are refused."""
    if not isinstance(x, np.ndarray):
        if isinstance(x, np.generic):
            x = np.asarray(x)
        elif isinstance(x, (list, tuple, bool, int, float, str)):
            try:
                a = np.asarray(x)
            except (ValueError, TypeError) as e:  # a ragged list, say
                raise InputError(f"{what}: the {type(x).__name__} given is not a tensor: {e}") \
                    from None
            if a.dtype.kind == "U" and (dt is None or dt.kind == "O"):
                x = a.astype(object)
            elif a.dtype.kind in "biuf" and (dt is None or (
                    dt.kind in "biuf" and np.can_cast(a.dtype, dt, "same_kind"))):
                x = a if dt is None else a.astype(dt)
            else:
                raise InputError(
                    f"{what}: a {type(x).__name__} of {a.dtype} values cannot be a tensor of "
                    f"{'the declared type' if dt is None else dtype_name(dt)}"
                )
        else:
            raise InputError(f"{what} must be a numpy array, got {type(x).__name__}")
    if dt is not None and dtype_name(x.dtype) != dtype_name(dt):
        raise InputError(f"{what} expects dtype {dtype_name(dt)}, got {dtype_name(x.dtype)}")
    if dt is not None and dt.kind == "O" and x.dtype != object:
        x = x.astype(object)
    return x


def _map_key(what: str, dt: np.dtype | None, k: Any) -> Any:
    if dt is None:
        return k
    if dt.kind == "O":
        if isinstance(k, str):
            return str(k)
        raise InputError(f"{what}: key {k!r} must be a string, got {type(k).__name__}")
    if isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
        k = int(k)
        info = np.iinfo(dt) if dt.kind in "iu" else None
        if info is not None and info.min <= k <= info.max:
            return k
        raise InputError(f"{what}: key {k} is out of range for {dtype_name(dt)} keys")
    raise InputError(
        f"{what}: key {k!r} must be an integer ({dtype_name(dt)}), got {type(k).__name__}"
    )


def _map_value(what: str, tp: Any, val: Any) -> Any:
    if tp.WhichOneof("value") != "tensor_type":
        return _structured_feed(what, tp, "unknown", val)
    a = _tensor_item(what, _elem_dtype(tp.tensor_type.elem_type), val)
    a = _native(a)
    return a[()] if a.ndim == 0 else readonly_view(a)  # scalars as NumPy scalars, as maps hold
