"""Operator contracts: the facts about an operator that ONNX schemas do not record."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opwarden.errors import ContractError

NAN_POLICIES = ("propagate", "produce", "suppress", "none")
OVERFLOW_POLICIES = ("wrap", "saturate", None)
BROADCAST_RULES = ("none", "multidirectional", "unidirectional")
LAYOUTS = ("any", "NCHW", "NHWC")
TOLERANCES = ("elementwise", "normwise")


def workspace_of(rule: int | Callable[..., int], shapes: list[tuple[int, ...]],
                 attrs: Mapping[str, Any]) -> int:
    """Bytes a workspace declaration (a constant or f(*input_shapes, **attrs)) gives."""
    return int(rule(*shapes, **attrs)) if callable(rule) else int(rule)


@dataclass(frozen=True)
class Allowed:
    """Allowed values of one attribute: a set of values, or a predicate with a description."""

    values: tuple = ()
    predicate: Callable[[Any], bool] | None = None
    description: str = ""

    def accepts(self, value: Any) -> bool:
        """Whether the attribute value is allowed (each item, for a list value)."""
        if self.predicate is not None:
            return bool(self.predicate(value))
        if isinstance(value, (list, tuple)):
            return all(v in self.values for v in value)
        return value in self.values

    def describe(self) -> str:
        """What is allowed, in words (for errors and `opwarden ops`)."""
        if self.description:
            return self.description
        return "one of " + ", ".join(repr(v) for v in self.values)


def one_of(*values: Any) -> Allowed:
    """Allowed values given as a finite set."""
    return Allowed(values=tuple(values))


def such_that(predicate: Callable[[Any], bool], description: str) -> Allowed:
    """Allowed values given as a predicate, described for error messages."""
    return Allowed(predicate=predicate, description=description)


@dataclass(frozen=True)
class Contract:
    """What an operator promises beyond its ONNX schema; checked by the loader, guard and verifier.

    - ``layout``: the data layout its tensor inputs must have ("any" when it does not care).
    - ``may_alias``: (input, output) pairs whose buffers may be shared (in-place allowed).
    - ``must_alias``: (input, output) pairs where the output is a view of the input.
      Output -1 stands for every output (Split: each output is a view of its input).
    - ``view_when``: ``f(attrs, input_shape) -> bool`` for an operator whose output 0 is a
      view of a C-contiguous input 0 when it holds (Reshape: always; Transpose: when the
      permutation keeps the order of the non-1 dims). The memory plan then shares input 0's
      buffer (a kernel that copies anyway, for a strided input, is still correct).
    - ``mutates``: inputs the kernel writes to (a correct operator mutates none).
    - ``workspace_bytes``: scratch memory, a constant or ``f(*input_shapes, **attrs) -> int``.
    - ``nan``: "propagate" (NaN in -> NaN out, none created), "produce" (the math can create
      NaN from finite inputs), "suppress" (NaN inputs may vanish), "none" (no floating output).
    - ``overflow``: integer overflow behaviour, "wrap", "saturate" or None (cannot overflow).
    - ``broadcast``: "none", "multidirectional" (numpy) or "unidirectional" (B to A).
    - ``allowed``: attribute name -> Allowed rule (values outside raise ModelError at load).
    - ``tolerance``: how variants are compared with the reference. "elementwise": each value
      within rtol of itself. "normwise": each value within rtol of the output's largest
      magnitude, for sums of products (convolutions), whose rounding error scales with the
      summands, not with a result that cancels to near zero; fast algorithms (Winograd's
      transforms, reordered or blocked sums) are correct to that bound, as BLAS is tested.
    """

    layout: str = "any"
    may_alias: tuple[tuple[int, int], ...] = ()
    must_alias: tuple[tuple[int, int], ...] = ()
    view_when: Callable[[Mapping[str, Any], tuple[int, ...]], bool] | None = None
    mutates: tuple[int, ...] = ()
    workspace_bytes: int | Callable[..., int] = 0
    thread_safe: bool = True
    nan: str = "propagate"
    overflow: str | None = None
    broadcast: str = "none"
    allowed: Mapping[str, Allowed] = field(default_factory=dict)
    deterministic: bool = True
    tolerance: str = "elementwise"

    def __post_init__(self) -> None:
        if self.tolerance not in TOLERANCES:
            raise ContractError(
                f"Contract.tolerance must be one of {TOLERANCES}, got {self.tolerance!r}"
            )
        if self.nan not in NAN_POLICIES:
            raise ContractError(f"Contract.nan must be one of {NAN_POLICIES}, got {self.nan!r}")
        if self.overflow not in OVERFLOW_POLICIES:
            raise ContractError(
                f"Contract.overflow must be one of {OVERFLOW_POLICIES}, got {self.overflow!r}"
            )
        if self.broadcast not in BROADCAST_RULES:
            raise ContractError(
                f"Contract.broadcast must be one of {BROADCAST_RULES}, got {self.broadcast!r}"
            )
        if self.layout not in LAYOUTS:
            raise ContractError(f"Contract.layout must be one of {LAYOUTS}, got {self.layout!r}")
        allowed = {}
        for name, rule in dict(self.allowed).items():
            if not isinstance(rule, Allowed):
                rule = one_of(*rule)
            allowed[name] = rule
        object.__setattr__(self, "allowed", allowed)

    def views(self, n_outputs: int) -> list[tuple[int, int]]:
        """The ``must_alias`` pairs of a node with `n_outputs` outputs (output -1 expanded)."""
        out: list[tuple[int, int]] = []
        for i, o in self.must_alias:
            if o == -1:
                out.extend((i, k) for k in range(n_outputs))
            else:
                out.append((i, o))
        return out

    def aliases(self, n_outputs: int) -> set[tuple[int, int]]:
        """Every (input, output) pair allowed to share memory: ``may_alias`` and the views."""
        return set(self.may_alias) | set(self.views(n_outputs))

    def workspace(self, shapes: list[tuple[int, ...]], attrs: Mapping[str, Any]) -> int:
        """Workspace bytes for these input shapes."""
        return workspace_of(self.workspace_bytes, shapes, attrs)

    def describe(self) -> dict[str, Any]:
        """JSON-friendly summary (for `opwarden ops --json`)."""
        return {
            "layout": self.layout,
            "may_alias": [list(p) for p in self.may_alias],
            "must_alias": [list(p) for p in self.must_alias],
            "view_when": self.view_when is not None,
            "mutates": list(self.mutates),
            "workspace_bytes": "f(shapes)"
            if callable(self.workspace_bytes)
            else self.workspace_bytes,
            "thread_safe": self.thread_safe,
            "nan": self.nan,
            "overflow": self.overflow,
            "broadcast": self.broadcast,
            "allowed": {k: v.describe() for k, v in self.allowed.items()},
            "deterministic": self.deterministic,
        }


# Contracts shared by many operators.
ELEMENTWISE = Contract(may_alias=((0, 0),), broadcast="multidirectional", overflow="wrap")
UNARY = Contract(may_alias=((0, 0),))
UNARY_PRODUCES_NAN = Contract(may_alias=((0, 0),), nan="produce")
VIEW = Contract(must_alias=((0, 0),), nan="propagate")
DEFAULT = Contract()


@dataclass(frozen=True)
class TensorFact:
    """Static facts about a tensor: dtype name and shape (ints, symbolic names or None)."""

    dtype: str | None
    shape: tuple | None = None

    @property
    def ndim(self) -> int | None:
        """The rank, None when the shape is unknown."""
        return None if self.shape is None else len(self.shape)

    @property
    def static(self) -> bool:
        """Every dimension is a known int."""
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def __str__(self) -> str:
        dims = "?" if self.shape is None else "[" + ",".join(str(d) for d in self.shape) + "]"
        return f"{self.dtype or '?'}{dims}"


# Dims only a declaration gives: part of a fact, so they live beside TensorFact.


class Declared:
    """A dimension only the model's declaration gives (value_info, a graph output's type) where
    shape inference could not tell it. Neither an int nor a symbol, so everything that reads
    facts (memory planning, workspaces, memory limits, shape folding, the output checks)
    treats it as unknown, as ONNX Runtime trusts a run over a stale declaration; it still
    carries the declared `value` (reports, the one-time output warning), and it survives the
    passes that copy or permute dims. Equal only to itself."""

    __slots__ = ("value",)

    def __init__(self, value: int | str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)

    def __str__(self) -> str:
        return str(self.value)


def verified(d: Any) -> bool:
    """Is `d` a dim the facts vouch for (an int, or a symbol inference gave)?"""
    return type(d) is int or type(d) is str


def has_declared(shape: Any) -> bool:
    """Does a fact's shape hold a dim only the model's declaration gives?"""
    return shape is not None and any(type(d) is Declared for d in shape)


def declared_value(d: Any) -> Any:
    """The dim as the model declared it (an int, a symbol or None)."""
    return d.value if type(d) is Declared else d


def mark_declared(shape: Any, axes: Any = None) -> Any:
    """`shape` with the dims at `axes` (all when None) marked declared-only."""
    if shape is None:
        return None
    return tuple(Declared(d) if (axes is None or i in axes) and verified(d) else d
                 for i, d in enumerate(shape))
