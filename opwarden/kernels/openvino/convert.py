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
    opsets: dict[str, int], poison: Iterable[str] = (),
) -> bytes:
    """A serialized ONNX model of `nodes` reading `inputs` (constants become initializers) and
    yielding `outputs`. `poison`: names of nodes whose first output is replaced by NaN (fault
    injection: what a broken device kernel would produce)."""
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
        if v.const is not None:
            inits.append(numpy_helper.from_array(np.asarray(v.const), v.name))
        else:
            params.append(value_info(v))
    g = helper.make_graph(protos, "opwarden_region", params, [value_info(v) for v in outputs],
                          initializer=inits + extra_inits)
    ops = [helper.make_opsetid(d, ver) for d, ver in sorted(opsets.items())]
    m = helper.make_model(g, opset_imports=ops or [helper.make_opsetid("", 13)])
    m.ir_version = _IR_VERSION
    return m.SerializeToString()


def _np(v: Value) -> Any:
    return np.dtype(v.fact.dtype) if v.fact.dtype not in (None, "bfloat16") else np.float32


def read(data: bytes) -> Any:
    """openvino.Model from serialized ONNX."""
    return core().read_model(data)


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


def refusal(data: bytes, device: str = "CPU") -> str | None:
    """None when OpenVINO reads the model and its `device` plugin runs every operation in it
    (Core.query_model), else OpenVINO's reason."""
    try:
        model = read(data)
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
