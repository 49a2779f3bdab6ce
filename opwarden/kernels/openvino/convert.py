"""ONNX models for OpenVINO: one node (capability queries, single-node variants) or a region.

OpenVINO reads ONNX through its frontend; what it cannot convert fails `read_model` with the
frontend's report, and what its plugin cannot run is missing from `Core.query_model`. Both
answers become a refusal in plain words (`refusal`). Constant inputs go in as initializers
(OpenVINO folds shapes and packs weights from them); the others are parameters with the facts'
shapes (symbolic dims stay dynamic).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from opwarden.ir.export import attribute_proto, value_info
from opwarden.ir.graph import Node, Value

_IR_VERSION = 8  # the frontend reads every IR up to the one its onnx release writes
_CORE: list[Any] = []
_CORE_LOCK = threading.Lock()


def core() -> Any:
    """The process's one openvino.Core (plugins load once)."""
    with _CORE_LOCK:
        if not _CORE:
            import openvino as ov

            _CORE.append(ov.Core())
        return _CORE[0]


def node_proto(n: Node, rename: dict[str, str] | None = None) -> onnx.NodeProto:
    """The NodeProto of `n` (output names mapped through `rename`)."""
    rename = rename or {}
    p = helper.make_node(
        n.op_type,
        [v.name if v is not None else "" for v in n.inputs],
        [rename.get(v.name, v.name) if v is not None else "" for v in n.outputs],
        name=n.name,
        domain=n.domain,
    )
    types = getattr(n, "attr_types", {})
    p.attribute.extend(attribute_proto(k, a, types.get(k)) for k, a in n.attrs.items())
    return p


def graph_model(
    nodes: Sequence[Node], inputs: Iterable[Value], outputs: Iterable[Value],
    opsets: dict[str, int], poison: Iterable[str] = (), big: dict[str, Any] | None = None,
) -> bytes:
    """A serialized ONNX model of `nodes` reading `inputs` (constants become initializers) and
    yielding `outputs`. `poison`: names of nodes whose first output is replaced by NaN (fault
    injection: what a broken device kernel would produce). `big`: when given, large float
    constants (weights) go in as parameters instead, their arrays put into `big` by name, for
    `read` to turn into constants sharing their memory (no copy through ONNX bytes)."""
    protos, extra_inits = [], []
    bad = set(poison)
    for n in nodes:
        if n.name in bad and n.outputs and n.outputs[0] is not None:
            real = n.outputs[0].name
            protos.append(node_proto(n, {real: real + "__before_fault"}))
            nan = numpy_helper.from_array(np.array(np.nan, dtype=_np(n.outputs[0])),
                                          real + "__fault")
            extra_inits.append(nan)
            protos.append(helper.make_node("Add", [real + "__before_fault", nan.name], [real],
                                           name=n.name + "__fault"))
        else:
            protos.append(node_proto(n))
    params, inits, seen = [], [], set()
    for v in inputs:
        if v.name in seen:
            continue
        seen.add(v.name)
        if v.const is not None and big is not None and is_big(v.const):
            params.append(value_info(v))
            big[v.name] = v.const
        elif v.const is not None:
            inits.append(numpy_helper.from_array(np.ascontiguousarray(v.const), v.name))
        else:
            params.append(value_info(v))
    g = helper.make_graph(protos, "opwarden_region", params, [value_info(v) for v in outputs],
                          initializer=inits + extra_inits)
    ops = [helper.make_opsetid(d, ver) for d, ver in sorted(opsets.items())]
    m = helper.make_model(g, opset_imports=ops or [helper.make_opsetid("", 13)])
    m.ir_version = _IR_VERSION
    return m.SerializeToString()


_BIG = 1 << 12  # elements of a float constant passed by memory, not through ONNX bytes


def is_big(c: Any) -> bool:
    """A constant `read` passes by memory: a float array of at least `_BIG` elements (weights:
    shape-like inputs OpenVINO's frontend needs as constants are small integers)."""
    return c.size >= _BIG and np.asarray(c).dtype.kind == "f"


def _np(v: Value) -> Any:
    return np.dtype(v.fact.dtype) if v.fact.dtype not in (None, "bfloat16") else np.float32


def read(data: bytes, big: dict[str, Any] | None = None) -> Any:
    """openvino.Model from serialized ONNX; each parameter named in `big` replaced by a
    constant sharing the memory of its array (kept alive by the caller)."""
    model = core().read_model(data)
    if big:
        from openvino import op

        for p in list(model.get_parameters()):
            a = big.get(p.get_friendly_name())
            if a is None:
                continue
            c = op.Constant(shared(a)[0], shared_memory=True)
            c.set_friendly_name(p.get_friendly_name())
            c.output(0).set_names(p.output(0).get_names())
            for t in list(p.output(0).get_target_inputs()):
                t.replace_source_output(c.output(0))
            model.remove_parameter(p)
    return model


def frontend_reason(e: BaseException) -> str:
    """The line of an OpenVINO frontend/plugin error that says what failed."""
    text = str(e)
    for pat in (r"No conversion rule found for operations:[^\n]*",
                r"OpConversionFailure[^\n]*", r"Check '[^\n]*"):
        m = re.search(pat, text)
        if m:
            return m.group(0).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else type(e).__name__


def refusal(data: bytes, device: str = "CPU", big: dict[str, Any] | None = None) -> str | None:
    """None when OpenVINO reads the model (`big`: as `read`) and its `device` plugin runs
    every operation in it (Core.query_model), else OpenVINO's reason."""
    try:
        model = read(data, big)
    except Exception as e:  # noqa: BLE001 - the frontend's refusal is the answer
        return f"OpenVINO cannot convert it: {frontend_reason(e)}"
    try:
        supported = core().query_model(model, device)
    except Exception as e:  # noqa: BLE001
        return f"OpenVINO {device} query_model failed: {frontend_reason(e)}"
    missing = sorted({op.get_type_name() for op in model.get_ops()
                      if op.get_friendly_name() not in supported})
    if missing:
        return f"OpenVINO {device} plugin does not support {', '.join(missing)} (query_model)"
    want = len(onnx.load_from_string(data).graph.output)
    if len(model.outputs) < want:
        return f"OpenVINO yields {len(model.outputs)} of its {want} outputs"
    return None


def owners(model: Any, tensor_owner: dict[str, str]) -> dict[str, str]:
    """OpenVINO op friendly name -> the ONNX node it came from: the node whose output tensor it
    names, else (an op the frontend made on the way, a bias broadcast) its consumer's node."""
    out: dict[str, str] = {}
    for op in reversed(model.get_ordered_ops()):
        hit = None
        for o in op.outputs():
            hit = next((tensor_owner[t] for t in o.get_names() if t in tensor_owner), None)
            if hit is not None:
                break
        if hit is None:
            for o in op.outputs():
                for t in o.get_target_inputs():
                    hit = out.get(t.get_node().get_friendly_name())
                    if hit is not None:
                        break
                if hit is not None:
                    break
        if hit is not None:
            out[op.get_friendly_name()] = hit
    return out


def layer_owners(compiled: Any, op_owner: dict[str, str]) -> dict[str, tuple[str, ...]]:
    """Runtime layer name -> the ONNX nodes fused into it (from its originalLayersNames)."""
    out: dict[str, tuple[str, ...]] = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        names = str(info["originalLayersNames"].astype(str)) if "originalLayersNames" in info \
            else ""
        nodes = dict.fromkeys(op_owner[n] for n in names.split(",") if n in op_owner)
        out[op.get_friendly_name()] = tuple(nodes)
    return out


# -- many nodes asked at once ---------------------------------------------------------------


def bag(nodes: Sequence[Node], opsets: dict[str, int]
        ) -> tuple[bytes, dict[str, int], dict[str, Any]]:
    """One model holding each of `nodes` on inputs of its own, as `refusal` would see it asked
    alone: its non-constant inputs are parameters of its own (symbolic dims renamed per node,
    so no two nodes share one), constants initializers (shared), every output a graph output.
    Returns the serialized model, tensor name -> index of the node it belongs to, and the
    large constants for `read` to pass by memory."""
    protos, params, inits, results = [], [], [], []
    consts: dict[int, str] = {}
    big: dict[str, Any] = {}
    owner: dict[str, int] = {}
    for i, n in enumerate(nodes):
        mine: dict[int, str] = {}
        ins = []
        for v in n.inputs:
            if v is None:
                ins.append("")
            elif v.const is not None:
                if id(v) not in consts:
                    consts[id(v)] = f"c{len(consts)}"
                    if is_big(v.const):
                        params.append(_own_info(v, consts[id(v)], i))
                        big[consts[id(v)]] = v.const
                    else:
                        inits.append(numpy_helper.from_array(np.ascontiguousarray(v.const),
                                                             consts[id(v)]))
                ins.append(consts[id(v)])
            else:
                if id(v) not in mine:
                    mine[id(v)] = f"q{i}_in{len(mine)}"
                    params.append(_own_info(v, mine[id(v)], i))
                    owner[mine[id(v)]] = i
                ins.append(mine[id(v)])
        outs = []
        for j, v in enumerate(n.outputs):
            if v is None:
                outs.append("")
                continue
            outs.append(f"q{i}_out{j}")
            owner[outs[-1]] = i
            results.append(_own_info(v, outs[-1], i))
        p = node_proto(n)
        p.name = f"q{i}"
        del p.input[:], p.output[:]
        p.input.extend(ins)
        p.output.extend(outs)
        protos.append(p)
    g = helper.make_graph(protos, "opwarden_query", params, results, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v)
                                            for d, v in sorted(opsets.items())])
    m.ir_version = _IR_VERSION
    return m.SerializeToString(), owner, big


def _own_info(v: Value, name: str, i: int) -> onnx.ValueInfoProto:
    vi = value_info(v)
    vi.name = name
    if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param"):
                d.dim_param = f"q{i}_{d.dim_param}"
    return vi


_MIN_SPLIT = 4


def bag_answers(nodes: Sequence[Node], opsets: dict[str, int],
                device: str = "CPU") -> dict[int, str | None]:
    """`refusal`'s answer for each of `nodes` as if asked alone, from one read and one
    query_model on their `bag` (index -> answer). Nodes the frontend has no conversion rule
    for are left out and asked again without them; a model it fails to read or query
    otherwise is split in halves; a node no answer could be attributed to is missing from the
    result (the caller asks it alone)."""
    if not nodes:
        return {}
    data, owner, big = bag(nodes, opsets)
    try:
        model = read(data, big)
        supported = core().query_model(model, device)
    except Exception as e:  # noqa: BLE001 - narrow it down
        m = re.search(r"No conversion rule found for operations:([^\n]*)", str(e))
        types = {t.strip().rsplit(".", 1)[-1] for t in m.group(1).split(",")} if m else set()
        keep = [i for i, n in enumerate(nodes) if n.op_type not in types]
        if 0 < len(keep) < len(nodes):
            sub = bag_answers([nodes[i] for i in keep], opsets, device)
            return {keep[j]: a for j, a in sub.items()}
        if len(nodes) < _MIN_SPLIT:
            return {}
        h = len(nodes) // 2
        split = bag_answers(nodes[:h], opsets, device)
        split.update({h + j: a for j, a in bag_answers(nodes[h:], opsets, device).items()})
        return split
    op_owner = owners(model, {t: str(i) for t, i in owner.items()})
    missing: dict[int, set[str]] = {}
    for op in model.get_ops():
        if op.get_friendly_name() in supported:
            continue
        who = op_owner.get(op.get_friendly_name())
        if who is None:
            return {}  # an unsupported operation of no node in particular: ask each alone
        missing.setdefault(int(who), set()).add(op.get_type_name())
    made: dict[int, int] = {}
    for r in model.outputs:
        hit = {owner[t] for t in r.get_names() if t in owner}
        for i in hit:
            made[i] = made.get(i, 0) + 1
    out: dict[int, str | None] = {}
    for i, n in enumerate(nodes):
        want = sum(v is not None for v in n.outputs)
        if i in missing:
            out[i] = f"OpenVINO {device} plugin does not support " \
                     f"{', '.join(sorted(missing[i]))} (query_model)"
        elif made.get(i, 0) < want:
            out[i] = f"OpenVINO yields {made.get(i, 0)} of its {want} outputs"
        else:
            out[i] = None
    return out


def shared(x: Any) -> tuple[Any, Any]:
    """(x as an array OpenVINO may wrap without a copy: C-contiguous, writable, the array
    whose memory it uses, to keep alive meanwhile)."""
    if type(x) is np.ndarray and x.flags.c_contiguous and x.flags.writeable:
        return x, None
    a = np.ascontiguousarray(x)
    if not a.flags.writeable:
        v = a.view()
        try:
            v.flags.writeable = True
            return v, a
        except ValueError:  # read-only memory (frozen feeds): an alias OpenVINO only reads
            import ctypes

            buf = (ctypes.c_char * a.nbytes).from_address(a.ctypes.data) if a.nbytes else b""
            alias = np.frombuffer(buf, a.dtype).reshape(a.shape) if a.nbytes else a.copy()
            return alias, a
    return a, None
