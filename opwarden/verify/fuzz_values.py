"""The fuzzer's value mutations: attributes, element types and shapes, opsets, initializers, feeds.

Each ``m_*`` mutator edits a model in place and describes the edit (None: nothing to edit);
``mutate_feeds`` edits the feeds (missing, retyped, reshaped, NaN / extreme / empty values,
ragged lists, odd objects, non-contiguous, read-only, broadcast, 0-d and big-endian arrays).
The structure mutations and the table of all mutators are in fuzz_mutate.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden.verify.fuzz_corpus import onnx_helpers
from opwarden.verify.fuzz_scope import Scope, node_scope, on_a_node, pick, scopes_of

DOMAINS = ("com.bogus", "ai.onnx.ml", "opwarden", "com.microsoft", "ai.onnx", "local.fuzz", " ")

INT_SPECIALS = (0, 1, -1, 2, 3, -7, 1 << 31, (1 << 31) - 1, 1 << 40, (1 << 63) - 1, -(1 << 63))
FLOAT_SPECIALS = (0.0, -1.0, 1.0, 0.5, float("nan"), float("inf"), float("-inf"), 1e38, 1e-45)
STRING_SPECIALS = (
    b"", b"NOTSET", b"SAME_UPPER", b"SAME_LOWER", b"VALID", b"bogus", b"\xff\xfe", b"constant",
    b"reflect", b"edge", b"wrap", b"linear", b"nearest", b"cubic", b"half_pixel",
    b"tf_crop_and_resize",
    b"RIGHT", b"LEFT", b"forward", b"bidirectional", b"DCR", b"CRD", b"ij,jk->ik", b"...",
)  # fmt: skip
ATTR_NAMES = (
    "axis", "axes", "perm", "pads", "strides", "kernel_shape", "dilations", "group", "to",
    "keepdims", "mode", "alpha", "beta", "transA", "transB", "epsilon", "k", "largest",
    "sorted", "direction", "value", "split", "num_outputs", "noop_with_empty_axes", "blocksize",
    "batch_dims", "ceil_mode", "auto_pad", "exclusive", "reverse", "output_padding",
    "output_shape", "storage_order", "select_last_index", "then_branch", "body", "seed",
    "dtype", "coordinate_transformation_mode", "upper", "equation", "num_scan_inputs",
    "hidden_size", "bogus_attr",
)  # fmt: skip
# DataType 0 (undefined) .. 26 (INT2) plus values no version of ONNX defines
ELEM_TYPES = tuple(range(0, 27)) + (27, 999, -3)
DIM_SPECIALS = (0, 1, 2, 3, -1, -5, 1 << 31, 1 << 40, (1 << 62), 7)


def _random_ints(rng: np.random.Generator) -> list[int]:
    r = rng.random()
    if r < 0.15:
        return []
    if r < 0.2:
        return [int(rng.integers(-3, 4))] * 1000
    n = int(rng.integers(1, 9))
    return [
        int(pick(rng, INT_SPECIALS)) if rng.random() < 0.5 else int(rng.integers(-4, 6))
        for _ in range(n)
    ]


def _tiny_graph() -> Any:
    _, TP, h, _ = onnx_helpers()
    return h.make_graph(
        [h.make_node("Identity", ["gi"], ["go"])],
        "tiny",
        [h.make_tensor_value_info("gi", TP.FLOAT, [1])],
        [h.make_tensor_value_info("go", TP.FLOAT, [1])],
    )


def _random_attr(name: str, rng: np.random.Generator) -> Any:
    onnx, TP, h, nh = onnx_helpers()
    kind = int(rng.integers(9))
    if kind == 0:
        return h.make_attribute(name, int(pick(rng, INT_SPECIALS)))
    if kind == 1:
        return h.make_attribute(name, float(pick(rng, FLOAT_SPECIALS)))
    if kind == 2:
        return h.make_attribute(name, pick(rng, STRING_SPECIALS))
    if kind == 3:
        ints = _random_ints(rng)
        a = h.make_attribute(name, ints) if ints else onnx.AttributeProto(name=name)
        a.type = onnx.AttributeProto.INTS
        return a
    if kind == 4:
        return h.make_attribute(name, [float(pick(rng, FLOAT_SPECIALS)) for _ in range(3)])
    if kind == 5:
        return h.make_attribute(name, [pick(rng, STRING_SPECIALS), b"x"])
    if kind == 6:
        arr = pick(rng, [np.array(1.5, np.float32), np.zeros((0, 3), np.int64),
                          np.array([1, 2], np.int32), np.array([True])])  # fmt: skip
        return h.make_attribute(name, nh.from_array(arr, name))
    if kind == 7:
        return h.make_attribute(name, _tiny_graph())
    a = onnx.AttributeProto(name=name)  # a type with no value, or no type at all
    a.type = int(pick(rng, (0, onnx.AttributeProto.INT, onnx.AttributeProto.TENSOR, 99)))
    return a


@on_a_node
def m_attr(model: Any, rng: np.random.Generator, s: Scope, i: int) -> str | None:
    n = s.nodes[i]
    r = rng.random()
    attrs = n.attribute
    if len(attrs) and r < 0.45:
        j = int(rng.integers(len(attrs)))
        a = attrs[j]
        if a.type == a.INT and rng.random() < 0.5:  # plausible values reach the kernels
            old = a.i
            a.i = int(rng.integers(-4, 5))
            return f"attr {s.where} node {i} {n.op_type}.{a.name} {old} -> {a.i}"
        if a.ints and rng.random() < 0.6:
            k = int(rng.integers(len(a.ints)))
            old = a.ints[k]
            a.ints[k] = int(pick(rng, INT_SPECIALS))
            return f"attr {s.where} node {i} {n.op_type}.{a.name}[{k}] {old} -> {a.ints[k]}"
        new = _random_attr(a.name, rng)
        a.CopyFrom(new)
        return f"attr {s.where} node {i} {n.op_type}.{a.name} -> {_attr_str(a)}"
    if len(attrs) and r < 0.6:
        j = int(rng.integers(len(attrs)))
        name = attrs[j].name
        del attrs[j]
        return f"attr {s.where} node {i} {n.op_type}: delete {name!r}"
    if len(attrs) and r < 0.7:
        j = int(rng.integers(len(attrs)))
        attrs.add().CopyFrom(attrs[j])
        return f"attr {s.where} node {i} {n.op_type}: duplicate {attrs[j].name!r}"
    if r < 0.8:
        a = attrs.add()
        a.name = pick(rng, ATTR_NAMES)
        a.ref_attr_name = "fuzz_ref"  # a reference outside any function
        a.type = onnx_helpers()[0].AttributeProto.INT
        return f"attr {s.where} node {i} {n.op_type}: {a.name!r} refers to a missing attribute"
    a = _random_attr(pick(rng, ATTR_NAMES), rng)
    attrs.add().CopyFrom(a)
    return f"attr {s.where} node {i} {n.op_type}: add {_attr_str(a)}"


def _attr_str(a: Any) -> str:
    s = str(a).replace("\n", " ")
    return s if len(s) < 120 else s[:117] + "..."


def _typed_values(model: Any) -> list[tuple[str, Any]]:
    out = []
    for s in scopes_of(model):
        if s.is_function:
            continue
        for kind in ("input", "output", "value_info"):
            for v in getattr(s.proto, kind):
                out.append((f"{s.where} {kind} {v.name!r}", v))
    return out


def m_type(model: Any, rng: np.random.Generator) -> str | None:
    vals = _typed_values(model)
    if not vals:
        return None
    where, v = pick(rng, vals)
    tt = v.type.tensor_type
    r = rng.random()
    if r < 0.3:
        old = tt.elem_type
        tt.elem_type = int(pick(rng, ELEM_TYPES))
        return f"type {where}: elem_type {old} -> {tt.elem_type}"
    if r < 0.4:
        v.ClearField("type")
        return f"type {where}: type removed"
    if r < 0.5:
        v.type.sequence_type.elem_type.tensor_type.elem_type = 1
        return f"type {where}: a sequence type"
    dims = tt.shape.dim
    if r < 0.6 or not len(dims):
        n = int(rng.integers(0, 7))
        tt.shape.ClearField("dim")
        for _ in range(n):
            tt.shape.dim.add().dim_value = int(rng.integers(1, 5))
        return f"type {where}: rank -> {n}"
    if r < 0.65:
        tt.ClearField("shape")
        return f"type {where}: shape removed"
    k = int(rng.integers(len(dims)))
    if rng.random() < 0.2:
        dims[k].dim_param = pick(rng, ("N", "", "x y"))
        return f"type {where}: dim {k} -> param {dims[k].dim_param!r}"
    dims[k].dim_value = int(pick(rng, DIM_SPECIALS))
    return f"type {where}: dim {k} -> {dims[k].dim_value}"


def m_add_value_info(model: Any, rng: np.random.Generator) -> str | None:
    s = pick(rng, [s for s in scopes_of(model) if not s.is_function])
    vals = [n for n in s.values() if n]
    if not vals:
        return None
    name = pick(rng, vals)
    v = s.proto.value_info.add()
    v.name = name
    v.type.tensor_type.elem_type = int(pick(rng, ELEM_TYPES))
    for _ in range(int(rng.integers(0, 4))):
        v.type.tensor_type.shape.dim.add().dim_value = int(pick(rng, DIM_SPECIALS))
    return f"value_info {s.where}: {name!r} declared {_attr_str(v.type)}"


def m_opset(model: Any, rng: np.random.Generator) -> str | None:
    imports = model.opset_import
    r = rng.random()
    if r < 0.15:
        model.ir_version = int(pick(rng, (0, 1, 3, 4, 7, 11, 100, -1)))
        return f"opset: ir_version -> {model.ir_version}"
    if r < 0.3 and len(imports):
        j = int(rng.integers(len(imports)))
        d = imports[j].domain
        del imports[j]
        return f"opset: import of domain {d!r} removed"
    if r < 0.45:
        imp = imports.add()
        imp.domain = pick(rng, DOMAINS + ("",))
        imp.version = int(pick(rng, (1, 13, 1000, 0)))
        return f"opset: import {imp.domain!r} v{imp.version} added"
    if r < 0.7 and len(imports):
        j = int(rng.integers(len(imports)))
        imports[j].version = int(pick(rng, (0, 1, 6, 7, 9, 10, 11, 12, 17, 21, 24, 1000, -1,
                                            1 << 40)))  # fmt: skip
        return f"opset: domain {imports[j].domain!r} -> v{imports[j].version}"
    got = node_scope(model, rng)
    if got is None:
        return None
    s, i = got
    s.nodes[i].domain = pick(rng, DOMAINS)
    return f"opset: {s.where} node {i} {s.nodes[i].op_type} domain -> {s.nodes[i].domain!r}"


def m_initializer(model: Any, rng: np.random.Generator) -> str | None:
    import onnx

    graphs = [s for s in scopes_of(model) if not s.is_function and len(s.proto.initializer)]
    if not graphs:
        return None
    s = pick(rng, graphs)
    j = int(rng.integers(len(s.proto.initializer)))
    t = s.proto.initializer[j]
    where = f"{s.where} initializer {t.name!r}"
    r = rng.random()
    if r < 0.15:
        if t.raw_data:
            t.raw_data = t.raw_data[: len(t.raw_data) // 2] if rng.random() < 0.7 else (
                t.raw_data + b"\x01\x02\x03"
            )
            return f"init {where}: raw_data length -> {len(t.raw_data)}"
        t.float_data.append(1.0)
        t.int64_data.append(1)
        return f"init {where}: typed data one element too long"
    if r < 0.3:
        del t.dims[:]
        t.dims.extend(int(pick(rng, DIM_SPECIALS)) for _ in range(int(rng.integers(0, 4))))
        return f"init {where}: dims -> {list(t.dims)}"
    if r < 0.4:
        old = t.data_type
        t.data_type = int(pick(rng, ELEM_TYPES))
        return f"init {where}: data_type {old} -> {t.data_type}"
    if r < 0.55:
        t.ClearField("raw_data")
        t.ClearField("float_data")
        t.ClearField("int64_data")
        t.ClearField("int32_data")
        t.ClearField("double_data")
        t.data_location = onnx.TensorProto.EXTERNAL
        loc = pick(rng, ("missing.bin", "/etc/hostname", "/dev/zero", "../../etc/passwd", "",
                          "/proc/self/mem", "sub/../../x.bin", "a\x00b"))  # fmt: skip
        e = t.external_data.add()
        e.key, e.value = "location", loc
        if rng.random() < 0.5:
            e = t.external_data.add()
            e.key, e.value = "offset", str(pick(rng, (0, -1, 1 << 40, 7)))
            e = t.external_data.add()
            e.key, e.value = "length", str(pick(rng, (0, 4, -4, 1 << 50)))
        return f"init {where}: external data at {loc!r}"
    if r < 0.65:
        del s.proto.initializer[j]
        return f"init {where}: dropped"
    if r < 0.75:
        d = s.proto.initializer.add()
        d.CopyFrom(t)
        d.dims.append(1)
        return f"init {where}: duplicated with another shape"
    if r < 0.85:
        vals = [n for n in s.values() if n and n != t.name]
        if not vals:
            return None
        old, t.name = t.name, pick(rng, vals)
        return f"init {where}: renamed to the value {t.name!r}"
    if r < 0.92:
        t.data_type = onnx.TensorProto.STRING
        t.ClearField("raw_data")
        t.string_data.extend([b"a", b"\xff"])
        return f"init {where}: string data"
    t.segment.begin, t.segment.end = 5, 1
    return f"init {where}: segment 5..1"


class _Odd:
    """A feed value no runtime knows."""

    def __repr__(self) -> str:
        return "<odd object>"


def mutate_feeds(feeds: dict[str, Any], rng: np.random.Generator) -> tuple[dict, str]:
    feeds = dict(feeds)
    if not feeds or rng.random() < 0.08:
        feeds[pick(rng, ("", "xx", "x"))] = np.zeros(2, np.float32)
        return feeds, "feeds: extra feed"
    name = pick(rng, sorted(feeds))
    v = feeds[name]
    arr = np.asarray(v) if isinstance(v, np.ndarray) else None
    kind = int(rng.integers(13))
    if kind == 0:
        del feeds[name]
        return feeds, f"feeds: {name!r} missing"
    if arr is None or arr.dtype == object:
        kind = int(pick(rng, (5, 6, 7)))
    if kind == 1:
        dt = pick(rng, (np.float16, np.float32, np.float64, np.int8, np.int32, np.int64,
                         np.uint8, np.bool_, np.complex64, object, np.str_))  # fmt: skip
        feeds[name] = arr.astype(dt)
        return feeds, f"feeds: {name!r} as {np.dtype(dt)}"
    if kind == 2:
        shape = list(arr.shape)
        r = rng.random()
        if r < 0.3 or not shape:
            shape.append(int(rng.integers(1, 3)))
        elif r < 0.5:
            shape.pop()
        else:
            shape[int(rng.integers(len(shape)))] = int(pick(rng, (0, 1, 3, 17)))
        feeds[name] = np.resize(arr, shape)
        return feeds, f"feeds: {name!r} shape -> {shape}"
    if kind == 3 and arr.dtype.kind in "fc":
        fill = float(pick(rng, (np.nan, np.inf, -np.inf, 3e38, -3e38, 1e-45)))
        out = arr.copy()
        out.flat[:: max(1, out.size // 3)] = fill
        feeds[name] = out
        return feeds, f"feeds: {name!r} with {fill}"
    if kind == 3 or kind == 4:
        if arr.dtype.kind in "iu":
            info = np.iinfo(arr.dtype)
            fill = int(pick(rng, (info.max, info.min, -1, 1 << 20)))
            out = arr.copy()
            out.flat[:: max(1, out.size // 2)] = np.array(fill).astype(arr.dtype)
            feeds[name] = out
            return feeds, f"feeds: {name!r} with {fill}"
        feeds[name] = np.zeros((0,) * max(arr.ndim, 1), arr.dtype)
        return feeds, f"feeds: {name!r} empty"
    if kind == 5:
        feeds[name] = [[1.0, 2.0], [3.0]]
        return feeds, f"feeds: {name!r} ragged list"
    if kind == 6:
        feeds[name] = pick(rng, (None, "abc", 3.5, _Odd(), {"a": 1}, [np.zeros(2)], b"\x00"))
        return feeds, f"feeds: {name!r} -> {feeds[name]!r}"
    if kind == 7:
        feeds[name] = v.tolist() if isinstance(v, np.ndarray) else [v]
        return feeds, f"feeds: {name!r} as a Python list"
    if kind == 8:
        big = np.empty(arr.shape[::-1] + (2,), arr.dtype)
        view = big[..., 0].T  # non-contiguous
        view[...] = arr
        feeds[name] = view
        return feeds, f"feeds: {name!r} non-contiguous"
    if kind == 9:
        ro = arr.copy()
        ro.setflags(write=False)
        feeds[name] = ro
        return feeds, f"feeds: {name!r} read-only"
    if kind == 10 and arr.size:
        shape = (1 << 20,) + arr.shape[1:] if arr.ndim else (1 << 20,)
        feeds[name] = np.broadcast_to(arr.reshape(-1)[:1].reshape((1,) * len(shape)), shape)
        return feeds, f"feeds: {name!r} broadcast view {shape}"
    if kind == 11:
        feeds[name] = np.asarray(arr.reshape(-1)[:1].reshape(())) if arr.size else arr
        return feeds, f"feeds: {name!r} 0-d"
    feeds[name] = arr.astype(arr.dtype.newbyteorder(">")) if arr.dtype.itemsize > 1 else arr
    return feeds, f"feeds: {name!r} big-endian"

