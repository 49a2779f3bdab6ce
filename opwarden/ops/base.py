"""One operator, one object: schema + contract + reference kernel + rules + variants.

The rules an operator carries: its shape rule (``infer``), its backward rule and gradcheck
cases (``grad``, ``grad_cases``; helpers in ops/grad.py), its samples, the inputs a layout
places (``layout_inputs``), its cost (``flops``: what the trace report and `opwarden bench`
count as its work) and, for a fused operator, the operators it computes (``pieces``: what a
device must run for it to run the fused node); each ops file declares them beside the operator.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opwarden.contract import DEFAULT, Contract, workspace_of
from opwarden.errors import ContractError, ModelError, UnsupportedOpError
from opwarden.ops import schema as _schema
from opwarden.ops.schema import Schema, canonical_domain

ANY_DTYPE = None


@dataclass
class Sample:
    """One valid call of an operator: positional inputs (None for an omitted optional input),
    attributes, and for ops whose output count varies the number of outputs wanted.

    Declared with an operator through ``OpDef.samples`` where its inputs cannot be made from
    the schema alone (a convolution's W must match X's channels, a program attribute must be
    a program); `opwarden check` runs every variant on them against the reference kernel.

    ``constants``: the inputs that are initializers in a model (weights, biases). The sample is
    then checked twice: as plain arrays (weights computed at run time) and with those inputs
    declared constant (``memory.constants``) as a session declares its initializers, which is
    what the kernel paths that cache work on constant weights (packing, transforms) need.
    """

    inputs: list[Any]
    attrs: dict[str, Any] = field(default_factory=dict)
    noutputs: int | None = None
    label: str = ""
    constants: tuple[int, ...] = ()


@dataclass
class Variant:
    """A kernel variant: one way to run an operator on a device for some dtypes and a layout."""

    name: str
    op: OpDef
    fn: Callable[..., Any]
    device: str = "cpu"
    dtypes: frozenset[str] | Mapping[str, frozenset[str]] | None = None
    layout: str = "any"
    priority: int = 0
    when: Callable[..., bool] | None = None
    reference: bool = False
    accepts_out: bool = False
    wants_noutputs: bool = False
    # out= may be a strided view (a slice of a Concat's output along its axis; last axis
    # contiguous) that the kernel writes into and returns; see opwarden/memory/lifetimes.py
    strided_out: bool = False
    # in_place_when(attrs) -> bool: whether the memory plan should write an output over a
    # dying input the contract lets it share (may_alias) for a node with these attributes;
    # None: always. Allowing an alias is the contract's (correctness); using it is the
    # kernel's call (speed): some kernels run slower in place for some attributes.
    in_place_when: Callable[[Mapping[str, Any]], bool] | None = None
    # Scratch this variant needs beyond its outputs, a constant or f(*input_shapes, **attrs)
    # -> bytes, as Contract.workspace_bytes; None: the operator contract's. A fast kernel whose
    # paths (bands, transformed tiles, padded copies) need more than the reference declares
    # says so here, and `opwarden check` measures every variant against its own declaration.
    workspace_bytes: int | Callable[..., int] | None = None
    # specialize(kwargs) -> fn: a kernel bound to one node, made once when a session compiles
    # the node (kwargs: its attributes, fixed from then on). It takes the same arguments and
    # must return the same results as `fn`; what it may add is a plan prepared from the
    # attributes and from the first call's shapes and constant inputs, so that later calls skip
    # the work that depends on nothing else (plan lookups, packed-weight caches, attribute
    # parsing). None: the node calls `fn`.
    specialize: Callable[[Mapping[str, Any]], Callable[..., Any]] | None = None
    # "builtin" (registered by opwarden itself) or "custom" (by user code: a module outside the
    # opwarden package, __main__, a test); "" at construction means: judge by fn's module.
    # SessionOptions(isolate=["custom"]) selects the custom ones.
    origin: str = ""

    def __post_init__(self) -> None:
        if not self.origin:
            self.origin = _origin_of(getattr(self.fn, "__module__", None))

    def workspace(self, shapes: list[tuple[int, ...]], attrs: Mapping[str, Any]) -> int:
        """Workspace bytes this variant declares for these input shapes."""
        if self.workspace_bytes is None:
            return self.op.contract.workspace(shapes, attrs)
        return workspace_of(self.workspace_bytes, shapes, attrs)

    def describe(self) -> dict[str, Any]:
        if isinstance(self.dtypes, Mapping):
            dts: Any = {k: sorted(v) for k, v in self.dtypes.items()}
        else:
            dts = sorted(self.dtypes) if self.dtypes else "any"
        return {
            "name": self.name,
            "device": self.device,
            "dtypes": dts,
            "layout": self.layout,
            "priority": self.priority,
            "when": self.when is not None,
            "reference": self.reference,
            "in_place_when": self.in_place_when is not None,
            "specialize": self.specialize is not None,
            "origin": self.origin,
            "workspace_bytes": "contract" if self.workspace_bytes is None
            else "f(shapes)" if callable(self.workspace_bytes) else self.workspace_bytes,
        }


def _origin_of(module: str | None) -> str:
    """ "builtin" for a module of the opwarden package, else "custom"."""
    m = module or ""
    return "builtin" if m == "opwarden" or m.startswith("opwarden.") else "custom"


def _wants_noutputs(fn: Callable[..., Any]) -> bool:
    try:
        return "noutputs" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class OpDef:
    """An operator at one version range: its schema, contract, reference kernel and variants."""

    def __init__(
        self,
        op_type: str,
        domain: str,
        since: int,
        reference: Callable[..., Any],
        contract: Contract,
        schema: Schema | None,
        layout_inputs: tuple[int, ...] = (),
    ) -> None:
        self.op_type = op_type
        self.domain = domain
        self.since = since
        self.reference = reference
        self.contract = contract
        self.custom_schema = schema  # None for standard ops: the ONNX schema is looked up per opset
        self.infer_fn: Callable[..., Any] | None = None
        self.grad_fn: Callable[..., Any] | None = None
        # f(op_type, since) -> Samples the backward rule is gradchecked on (ops.grad)
        self.grad_cases_fn: Callable[[str, int], list[Sample]] | None = None
        # The activation inputs whose channel axis a layout (NCHW / NHWC) places; output 0 is
        # the activation output. Empty: the op does not care about layout.
        self.layout_inputs = tuple(layout_inputs)
        self.samples_fn: Callable[[Any], Iterable[Sample]] | None = None
        # f(input_shapes, output_shapes) -> FLOPs of one call (None where the shapes do not
        # tell); None: the reports count one FLOP per output element (trace.report.op_flops)
        self.flops_fn: Callable[[list[Any], list[Any]], float | None] | None = None
        # f(node) -> [(op_type, attrs, inputs)]: the standard operators a fused node computes,
        # in order; a device runs the node when it runs each (devices.base.Device.accepts)
        self.pieces_fn: Callable[[Any], list[tuple[str, dict[str, Any], list[Any]]]] | None = None
        self.variants: list[Variant] = []
        self.__doc__ = reference.__doc__
        self.__name__ = op_type
        self.variants.append(
            Variant(
                name=f"{op_type.lower()}.ref",
                op=self,
                fn=reference,
                device="cpu",
                priority=-1000,
                reference=True,
                wants_noutputs=_wants_noutputs(reference),
            )
        )

    @property
    def qualname(self) -> str:
        dom = f"{self.domain}::" if self.domain else ""
        return f"{dom}{self.op_type}-{self.since}"

    def __repr__(self) -> str:
        return f"<op {self.qualname}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the reference kernel."""
        return self.reference(*args, **kwargs)

    def schema_for(self, opset: int) -> Schema:
        """The schema that governs this op in a model importing `opset` of its domain."""
        if self.custom_schema is not None:
            return self.custom_schema
        s = _schema.from_onnx(self.op_type, self.domain, opset)
        if s is None:
            raise ModelError(f"no ONNX schema for {self.op_type} at opset {opset}")
        return s

    def kernel(
        self,
        device: str = "cpu",
        *,
        dtypes: Iterable[str] | Mapping[str, Iterable[str]] | None = None,
        layout: str = "any",
        priority: int = 0,
        when: Callable[..., bool] | None = None,
        name: str | None = None,
        accepts_out: bool = False,
        strided_out: bool = False,
        in_place_when: Callable[[Mapping[str, Any]], bool] | None = None,
        workspace_bytes: int | Callable[..., int] | None = None,
        specialize: Callable[[Mapping[str, Any]], Callable[..., Any]] | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering a variant of this operator (`workspace_bytes`, `specialize`:
        see Variant)."""

        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            vname = name or f"{self.op_type.lower()}.{device}.{fn.__name__.strip('_') or 'v'}"
            if any(v.name == vname for v in self.variants):
                # Re-registration replaces: users may override a variant by name.
                self.variants = [v for v in self.variants if v.name != vname]
            self.variants.append(
                Variant(
                    name=vname,
                    op=self,
                    fn=fn,
                    device=device,
                    dtypes=_norm_dtypes(dtypes),
                    layout=layout,
                    priority=priority,
                    when=when,
                    accepts_out=accepts_out,
                    wants_noutputs=_wants_noutputs(fn),
                    strided_out=strided_out and accepts_out,
                    in_place_when=in_place_when,
                    workspace_bytes=workspace_bytes,
                    specialize=specialize,
                    # The registering module, not fn's: a built-in may register a NumPy
                    # function, a user may register a kernel written elsewhere.
                    origin=_origin_of(sys._getframe(1).f_globals.get("__name__")),
                )
            )
            return fn

        return deco

    def infer(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator setting the shape/type rule: f(*input_facts, **attrs) -> fact or tuple."""
        self.infer_fn = fn
        return fn

    def grad(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator setting the backward rule: f(ctx, *dOutputs, **attrs) -> one grad per input."""
        self.grad_fn = fn
        return fn

    def grad_cases(self, fn: Callable[[str, int], list[Sample]]) -> Callable[..., Any]:
        """Decorator setting the gradcheck cases of the backward rule: f(op_type, since) ->
        Samples (float64, away from the op's kinks)."""
        self.grad_cases_fn = fn
        return fn

    def samples(self, fn: Callable[[Any], Iterable[Sample]]) -> Callable[..., Any]:
        """Decorator setting the sample inputs: f(rng: numpy Generator) -> Samples, valid calls
        that together reach every path of the variants (what `opwarden check` validates them
        on when neither the schema nor the ONNX node suite gives inputs)."""
        self.samples_fn = fn
        return fn

    def flops(
        self, fn: Callable[[list[Any], list[Any]], float | None]
    ) -> Callable[[list[Any], list[Any]], float | None]:
        """Decorator setting the cost rule: f(input_shapes, output_shapes) -> FLOPs of one call
        (shapes as lists of dims, None for an omitted input), None where the shapes do not
        tell (the reports then count output elements)."""
        self.flops_fn = fn
        return fn

    def pieces(
        self, fn: Callable[[Any], list[tuple[str, dict[str, Any], list[Any]]]]
    ) -> Callable[[Any], list[tuple[str, dict[str, Any], list[Any]]]]:
        """Decorator setting a fused operator's decomposition for capability checks: f(node) ->
        [(op_type, attrs, input values)], the standard operators it computes in order."""
        self.pieces_fn = fn
        return fn

    def function_body(self, opset: int):
        """The ONNX function body (decomposition) at this opset, if the spec gives one."""
        if self.custom_schema is not None:
            return None
        return _schema.onnx_function_body(self.op_type, self.domain, opset)


def shape_size(shape: Any) -> int:
    """Elements of a recorded shape (its int dims; 0 for no shape): for cost rules."""
    if not isinstance(shape, (list, tuple)):
        return 0
    return int(math.prod(d for d in shape if isinstance(d, int)))


def _norm_dtypes(dtypes: Any) -> frozenset[str] | Mapping[str, frozenset[str]] | None:
    if dtypes is None:
        return None
    if isinstance(dtypes, str):
        return frozenset({dtypes})
    if isinstance(dtypes, Mapping):
        return {k: frozenset([v] if isinstance(v, str) else v) for k, v in dtypes.items()}
    return frozenset(dtypes)


class Registry:
    """All operators, by (domain, op_type), each a list of OpDefs sorted by `since`."""

    def __init__(self) -> None:
        self._ops: dict[tuple[str, str], list[OpDef]] = {}
        self._domains: dict[str, list[str]] = {}  # op_type -> its domains, the standard first

    def add(self, opdef: OpDef) -> None:
        key = (opdef.domain, opdef.op_type)
        versions = [o for o in self._ops.get(key, []) if o.since != opdef.since]
        versions.append(opdef)
        versions.sort(key=lambda o: o.since)
        self._ops[key] = versions
        doms = self._domains.setdefault(opdef.op_type, [])
        if opdef.domain not in doms:
            doms.append(opdef.domain)
            doms.sort(key=lambda d: d != "")

    def versions(self, op_type: str, domain: str = "") -> list[OpDef]:
        return list(self._ops.get((canonical_domain(domain), op_type), []))

    def all(self) -> list[OpDef]:
        return [o for key in sorted(self._ops) for o in self._ops[key]]

    def latest(self, op_type: str, domain: str = "") -> OpDef | None:
        v = self._ops.get((canonical_domain(domain), op_type))
        return v[-1] if v else None

    def named(self, op_type: str) -> list[OpDef]:
        """The latest OpDef called `op_type` in each domain, the standard one first: for what
        names only an op type (a trace record; com.microsoft and opwarden both have a
        FusedMatMul)."""
        found = (self._ops.get((d, op_type)) for d in self._domains.get(op_type, ()))
        return [vs[-1] for vs in found if vs]

    def resolve(self, op_type: str, domain: str, opset: int) -> tuple[OpDef | None, Schema]:
        """(operator object, governing schema) for a node; raises ModelError for unknown ops.

        Standard ops: the ONNX schema at the model's opset names a `since_version`; the op object
        with the highest `since` not above it implements it. The op object may be None when we
        know the schema but have no implementation (the caller may still decompose the node).
        """
        domain = canonical_domain(domain)
        versions = self._ops.get((domain, op_type), [])
        if domain in _schema.STANDARD_DOMAINS:
            sch = _schema.from_onnx(op_type, domain, opset)
            if sch is None:
                if versions and versions[0].custom_schema is not None:
                    return self._custom(versions, op_type, domain, opset)
                dom = domain or "ai.onnx"
                raise UnsupportedOpError(
                    f"unknown operator {op_type!r} in domain {dom!r} at opset {opset}"
                )
            impl = [o for o in versions if o.since <= sch.since]
            return (impl[-1] if impl else None), sch
        return self._custom(versions, op_type, domain, opset)

    @staticmethod
    def _custom(versions: list[OpDef], op_type: str, domain: str, opset: int):
        impl = [o for o in versions if o.since <= opset]
        if not impl:
            if versions:
                raise UnsupportedOpError(
                    f"operator {domain}::{op_type} is registered from version "
                    f"{versions[0].since}, but the model imports {domain} at opset {opset}"
                )
            raise UnsupportedOpError(
                f"unknown operator {op_type!r} in domain {domain!r}: no operator registered "
                f"(register one with @opwarden.op)"
            )
        o = impl[-1]
        assert o.custom_schema is not None
        return o, o.custom_schema


REGISTRY = Registry()


def op(
    op_type: str,
    *,
    since: int | None = None,
    domain: str = "",
    contract: Contract | None = None,
    inputs: list[str] | None = None,
    outputs: list[str] | None = None,
    types: Mapping[str, Iterable[str]] | None = None,
    attrs: Mapping[str, Any] | None = None,
    layout_inputs: tuple[int, ...] = (),
) -> Callable[[Callable[..., Any]], OpDef]:
    """Declare an operator whose reference kernel is the decorated NumPy function.

    Standard-domain ops take their schema from `onnx.defs` (``since`` must be a version at which
    ONNX changed the op). Custom domains declare the schema here: ``inputs``/``outputs`` as
    ``"name: T"`` strings (suffix ``?`` optional, prefix ``*`` variadic), ``types`` mapping
    constraint names to dtype names, ``attrs`` mapping names to defaults (or ``(type, default)``).
    ``layout_inputs``: the inputs whose channel axis a layout places (see OpDef.layout_inputs).
    """
    domain = canonical_domain(domain)

    def deco(fn: Callable[..., Any]) -> OpDef:
        if domain in _schema.STANDARD_DOMAINS and inputs is None:
            ver = since if since is not None else 10**6
            sch = _schema.from_onnx(op_type, domain, ver)
            if sch is None:
                raise ContractError(f"ONNX defines no operator {op_type!r} in domain {domain!r}")
            if since is not None and sch.since != since:
                raise ContractError(
                    f"{op_type}: ONNX has no version {since} (the schema at {since} "
                    f"is version {sch.since})"
                )
            _check_allowed_names(op_type, contract, sch)
            opdef = OpDef(op_type, domain, sch.since, fn, contract or DEFAULT, None, layout_inputs)
        else:
            from opwarden.ops.custom import build_schema

            sch = build_schema(op_type, domain, since or 1, inputs, outputs, types, attrs, fn)
            opdef = OpDef(op_type, domain, since or 1, fn, contract or DEFAULT, sch, layout_inputs)
        REGISTRY.add(opdef)
        return opdef

    return deco


def _check_allowed_names(op_type: str, contract: Contract | None, sch: Schema) -> None:
    if contract is None:
        return
    for name in contract.allowed:
        if name not in sch.attrs:
            raise ContractError(f"{op_type}: contract restricts unknown attribute {name!r}")


def kernel(
    op_type: str,
    device: str = "cpu",
    *,
    dtypes: Iterable[str] | Mapping[str, Iterable[str]] | None = None,
    layout: str = "any",
    priority: int = 0,
    when: Callable[..., bool] | None = None,
    name: str | None = None,
    domain: str = "",
    since: int | None = None,
    accepts_out: bool = False,
    strided_out: bool = False,
    in_place_when: Callable[[Mapping[str, Any]], bool] | None = None,
    workspace_bytes: int | Callable[..., int] | None = None,
    specialize: Callable[[Mapping[str, Any]], Callable[..., Any]] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a kernel variant for an existing operator (its latest version unless `since`)."""
    versions = REGISTRY.versions(op_type, domain)
    if not versions:
        raise ContractError(f"cannot add a kernel: no operator {op_type!r} in domain {domain!r}")
    if since is None:
        target = versions[-1]
    else:
        match = [o for o in versions if o.since == since]
        if not match:
            have = [o.since for o in versions]
            raise ContractError(f"{op_type} has no version {since} (versions: {have})")
        target = match[0]
    return target.kernel(
        device,
        dtypes=dtypes,
        layout=layout,
        priority=priority,
        when=when,
        name=name,
        accepts_out=accepts_out,
        strided_out=strided_out,
        in_place_when=in_place_when,
        workspace_bytes=workspace_bytes,
        specialize=specialize,
    )


@dataclass
class Selection:
    """The outcome of choosing a variant for one node: the winner and why others lost."""

    variant: Variant | None
    rejected: list[tuple[str, str]] = field(default_factory=list)
