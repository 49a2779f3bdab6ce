"""The openvino device: what it runs is OpenVINO's own answer, plus opwarden's contract checks.

`OpenVINODevice.accepts(node)` asks OpenVINO about the node as one-node ONNX model (frontend
conversion, then `Core.query_model` on the CPU plugin; answers cached per node signature), after
the checks opwarden needs to guard and fall back (an operator opwarden implements, so the CPU
path can rerun it; tensors; none of the deviations `opwarden check` measured, deviations.py;
no subgraphs). A refusal carries OpenVINO's reason. `make_region` builds the compiled region
(region.py) place/regions.py groups nodes into. Every standard operator also gets a single-node
compiled variant ("<op>.openvino", `when`: OpenVINO accepts the facts), so `opwarden check
--device openvino` validates OpenVINO's kernels against the reference and `opwarden ops
--device openvino` lists them.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np
import onnx
import openvino as ov
from onnx import helper, numpy_helper

from opwarden.contract import Contract, Declared, TensorFact
from opwarden.devices.base import Device, register_device
from opwarden.dtypes import onnx_type
from opwarden.errors import KernelError
from opwarden.ir.export import attribute_proto
from opwarden.ir.graph import Node, Value
from opwarden.kernels.openvino import convert as C
from opwarden.kernels.openvino import deviations as D
from opwarden.kernels.openvino import probe
from opwarden.kernels.openvino.region import (
    LRU_SIZE,
    PRECISIONS,
    Region,
    feed_order,
    ov_config,
)
from opwarden.ops.base import REGISTRY, OpDef
from opwarden.ops.custom import build_schema
from opwarden.ops.select import kernel_kwargs, select

DEVICE_NAME = "openvino"
REGION_OP, REGION_DOMAIN = "OpenVINORegion", "opwarden.openvino"
_MAX_EMBED = 64  # integer inputs this small are embedded as constants (shapes, axes, pads)
_MAX_ANSWERS = 1 << 14  # node signatures whose answer is kept


def _region_ref(*inputs: Any, region: Region | None = None) -> Any:
    """A region's reference: its nodes one by one on the host kernels."""
    assert region is not None
    return region.cpu(*inputs)


def _region_op() -> OpDef:
    sch = build_schema(REGION_OP, REGION_DOMAIN, 1, ["*inputs: T"], ["*outputs: T"],
                       {"T": sorted(D.DTYPES)}, None, _region_ref)
    opdef = OpDef(REGION_OP, REGION_DOMAIN, 1, _region_ref, Contract(), sch)
    opdef.kernel(DEVICE_NAME, name="openvino.region", specialize=lambda kw: kw["region"].run)(
        lambda *inputs, region=None: region.run(*inputs))
    return opdef


class OpenVINODevice(Device):
    """The OpenVINO runtime on its CPU plugin (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(
            DEVICE_NAME, kind="openvino", host_memory=True, preferred_layout="NCHW",
            description=f"OpenVINO {ov.get_version().split('-')[0]} on its CPU plugin; "
                        "compiled regions, f32 unless a precision is asked for",
            extra={"openvino_version": ov.get_version(),
                   "capabilities": list(C.core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")),
                   "default_precision": str(C.core().get_property("CPU",
                                                                  "INFERENCE_PRECISION_HINT"))},
        )
        self.region_opdef = _region_op()
        self._answers: OrderedDict[tuple, str | None] = OrderedDict()
        self._asked: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def accepts(self, node: Any, quarantine: Any = None) -> tuple[bool, str]:
        why = self._contract(node)
        if why is None:
            why = self._ask(node)
        if why is None and quarantine is not None and f"{node.op_type}.openvino" in quarantine:
            why = f"{node.op_type}.openvino quarantined as unstable"
        return (why is None), (why or "")

    def capabilities(self) -> list[dict[str, Any]]:
        """The operator versions OpenVINO accepts (probe.py: OpenVINO asked once per version,
        cached), each with its single-node variant and the deviations that keep nodes off."""
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for o in REGISTRY.all():
            var = next((v for v in o.variants if v.device == self.name), None)
            if var is None or probe.op_refusal(o) is not None:
                continue
            cons = [{"description": "OpenVINO's own answer on the node's facts "
                                    "(Core.query_model)"}]
            nan = D.nan_note(o.op_type)
            if nan:
                cons.append({"description": nan + "; the single-node variant is declared "
                                                  "unsupported, regions run it and say so"})
            row = rows.setdefault((o.domain, o.op_type), {
                "op": o.op_type, "domain": o.domain or "ai.onnx", "variants": []})
            row["variants"].append({"name": var.name, "since": o.since,
                                    "dtypes": sorted(D.DTYPES), "layouts": ["NCHW"],
                                    "constraints": cons})
        return list(rows.values())

    def note(self, node: Node) -> str | None:
        """explain's note on a node in a region whose OpenVINO kernel departs from its
        contract (deviations.NAN_LOST), or None."""
        return D.nan_note(node.op_type, node.opset)

    def layouts_for(self, node: Any, quarantine: Any = None) -> tuple[str, ...]:
        return ("NCHW",)

    def _contract(self, node: Any) -> str | None:
        """What opwarden itself needs of a node it hands to OpenVINO, or None."""
        if node.opdef is None:
            return f"opwarden has no CPU kernel for {node.op_type} to fall back to"
        if node.subgraphs():
            return f"{node.op_type} has subgraphs; they run on the host"
        for v in list(node.inputs) + list(node.outputs):
            if v is None:
                continue
            if v.kind != "tensor":
                return f"value {v.name!r} is a {v.kind}: openvino takes tensors"
            if v.fact.shape is None:
                return f"value {v.name!r} has no known rank; openvino needs one"
        return D.node_refusal(node)

    def _ask(self, node: Node) -> str | None:
        """OpenVINO's answer on `node`: cached per signature (across sessions); on a miss,
        every node of its graph not answered yet is put to OpenVINO at once (`_ask_graph`),
        and only what that cannot answer is asked alone."""
        key = _signature(node)
        hit, answer = self._cached(key)
        if hit:
            return answer
        g = node.graph
        if g is not None and self._asked.get(id(g)) is not g:
            self._asked[id(g)] = g
            self._ask_graph(g)
            hit, answer = self._cached(key)
            if hit:
                return answer
        outs = [v for v in node.outputs if v is not None]
        ins = [v for v in node.inputs if v is not None]
        opsets = {"": node.opset} if node.domain in ("", "ai.onnx") else {node.domain: node.opset}
        big: dict[str, Any] = {}
        answer = C.refusal(C.graph_model([node], ins, outs, opsets, big=big), big=big)
        self._store({key: answer})
        return answer

    def _cached(self, key: tuple) -> tuple[bool, str | None]:
        with self._lock:
            if key in self._answers:
                self._answers.move_to_end(key)
                return True, self._answers[key]
        return False, None

    def _store(self, answers: dict[tuple, str | None]) -> None:
        with self._lock:
            self._answers.update(answers)
            while len(self._answers) > _MAX_ANSWERS:
                self._answers.popitem(last=False)

    def _ask_graph(self, graph: Any) -> None:
        """Answer every node of `graph` that passes the contract checks and whose signature
        is not cached: one node per signature, each on inputs of its own (what asking it alone
        would see), all in one model, one read and one query_model (convert.bag_answers)."""
        todo: dict[tuple, Node] = {}
        for n in graph.nodes:
            if self._contract(n) is not None:
                continue
            k = _signature(n)
            if k not in todo and not self._cached(k)[0]:
                todo[k] = n
        batches: list[tuple[dict[str, int], list[tuple]]] = []
        for k, n in todo.items():  # one opset per domain in a model
            dom = "" if n.domain in ("", "ai.onnx") else n.domain
            for opsets, keys in batches:
                if opsets.get(dom, n.opset) == n.opset:
                    opsets[dom] = n.opset
                    keys.append(k)
                    break
            else:
                batches.append(({dom: n.opset}, [k]))
        for opsets, keys in batches:
            got = C.bag_answers([todo[k] for k in keys], opsets)
            self._store({keys[i]: a for i, a in got.items()})

    def make_region(self, name: str, nodes: list[Node], inputs: list[Value],
                    outputs: list[Value], opsets: dict[str, int], options: Any,
                    quarantine: Any) -> Region:
        """The compiled region of `nodes` (boundary values given), for a session's options."""
        precision = getattr(options, "precision", "f32") or "f32"
        if precision not in PRECISIONS:
            from opwarden.errors import OptionsError

            raise OptionsError(
                f"openvino: precision {precision!r} is not one its CPU plugin computes in; it "
                f"takes {', '.join(PRECISIONS)} (int8 runs only in a quantized, QDQ model)")
        asked = precision
        precision, unavailable = self.effective_precision(precision)
        host = []
        for n in nodes:
            var, _ = select(n, "cpu", "NCHW", quarantine)
            var = var or next(v for v in n.opdef.variants if v.reference)
            kw = kernel_kwargs(n)
            fn = var.fn if var.specialize is None else var.specialize(dict(kw))
            host.append((fn, {} if var.specialize is not None else kw))
        region = Region(name, nodes, inputs, outputs, opsets, precision,
                        int(getattr(options, "intra_op_num_threads", 0) or 0),
                        bool(getattr(options, "trace", False)
                             or getattr(options, "enable_profiling", False)), host)
        if unavailable:
            region.precision_note = unavailable
            import warnings

            from opwarden.errors import PrecisionWarning

            warnings.warn(f"openvino region {name}: precision {asked} asked for; {unavailable}",
                          PrecisionWarning, stacklevel=2)
        return region

    def effective_precision(self, precision: str) -> tuple[str, str | None]:
        """(the precision a region computes in, why it is not the one asked for): OpenVINO's
        CPU plugin given a bf16/f16 hint on a CPU without that capability computes in f32
        without saying so; opwarden says so."""
        need = {"bf16": "BF16", "f16": "FP16"}.get(precision)
        caps = self.extra.get("capabilities", [])
        if need is None or need in caps:
            return precision, None
        return "f32", (f"this CPU's OpenVINO plugin has no {need} capability "
                       f"(OPTIMIZATION_CAPABILITIES: {', '.join(caps)}), so it computes in f32")


def _signature(node: Node) -> tuple:
    """What OpenVINO's answer about a node depends on: operator, attributes, input and output
    facts (symbolic dims by their pattern within the node, not their names: each layer of an
    encoder names its own), small constants' values."""
    syms: dict[Any, int] = {}

    def dims(shape: Any) -> Any:
        if shape is None:
            return None
        out: list[Any] = []
        for d in shape:
            v = d.value if isinstance(d, Declared) else d  # written as declared
            if type(v) is int:
                out.append(v)
            elif type(v) is str:
                out.append(("s", syms.setdefault(v, len(syms))))
            else:  # unknown: tied to nothing
                out.append(("?", len(out)))
        return tuple(out)

    ins: list[Any] = []
    for v in node.inputs:
        if v is None:
            ins.append(None)
            continue
        c = v.const
        val = c.tobytes() if c is not None and c.size <= _MAX_EMBED else (c is not None)
        ins.append((v.fact.dtype, dims(v.fact.shape), val))
    outs = tuple((v.fact.dtype, dims(v.fact.shape)) for v in node.outputs if v is not None)
    return (node.op_type, node.domain, node.opset, _attr_key(node.attrs), tuple(ins), outs)


# -- single-node compiled variants ----------------------------------------------------------


def _embedded(i: int, a: Any) -> bool:
    """Whether input `i` goes into a one-node model as a constant: a small integer parameter
    (shape, axes, pads), never the data input, which OpenVINO would fold to another shape."""
    return i > 0 and a.dtype.kind in "iub" and a.size <= _MAX_EMBED


class _OneNode:
    """The kernel of one operator run as a one-node OpenVINO model, compiled per call
    signature (attributes, input shapes and dtypes, small integer inputs) in an LRU."""

    def __init__(self, opdef: OpDef) -> None:
        self.opdef = opdef
        self.cache: OrderedDict[tuple, Any] = OrderedDict()
        self.lock = threading.Lock()

    def model(self, args: list[Any], attrs: dict[str, Any], noutputs: int) -> bytes:
        params, inits, names = [], [], []
        for i, a in enumerate(args):
            if a is None:
                names.append("")
                continue
            a = np.asarray(a)
            names.append(f"x{i}")
            if _embedded(i, a):
                inits.append(numpy_helper.from_array(np.ascontiguousarray(a), f"x{i}"))
            else:
                params.append(helper.make_tensor_value_info(f"x{i}", onnx_type(a.dtype),
                                                            list(a.shape)))
        outs = [f"y{k}" for k in range(noutputs)]
        p = helper.make_node(self.opdef.op_type, names, outs, name="n")
        p.attribute.extend(attribute_proto(k, v) for k, v in attrs.items() if v is not None)
        g = helper.make_graph([p], "one", params,
                              [onnx.ValueInfoProto(name=o) for o in outs], initializer=inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", max(self.opdef.since, 7))])
        m.ir_version = 8
        return m.SerializeToString()

    def compiled(self, args: list[Any], attrs: dict[str, Any], noutputs: int,
                 or_one: bool) -> Any:
        """The compiled model for this call signature (LRU); `or_one`: when OpenVINO cannot
        convert the node with `noutputs` outputs, the node with its first output only."""
        arrs = [None if a is None else np.asarray(a) for a in args]
        key = (repr(sorted(attrs.items())), noutputs, tuple(
            None if a is None else (a.dtype.str, a.shape, a.tobytes() if _embedded(i, a)
                                    else None) for i, a in enumerate(arrs)))
        with self.lock:
            hit = self.cache.get(key)
        if hit is not None:
            return hit
        try:
            hit = C.core().compile_model(C.read(self.model(args, attrs, noutputs)), "CPU",
                                         ov_config("f32", 0, False))
        except Exception:
            if not or_one or noutputs == 1:
                raise
            hit = C.core().compile_model(C.read(self.model(args, attrs, 1)), "CPU",
                                         ov_config("f32", 0, False))
        with self.lock:
            self.cache[key] = hit
            while len(self.cache) > LRU_SIZE * 8:
                self.cache.popitem(last=False)
        return hit

    def __call__(self, *args: Any, noutputs: int = 1, or_one: bool = False,
                 **attrs: Any) -> Any:
        attrs = {k: v for k, v in attrs.items() if k not in ("out", "workspace")}
        compiled = self.compiled(list(args), attrs, noutputs, or_one)
        by_name = {f"x{i}": a for i, a in enumerate(np.asarray(x) if x is not None else None
                                                    for x in args)
                   if a is not None and not _embedded(i, a)}
        # by name: OpenVINO drops a parameter the operator ignores (Dropout's ratio at
        # inference), which shifts the positions of the others
        names = list(by_name)
        feeds = [C.shared(by_name[names[k]])[0] for k in feed_order(compiled.inputs, names)]
        if len(compiled.outputs) < (1 if or_one else noutputs):
            raise KernelError(f"OpenVINO's {self.opdef.op_type} yields {len(compiled.outputs)}"
                              f" of the {noutputs} outputs asked for")
        res = compiled.create_infer_request().infer(feeds, share_inputs=True)
        outs = tuple(res[o] for o in compiled.outputs)
        return outs if len(outs) > 1 else outs[0]


def _attr_key(attrs: dict[str, Any]) -> tuple:
    return tuple((k, (a.dtype.str, a.shape, a.tobytes()) if isinstance(a, np.ndarray)
                  else repr(a)) for k, a in sorted(attrs.items(), key=lambda t: t[0]))


def _when(opdef: OpDef, noutputs: int = 1, or_one: bool = False):
    answers: OrderedDict[tuple, bool] = OrderedDict()  # what OpenVINO said, per facts

    def when(*facts: TensorFact, **attrs: Any) -> bool:
        if D.variant_refusal(opdef.op_type, [f.dtype for f in facts],
                             [f.shape for f in facts], attrs, opdef.since,
                             bool(opdef.contract.must_alias)) is not None:
            return False
        key = (tuple((f.dtype, None if f.shape is None else tuple(
            d if isinstance(d, int) else None for d in f.shape)) for f in facts),
            _attr_key(attrs))
        hit = answers.get(key)
        if hit is None:
            hit = answers[key] = asks(facts, attrs)
            while len(answers) > 1024:
                answers.popitem(last=False)
        return hit

    def asks(facts: tuple[TensorFact, ...], attrs: dict[str, Any]) -> bool:
        ins = [f"x{i}" for i in range(len(facts))]
        params = [helper.make_tensor_value_info(
            n, onnx_type(np.dtype(f.dtype or "float32")),
            None if f.shape is None else [d if isinstance(d, int) else None for d in f.shape])
            for n, f in zip(ins, facts)]
        for n in (noutputs, 1) if or_one and noutputs > 1 else (noutputs,):
            outs = [f"y{k}" for k in range(n)]
            p = helper.make_node(opdef.op_type, ins, outs, name="n")
            p.attribute.extend(attribute_proto(k, v) for k, v in attrs.items() if v is not None)
            g = helper.make_graph([p], "q", params, [onnx.ValueInfoProto(name=o) for o in outs])
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", max(opdef.since, 7))])
            m.ir_version = 8
            if C.refusal(m.SerializeToString()) is None:
                return True
        return False
    return when


def _one_node(opdef: OpDef) -> tuple[Any, Any]:
    """(the single-node variant's kernel, its `when`)."""
    import inspect

    runner = _OneNode(opdef)
    if "noutputs" in inspect.signature(opdef.reference).parameters:
        def one_node_openvino(*args: Any, noutputs: int = 1, **attrs: Any) -> Any:
            """The operator as a one-node OpenVINO model (compiled per call signature)."""
            return runner(*args, noutputs=noutputs, **attrs)
        return one_node_openvino, _when(opdef)
    # A reference not told how many outputs yields what its attributes make (LayerNorm: all
    # three; BatchNormalization: one unless training): all the schema's outputs where OpenVINO
    # converts the node with them, else the first.
    n = max(1, min(opdef.schema_for(opdef.since).max_outputs, 16))

    def one_node_openvino_all(*args: Any, **attrs: Any) -> Any:
        """The operator as a one-node OpenVINO model yielding the outputs it converts with."""
        return runner(*args, noutputs=n, or_one=True, **attrs)
    return one_node_openvino_all, _when(opdef, n, True)


def _register_variants() -> None:
    for o in REGISTRY.all():
        if o.domain not in ("", "ai.onnx") or any(v.device == DEVICE_NAME for v in o.variants):
            continue
        # dtypes: what crosses into OpenVINO as ONNX computes it (no float64, so gradcheck
        # holds the operator's rule to the reference, as for any variant without it)
        fn, when = _one_node(o)
        o.kernel(DEVICE_NAME, name=f"{o.op_type}.openvino", when=when,
                 dtypes=sorted(D.DTYPES))(fn)


def register() -> OpenVINODevice:
    """Add the openvino device and its single-node variants (idempotent)."""
    from opwarden.devices.base import has_device

    if has_device(DEVICE_NAME):
        from opwarden.devices.base import get_device

        return get_device(DEVICE_NAME)  # type: ignore[return-value]
    dev = register_device(OpenVINODevice())
    _register_variants()
    return dev  # type: ignore[return-value]


register()
