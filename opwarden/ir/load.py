"""Load an ONNX model (path, bytes or ModelProto) into the IR, with facts from shape inference.

Here: reading the source (a file is memory-mapped, weights read in place where the wire format
allows), version checks, and `GraphBuilder`, which turns each GraphProto into a `Graph` of
nodes and values (initializers and external data confined to the model's folder, attributes
read, subgraphs built with their outer scope). Beside it: the facts from shape inference and
their checks against the declarations (infer.py), model-local function inlining and its limits
(functions.py), file order made topological (toposort.py).
"""

from __future__ import annotations

import functools
import mmap
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from opwarden.contract import TensorFact
from opwarden.dtypes import dtype_name
from opwarden.errors import ModelError
from opwarden.ir.build import NodeBuilder, type_fact, wire_outputs
from opwarden.ir.dynamic_dims import negative_dims_dynamic
from opwarden.ir.functions import MAX_INLINED_NODES, check_inlined_size, expand_functions
from opwarden.ir.graph import Graph, Model, Node
from opwarden.ir.infer import Inferred, check_dims, custom_infer, infer, pool_ceil_facts
from opwarden.ir.tensors import payload_array, to_array
from opwarden.ir.toposort import toposort
from opwarden.ir.wire import Payload, split_payloads
from opwarden.ops.schema import attr_value, canonical_domain


@dataclass
class Source:
    """A parsed model and where its bytes came from."""

    proto: onnx.ModelProto
    base_dir: str | None = None
    owned: bool = False  # the loader parsed the protobuf itself (raw bytes may be moved out)
    buffer: Any = None  # the serialized model (mmap or bytes) that `payloads` point into
    payloads: dict[str, Payload] = field(default_factory=dict)


def _read_buffer(source: Any) -> tuple[Any, str | None]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return (source if isinstance(source, bytes) else bytes(source)), None
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise ModelError(f"model file not found: {path!r}")
        if os.path.isdir(path):
            raise ModelError(f"model path is a directory, not a file: {path!r}")
        base_dir = os.path.dirname(os.path.abspath(path))
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return b"", base_dir
            # Weights become views over this read-only mapping: pages are shared with the page
            # cache and only what the run touches becomes resident.
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), base_dir
    raise ModelError(
        f"cannot load a model from {type(source).__name__}; "
        "expected a path, bytes or onnx.ModelProto"
    )


def read_source(source: Any) -> Source:
    """Parse a path, bytes or ModelProto, leaving large weight payloads in the source buffer."""
    if isinstance(source, Source):  # read already (the session edits free dims before load)
        return source
    if isinstance(source, onnx.ModelProto):
        return Source(source)
    buf, base_dir = _read_buffer(source)
    payloads: dict[str, Payload] = {}
    data: Any = buf
    try:
        split = split_payloads(buf)
    except ModelError:
        split = None  # let the protobuf parser give its own diagnosis
    if split is not None:
        data, payloads = split
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data if isinstance(data, bytes) else bytes(data))
    except (DecodeError, ValueError, RuntimeError) as e:
        raise ModelError(f"not a valid ONNX model (protobuf parse failed: {e})") from None
    if not proto.HasField("graph"):
        raise ModelError("not a valid ONNX model: it has no graph (empty, truncated or not ONNX)")
    if proto.ir_version <= 0:
        raise ModelError(f"not a valid ONNX model: ir_version is {proto.ir_version}")
    return Source(proto, base_dir, True, buf if payloads else None, payloads)


class GraphBuilder(NodeBuilder):
    """Builds a model's graphs from their protos, with the loader's defences (external data
    confined to the model's folder, UTF-8 names, inference's corrected shapes)."""

    def __init__(
        self, opsets: dict[str, int], functions, base_dir, owned, inferred: Inferred | dict,
        source=None
    ) -> None:
        if not isinstance(inferred, Inferred):  # types alone
            inferred = Inferred(inferred)
        self.opsets = opsets
        self.functions = functions
        self.base_dir = base_dir
        self.owned = owned
        self.types = inferred.types
        self.hints = inferred.hints
        self.notes = list(inferred.notes)
        self.source = source
        self.names: set[str] = set()
        self.budget = [MAX_INLINED_NODES]

    def _tensor_reader(self, held: str):
        """A tensor attribute's converter: external data from the model's folder only (onnx's
        own reader would resolve it against the current directory), the rest as before."""
        def read(t: onnx.TensorProto):
            if t.data_location == onnx.TensorProto.EXTERNAL:
                return to_array(t, self.base_dir, where=f"{held}, tensor {t.name!r}")
            return numpy_helper.to_array(t)
        return read

    def graph(self, gp: onnx.GraphProto, outer: Graph | None) -> Graph:
        g = Graph(gp.name or "graph", outer=outer)
        payloads = self.source.payloads if self.source is not None and outer is None else {}
        where = "" if outer is None else f" of graph {g.name!r}"
        for t in gp.initializer:
            pl = payloads.get(t.name)
            if pl is not None:
                arr = payload_array(t, self.source.buffer, pl)
            else:
                arr = to_array(t, self.base_dir, self.owned, f"initializer {t.name!r}{where}")
            g.add_value(t.name, const=arr, fact=TensorFact(dtype_name(arr.dtype), arr.shape))
        for st in gp.sparse_initializer:
            arr = _sparse_to_dense(st, self.base_dir,
                                   f"sparse initializer {st.values.name!r}{where}")
            g.add_value(
                st.values.name, const=arr, fact=TensorFact(dtype_name(arr.dtype), arr.shape)
            )
        for vi in gp.input:
            if vi.name in g.values:
                g.initializers[vi.name] = g.values[vi.name]
                g.inputs.append(g.values[vi.name])
                continue
            kind, fact = type_fact(vi.type)
            tp = None
            if kind != "tensor":  # a copy: a submessage would keep the whole model alive
                tp = onnx.TypeProto()
                tp.CopyFrom(vi.type)
            g.inputs.append(g.add_value(vi.name, kind=kind, fact=fact, type_proto=tp))
        for name, v in g.values.items():
            if v.const is not None:
                g.initializers[name] = v
        # The main graph's declared value_info was checked against inference (self.types,
        # self.hints); a subgraph's is read as declared, its dims declared-only.
        local_types = {vi.name: vi.type for vi in gp.value_info} if outer is not None else {}
        protos = expand_functions(list(gp.node), self.functions, budget=self.budget)
        avail = set(g.values)
        corrected: set[int] = set()
        for i, n in enumerate(toposort(protos, avail, g.name)):
            g.nodes.append(self.node(n, g, i, local_types))
            pool_ceil_facts(g.nodes[-1], corrected)
            custom_infer(g.nodes[-1], self.notes)
            check_dims(g.nodes[-1])
        wire_outputs(g, gp)  # (the main graph's facts went through `infer`)
        return g

    def node(
        self, n: onnx.NodeProto, g: Graph, index: int,
        local_types: dict[str, onnx.TypeProto] | None = None, reuse: bool = False,
    ) -> Node:
        for field_ in (n.op_type, n.domain, n.name, *n.input, *n.output):
            if not isinstance(field_, str):
                raise ModelError(
                    f"node {index} of graph {g.name!r} has a name or type that is not valid "
                    f"UTF-8: {field_!r}"
                )
        return super().node(n, g, index, local_types, reuse)

    def attribute(self, a: onnx.AttributeProto, held: str) -> Any:
        """Tensor payloads read confined to the model's folder, sparse ones embedded."""
        val = attr_value(a, self._tensor_reader(held))
        if a.type == onnx.AttributeProto.SPARSE_TENSOR:
            val = _sparse_embedded(val, self.base_dir, held)
        return val

    def fact(self, name: str) -> tuple[str, TensorFact]:
        kind, fact = super().fact(name)
        hint = self.hints.get(name)  # a declared-only shape where inference gave none
        return (kind, TensorFact(fact.dtype, hint)) if hint is not None else (kind, fact)


def _sparse_to_dense(st: onnx.SparseTensorProto, base_dir: str | None = None,
                     where: str = "sparse tensor"):
    import numpy as np

    vals = to_array(st.values, base_dir, where=f"{where} values")
    idx = to_array(st.indices, base_dir, where=f"{where} indices").astype(np.int64)
    dims = tuple(int(d) for d in st.dims)
    dense = np.zeros(int(np.prod(dims)), dtype=vals.dtype)
    if idx.ndim == 2:
        idx = np.ravel_multi_index(tuple(idx.T), dims)
    dense[idx] = vals
    return dense.reshape(dims)


def _sparse_embedded(sp: onnx.SparseTensorProto, base_dir: str | None, held: str):
    """A sparse tensor attribute with its external values/indices read (confined to the model's
    folder) into the message, so the kernel never resolves a location itself."""
    parts = [f for f in ("values", "indices")
             if getattr(sp, f).data_location == onnx.TensorProto.EXTERNAL]
    if not parts:
        return sp
    out = onnx.SparseTensorProto()
    out.CopyFrom(sp)
    for f in parts:
        t = getattr(sp, f)
        arr = to_array(t, base_dir, where=f"{held}, sparse {f} {t.name!r}")
        getattr(out, f).CopyFrom(numpy_helper.from_array(arr.copy(), t.name))
    return out


def load(source: Any) -> Model:
    """Parse and convert a model; raises ModelError (never another type) on malformed input."""
    src = read_source(source)
    restore = negative_dims_dynamic(src.proto)  # dim_value -1: dynamic, as in ORT
    try:
        model = _convert(src)
    except ModelError:
        raise
    except (RecursionError, MemoryError) as e:
        raise ModelError(f"model cannot be loaded: {type(e).__name__}") from None
    except Exception as e:  # noqa: BLE001 - corrupt protobufs surface as assorted errors
        raise ModelError(f"model cannot be loaded: {type(e).__name__}: {e}") from None
    finally:
        restore()
    for note in model.notes:
        # ONNX Runtime's "Error merging shape info ... Falling back to lenient merge"
        warnings.warn(f"opwarden: {note}", RuntimeWarning, stacklevel=2)
    return model


# Domains whose versions onnx defines: a model importing a later version than the installed
# onnx knows would otherwise run with the newest schemas onnx has, which may not mean the same.
_ONNX_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training",
                 "ai.onnx.preview")


@functools.cache
def known_opsets() -> dict[str, int]:
    """The highest opset version of each onnx-defined domain the installed onnx knows."""
    import onnx.defs

    known = {d: 1 for d in _ONNX_DOMAINS}
    for s in onnx.defs.get_all_schemas_with_history():
        d = canonical_domain(s.domain)
        if d in known:
            known[d] = max(known[d], s.since_version)
    known[""] = max(known[""], onnx.defs.onnx_opset_version())
    # (release, IR version, ai.onnx, ai.onnx.ml, ai.onnx.training) rows
    for row in onnx.helper.VERSION_TABLE:
        for d, v in zip(("", "ai.onnx.ml", "ai.onnx.training"), row[2:]):
            if v is not None:
                known[d] = max(known[d], int(v))
    return known


def _check_versions(proto: onnx.ModelProto, opsets: dict[str, int]) -> None:
    if proto.ir_version <= 0:  # (a parsed file was checked already; a ModelProto was not)
        raise ModelError(f"not a valid ONNX model: ir_version is {proto.ir_version}")
    if proto.ir_version > onnx.IR_VERSION:
        raise ModelError(
            f"model has IR version {proto.ir_version}; the installed onnx "
            f"{onnx.__version__} knows IR versions up to {onnx.IR_VERSION}"
        )
    known = known_opsets()
    for d, v in opsets.items():
        if d in known and v > known[d]:
            raise ModelError(
                f"model imports domain {d or 'ai.onnx'!r} at opset {v}, but the highest "
                f"version the installed onnx {onnx.__version__} defines is {known[d]}"
            )


def _convert(src: Source) -> Model:
    proto, base_dir, owned = src.proto, src.base_dir, src.owned
    opsets: dict[str, int] = {}
    for imp in proto.opset_import:
        opsets[canonical_domain(imp.domain)] = int(imp.version)
    if not proto.opset_import:
        opsets[""] = 1 if proto.ir_version < 3 else 0
    if opsets.get("", 1) <= 0:
        raise ModelError("model imports the default domain at opset 0 or below")
    _check_versions(proto, opsets)
    functions = {(f.domain, f.name): f for f in proto.functions}
    check_inlined_size(proto)
    from opwarden.ir.validate import sanity_before_inference  # what would crash onnx's inference

    sanity_before_inference(proto)
    inferred = infer(proto)
    builder = GraphBuilder(opsets, functions, base_dir, owned, inferred, src)
    graph = builder.graph(proto.graph, None)
    return Model(
        graph=graph,
        opsets=opsets,
        ir_version=int(proto.ir_version),
        producer=proto.producer_name,
        base_dir=base_dir,
        functions=functions,
        metadata={p.key: p.value for p in proto.metadata_props},
        buffer=src.buffer,
        notes=builder.notes,
        declared=inferred.declared,
    )
