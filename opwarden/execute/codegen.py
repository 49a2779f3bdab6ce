"""The lean run loop: a bound call list compiled to straight-line Python source.

Each tensor slot becomes a local variable, each step one call with its kernel, attribute dict
and planned buffers bound as globals of the generated function; dead values are deleted right
after their last reader. A run is then a sequence of kernel calls with no interpretation left:
no slot lists, no per-step dispatch, no dict copies. A kernel that is a bare ufunc call (it
declares its `direct` form, see `direct_form`) is not called at all: the step is that ufunc
call into its planned buffer, with constant operands shaped like the output, and later steps
read the buffer (nothing to check: the buffer has the plan's shape and dtype).

With ``contract`` the loop also enforces the cheap half of the contract check: every value a
kernel receives is read-only (so writing into an input raises), a kernel may not return one of
its inputs (or a direct view of it) unless its contract declares that alias, and each typed
tensor output must be an array of the plan's dtype and, where the facts give it whole (symbolic
dims bound from the feeds), shape: one identity test and two compares against constants, so a
wrong result is blamed on the step that made it, not on the next one. Any exception leaves
the loop as `LeanFault`; the session then reruns the whole run under the guard, which records the
fault, falls back to the reference kernel and quarantines the variant.
"""

from __future__ import annotations

import keyword
from typing import Any

import numpy as np

from opwarden.execute.forms import direct_form, prepared_form, shaped_operand
from opwarden.execute.shapes import ShapeMiss, record_value
from opwarden.ops.common import KEYWORD_OUT


class LeanFault(Exception):
    """A step failed inside the lean loop; `index` is the step, `error` the original exception."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(f"step {index}: {type(error).__name__}: {error}")
        self.index = index
        self.error = error


class _AliasFault(Exception):
    pass


class _OutputFault(Exception):
    pass


def _one(r: Any) -> Any:
    """Output 0 of a single-output kernel result (tuple unwrapped, NumPy scalar made an array)."""
    if type(r) is tuple:
        if not r:
            raise ValueError("kernel returned no outputs")
        r = r[0]
    if isinstance(r, np.generic):
        return np.asarray(r)
    return r


def _many(r: Any, n: int, needed: tuple[int, ...]) -> tuple:
    if type(r) is not tuple:
        r = (r,)
    if needed and max(needed) >= len(r):
        raise ValueError(f"kernel returned {len(r)} outputs, node needs output {max(needed)}")
    out = tuple(np.asarray(x) if isinstance(x, np.generic) else x for x in r[:n])
    return out + (None,) * (n - len(out))


def _ro(x: Any) -> Any:
    if type(x) is np.ndarray and x.flags.writeable:
        x.flags.writeable = False
    return x


def _ro_out(x: Any, o: np.ndarray, r: np.ndarray) -> Any:
    """Output 0 of a step with a planned buffer `o`, made read-only for the steps after: `r`
    (o's read-only view) when the kernel returned o, also inside a tuple, so that o itself
    stays writable for the next run; else the result, marked read-only."""
    x = _one(x)
    return r if x is o else _ro(x)


def feed_view(x: Any) -> Any:
    """A feed as kernels see it under the contract check: a read-only view when writable."""
    if type(x) is np.ndarray and x.flags.writeable:
        v = x.view()
        v.flags.writeable = False
        return v
    return x


def _alias(i: int) -> None:
    raise _AliasFault(f"step {i} returned one of its inputs (or a view of it), undeclared")


def _bad_out(i: int, k: int, x: Any, shape: tuple | None, dtype: Any) -> None:
    """The slow half of the output check: raises unless `x` passes after all (an ndarray
    subclass, an equal but distinct dtype object)."""
    if not isinstance(x, np.ndarray):
        raise _OutputFault(f"step {i} output {k} is {type(x).__name__}, not a tensor")
    if dtype is not None and x.dtype != dtype:
        raise _OutputFault(f"step {i} output {k} has dtype {x.dtype}, the plan expects {dtype}")
    if shape is not None and (len(x.shape) != len(shape) or any(
            d is not None and d != n for d, n in zip(shape, x.shape))):
        want = ["?" if d is None else d for d in shape]  # ?: only the model declares it
        raise _OutputFault(
            f"step {i} output {k} has shape {list(x.shape)}, the plan expects {want}")


def _out(i: int, k: int, x: Any, shape: tuple | None, dtype: Any) -> Any:
    """Output `k` of step `i` as kept (`_one`), after the slow half of its check."""
    x = _one(x)
    _bad_out(i, k, x, shape, dtype)
    return x


def _dim_names(program: Any) -> dict[str, str]:
    """Symbolic dim name -> the expression (over `feeds`) that binds it in a run."""
    out: dict[str, str] = {}
    for k, v in enumerate(program.graph.inputs):
        shape = v.fact.shape if v.kind == "tensor" else None
        for axis, d in enumerate(shape or ()):
            if isinstance(d, str) and d not in out:
                out[d] = f"feeds[{k}].shape[{axis}]"
    return out


def _expect(v: Any, dims: dict[str, str]) -> tuple[str | None, list[str], Any] | None:
    """(shape expression or None, the shape tests over "{x}", dtype or None) a typed tensor
    value is checked against; None for values without a type (nothing to check). A shape with
    dims only the model declares (checks.checked_shape) is None there, and its other dims are
    tested one by one; a whole shape is one compare against a constant tuple."""
    from opwarden.contract import Declared
    from opwarden.guard.checks import checked_shape, expected_dtype

    if v is None or v.kind != "tensor" or v.fact.dtype is None:
        return None
    shape = checked_shape(v.fact.shape)
    if shape is None or not all(type(d) is int or d in dims or (d is None and type(e) is Declared)
                                for d, e in zip(shape, v.fact.shape)):
        return None, [], expected_dtype(v.fact)  # a dim unknown, or unbound in a run
    parts = ["None" if d is None else str(d) if type(d) is int else f"_d{list(dims).index(d)}"
             for d in shape]
    expr = f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
    if None not in shape:
        return expr, [f"{{x}}.shape != {expr}"], expected_dtype(v.fact)
    tests = [f"len({{x}}.shape) != {len(shape)}"]
    tests += [f"{{x}}.shape[{a}] != {p}" for a, p in enumerate(parts) if p != "None"]
    return expr, tests, expected_dtype(v.fact)


def compile_calls(program: Any, calls: list[tuple], contract: bool = False,
                  stoppable: bool = False, fold: Any = None, record: Any = None) -> Any:
    """Python function ``run(feeds, captured) -> outputs`` equivalent to `program.run(calls)`.

    `stoppable`: ``run(feeds, captured, stop)`` calls ``stop.check(where)`` before each step
    (RunOptions.terminate; a separate function, so runs without one pay nothing). `fold` (an
    execute.shapes.ShapeFold): its steps are not run, later steps read their folded values,
    and each of its Shape/Size steps on a computed tensor becomes a compare of that tensor's
    shape (ShapeMiss, not LeanFault, when it differs). `record` (execute.shapes.Candidates):
    while the function's global ``_rec`` is a dict, each candidate's results go into it."""
    gen = _Source(program, contract, stoppable)
    steps = set(record.steps) if record is not None else ()
    for i, call in enumerate(calls):
        gen.starts.append(len(gen.body))
        if fold is not None and i in fold.skip:
            gen.folded(i, call, fold)
            continue
        if i in steps:
            gen.pending = (i, record.roots.get(i))
        gen.step(i, call)
    return gen.function()


def _miss(i: int, got: tuple[int, ...], want: tuple[int, ...]) -> None:
    raise ShapeMiss(i, tuple(got), want)


# Compiled sources kept per program (most recently used).
CODE_CACHE = 4


def _step_at(starts: list[int], first_line: int, tb: Any) -> int:
    """The step whose lines hold the line the traceback `tb` is at (-1: before any step)."""
    import bisect

    line = tb.tb_lineno if tb is not None else None
    if line is None:
        return -1
    return bisect.bisect_right(starts, line - first_line) - 1


class _Source:
    """The generated source of one lean loop, and the globals (`ns`) its names refer to.

    Names in the source: `s<slot>` a value, `c<slot>` a constant, `f<i>`/`k<i>` step i's
    kernel and keyword dict, `o<i>`/`r<i>` its planned buffer and that buffer's read-only
    view, `h<i>` its arena-view hook, `p<i>_<name>` its subgraph programs, `_t<j>` the
    expected dtypes, `_d<j>` the symbolic dims bound from the feeds, `u<i>`/`u<i>_<j>` a
    direct step's ufunc and constants, `k<i>_<j>` step i's attribute values passed by keyword.
    A direct step's result is its buffer (`r<i>`, or `o<i>` without the contract check),
    which later steps read by that name. Which step raised is found from the line it raised
    at (`starts`: each step's first body line), so steps pay no bookkeeping for it.
    """

    def __init__(self, program: Any, contract: bool, stoppable: bool = False) -> None:
        from opwarden.execute.bound import BoundGraph

        self.program = program
        self.stoppable = stoppable
        self.contract = contract
        self.ns: dict[str, Any] = {
            "_one": _one,
            "_many": _many,
            "_ro": _ro,
            "_ro_out": _ro_out,
            "_feed": feed_view,
            "_alias": _alias,
            "_bad_out": _bad_out,
            "_out": _out,
            "_ndarray": np.ndarray,
            "_BoundGraph": BoundGraph,
            "_LeanFault": LeanFault,
            "_step_at": _step_at,
            "_miss": _miss,
            "_ShapeMiss": ShapeMiss,
            "_keep": record_value,
            "_rec": None,
        }
        self.pending: tuple[int, int | None] | None = None  # a candidate step to record
        self.names: dict[int, str] = {}  # slot -> the buffer name a direct step left it in
        self.starts: list[int] = []
        self.lines = ["def _run(feeds, captured, stop):" if stoppable else
                      "def _run(feeds, captured):"]
        add = self.lines.append
        self.dims = _dim_names(program) if contract else {}
        for j, expr in enumerate(self.dims.values()):
            add(f"    _d{j} = {expr}")
        self.dtypes: dict[Any, str] = {}
        for k, s in enumerate(program.input_slots):
            add(f"    s{s} = _feed(feeds[{k}])" if contract else f"    s{s} = feeds[{k}]")
        for k, s in enumerate(program.capture_slots):
            add(f"    s{s} = captured[{k}]")
        self.fed = set(program.input_slots) | set(program.capture_slots)
        for s, c in enumerate(program.template):
            if c is not None and s not in self.fed:
                self.ns[f"c{s}"] = _ro(c) if contract and isinstance(c, np.ndarray) else c
        add("    try:")
        self.body: list[str] = []

    def ref(self, s: int) -> str:
        """The name slot s is read by."""
        if s < 0:
            return "None"
        if s in self.names:
            return self.names[s]
        # an initializer that is also a graph input is fed (its value overrides the constant)
        const = self.program.template[s] is not None and s not in self.fed
        return f"c{s}" if const else f"s{s}"

    def constant(self, s: int) -> Any:
        """Slot s's constant value as steps read it, `...` for a computed value, None for an
        absent input (see prepared_form)."""
        if s < 0:
            return None
        name = self.ref(s)
        return self.ns[name] if name == f"c{s}" else ...

    def check(self, i: int, k: int, s: int) -> tuple[str, str] | None:
        """The output check of slot s (output k of step i): (a condition true when the value
        may be wrong, the arguments of _bad_out/_out), or None when s has no type to check."""
        want = _expect(self.program.values[s], self.dims)
        if want is None:
            return None
        shape, shape_tests, dt = want
        tests = [f"type(s{s}) is not _ndarray"]
        tests += [t.format(x=f"s{s}") for t in shape_tests]
        dname = "None"
        if dt is not None:
            dname = self.dtypes.get(dt) or self.dtypes.setdefault(dt, f"_t{len(self.dtypes)}")
            self.ns[dname] = dt
            # builtin dtypes are singletons: `is not` is the fast test, _bad_out the exact one
            tests.append(f"s{s}.dtype is not {dname}")
        return " or ".join(tests), f"{i}, {k}, s{s}, {shape or 'None'}, {dname}"

    def step(self, i: int, call: tuple) -> None:
        """The lines of step i: the kernel call, its outputs stored (and checked), its
        arena-view hook, the alias checks, the dead values deleted."""
        st, fn, ins, kw, frees, hook = call
        ns, body = self.ns, self.body
        if self.stoppable:
            body.append(f"stop.check({'before node ' + st.placement.node.label!r})")
        direct = direct_form(call)
        if direct is not None:
            self.direct(i, call, *direct)
            return
        prepared = prepared_form(call, tuple(self.constant(s) for s in ins))
        if prepared is not None:
            fn, kw = prepared, {"out": kw["out"]}
        ns[f"f{i}"] = fn
        out_buf = kw.get("out") if isinstance(kw, dict) else None
        if out_buf is not None and self.contract:
            # Later steps get the planned buffer's read-only view (r), never the buffer (o)
            # itself made read-only: the next run hands it to the kernel again (_ro_out).
            ro = out_buf.view()
            ro.flags.writeable = False
            ns[f"o{i}"], ns[f"r{i}"] = out_buf, ro
        expr = self.call_expr(i, st, ins, kw)
        if len(st.outs) == 1:
            out_names = self.store_one(i, st.outs[0], expr, out_buf is not None)
        else:
            out_names = self.store_many(i, st.outs, expr, out_buf is not None)
        # A planned result the kernel returned as its buffer is neither an unplanned arena view
        # nor an input (inputs are never this step's buffer): hook and alias checks only test
        # other results (store_one's else branch, indented under it).
        indent = "    " if out_buf is not None and self.contract and len(st.outs) == 1 else ""
        if hook is not None:
            self.hook(i, st.outs, hook, out_buf, indent)
        if self.contract and out_names:
            self.alias_checks(i, st, ins, indent)
        self.free(frees)

    def folded(self, i: int, call: tuple, fold: Any) -> None:
        """Step i folded for this signature: its outputs are constants (m<slot>) later steps
        read by name; a Shape/Size of a computed tensor leaves the compare of that tensor's
        shape with the one folded from (q<i>)."""
        st, _fn, _ins, _kw, frees, _hook = call
        root = fold.roots.get(i)
        if root is not None:
            src, shape = root
            self.ns[f"q{i}"] = shape
            x = self.ref(src)
            self.body.append(f"if {x}.shape != q{i}: _miss({i}, {x}.shape, q{i})")
        for s in st.outs:
            if s >= 0:
                self.ns[f"m{s}"] = fold.values[s]
                self.names[s] = f"m{s}"
        self.free(frees)

    def free(self, frees: tuple[int, ...]) -> None:
        """`del` of the slots dead after a step (a direct step's buffer is no local), after
        the recording of a candidate step's results (and a root's input shape)."""
        if self.pending is not None:
            i, src = self.pending
            self.pending = None
            st = self.program.steps[i]
            parts = [f"_rec[{s}] = _keep({self.ref(s)})" for s in st.outs if s >= 0]
            if src is not None:
                parts.append(f"_rec[('in', {i})] = {self.ref(src)}.shape")
            self.body.append(f"if _rec is not None: {'; '.join(parts)}")
        for s in frees:
            if s not in self.names:
                self.body.append(f"del s{s}")

    def direct(self, i: int, call: tuple, ufunc: Any, consts: tuple) -> None:
        """A direct step (see direct_form). Into a planned buffer: the ufunc called with it
        as out=, which a ufunc returns, so the buffer (its read-only view under the contract
        check) is the value later steps read. Without one: the ufunc's result, which for
        array inputs is a fresh array of its own memory (base None): no input and no arena
        view, so the hook and alias checks run only for any other result."""
        st, _fn, ins, kw, frees, hook = call
        ns, body = self.ns, self.body
        ns[f"u{i}"] = ufunc
        out = kw.get("out")
        args = [self.operand(s, out) for s in ins]
        for j, c in enumerate(consts):
            ns[f"u{i}_{j}"] = c if out is None else shaped_operand(c, out.shape)
            args.append(f"u{i}_{j}")
        o = st.outs[0]
        if out is None:
            body.append(f"s{o} = u{i}({', '.join(args)})")
            self.direct_result(i, st, ins, hook)
            self.free(frees)
            return
        ns[f"o{i}"] = out
        # out positionally: a keyword costs a fifth of a tiny call; not where NumPy deprecates it
        tail = f"out=o{i}" if ufunc in KEYWORD_OUT else f"o{i}"
        body.append(f"u{i}({', '.join(args)}, {tail})")
        name = f"o{i}"
        if self.contract:
            ro = out.view()
            ro.flags.writeable = False
            ns[f"r{i}"] = ro
            name = f"r{i}"
        self.names[o] = name
        self.free(frees)

    def operand(self, s: int, out: np.ndarray | None) -> str:
        """The name a direct step into buffer `out` reads slot s by: a constant of another
        shape than `out` by its copy shaped like it (shaped_operand), made once per shape."""
        name = self.ref(s)
        c = self.ns.get(name) if name == f"c{s}" and out is not None else None
        if out is None or not isinstance(c, np.ndarray) or c.shape == out.shape:
            return name
        key = f"c{s}_{'_'.join(map(str, out.shape))}"
        if key not in self.ns:
            shaped = shaped_operand(c, out.shape)
            if shaped is c:
                return name
            self.ns[key] = shaped
        return key

    def direct_result(self, i: int, st: Any, ins: tuple[int, ...], hook: Any) -> None:
        """The checks of an unplanned direct step's result s<o>: a fresh array of the plan's
        type passes with one test (and is made read-only); anything else takes every check
        the kernel's result would (store_one, hook, alias), indented under that test."""
        body, o = self.body, st.outs[0]
        want = self.check(i, 0, o) if self.contract else None
        typed = f"type(s{o}) is not _ndarray"
        fresh = f"{typed} or s{o}.base is not None"
        if want is not None:
            fresh += want[0][len(typed):]  # (the type test leads every check)
        body.append(f"if {fresh}:")
        body.append(f"    s{o} = _out({want[1]})" if want is not None else f"    s{o} = _one(s{o})")
        if self.contract:
            body.append(f"    _ro(s{o})")
        if hook is not None:
            body.append(f"    s{o} = h{i}.fix(s{o}, 0)")
            self.ns[f"h{i}"] = hook
        if self.contract:
            self.alias_checks(i, st, ins, "    ")
            body.append(f"else: s{o}.flags.writeable = False")

    def call_expr(self, i: int, st: Any, ins: tuple[int, ...], kw: Any) -> str:
        """`f<i>(inputs, **kwargs)`, subgraph attributes bound to their captured values."""
        ns, ref = self.ns, self.ref
        args = ", ".join(ref(s) for s in ins)
        call_kw = ""
        if st.graphs:
            parts = []
            # a stoppable loop's Loop/Scan bodies check the stop before each iteration
            tail = ", None, stop" if self.stoppable else ""
            for name, g in st.graphs.items():
                if isinstance(g, list):
                    items = []
                    for j, (prog, caps) in enumerate(g):
                        ns[f"p{i}_{name}_{j}"] = prog
                        items.append(
                            f"_BoundGraph(p{i}_{name}_{j}, [{', '.join(ref(c) for c in caps)}]"
                            f"{tail})"
                        )
                    parts.append(f"{name!r}: [{', '.join(items)}]")
                else:
                    prog, caps = g
                    ns[f"p{i}_{name}"] = prog
                    parts.append(
                        f"{name!r}: _BoundGraph(p{i}_{name}, [{', '.join(ref(c) for c in caps)}]"
                        f"{tail})"
                    )
            ns[f"k{i}"] = kw
            call_kw = f"**k{i}, **{{{', '.join(parts)}}}"
        elif kw and all(type(k) is str and k.isidentifier() and not keyword.iskeyword(k)
                        for k in kw):
            # by keyword: a Python kernel takes them without a dict built for the call
            parts = []
            for j, (k, v) in enumerate(kw.items()):
                name = f"o{i}" if k == "out" else f"k{i}_{j}"  # (the planned buffer: o<i>)
                ns[name] = v
                parts.append(f"{k}={name}")
            call_kw = ", ".join(parts)
        elif kw:
            ns[f"k{i}"] = kw
            call_kw = f"**k{i}"
        sep = ", " if args and call_kw else ""
        return f"f{i}({args}{sep}{call_kw})"

    def store_one(self, i: int, o: int, call: str, planned: bool) -> list[str]:
        """A single-output step's result stored in s<o> and checked; the names it set."""
        body, contract = self.body, self.contract
        target = f"s{o}" if o >= 0 else "_"
        want = self.check(i, 0, o) if contract and o >= 0 else None
        body.append(f"{target} = {call}")
        if planned and contract:
            # The planned buffer has the plan's shape and dtype: only other results are
            # checked (the lines step() adds for them go under this else too).
            body.append(f"if {target} is o{i}: {target} = r{i}")
            body.append("else:")
            body.append(f"    {target} = _ro_out({target}, o{i}, r{i})")
            if want is not None:
                body.append(f"    if {want[0]}: _bad_out({want[1]})")
        else:
            if want is None:
                body.append(f"if type({target}) is not _ndarray: {target} = _one({target})")
            else:
                body.append(f"if {want[0]}: {target} = _out({want[1]})")
            if contract:
                body.append(f"_ro({target})")
        return [target] if o >= 0 else []

    def store_many(self, i: int, outs: tuple[int, ...], call: str, planned: bool) -> list[str]:
        """A multi-output step's results stored and checked; the names it set."""
        body, contract = self.body, self.contract
        needed = tuple(k for k, s in enumerate(outs) if s >= 0)
        body.append(f"_r = _many({call}, {len(outs)}, {needed!r})")
        out_names = []
        for k, s in enumerate(outs):
            if s < 0:
                continue
            if k == 0 and planned and contract:
                body.append(f"s{s} = _ro_out(_r[0], o{i}, r{i})")
            else:
                body.append(f"s{s} = _r[{k}]" + (f"; _ro(s{s})" if contract else ""))
            out_names.append(f"s{s}")
            want = self.check(i, k, s) if contract else None
            if want is not None:
                body.append(f"if {want[0]}: _bad_out({want[1]})")
        return out_names

    def hook(self, i: int, outs: tuple[int, ...], hook: Any, out_buf: Any,
             indent: str = "") -> None:
        """Results that may be unplanned views into the arena, passed through `h<i>.fix`."""
        ns, body = self.ns, self.body
        ns[f"h{i}"] = hook
        for k, s in enumerate(outs):
            if s < 0:
                continue
            if k == 0 and out_buf is not None and self.contract:
                body.append(f"{indent}if s{s} is not r{i}: s{s} = h{i}.fix(s{s}, {k})")
            elif k == 0 and out_buf is not None:
                body.append(f"if s{s} is not o{i}: s{s} = h{i}.fix(s{s}, {k})")
                ns[f"o{i}"] = out_buf
            else:
                body.append(f"s{s} = h{i}.fix(s{s}, {k})")

    def alias_checks(self, i: int, st: Any, ins: tuple[int, ...], indent: str = "") -> None:
        """The test that no output is (a direct view of) an input its contract does not let
        it alias."""
        allowed = st.placement.variant.op.contract.aliases(len(st.outs))
        checks = []
        for k, s in enumerate(st.outs):
            if s < 0:
                continue
            for a, src in enumerate(ins):
                if src < 0 or (a, k) in allowed:
                    continue
                r = self.ref(src)
                checks.append(f"s{s} is {r} or (type(s{s}) is _ndarray and s{s}.base is {r})")
        if checks:
            self.body.append(f"{indent}if {' or '.join(checks)}: _alias({i})")

    def function(self) -> Any:
        """The generated `_run`, compiled, with its source as `.source`."""
        add = self.lines.append
        first = len(self.lines) + 1  # the line number of body line 0
        for line in self.body or ["pass"]:
            add("        " + line)
        self.ns["_starts"] = self.starts
        add("    except (KeyboardInterrupt, GeneratorExit, _ShapeMiss):")
        add("        raise")
        add("    except BaseException as e:  # a kernel's SystemExit is its fault too")
        add(f"        raise _LeanFault(_step_at(_starts, {first}, e.__traceback__), e) from e")
        outs = ", ".join(self.ref(s) for s in self.program.output_slots)
        add(f"    return [{outs}]")
        src = "\n".join(self.lines) + "\n"
        # Signatures of one program mostly generate the same source (shapes are names bound
        # from the feeds): compiling it is most of a new signature's cost, so reuse the code.
        cache = self.program.code_cache
        code = cache.pop(src, None)
        if code is None:
            code = compile(src, f"<opwarden program {self.program.graph.name}>", "exec")
        cache[src] = code
        while len(cache) > CODE_CACHE:
            del cache[next(iter(cache))]
        exec(code, self.ns)  # noqa: S102 - the source is generated above from the call list
        fn = self.ns["_run"]
        fn.source = src
        return fn
