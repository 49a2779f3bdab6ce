"""Which operators OpenVINO accepts at all: asked once per operator version, then cached.

OpenVINO lists no operators; its ONNX frontend answers a model. Each operator version is put
to it as one node on tensors of its schema's types (float32 where allowed): "No conversion
rule found" means the frontend has none, and a converted node the CPU plugin's query_model
leaves out means the plugin has none. A node the frontend has a rule for but cannot convert
with these stand-in inputs (an attribute it requires, a shape it checks) still counts as
accepted: real nodes are asked again, one by one, when a session places them
(OpenVINODevice.accepts).
"""

from __future__ import annotations

import threading
from typing import Any

import onnx
from onnx import helper

from opwarden.dtypes import onnx_type
from opwarden.kernels.openvino import convert as C

_PREFER = ("float32", "int64", "int32", "bool", "uint8", "int8", "float16")
_ANSWERS: dict[tuple[str, str, int], str | None] = {}
_LOCK = threading.Lock()


def _dtype(allowed: frozenset[str] | None) -> str:
    if allowed is None:
        return "float32"
    return next((d for d in _PREFER if d in allowed), "float32")


def stand_in(opdef: Any) -> bytes:
    """One node of `opdef` (at its first opset) on [1, 1, 2, 2] tensors of its schema's types."""
    import numpy as np

    sch = opdef.schema_for(opdef.since)
    n_in = max(sch.min_inputs, 1) if sch.inputs else 0
    params, names = [], []
    for i in range(n_in):
        p = sch.input_param(i)
        dt = _dtype(sch.allowed_dtypes(p.type_str) if p is not None else None)
        names.append(f"x{i}")
        params.append(helper.make_tensor_value_info(f"x{i}", onnx_type(np.dtype(dt)),
                                                    [1, 1, 2, 2]))
    outs = [f"y{k}" for k in range(max(sch.min_outputs, 1))]
    node = helper.make_node(opdef.op_type, names, outs, name="n", domain=opdef.domain)
    g = helper.make_graph([node], "probe", params, [onnx.ValueInfoProto(name=o) for o in outs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(opdef.domain, opdef.since)])
    m.ir_version = 8
    return m.SerializeToString()


def op_refusal(opdef: Any) -> str | None:
    """None when OpenVINO has a conversion rule and a CPU kernel for this operator version,
    else its answer (cached per process)."""
    key = (opdef.domain, opdef.op_type, opdef.since)
    with _LOCK:
        if key in _ANSWERS:
            return _ANSWERS[key]
    why = _ask(opdef)
    with _LOCK:
        _ANSWERS[key] = why
    return why


def _ask(opdef: Any) -> str | None:
    try:
        data = stand_in(opdef)
    except Exception as e:  # noqa: BLE001 - a schema we cannot write a node for
        return f"no stand-in node: {e}"
    try:
        model = C.read(data)
    except Exception as e:  # noqa: BLE001 - the frontend's answer
        why = C.frontend_reason(e)
        if "No conversion rule" in why:
            return f"OpenVINO cannot convert it: {why}"
        return None  # a rule exists; these stand-in inputs do not fit it
    try:
        supported = C.core().query_model(model, "CPU")
    except Exception as e:  # noqa: BLE001
        return f"OpenVINO CPU query_model failed: {C.frontend_reason(e)}"
    missing = sorted({op.get_type_name() for op in model.get_ops()
                      if op.get_friendly_name() not in supported})
    if missing:
        return f"OpenVINO CPU plugin does not support {', '.join(missing)} (query_model)"
    return None
