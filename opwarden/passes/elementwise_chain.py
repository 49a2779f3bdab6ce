"""`elementwise_fusion` (level 2): a tree of elementwise nodes as one FusedElementwise.

Elementwise nodes whose intermediates have the output's shape and one reader each (Add+Relu,
BatchNorm-as-Mul/Add+Relu, swish, ...) become one FusedElementwise node whose `program`
attribute spells the tree out as statements over the external inputs x0, x1, ... and
temporaries t0, t1, ... (`t0=mul(x0,x1);t1=add(t0,x2);t2=relu(t1)`), so the kernel passes
over the data once instead of once per node.
"""

from __future__ import annotations

import onnx

from opwarden.ir.graph import Node, Value
from opwarden.ops.select import kernel_kwargs
from opwarden.passes.match import activation_of, known_shape
from opwarden.passes.rewrite import PassResult, Rewriter, fuse

# ONNX operator -> program primitive (ops.fused_elementwise.PRIMITIVES): a unary primitive is
# its operator's name in lower case.
_UNARY = {t: t.lower() for t in ("Neg", "Abs", "Exp", "Log", "Sqrt", "Reciprocal", "Tanh",
                                  "Relu", "Sigmoid", "HardSwish")}
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}
_VARIADIC = {"Sum": "add", "Max": "max", "Min": "min"}


def _ew_spec(rw: Rewriter, node: Node) -> tuple[str, list[Value], list[float]] | None:
    """(program op, tensor inputs, number params) of a fusable elementwise node."""
    if node.domain or node.opdef is None or len(node.outputs) != 1 or node.outputs[0] is None:
        return None
    y = node.outputs[0]
    if y.fact.dtype not in ("float32", "float64") or known_shape(y) is None:
        return None
    t = node.op_type
    ins = node.inputs
    if any(v is None or v.fact.dtype != y.fact.dtype for v in ins[:1]):
        return None
    if t in _UNARY:
        return _UNARY[t], [ins[0]], []
    if t in _BINARY and node.opdef.since >= 7:
        if ins[1] is None or ins[1].fact.dtype != y.fact.dtype:
            return None
        return _BINARY[t], list(ins), []
    if t in _VARIADIC and len(ins) >= 2 and all(v is not None for v in ins):
        if any(v.fact.dtype != y.fact.dtype for v in ins):
            return None
        return _VARIADIC[t], list(ins), []
    if t == "LeakyRelu":
        return "leakyrelu", [ins[0]], [float(kernel_kwargs(node).get("alpha", 0.01))]
    if t == "HardSigmoid":
        kw = kernel_kwargs(node)
        return "hardsigmoid", [ins[0]], [float(kw.get("alpha", 0.2)), float(kw.get("beta", 0.5))]
    if t == "Clip":
        act = activation_of(rw, node, ins[0])
        if act is not None:
            return "clip", [ins[0]], act[1]
    return None


def _fmt(p: float) -> str:
    return repr(float(p))


def _ref(v: Value, group: dict, temps: dict[int, str], externals: list[Value]) -> str:
    """How a program names v: the temporary of a group member, or an external input xK."""
    if v.producer is not None and id(v.producer) in group:
        return temps[id(v)]
    for k, e in enumerate(externals):
        if e is v:
            return f"x{k}"
    externals.append(v)
    return f"x{len(externals) - 1}"


def _group(rw: Rewriter, root: Node, spec: tuple) -> dict[int, tuple[Node, tuple]]:
    """root and the fusable producers above it whose outputs have root's shape and dtype and
    are read only inside the group: id(node) -> (node, _ew_spec)."""
    shape = known_shape(root.outputs[0])
    group = {id(root): (root, spec)}
    stack = [root]
    while stack:
        n = stack.pop()
        for v in group[id(n)][1][1]:
            p = v.producer
            if p is None or id(p) in group or id(p) in rw.removed or p.graph is not rw.graph:
                continue
            if rw.single_use(v) is not n or known_shape(v) != shape:
                continue
            ps = _ew_spec(rw, p)
            if ps is None or v.fact.dtype != root.outputs[0].fact.dtype:
                continue
            group[id(p)] = (p, ps)
            stack.append(p)
    return group


def _program(members: list[tuple[Node, tuple]], group: dict) -> tuple[str, list[Value]]:
    """(the FusedElementwise program of `members` in graph order, its external inputs)."""
    externals: list[Value] = []
    temps: dict[int, str] = {}
    stmts: list[str] = []
    for n, (prim, ins, params) in members:
        args = [_ref(v, group, temps, externals) for v in ins]
        nums = [_fmt(p) for p in params]
        cur = args[0]
        if len(args) == 1:
            cur = f"t{len(stmts)}"
            stmts.append(f"{cur}={prim}({','.join([args[0], *nums])})")
        for a in args[1:]:
            nxt = f"t{len(stmts)}"
            stmts.append(f"{nxt}={prim}({cur},{a})")
            cur = nxt
        temps[id(n.outputs[0])] = cur
    return ";".join(stmts), externals


def elementwise_fusion(rw: Rewriter) -> PassResult:
    """Trees of elementwise nodes whose intermediates have the output's shape and one reader
    -> one FusedElementwise (Add+Relu, BN-as-Mul/Add+Relu, swish, ...)."""
    res = PassResult()
    nodes = rw.graph.nodes
    pos = {id(n): i for i, n in enumerate(nodes)}
    done: set[int] = set()
    for root in reversed(nodes):
        if id(root) in rw.removed or id(root) in done:
            continue
        spec = _ew_spec(rw, root)
        if spec is None:
            continue
        group = _group(rw, root, spec)
        if len(group) < 2:
            continue
        members = sorted(group.values(), key=lambda e: pos[id(e[0])])
        program, externals = _program(members, group)
        done.update(group)
        fuse(rw, res, "FusedElementwise", [n for n, _ in members], externals,
             {"program": program}, {"program": onnx.AttributeProto.STRING})
    return res
