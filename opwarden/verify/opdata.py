"""The inputs of one `check` call: per-operator data (OpData) and the shared cache (Context).

``OpData`` builds once per operator version, and shares among its variants, the cases the
checks run on: generated from the schema (``base``; elementwise built-ins only, the others use
the node suite's), given with the op (``given``: ONNX node-suite cases and declared samples),
and ``boundary`` ones (empty, broadcast, large, non-contiguous). It also answers what the
checks need to know about the op: output shapes by broadcasting or by its shape rule (onnx
shape inference for built-ins), NaN and narrow-integer probes, and per-thread inputs for the
concurrency check. ``Context`` holds the OpData and the reference kernel's result per case.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden.contract import TensorFact
from opwarden.dtypes import INTS, dtype_name
from opwarden.memory.constants import mark as mark_constant
from opwarden.ops.base import OpDef, Variant
from opwarden.ops.schema import STANDARD_DOMAINS
from opwarden.verify import inputs as I
from opwarden.verify.calling import accepts, call, fact_of, float_inputs, is_arr, mismatch

THREAD_SAMPLE_ELEMENTS = 1 << 16  # input elements of a declared sample used for concurrency


class Context:
    """The options of one `check` call, the OpData per operator and the reference kernel's
    result per case (an exception it raised included), shared by every checker."""

    def __init__(
        self, seed: int, quick: bool, suite_limit: int, rounds: int, fast_suite: bool = False
    ) -> None:
        self.fast_suite = fast_suite
        self.seed = seed
        self.quick = quick
        self.suite_limit = suite_limit
        self.rounds = rounds
        self._data: dict[int, OpData] = {}
        self._ref: dict[int, Any] = {}

    def data(self, opdef: OpDef) -> OpData:
        d = self._data.get(id(opdef))
        if d is None:
            d = self._data[id(opdef)] = OpData(opdef, self)
        return d

    def ref_out(self, ref: Variant, case: I.Case) -> list | BaseException:
        key = id(case)
        hit = self._ref.get(key)
        if hit is not None and hit[0] is case:
            return hit[1]
        try:
            res: Any = call(ref, case, case.fresh_inputs())
        except Exception as e:  # noqa: BLE001 - recorded; each check decides what it means
            res = e
        self._ref[key] = (case, res)
        return res


class OpData:
    """Inputs of one operator version, built once and shared by its variants."""

    def __init__(self, opdef: OpDef, ctx: Context) -> None:
        self.op = opdef
        self.ctx = ctx
        self.custom = opdef.domain not in STANDARD_DOMAINS
        self.rng = np.random.default_rng(ctx.seed)
        self.plan: I.Plan | None = None
        self.base: list[I.Case] = []
        # Cases given with the op: the ONNX node suite's (built-ins) and its declared samples.
        self.given: list[I.Case] = []
        self.boundary: list[I.Case] = []
        self.elementwise = False
        self.skip_reason = ""
        self._graph_attrs = any(
            s.type in ("GRAPH", "GRAPHS") for s in opdef.schema_for(opdef.since).attrs.values()
        )
        if self._graph_attrs:
            self.skip_reason = "graph attributes need a runtime (checked by the conformance suite)"
            return
        if not self.custom:
            try:
                self.given = I.suite_cases(opdef, limit=ctx.suite_limit, fast=ctx.fast_suite)
            except Exception:  # noqa: BLE001 - a broken suite module leaves no suite cases
                self.given = []
        samples = I.sample_cases(opdef, self.rng)
        self.given += samples
        try:
            self.plan = I.plan(opdef)
        except Exception:  # noqa: BLE001
            self.plan = None
        if self.plan is not None:
            self.base = I.base_cases(self.plan, self.rng)
            if self.custom and samples and self.base and all(
                isinstance(ctx.ref_out(_ref(opdef), c), BaseException) for c in self.base
            ):
                # The schema's default attributes are no valid call (FusedElementwise's empty
                # program): generate with those of a declared sample of as many inputs.
                fit = [c for c in samples if len(c.inputs) == self.plan.n_inputs]
                if fit:
                    self.plan.attrs = dict(fit[0].attrs)
                    self.base = I.base_cases(self.plan, self.rng)
            if not self.custom:
                # built-in ops: only those whose reference takes the generated inputs
                self.base = [
                    c
                    for c in self.base
                    if not isinstance(ctx.ref_out(_ref(opdef), c), BaseException)
                ]
            self.elementwise = self._is_elementwise()
            if not self.custom and not self.elementwise:
                self.base = []  # non-elementwise built-ins use the node suite's inputs
        self.boundary = self._boundary()

    def _is_elementwise(self) -> bool:
        ok = 0
        for c in self.base[:1]:
            for shape in (I.BASE_SHAPE, (2, 1, 3), (5,)):
                cc = I.Case(
                    [_reshape(self.rng, x, shape) for x in c.inputs],
                    dict(c.attrs),
                    "probe",
                    noutputs=c.noutputs,
                )
                out = self.ctx.ref_out(_ref(self.op), cc)
                if isinstance(out, BaseException) or not out or not is_arr(out[0]):
                    return False
                if tuple(out[0].shape) != shape:
                    return False
                ok += 1
        return ok == 3

    def _boundary(self) -> list[I.Case]:
        out: list[I.Case] = []
        if self.elementwise and self.plan is not None:
            bcast = self.op.contract.broadcast == "multidirectional" or self.custom
            for b_i, b in enumerate(self.plan.bindings):
                for label, shapes in I.boundary_shapes(self.plan.n_inputs, bcast):
                    if b_i and "large" in label:
                        continue
                    dts = "/".join(I.binding_dtypes(self.plan, b))
                    out.append(
                        I.make_case(
                            self.plan, b, shapes, self.rng, f"{dts} {label}", source="boundary"
                        )
                    )
        for c in self.base[:3] + self.given:
            arrs = [x for x in c.inputs if is_arr(x) and x.ndim and x.size]
            if not arrs:
                continue
            nc = c.copy()
            nc.inputs = [I.strided(x) if is_arr(x) and x.ndim and x.size else x for x in c.inputs]
            for i in nc.constants:  # (a non-contiguous initializer, declared constant too)
                mark_constant(nc.inputs[i])
            nc.label, nc.source, nc.expected = c.label + " (non-contiguous)", "boundary", None
            out.append(nc)
        return out

    def small_boundary(self) -> list[I.Case]:
        return [c for c in self.boundary if c.size <= 4096]

    def large(self) -> list[I.Case]:
        return [c for c in self.boundary if c.size > 4096]

    # expected shapes --------------------------------------------------------------------------
    def expect_shape(self, c: I.Case) -> tuple | None:
        """Output 0's shape by broadcasting (elementwise ops) or by the shape rule."""
        if self.elementwise and c.node is None:
            try:
                return tuple(np.broadcast_shapes(*[x.shape for x in c.inputs if is_arr(x)]))
            except ValueError:
                return None
        try:
            facts = self.rule_facts(c)
        except Exception:  # noqa: BLE001
            return None
        if not facts or facts[0] is None or not facts[0].static:
            return None
        return tuple(facts[0].shape)

    def rule_facts(self, c: I.Case) -> list[TensorFact | None] | None:
        """Output facts from the op's .infer rule, or onnx shape inference for built-ins."""
        facts = [fact_of(x) for x in c.inputs]
        if self.op.infer_fn is not None:
            res = self.op.infer_fn(*facts, **c.attrs)
            res = list(res) if isinstance(res, (tuple, list)) else [res]
            return [r if isinstance(r, TensorFact) else None for r in res]
        if self.custom:
            return None
        return _onnx_infer(self.op, c)

    # NaN probes ---------------------------------------------------------------------------------
    def nan_cases(self, variant: Variant) -> list[I.Case]:
        out = []
        for c in self.base + self.given:
            if not float_inputs(c):
                continue
            nc = c.copy()
            nc.expected = None
            if self.elementwise and self._pointwise(c):
                # input 0 always; the others only where every input is data (symmetric ops)
                every = self.custom or self.op.contract.broadcast == "multidirectional"
                for k, x in enumerate(nc.inputs):
                    if (k == 0 or every) and is_arr(x) and x.dtype.kind == "f" and x.size:
                        x.ravel()[::3] = np.nan
                nc.label = c.label + " with NaN at every 3rd element"
            elif self.custom:
                x = nc.inputs[0]
                if not (is_arr(x) and x.dtype.kind == "f" and x.size):
                    continue
                x[...] = np.nan
                nc.label = c.label + " with input 0 all NaN"
            else:
                continue
            if accepts(variant, nc):
                out.append(nc)
        return out[:4]

    def _pointwise(self, c: I.Case) -> bool:
        """Does the reference compute output 0 element by element on this case (its output
        permuted like the inputs when all inputs are permuted alike)? Shape-preserving ops that
        move elements (ChannelShuffle with group > 1) are not, whatever the shapes suggest.
        True when it cannot be told: inputs of different shapes, non-deterministic ops."""
        arrs = [x for x in c.inputs if is_arr(x)]
        if (not self.op.contract.deterministic or not arrs or arrs[0].size < 2
                or any(x.shape != arrs[0].shape for x in arrs)):
            return True
        want = self.ctx.ref_out(_ref(self.op), c)
        if isinstance(want, BaseException) or not want or not is_arr(want[0]):
            return True
        if want[0].shape != arrs[0].shape:
            return False
        perm = np.random.default_rng(7).permutation(arrs[0].size)
        moved = [x.ravel()[perm].reshape(x.shape) if is_arr(x) else x for x in c.inputs]
        try:
            got = call(_ref(self.op), c, moved)
        except Exception:  # noqa: BLE001 - refusing permuted values: not element by element
            return False
        return bool(got) and mismatch(got[0], want[0].ravel()[perm].reshape(want[0].shape)) is None

    def nan_lost(self, c: I.Case, got: list) -> str | None:
        if not got or not is_arr(got[0]) or got[0].dtype.kind not in "fc" or not got[0].size:
            return None
        o = got[0]
        if self.elementwise:
            for i, x in enumerate(c.inputs):
                if not (is_arr(x) and x.dtype.kind == "f" and x.size):
                    continue
                try:
                    mask = np.broadcast_to(np.isnan(x), o.shape)
                except ValueError:
                    continue
                lost = mask & ~np.isnan(o)
                if lost.any():
                    k = int(np.flatnonzero(lost.ravel())[0])
                    return (
                        f"input {i} has NaN where output 0 has {o.ravel()[k].item()!r} "
                        f"(flat index {k}; {int(lost.sum())} NaN lost)"
                    )
            return None
        if not np.isnan(o).any():
            return "input 0 is all NaN, output 0 holds no NaN"
        return None

    # overflow probes ------------------------------------------------------------------------------
    def overflow_cases(self) -> list[I.Case]:
        if self.plan is None or not self.base:
            return []
        out = []
        for b in self.plan.bindings:
            dts = I.binding_dtypes(self.plan, b)
            narrow = [d for d in dts if d in INTS and np.dtype(d).itemsize <= 2]
            if not narrow or any(d != narrow[0] for d in dts if d in INTS):
                continue
            n_int = sum(d in INTS for d in dts)
            vals = I.extreme_ints(narrow[0], 11)
            grids = np.meshgrid(*([vals] * min(n_int, 2)), indexing="ij")
            flat = [g.ravel() for g in grids]
            inputs, k = [], 0
            for d in dts:
                if d in INTS:
                    inputs.append(np.ascontiguousarray(flat[min(k, len(flat) - 1)]))
                    k += 1
                else:
                    inputs.append(I.random_array(self.rng, d, flat[0].shape))
            out.append(
                I.Case(
                    inputs,
                    dict(self.plan.attrs),
                    f"{'/'.join(dts)} extreme values",
                    source="overflow",
                    noutputs=max(1, self.plan.schema.min_outputs),
                )
            )
        return out

    # concurrency inputs ---------------------------------------------------------------------------
    def thread_cases(self, variant: Variant, n: int) -> list[I.Case]:
        """n inputs, distinct per thread where they can be generated, big enough to race on."""
        mine = [c for c in self.base if accepts(variant, c)]
        if mine and self.plan is not None:
            c0 = mine[0]
            shape = I.CONCURRENCY_SHAPE if self.elementwise else None
            out = []
            for t in range(n):
                rng = np.random.default_rng(1000 + t)
                inputs = [_reshape(rng, x, shape or x.shape) for x in c0.inputs]
                out.append(
                    I.Case(
                        inputs,
                        dict(c0.attrs),
                        f"{c0.label.split()[0]} thread {t} {list(shape or c0.inputs[0].shape)}",
                        noutputs=c0.noutputs,
                    )
                )
            if not isinstance(self.ctx.ref_out(_ref(self.op), out[0]), BaseException):
                return out
            if not isinstance(self.ctx.ref_out(_ref(self.op), c0), BaseException):
                return [c0] * n
            # (a custom op's schema-made inputs the reference rejects: its given cases)
        mine = [c for c in self.given if accepts(variant, c)]
        if not mine:
            return []
        c0 = mine[-1]
        samples = [c for c in mine if c.source == "sample"]
        if samples:
            # the largest that keeps THREADS x CALLS calls quick
            c0 = ([c for c in samples if c.size <= THREAD_SAMPLE_ELEMENTS] or samples[:1])[-1]
            # Distinct float data per thread (shapes, dtypes and attributes of the sample);
            # declared constants shared by all, as concurrent runs share a session's weights
            # (and race to fill the caches kernels keep for them).
            out = []
            for t in range(n):
                rng = np.random.default_rng(1000 + t)
                inputs = [
                    _reshape(rng, x, x.shape)
                    if is_arr(x) and x.dtype.kind == "f" and i not in c0.constants else x
                    for i, x in enumerate(c0.inputs)
                ]
                out.append(I.Case(inputs, dict(c0.attrs), f"{c0.label} thread {t}",
                                  source="sample", noutputs=c0.noutputs, opset=c0.opset,
                                  constants=c0.constants))
            if not isinstance(self.ctx.ref_out(_ref(self.op), out[0]), BaseException):
                return out
        return [c0] * n


def _reshape(rng: np.random.Generator, x: Any, shape: tuple) -> Any:
    """A fresh random array like x (same dtype) of `shape`."""
    if not is_arr(x):
        return x
    return I.random_array(rng, dtype_name(x.dtype), tuple(shape))


def _ref(opdef: OpDef) -> Variant:
    return next(v for v in opdef.variants if v.reference)


def _onnx_infer(opdef: OpDef, c: I.Case) -> list[TensorFact | None] | None:
    """Output facts by onnx's shape inference on a one-node model with these input types."""
    import onnx
    from onnx import helper

    from opwarden.dtypes import onnx_type
    from opwarden.ir.export import attribute_proto

    if c.node is not None:
        node = onnx.NodeProto()
        node.CopyFrom(c.node)
        opset = c.opset
    else:
        node = helper.make_node(
            opdef.op_type,
            [f"i{k}" if x is not None else "" for k, x in enumerate(c.inputs)],
            [f"o{j}" for j in range(c.noutputs)],
            domain=opdef.domain,
        )
        node.attribute.extend(
            attribute_proto(k, v)
            for k, v in c.attrs.items()
            if v is not None and not (isinstance(v, list) and not v)
        )
        opset = c.opset or opdef.since
    vis = []
    for name, x in zip(node.input, c.inputs):
        if not name or not is_arr(x):
            if name:
                return None
            continue
        vis.append(helper.make_tensor_value_info(name, onnx_type(x.dtype), list(x.shape)))
    outs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    g = helper.make_graph([node], "g", vis, outs)
    imports = [helper.make_opsetid(opdef.domain, opset)]
    if opdef.domain:
        imports.append(helper.make_opsetid("", 21))
    m = helper.make_model(g, opset_imports=imports)
    m.ir_version = 8
    try:
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False)
    except Exception:  # noqa: BLE001 - onnx's inference may reject corner cases
        return None
    from opwarden.ir.build import type_fact

    types = {vi.name: vi.type for vi in inferred.graph.output}
    types.update({vi.name: vi.type for vi in inferred.graph.value_info})
    res: list[TensorFact | None] = []
    for o in node.output:
        tp = types.get(o)
        if tp is None or not o:
            res.append(None)
            continue
        kind, fact = type_fact(tp)
        res.append(fact if kind == "tensor" and (fact.shape is not None or fact.dtype) else None)
    return res

