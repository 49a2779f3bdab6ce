"""Fused operators written back as the standard operators they compute (for the optimized
model onnxruntime is to read: `ort.optimized`).

FusedConv (Conv, + Z, activation), FusedGemm (Gemm, activation) and FusedMatMul (MatMul, + C,
activation) expand exactly: the same operators in the same order as their reference kernels
(ops/fused.py). A FusedConv's `branches` are its Conv with W's structural zeros multiplied after
all. The activations are ONNX operators where the model's opset has them (HardSwish from 14,
Gelu from 20) and their defining formulas below. A node with no expansion (FusedElementwise's
programs, a shuffled input) is reported, and the caller writes the unfused graph instead.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from opwarden.dtypes import np_dtype_of

_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
_GEMM_ATTRS = ("alpha", "beta", "transA", "transB")


class _Expander:
    """The new nodes and constants of one graph, with fresh value names."""

    def __init__(self, graph: onnx.GraphProto, opset: int, dtypes: dict[str, str]) -> None:
        self.opset = opset
        self.dtypes = dtypes
        self.taken = {v for n in graph.node for v in (*n.input, *n.output)}
        self.taken |= {t.name for t in graph.initializer} | {i.name for i in graph.input}
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def fresh(self, base: str) -> str:
        k = 0
        while f"{base}__x{k}" in self.taken:
            k += 1
        name = f"{base}__x{k}"
        self.taken.add(name)
        return name

    def const(self, base: str, value: float, dtype: np.dtype) -> str:
        name = self.fresh(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def add(self, op: str, ins: list[str], out: str, name: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op, ins, [out], name=name, **attrs))
        return out

    def activation(self, act: str, params: list[float], x: str, y: str, name: str,
                   dtype: np.dtype) -> bool:
        """y = act(x) as standard nodes; False for an activation with no expansion."""
        p = [float(v) for v in params]
        if act in ("Relu", "Sigmoid", "Tanh"):
            self.add(act, [x], y, name)
        elif act == "LeakyRelu":
            self.add(act, [x], y, name, alpha=p[0] if p else 0.01)
        elif act == "Clip":
            self._clip(p, x, y, name, dtype)
        elif act == "HardSwish":
            if self.opset >= 14:
                self.add("HardSwish", [x], y, name)
            else:
                h = self.add("HardSigmoid", [x], self.fresh(y), name + "/hardsigmoid",
                             alpha=1.0 / 6, beta=0.5)
                self.add("Mul", [x, h], y, name)
        elif act == "Gelu":
            self._gelu(bool(p and p[0]), x, y, name, dtype)
        elif act == "Swish":  # x sigmoid(alpha x), as exporters write SiLU for alpha 1
            alpha = p[0] if p else 1.0
            t = x if alpha == 1.0 else self.add(
                "Mul", [x, self.const(y + "_alpha", alpha, dtype)], self.fresh(y),
                name + "/scale")
            s = self.add("Sigmoid", [t], self.fresh(y), name + "/sigmoid")
            self.add("Mul", [x, s], y, name)
        else:
            return False
        return True

    def _clip(self, p: list[float], x: str, y: str, name: str, dtype: np.dtype) -> None:
        if self.opset >= 11:
            lo = self.const(y + "_min", p[0], dtype) if len(p) > 0 else ""
            hi = self.const(y + "_max", p[1], dtype) if len(p) > 1 else ""
            self.add("Clip", [x, lo, hi], y, name)
            return
        attrs = {}
        if len(p) > 0:
            attrs["min"] = p[0]
        if len(p) > 1:
            attrs["max"] = p[1]
        self.add("Clip", [x], y, name, **attrs)

    def _gelu(self, tanh: bool, x: str, y: str, name: str, dtype: np.dtype) -> None:
        if self.opset >= 20:
            self.add("Gelu", [x], y, name, approximate="tanh" if tanh else "none")
            return
        if tanh:  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            x3 = self.add("Mul", [x, self.add("Mul", [x, x], self.fresh(y), name + "/sq")],
                          self.fresh(y), name + "/cube")
            inner = self.add("Add", [x, self.add(
                "Mul", [x3, self.const(y + "_c", 0.044715, dtype)], self.fresh(y),
                name + "/scale3")], self.fresh(y), name + "/inner")
            t = self.add("Tanh", [self.add(
                "Mul", [inner, self.const(y + "_k", math.sqrt(2 / math.pi), dtype)],
                self.fresh(y), name + "/scale")], self.fresh(y), name + "/tanh")
        else:  # 0.5 x (1 + erf(x / sqrt 2))
            t = self.add("Erf", [self.add("Div", [x, self.const(y + "_r2", math.sqrt(2), dtype)],
                                          self.fresh(y), name + "/div")],
                         self.fresh(y), name + "/erf")
        one = self.add("Add", [t, self.const(y + "_1", 1.0, dtype)], self.fresh(y),
                       name + "/one")
        half = self.add("Mul", [x, self.const(y + "_h", 0.5, dtype)], self.fresh(y),
                        name + "/half")
        self.add("Mul", [half, one], y, name)

    def fused(self, n: onnx.NodeProto) -> bool:
        """Append `n`'s expansion; False (nothing appended that matters) when it has none."""
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        act = attrs.pop("activation", b"")
        act = act.decode() if isinstance(act, bytes) else str(act)
        params = list(attrs.pop("activation_params", []))
        y = n.output[0]
        dtype = np_dtype_of(self.dtypes.get(y, "float32"))
        ins = list(n.input)
        if n.op_type == "FusedConv" and not int(attrs.pop("input_shuffle", 0)):
            attrs.pop("branches", None)  # W holds the structural zeros: one Conv is the same
            base = ("Conv", ins[:3], {k: v for k, v in attrs.items() if k in _CONV_ATTRS})
            extra = ins[3] if len(ins) > 3 and ins[3] else ""
        elif n.op_type == "FusedGemm":
            base = ("Gemm", ins[:3], {k: v for k, v in attrs.items() if k in _GEMM_ATTRS})
            extra = ""
        elif n.op_type == "FusedMatMul":
            base = ("MatMul", ins[:2], {})
            extra = ins[2] if len(ins) > 2 and ins[2] else ""
        else:
            return False
        mark = len(self.nodes), len(self.inits)
        op, args, kw = base
        while args and not args[-1]:
            args.pop()
        t = y if not (extra or act) else self.fresh(y)
        self.add(op, args, t, n.name or y, **kw)
        if extra:
            r = y if not act else self.fresh(y)
            t = self.add("Add", [t, extra], r, (n.name or y) + "/add")
        if act and not self.activation(act, params, t, y, (n.name or y) + "/" + act, dtype):
            del self.nodes[mark[0]:], self.inits[mark[1]:]
            return False
        return True


def expand_fused(proto: onnx.ModelProto, dtypes: dict[str, str]) -> list[str]:
    """Rewrite the main graph's opwarden-domain nodes of `proto` as standard nodes, in place;
    returns the names of the nodes that have no expansion (then `proto` is left unchanged).
    `dtypes`: value name -> dtype name (the fused outputs' types, for the constants)."""
    g = proto.graph
    opset = next((int(i.version) for i in proto.opset_import if i.domain in ("", "ai.onnx")), 1)
    ex = _Expander(g, opset, dtypes)
    missing = []
    for n in g.node:
        if n.domain not in ("opwarden",):
            kept = onnx.NodeProto()
            kept.CopyFrom(n)  # g.node is cleared below
            ex.nodes.append(kept)
        elif not ex.fused(n):
            missing.append(f"{n.name or n.output[0]} ({n.op_type})")
    if missing:
        return missing
    del g.node[:]
    g.node.extend(ex.nodes)
    g.initializer.extend(ex.inits)
    kept = [i for i in proto.opset_import if i.domain != "opwarden"]
    del proto.opset_import[:]
    proto.opset_import.extend(kept)
    return []
