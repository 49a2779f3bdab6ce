"""Fused operator FusedElementwise (domain "opwarden"): a chain of elementwise ops of one
output shape, created by the fusion pass, as a small program.

The reference kernel runs the program through the built-in operators' reference kernels, so
the fused chain equals the unfused nodes exactly; the fast variant runs it in place in the
output buffer (`fused_elementwise_inplace`).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import numpy as np

from opwarden.contract import Contract, TensorFact, such_that
from opwarden.errors import KernelError
from opwarden.ops import activation as _act
from opwarden.ops import elementwise as _ew
from opwarden.ops.base import REGISTRY, Sample, op
from opwarden.ops.common import KEYWORD_OUT, SHAPED_MAX, broadcast_shapes, normal

DOMAIN = "opwarden"


# ---------------------------------------------------------------------------------------------
# FusedElementwise
#
# `program` is a ';'-separated list of statements `tK=op(arg, ...)`; an argument is an input
# (`x0`, `x1`, ...), an earlier temporary (`tJ`) or a number literal. The last statement is the
# output. Every temporary has the output's shape (the passes only fuse nodes that do), so the
# fast kernel can evaluate the chain in place, chunk by chunk, without broadcasting surprises.


def _hardswish(x, out=None):
    # x is read again at the end, so the gate cannot be built in x's own buffer.
    t = np.asarray(np.divide(x, x.dtype.type(6), out=None if out is x else out))
    t += x.dtype.type(0.5)
    np.clip(t, 0, 1, out=t)
    return np.multiply(t, x, out=out if out is not None else t)


def _sigmoid(x, out=None):
    # 1/(1+e^-x): overflow to inf gives an exact 0; NaN stays NaN.
    t = np.negative(x, out=out)
    np.exp(t, out=t)
    t += t.dtype.type(1)
    return np.reciprocal(t, out=t)


def _leakyrelu(x, alpha, out=None):
    neg = x < 0
    if out is None:
        out = np.empty_like(x)
    np.copyto(out, x)
    np.multiply(out, out.dtype.type(alpha), out=out, where=neg)
    return out


def _relu(x, out=None):
    if out is not None:
        return _act.relu(x, out)  # the chunked maximum against zeros (float32 fast path)
    return np.maximum(x, x.dtype.type(0))


def _clip(x, lo, hi, out=None):
    t = np.maximum(x, x.dtype.type(lo), out=out)
    return np.minimum(t, x.dtype.type(hi), out=t)


def _hardsigmoid(x, alpha, beta, out=None):
    t = np.multiply(x, x.dtype.type(alpha), out=out)
    t += x.dtype.type(beta)
    return np.clip(t, 0, 1, out=t)


def _ref_clip(x, lo, hi):
    return _act.Clip(x, np.asarray(lo, x.dtype), np.asarray(hi, x.dtype))


_REF = _act.REFERENCES

# name -> (tensor arguments, number parameters, fast fn(*tensors, *params, out=), reference fn)
# The reference functions are the built-in operators' reference kernels, so a fused chain run
# by the reference variant equals the unfused nodes exactly.
PRIMITIVES: dict[str, tuple[int, int, Any, Any]] = {
    "add": (2, 0, np.add, _ew.Add),
    "sub": (2, 0, np.subtract, _ew.Sub),
    "mul": (2, 0, np.multiply, _ew.Mul),
    "div": (2, 0, np.divide, _ew.Div),
    "max": (2, 0, np.maximum, _ew.Max),
    "min": (2, 0, np.minimum, _ew.Min),
    "neg": (1, 0, np.negative, _ew.Neg),
    "abs": (1, 0, np.absolute, _ew.Abs),
    "exp": (1, 0, np.exp, _ew.Exp),
    "log": (1, 0, np.log, _ew.Log),
    "sqrt": (1, 0, np.sqrt, _ew.Sqrt),
    "reciprocal": (1, 0, np.reciprocal, _ew.Reciprocal),
    "tanh": (1, 0, np.tanh, _REF["Tanh"]),
    "relu": (1, 0, _relu, _REF["Relu"]),
    "sigmoid": (1, 0, _sigmoid, _REF["Sigmoid"]),
    "hardswish": (1, 0, _hardswish, _REF["HardSwish"]),
    "leakyrelu": (1, 1, _leakyrelu, lambda x, a: _act.LeakyRelu(x, alpha=a)),
    "clip": (1, 2, _clip, _ref_clip),
    "hardsigmoid": (1, 2, _hardsigmoid, lambda x, a, b: _act.HardSigmoid(x, alpha=a, beta=b)),
}

_STMT = re.compile(r"^\s*(t\d+)\s*=\s*([a-z]+)\((.*)\)\s*$")


@lru_cache(maxsize=1024)
def parse_program(program: str) -> tuple[tuple[str, str, tuple[Any, ...]], ...]:
    """Statements (dest, op, args) of a program; args are 'xN'/'tN' names or floats."""
    stmts = []
    defined: set[str] = set()
    for k, text in enumerate(s for s in program.split(";") if s.strip()):
        m = _STMT.match(text)
        if m is None:
            raise KernelError(f"FusedElementwise: statement {k} {text!r} is not 'tN=op(args)'")
        dest, name, body = m.groups()
        if name not in PRIMITIVES:
            raise KernelError(
                f"FusedElementwise: statement {k} uses unknown op {name!r}; known: "
                f"{', '.join(sorted(PRIMITIVES))}"
            )
        args: list[Any] = []
        for a in (x.strip() for x in body.split(",") if x.strip()):
            if a[0] in "xt" and a[1:].isdigit():
                if a[0] == "t" and a not in defined:
                    raise KernelError(f"FusedElementwise: statement {k} reads {a} before it is set")
                args.append(a)
            else:
                try:
                    args.append(float(a))
                except ValueError:
                    raise KernelError(f"FusedElementwise: bad argument {a!r} in {text!r}") from None
        ntensor, nparam = PRIMITIVES[name][:2]
        if len(args) != ntensor + nparam or not all(isinstance(a, str) for a in args[:ntensor]):
            raise KernelError(
                f"FusedElementwise: {name} takes {ntensor} tensor and {nparam} number arguments, "
                f"got {text!r}"
            )
        defined.add(dest)
        stmts.append((dest, name, tuple(args)))
    if not stmts:
        raise KernelError("FusedElementwise: empty program")
    return tuple(stmts)


def _program_ok(program: Any) -> bool:
    try:
        parse_program(str(program))
    except KernelError:
        return False
    return True


@op(
    "FusedElementwise",
    domain=DOMAIN,
    since=1,
    inputs=["*inputs: T"],
    outputs=["Y: T"],
    types={"T": ["float32", "float64"]},
    attrs={"program": ("STRING", "")},
    contract=Contract(
        nan="produce",
        broadcast="multidirectional",
        allowed={"program": such_that(_program_ok, "a valid elementwise program")},
    ),
)
def FusedElementwise(*inputs, program=""):
    """An elementwise chain as one node: `program` over the inputs, NumPy broadcasting."""
    env: dict[str, Any] = {f"x{i}": x for i, x in enumerate(inputs)}
    result = None
    with np.errstate(all="ignore"):
        for dest, name, args in parse_program(program):
            ntensor, _, _, fn = PRIMITIVES[name]
            vals = []
            for a in args[:ntensor]:
                if a not in env:
                    raise KernelError(f"FusedElementwise: {a} is not given ({len(inputs)} inputs)")
                vals.append(np.asarray(env[a]))
            result = np.asarray(fn(*vals, *args[ntensor:]))
            env[dest] = result
    return result


@FusedElementwise.infer
def _fused_elementwise_infer(*facts, program=""):
    shape = broadcast_shapes(*[f.shape for f in facts])
    return TensorFact(facts[0].dtype if facts else None, shape)


@FusedElementwise.samples
def _fused_elementwise_samples(rng):
    r = normal(rng)
    yield Sample([r(3, 4), r(4)], {"program": "t0=add(x0,x1);t1=relu(t0)"}, label="add relu")
    yield Sample([r(2, 3, 4), r(3, 1), r(1)],
                 {"program": "t0=mul(x0,x1);t1=add(t0,x2);t2=sigmoid(t1);t3=mul(t2,x0)"},
                 label="broadcast mul add, swish-like")
    yield Sample([np.abs(r(5, 6)) + 0.1],
                 {"program": "t0=sqrt(x0);t1=log(t0);t2=neg(t1);t3=exp(t2);t4=reciprocal(t3)"},
                 label="unary chain")
    yield Sample([r(4, 8), r(4, 8)],
                 {"program": "t0=sub(x0,x1);t1=abs(t0);t2=clip(t1,0.0,6.0);t3=div(t2,x1);"
                             "t4=max(t3,x0);t5=min(t4,x1);t6=tanh(t5)"}, label="binary chain")
    yield Sample([r(64, 64)], {"program": "t0=hardswish(x0);t1=leakyrelu(t0,0.1);"
                                          "t2=hardsigmoid(t1,0.2,0.5)"}, label="activations")
    # SiLU as exporters write it (Sigmoid then Mul), over the range where sigmoid saturates
    yield Sample([r(4, 300) * 40], {"program": "t0=sigmoid(x0);t1=mul(x0,t0)"}, label="silu")
    d = normal(rng, np.float64)
    yield Sample([d(3, 4), d(3, 4)], {"program": "t0=add(x0,x1);t1=tanh(t0)"}, label="float64")


# The fast variant runs the program in the output buffer with in-place ufuncs (a linear chain
# needs no other memory), whole tensors at a time: chunking into cache-sized slabs (numexpr
# style) only pays for tensors that do not stay in cache, and costs a dispatch per chunk.


def last_reads(stmts) -> dict[str, int]:
    """Name -> index of the last statement of a parsed program that reads it."""
    last: dict[str, int] = {}
    for k, (_, _, args) in enumerate(stmts):
        for a in args:
            if isinstance(a, str):
                last[a] = k
    return last


def _compile(program: str):
    """Statements with each temporary mapped to a register: the output buffer (-1) first, then
    scratch buffers, reusing dead ones; a linear chain runs entirely in the output buffer."""
    stmts = parse_program(program)
    last = last_reads(stmts)
    reg_of: dict[str, int] = {}
    free: list[int] = [-1]
    nregs = 0
    plan = []
    for k, (dest, name, args) in enumerate(stmts):
        srcs = tuple(reg_of[a] if isinstance(a, str) and a[0] == "t" else a for a in args)
        # Temporaries whose last reader is this statement can hold its result (ufuncs allow
        # exact in-place operation).
        for a in set(args):
            if isinstance(a, str) and a[0] == "t" and last.get(a) == k and a in reg_of:
                free.append(reg_of.pop(a))
        if k == len(stmts) - 1:
            dst = -1  # every live temporary is read here, so the output buffer is free
        elif -1 in free:
            free.remove(-1)
            dst = -1
        elif free:
            dst = free.pop()
        else:
            dst, nregs = nregs, nregs + 1
        reg_of[dest] = dst
        plan.append((PRIMITIVES[name][2], PRIMITIVES[name][0], srcs, dst))
    return tuple(plan), nregs


_compile_cached = lru_cache(maxsize=1024)(_compile)


def _generate(plan, nregs: int, shape: tuple[int, ...], in_shapes: tuple, dtype: Any):
    """The plan as one straight-line Python function run(xs, regs, out): no per-step
    interpretation, so a small tensor's chain costs about its bare ufunc calls. For small
    outputs an input of another shape is reshaped (same size) or expanded (read several
    times) to the output's shape once per call, and Relu compares against a zero array of
    that shape; elements, and so results, are those of the broadcast."""
    size = int(np.prod(shape, dtype=np.int64))
    small = size <= SHAPED_MAX
    reads: dict[int, int] = {}
    for _fn, ntensor, srcs, _dst in plan:
        for a in srcs[:ntensor]:
            if isinstance(a, str):
                reads[int(a[1:])] = reads.get(int(a[1:]), 0) + 1
    env: dict[str, Any] = {"_np": np, "_bt": np.broadcast_to, "_shape": shape,
                           "_zero": np.zeros(shape, dtype) if small else None}
    lines = ["def run(xs, regs, out):"]
    lines += [f"    r{j} = regs[{j}]" for j in range(nregs)]
    names: dict[int, str] = {}
    for j, n in reads.items():
        names[j] = f"xs[{j}]"
        if not small or in_shapes[j] == shape:
            continue
        if int(np.prod(in_shapes[j], dtype=np.int64)) == size:
            lines.append(f"    a{j} = xs[{j}].reshape(_shape)")
        elif n >= 3:
            lines.append(f"    a{j} = _np.ascontiguousarray(_bt(xs[{j}], _shape))")
        else:
            continue
        names[j] = f"a{j}"

    def name(s) -> str:
        if isinstance(s, str):
            return names[int(s[1:])]
        return "out" if s < 0 else f"r{s}"

    for k, (fn, ntensor, srcs, dst) in enumerate(plan):
        args = [name(a) for a in srcs[:ntensor]]
        if fn is _relu and small:
            fn, args = np.maximum, [*args, "_zero"]
        env[f"f{k}"] = fn
        # Numbers by name: repr() of inf / nan is no Python literal (Clip without a bound).
        for j, p in enumerate(srcs[ntensor:]):
            env[f"c{k}_{j}"] = float(p)
            args.append(f"c{k}_{j}")
        # out positionally where a ufunc allows it: a keyword costs a fifth of a tiny call
        tail = name(dst) if isinstance(fn, np.ufunc) and fn not in KEYWORD_OUT \
            else f"out={name(dst)}"
        lines.append(f"    f{k}({', '.join(args)}, {tail})")
    exec("\n".join(lines), env)  # noqa: S102 - source built from a parsed, whitelisted program
    return env["run"]


# Programs whose ops can overflow or leave their domain run under errstate (a context manager
# costs a few microseconds, as much as a small tensor's whole chain).
_QUIET = frozenset({"add", "sub", "mul", "max", "min", "neg", "abs", "relu", "clip", "tanh",
                    "leakyrelu", "hardsigmoid", "hardswish"})
_SETUPS: dict[tuple, tuple] = {}


def _setup(program: str, shapes: tuple, dtype: Any) -> tuple:
    """(run, scratch count, output shape, needs errstate) per program, input shapes, dtype."""
    key = (program, shapes, dtype)
    got = _SETUPS.get(key)
    if got is None:
        plan, nregs = _compile_cached(program)
        noisy = any(name not in _QUIET for _, name, _ in parse_program(program))
        shape = np.broadcast_shapes(*shapes)
        got = (_generate(plan, nregs, shape, shapes, dtype), nregs, shape, noisy)
        if len(_SETUPS) > 4096:
            _SETUPS.clear()
        _SETUPS[key] = got
    return got


@FusedElementwise.kernel(device="cpu", name="fusedelementwise.cpu.inplace", accepts_out=True,
                         priority=10)
def fused_elementwise_inplace(*inputs, program="", out=None):
    """The program evaluated in place in `out` (scratch buffers only for non-linear programs)."""
    xs = [x if isinstance(x, np.ndarray) else np.asarray(x) for x in inputs]
    dtype = xs[0].dtype
    run, nregs, shape, noisy = _setup(program, tuple(x.shape for x in xs), dtype)
    if out is None:
        out = np.empty(shape, dtype)
    regs = [np.empty(shape, dtype) for _ in range(nregs)]
    if noisy:
        with np.errstate(all="ignore"):
            run(xs, regs, out)
    else:
        run(xs, regs, out)
    return out


@FusedElementwise.pieces
def _fused_elementwise_pieces(node: Any) -> list[tuple[str, dict[str, Any], list[Any]]]:
    """Every operator the program names (a capitalised word that is one), over inputs 0-1."""
    prog = node.attrs.get("program", "")
    if isinstance(prog, bytes):
        prog = prog.decode()
    names = dict.fromkeys(re.findall(r"[A-Z][A-Za-z]+", str(prog)))
    return [(n, {}, node.inputs[:2]) for n in names if REGISTRY.latest(n) is not None]
