"""Inputs for the validation harness: generated from schemas, or taken from the ONNX node suite."""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opwarden.dtypes import FLOATS, INTS
from opwarden.memory.constants import mark as mark_constant
from opwarden.ops.base import OpDef
from opwarden.ops.schema import Schema

# Dtypes tried per type constraint, in this order (first ones form the "base" cases).
PREFERRED = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int32",
    "int8",
    "int64",
    "uint8",
    "int16",
    "uint16",
    "uint32",
    "uint64",
    "bool",
)
BASE_SHAPE = (3, 4)
CONCURRENCY_SHAPE = (256, 256)
LARGE = 2**20
ABSENT = object()  # a node output the suite case does not check


@dataclass
class Case:
    """One call of a kernel: positional inputs (None for an omitted optional) and attributes."""

    inputs: list[Any]
    attrs: dict[str, Any]
    label: str
    source: str = "generated"  # generated | boundary | suite
    expected: list[Any] | None = None  # node-suite outputs, when known
    rtol: float = 1e-3
    atol: float = 1e-7
    node: Any = None  # onnx.NodeProto of a node-suite case
    opset: int = 0
    noutputs: int = 1
    constants: tuple[int, ...] = ()  # inputs declared constant (memory.constants), never copied

    @property
    def size(self) -> int:
        return sum(int(getattr(x, "size", 1)) for x in self.inputs if x is not None)

    def fresh_inputs(self) -> list[Any]:
        """The inputs for one call: private copies, except the declared constants, which are
        shared as a session shares its initializers between runs and threads (read-only)."""
        return [x if i in self.constants else _copy(x) for i, x in enumerate(self.inputs)]

    def copy(self) -> Case:
        c = Case(**{k: getattr(self, k) for k in self.__dataclass_fields__})
        c.inputs = self.fresh_inputs()
        return c

    def describe(self) -> dict[str, Any]:
        """JSON-friendly description: shapes, dtypes, attributes, small values in full."""
        shapes, dtypes, values = [], [], []
        for x in self.inputs:
            if isinstance(x, np.ndarray):
                shapes.append(list(x.shape))
                dtypes.append(x.dtype.name if x.dtype.kind not in "OUS" else "string")
                values.append(_small(x))
            else:
                shapes.append(None)
                dtypes.append(type(x).__name__ if x is not None else None)
                values.append(None)
        out: dict[str, Any] = {"label": self.label, "shapes": shapes, "dtypes": dtypes}
        if any(v is not None for v in values):
            out["values"] = values
        attrs = {k: _small(v) if isinstance(v, np.ndarray) else v for k, v in self.attrs.items()}
        attrs = {
            k: v for k, v in attrs.items() if isinstance(v, (int, float, str, list, type(None)))
        }
        if attrs:
            out["attrs"] = attrs
        noncontig = [
            i
            for i, x in enumerate(self.inputs)
            if isinstance(x, np.ndarray) and x.ndim and not x.flags.c_contiguous
        ]
        if noncontig:
            out["non_contiguous"] = noncontig
        return out


def _copy(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        # keep the memory layout (non-contiguous inputs stay non-contiguous)
        return _like(x, x.copy(order="K"))
    if isinstance(x, list):
        return [_copy(v) for v in x]
    return x


def _like(orig: np.ndarray, data: np.ndarray) -> np.ndarray:
    if orig.ndim and not orig.flags.c_contiguous and not orig.flags.f_contiguous:
        return strided(data)
    return data


def _small(x: np.ndarray) -> Any:
    if x.size > 16:
        return None
    if x.dtype.kind in "fc" or x.dtype.kind == "V":
        return [None if not np.isfinite(v) else float(v) for v in x.astype(np.float64).ravel()]
    if x.dtype.kind in "biu":
        return [int(v) for v in x.ravel()]
    return [str(v) for v in x.ravel()]


def strided(x: np.ndarray) -> np.ndarray:
    """The same values in a non-contiguous array (every other element of a bigger buffer)."""
    if x.ndim == 0:
        return x
    buf = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), dtype=x.dtype)
    buf[..., ::2] = x
    return buf[..., ::2]


# ---------------------------------------------------------------- values ---------------------


def random_array(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Random values that are ordinary for the dtype (small ints, normal floats, mixed bools)."""
    dt = np.dtype(dtype)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in INTS:
        lo = 0 if dt.kind == "u" else -9
        return rng.integers(lo, 10, size=shape).astype(dt)
    if dtype in FLOATS or dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    if dtype == "string":
        return np.array(
            [f"s{i}" for i in rng.integers(0, 9, size=int(np.prod(shape)))], dtype=object
        ).reshape(shape)
    return rng.standard_normal(shape).astype(np.float32).astype(dt)


def extreme_ints(dtype: str, n: int) -> np.ndarray:
    """n values of an integer dtype concentrated at its limits (overflow probes)."""
    info = np.iinfo(np.dtype(dtype))
    vals = [
        info.max,
        info.min,
        info.max - 1,
        info.min + 1,
        info.max // 2 + 1,
        -1,
        0,
        1,
        2,
        info.max // 3,
        info.min // 2,
    ]
    vals = [v for v in vals if info.min <= v <= info.max]
    return np.array([vals[i % len(vals)] for i in range(n)], dtype=np.int64).astype(dtype)


# ---------------------------------------------------------------- schema-driven --------------


@dataclass
class Plan:
    """How to generate inputs for one operator from its schema: formal inputs and dtype choices."""

    schema: Schema
    bindings: list[dict[str, str]]  # type constraint -> dtype, one per dtype combination
    n_inputs: int
    attrs: dict[str, Any]
    elementwise: bool = False  # output 0 has the broadcast shape of the inputs
    reason: str = ""
    notes: dict[str, Any] = field(default_factory=dict)


def _param_dtypes(schema: Schema, type_str: str) -> list[str] | None:
    allowed = schema.allowed_dtypes(type_str)
    if allowed is None:
        return None
    return [d for d in PREFERRED if d in allowed]


def governed_opset(opdef: OpDef) -> int:
    """The newest opset whose schema this operator object implements (it covers every ONNX
    version from its `since` up to the next registered object's)."""
    from opwarden.ops import REGISTRY
    from opwarden.ops.schema import from_onnx

    if opdef.custom_schema is not None:
        return opdef.since
    later = [
        o.since for o in REGISTRY.versions(opdef.op_type, opdef.domain) if o.since > opdef.since
    ]
    cap = min(later) - 1 if later else 10**4
    sch = from_onnx(opdef.op_type, opdef.domain, cap)
    return sch.since if sch is not None and sch.since >= opdef.since else opdef.since


def plan(opdef: OpDef, opset: int | None = None) -> Plan | None:
    """A generation plan when every needed input and attribute can be made from the schema."""
    opset = opset or governed_opset(opdef)
    schema = opdef.schema_for(opset)
    attrs: dict[str, Any] = {}
    for name, spec in schema.attrs.items():
        if spec.required:
            return None
        if spec.has_default:
            attrs[name] = spec.default
    ins = [p for p in schema.inputs if p.option != "optional"]
    if not ins or list(schema.inputs[: len(ins)]) != ins:
        return None  # no inputs, or an optional input before a required one
    constraints: list[str] = []
    for p in ins:
        if p.type_str in schema.type_constraints:
            if p.type_str not in constraints:
                constraints.append(p.type_str)
        elif _param_dtypes(schema, p.type_str) is None:
            return None
    choices = {}
    for c in constraints:
        ds = _param_dtypes(schema, c)
        if not ds:
            return None
        choices[c] = ds
    bindings: list[dict[str, str]] = []
    if constraints:
        first = constraints[0]
        for d in choices[first]:
            b = {first: d}
            for c in constraints[1:]:
                b[c] = d if d in choices[c] else choices[c][0]
            bindings.append(b)
    else:
        bindings.append({})
    n = len(ins)
    if ins[-1].option == "variadic":
        n = max(n, 2)
    return Plan(schema, bindings, n, attrs, notes={"opset": opset})


def binding_dtypes(p: Plan, binding: Mapping[str, str]) -> list[str]:
    out = []
    for i in range(p.n_inputs):
        param = p.schema.input_param(i)
        assert param is not None
        if param.type_str in binding:
            out.append(binding[param.type_str])
        else:
            ds = _param_dtypes(p.schema, param.type_str)
            out.append(ds[0] if ds else "float32")
    return out


def make_case(
    p: Plan,
    binding: Mapping[str, str],
    shapes: list[tuple[int, ...]],
    rng: np.random.Generator,
    label: str,
    source: str = "generated",
) -> Case:
    dts = binding_dtypes(p, binding)
    inputs = [random_array(rng, d, s) for d, s in zip(dts, shapes)]
    return Case(
        inputs,
        dict(p.attrs),
        label,
        source=source,
        noutputs=max(1, p.schema.min_outputs),
        opset=p.notes.get("opset", 0),
    )


def base_cases(
    p: Plan, rng: np.random.Generator, shape: tuple[int, ...] = BASE_SHAPE
) -> list[Case]:
    """One case per dtype binding, all inputs of `shape`."""
    return [
        make_case(
            p, b, [shape] * p.n_inputs, rng, f"{'/'.join(binding_dtypes(p, b))} {list(shape)}"
        )
        for b in p.bindings
    ]


def boundary_shapes(n_inputs: int, broadcast: bool) -> list[tuple[str, list[tuple[int, ...]]]]:
    """(label, per-input shapes): empty, one, all-ones rank 4, large, rank 0, broadcasting."""
    same = [
        ("empty [0]", (0,)),
        ("[1]", (1,)),
        ("[1,1,1,1]", (1, 1, 1, 1)),
        ("rank 0", ()),
        ("empty [2,0,3]", (2, 0, 3)),
        (f"large [{LARGE}]", (LARGE,)),
    ]
    out = [(lab, [s] * n_inputs) for lab, s in same]
    if broadcast and n_inputs >= 2:
        combos = [
            ("broadcast [3,1]x[1,4]", [(3, 1), (1, 4)]),
            ("broadcast [4]x[3,4]", [(4,), (3, 4)]),
            ("broadcast []x[3,4]", [(), (3, 4)]),
            ("broadcast [2,1,4]x[3,1]", [(2, 1, 4), (3, 1)]),
            ("broadcast [3,4]x[0,1,4]", [(3, 4), (0, 1, 4)]),
        ]
        for lab, shapes in combos:
            out.append((lab, [shapes[i % 2] for i in range(n_inputs)]))
    return out


# ---------------------------------------------------------------- declared samples -----------


def sample_cases(opdef: OpDef, rng: np.random.Generator) -> list[Case]:
    """The operator's declared samples (``OpDef.samples``) as cases, smallest first.

    A samples function that raises, or yields something that is not a Sample, is the op
    author's bug: it is raised as a ContractError naming the operator.
    """
    from opwarden.errors import ContractError
    from opwarden.ops.base import Sample

    if opdef.samples_fn is None:
        return []
    sch = opdef.schema_for(opdef.since)
    defaults = {n: a.default for n, a in sch.attrs.items() if a.has_default}
    out: list[Case] = []
    try:
        samples = list(opdef.samples_fn(rng))
    except Exception as e:  # noqa: BLE001 - reported against the op that declared it
        raise ContractError(
            f"{opdef.qualname}: its samples function raised {type(e).__name__}: {e}"
        ) from e
    for k, smp in enumerate(samples):
        if not isinstance(smp, Sample):
            raise ContractError(
                f"{opdef.qualname}: sample {k} is a {type(smp).__name__}, expected an "
                "opwarden.Sample(inputs, attrs, noutputs, label, constants)"
            )
        inputs = [np.asarray(x) if isinstance(x, (np.generic, float, int)) else x
                  for x in smp.inputs]
        consts = tuple(i for i in smp.constants if 0 <= i < len(inputs)
                       and isinstance(inputs[i], np.ndarray))
        label = smp.label or f"sample {k}"
        case = Case(inputs, {**defaults, **smp.attrs}, label, source="sample",
                    noutputs=smp.noutputs or max(1, sch.min_outputs), opset=opdef.since)
        if consts:
            # Twice: weights computed at run time (plain copies), and initializers.
            out.append(case.copy())
            case.inputs = [mark_constant(x) if i in consts else x for i, x in enumerate(inputs)]
            case.constants, case.label = consts, label + " [constant weights]"
        out.append(case)
    out.sort(key=lambda c: c.size)
    return out


# ---------------------------------------------------------------- ONNX node suite ------------

# node-suite module names are the lower-case op names with a few exceptions; a full import of
# every module costs ~10 s, so single modules are imported when only a few ops are checked.
_SUITE_ALL = False


@functools.cache
def _suite_module_names() -> tuple[str, ...]:
    import pkgutil

    import onnx.backend.test.case.node as pkg

    return tuple(name for _, name, _ in pkgutil.iter_modules(pkg.__path__))


# node-suite modules whose case generation alone takes seconds (onnx's reference pooling)
SLOW_SUITE_MODULES = frozenset({"averagepool", "maxpool", "lppool"})


def _suite_cases(op_types: set[str] | None, fast: bool = False) -> list[Any]:
    """Node-suite TestCases, importing only the modules that may hold `op_types`."""
    global _SUITE_ALL
    import onnx.backend.test.case.node as pkg

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        if op_types is None or _SUITE_ALL:
            if not _SUITE_ALL:
                from onnx.backend.test.loader import load_model_tests

                load_model_tests(kind="node")
                _SUITE_ALL = True
        else:
            by_key: dict[str, list[str]] = {}
            for name in _suite_module_names():
                by_key.setdefault(name.replace("_", ""), []).append(name)
            for t in op_types:
                for mod in by_key.get(t.lower(), []):
                    if fast and mod in SLOW_SUITE_MODULES:
                        continue
                    try:
                        importlib.import_module(f"{pkg.__name__}.{mod}")
                    except Exception:  # noqa: BLE001 - a broken case module is only skipped
                        pass
    return list(pkg._NodeTestCases)


def _to_np(x: Any) -> Any:
    import onnx
    from onnx import numpy_helper

    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x)
    if isinstance(x, list):
        return [_to_np(v) for v in x]
    return x


@functools.cache
def _expected_failures() -> frozenset[str]:
    from opwarden.verify.conformance import read_expected

    return frozenset(read_expected())


def suite_cases(opdef: OpDef, limit: int = 6, fast: bool = False) -> list[Case]:
    """Single-node cases of the ONNX node suite governed by this operator version."""
    from opwarden.ops import REGISTRY
    from opwarden.ops.schema import attr_value, canonical_domain

    out: list[Case] = []
    bad = _expected_failures()
    if fast and opdef.op_type.lower() in SLOW_SUITE_MODULES and not _SUITE_ALL:
        return out
    for tc in _suite_cases({opdef.op_type}, fast):
        if tc.name in bad or "_expanded" in tc.name or tc.model is None:
            continue
        g = tc.model.graph
        if len(g.node) != 1:
            continue
        node = g.node[0]
        if node.op_type != opdef.op_type or canonical_domain(node.domain) != opdef.domain:
            continue
        opset = next(
            (
                o.version
                for o in tc.model.opset_import
                if canonical_domain(o.domain) == opdef.domain
            ),
            0,
        )
        try:
            impl, schema = REGISTRY.resolve(node.op_type, node.domain, opset)
        except Exception:  # noqa: BLE001 - unknown at this opset: not our case
            continue
        if impl is not opdef:
            continue
        if any(a.type in (5, 10) for a in node.attribute):  # GRAPH / GRAPHS need a runtime
            continue
        init = {t.name for t in g.initializer}
        names = [i.name for i in g.input if i.name not in init]
        for inputs, outputs in tc.data_sets[:1]:
            feeds = dict(zip(names, [_to_np(x) for x in inputs]))
            args = [feeds.get(x) if x else None for x in node.input]
            if any(x and x not in feeds for x in node.input):
                continue
            attrs = {k: s.default for k, s in schema.attrs.items() if s.has_default}
            attrs.update({a.name: attr_value(a) for a in node.attribute})
            by_name = dict(zip([o.name for o in g.output], outputs))
            expected = [_to_np(by_name[o]) if o in by_name else ABSENT for o in node.output]
            out.append(
                Case(
                    args,
                    attrs,
                    tc.name,
                    source="suite",
                    expected=expected,
                    rtol=tc.rtol,
                    atol=tc.atol,
                    node=node,
                    opset=opset,
                    noutputs=len(node.output),
                )
            )
    out.sort(key=lambda c: c.size)
    return out[:limit]


def preload_suite() -> None:
    """Generate every node-suite case once (for whole-registry runs)."""
    _suite_cases(None)
