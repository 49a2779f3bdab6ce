"""Reverse-mode differentiation over a whole model: `grad(model, feeds, wrt, output)`."""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from opwarden.autograd.core import GradContext, call_rule, upstream
from opwarden.errors import InputError, ModelError, OpwardenError, UnsupportedOpError
from opwarden.ir.graph import Graph, Model, Value
from opwarden.ir.load import load
from opwarden.ir.validate import validate
from opwarden.ops.grad import is_float
from opwarden.ops.select import kernel_kwargs
from opwarden.place.partition import place_graph

_CACHE: OrderedDict[Any, Graph] = OrderedDict()
_CACHE_SIZE = 8


def _prepare(source: Any) -> Graph:
    """The model's main graph, loaded, validated and decomposed, but never optimized.

    Optimizations (fusion, layout) rewrite nodes into forms without backward rules, so gradients
    run on the graph as written (nodes without an implementation go through their ONNX function
    body, as in a session).
    """
    model = source if isinstance(source, Model) else load(source)
    if not isinstance(source, Model):
        validate(model)
    if any(n.subgraphs() for n in model.graph.nodes):
        sub = next(n for n in model.graph.nodes if n.subgraphs())
        raise UnsupportedOpError(
            f"node {sub.label} has subgraphs; opwarden.grad does not differentiate control flow"
        )
    place_graph(model.graph, ["cpu"], model.opsets)
    return model.graph


def _cache_key(source: Any) -> Any:
    if isinstance(source, (str, os.PathLike)):
        p = os.fspath(source)
        try:
            return ("path", os.path.abspath(p), os.stat(p).st_mtime_ns)
        except OSError:
            return None
    if isinstance(source, (bytes, bytearray)):
        return ("bytes", hashlib.sha256(source).hexdigest())
    if isinstance(source, onnx.ModelProto):
        return ("bytes", hashlib.sha256(source.SerializeToString()).hexdigest())
    return None


def _graph_of(model_or_session: Any) -> Graph:
    from opwarden.session import InferenceSession

    if isinstance(model_or_session, InferenceSession):
        sess = model_or_session
        cached = getattr(sess, "_opwarden_grad_graph", None)
        if cached is not None:
            return cached
        source = getattr(sess, "source", None)
        if source is not None:
            g = _prepare(source)
        elif _rewritten(sess):
            raise ModelError(
                "this session's graph was optimized (fused or re-laid-out nodes have no backward "
                "rules); pass the model itself to opwarden.grad, or a session built with "
                "optimization_level=0"
            )
        else:
            g = sess.model.graph
        sess._opwarden_grad_graph = g  # type: ignore[attr-defined]
        return g
    key = _cache_key(model_or_session)
    if key is not None and key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    g = _prepare(model_or_session)
    if key is not None:
        _CACHE[key] = g
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return g


def _rewritten(sess: Any) -> bool:
    if any(e.get("changes") for e in getattr(sess, "pass_report", None) or ()):
        return True
    g = sess.model.graph
    return any(n.domain == "opwarden" for n in g.nodes) or any(
        getattr(v, "layout", None) == "NHWC" for v in g.values.values()
    )


def _bind_feeds(g: Graph, feeds: Mapping[str, Any]) -> dict[int, Any]:
    """Values of graph inputs and initializers (feeds may override initializers)."""
    if not isinstance(feeds, Mapping):
        raise InputError(f"feeds must be a dict of name -> array, got {type(feeds).__name__}")
    known = {v.name: v for v in g.inputs}
    known.update(g.initializers)
    for name in feeds:
        if name not in known:
            raise InputError(
                f"unknown feed {name!r}; the model's inputs are "
                f"{[v.name for v in g.inputs if v.name not in g.initializers]} and its "
                f"initializers {list(g.initializers)}"
            )
    env: dict[int, Any] = {}
    for name, v in known.items():
        if name in feeds:
            x = np.asarray(feeds[name])
            want = v.fact.dtype
            if want is not None and want != "string" and x.dtype != np.dtype(want):
                raise InputError(f"feed {name!r} expects dtype {want}, got {x.dtype}")
            if v.fact.shape is not None and x.ndim != len(v.fact.shape):
                raise InputError(
                    f"feed {name!r} expects rank {len(v.fact.shape)} (shape "
                    f"{list(v.fact.shape)}), got shape {list(x.shape)}"
                )
            env[id(v)] = x
        elif v.const is not None:
            env[id(v)] = v.const
        elif name not in g.initializers:
            raise InputError(f"missing feed for input {name!r}")
    return env


def _lookup(g: Graph, name: str, what: str) -> Value:
    v = g.values.get(name)
    if v is None:
        raise InputError(
            f"unknown {what} name {name!r}: not a value of the model (inputs "
            f"{[x.name for x in g.inputs if x.name not in g.initializers]}, initializers "
            f"{list(g.initializers)}, outputs {[x.name for x in g.outputs]})"
        )
    return v


def _forward(g: Graph, env: dict[int, Any]) -> dict[int, list[Any]]:
    """Run every node's reference kernel, filling `env` (value id -> array); returns each
    node's full result (kernels may return more than the node names)."""
    results: dict[int, list[Any]] = {}
    for node in g.nodes:
        if node.opdef is None:
            raise UnsupportedOpError(f"node {node.label}: no implementation to run")
        kw = kernel_kwargs(node)
        if node.opdef.variants[0].wants_noutputs:
            kw["noutputs"] = len(node.outputs)
        args = [env.get(id(v)) if v is not None else None for v in node.inputs]
        try:
            res = node.opdef.reference(*args, **kw)
        except OpwardenError as e:
            raise type(e)(f"node {node.label}: {e}") from e
        except Exception as e:  # noqa: BLE001 - name the node whose kernel failed
            raise ModelError(f"node {node.label}: forward failed: {type(e).__name__}: {e}") from e
        outs = [np.asarray(r) if r is not None else None for r in
                (res if isinstance(res, tuple) else (res,))]
        results[id(node)] = outs
        for v, y in zip(node.outputs, outs):
            if v is not None:
                env[id(v)] = y
    return results


def _backward(
    g: Graph, env: dict[int, Any], results: dict[int, list[Any]], targets: list[Value],
    out_v: Value, y: Any,
) -> dict[int, np.ndarray]:
    """The backward rules in reverse node order from d(output) = ones: value id -> gradient,
    for the values that depend on a target."""
    # Which values depend on a target (only their gradients are needed).
    needs = {id(v) for v in targets}
    for node in g.nodes:
        if any(v is not None and id(v) in needs for v in node.inputs):
            needs.update(id(v) for v in node.outputs if v is not None)

    grads: dict[int, np.ndarray] = {id(out_v): np.ones_like(y)}
    for node in reversed(g.nodes):
        out_g = [grads.get(id(v)) if v is not None else None for v in node.outputs]
        if all(x is None for x in out_g):
            continue
        if not any(v is not None and id(v) in needs for v in node.inputs):
            continue
        if node.opdef.grad_fn is None:
            raise UnsupportedOpError(
                f"node {node.label}: operator {node.opdef.qualname} has no backward rule, and "
                f"it lies between the wrt values and output {out_v.name!r}"
            )
        outs = results[id(node)]
        ctx = GradContext(
            inputs=[env.get(id(v)) if v is not None else None for v in node.inputs],
            outputs=outs,
            attrs=kernel_kwargs(node),
            op=node.opdef,
            node=node.label,
        )
        for v, gx in zip(node.inputs, call_rule(node.opdef, ctx, upstream(outs, out_g))):
            if v is None or gx is None or id(v) not in needs:
                continue
            prev = grads.get(id(v))
            grads[id(v)] = gx if prev is None else prev + gx
    return grads


def grad(
    model_or_session: Any,
    feeds: Mapping[str, Any],
    wrt: Sequence[str],
    output: str | None = None,
) -> dict[str, np.ndarray]:
    """Gradients of `output` with respect to the named inputs/initializers/values.

    Runs the forward pass with every node's reference kernel (keeping intermediates), then the
    backward rules in reverse order from d(output) = 1 (ones for a non-scalar output). `feeds`
    may also override initializers (e.g. the weights being trained). Returns {name: gradient}
    in `wrt` order, each with its value's shape and dtype.
    """
    if isinstance(wrt, str):
        wrt = [wrt]
    g = _graph_of(model_or_session)
    if output is None:
        if len(g.outputs) != 1:
            raise InputError(
                f"the model has {len(g.outputs)} outputs {[v.name for v in g.outputs]}; "
                "name the one to differentiate with output="
            )
        out_v = g.outputs[0]
    else:
        out_v = _lookup(g, output, "output")
    targets = [_lookup(g, n, "wrt") for n in wrt]
    env = _bind_feeds(g, feeds)

    results = _forward(g, env)
    y = env.get(id(out_v))
    if y is None or not is_float(np.asarray(y)):
        raise InputError(
            f"output {out_v.name!r} is not a floating-point tensor; cannot differentiate it"
        )

    grads = _backward(g, env, results, targets, out_v, y)

    result: dict[str, np.ndarray] = {}
    for v in targets:
        x = np.asarray(env[id(v)])
        gx = grads.get(id(v))
        result[v.name] = np.zeros_like(x) if gx is None else np.asarray(gx, dtype=x.dtype)
    return result
