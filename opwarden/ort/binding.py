"""SessionIOBinding: onnxruntime's IO binding over host memory.

Inputs are bound as arrays (`bind_cpu_input`), OrtValues or host pointers (`bind_input`: the
memory is read in place through a NumPy view, no copy). Outputs are bound by name, to a fresh
result each run, or to caller memory (a pointer with its type and shape, or an OrtValue): the
run's result lands in that memory, which the OrtValues `get_outputs()` returns then view.

Zero copies where the binding allows: when the CPU kernel producing a bound output takes an
`out=` buffer and the output's shape for this run's feeds is the buffer's, the compiled loop
is given the caller's memory as that kernel's `out=` (`BoundOutputs`, one compiled loop per
plan and binding), so the kernel writes the result there itself. Otherwise (another device, a
view operator, a shape only the run tells, a kernel that returned a new array, a guarded
run) the result is copied into the buffer once. A result whose shape or type differs from a
bound buffer is an `InputError` naming the output. Devices other than "cpu" do not exist for
bindings (values live in host memory).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden.contract import has_declared
from opwarden.dtypes import dtype_name
from opwarden.errors import InputError
from opwarden.ort.values import OrtValue, array_at, check_host, element_dtype


class BoundOutputs:
    """The caller's output buffers of one binding, by the session's output index, and the
    compiled loops that write into them (per plan, contract flag and stoppability)."""

    def __init__(self, buffers: dict[int, np.ndarray]) -> None:
        self.buffers = buffers
        self._loops: dict[tuple, tuple[Any, Any]] = {}

    def loop(self, program: Any, bound: Any, dims: dict[str, int], feeds: list[Any],
             contract: bool, stoppable: bool) -> Any:
        """The compiled loop for `bound` (a plan's call list bound to its arena) with the
        buffers as out= where they fit, or None when none does."""
        key = (id(bound), contract, stoppable, tuple(sorted(dims.items())))
        got = self._loops.get(key)
        if got is not None and got[0] is bound:
            return got[1]
        calls = zero_copy_calls(program, bound.calls, self.buffers, dims, feeds)
        fn = None if calls is None else program.compile(calls, contract, stoppable)
        if len(self._loops) > 8:
            self._loops.clear()
        self._loops[key] = (bound, fn)
        return fn


def _run_shape(shape: Any, dims: dict[str, int]) -> tuple[int, ...] | None:
    """A fact's shape with this run's symbolic dims bound; None unless every dim is known."""
    if shape is None or has_declared(shape):
        return None
    out = []
    for d in shape:
        n = d if isinstance(d, int) else dims.get(d) if isinstance(d, str) else None
        if n is None or n < 0:
            return None
        out.append(n)
    return tuple(out)


def zero_copy_calls(program: Any, calls: list[tuple], buffers: dict[int, np.ndarray],
                    dims: dict[str, int], feeds: list[Any]) -> list[tuple] | None:
    """`calls` with each buffer given as `out=` to the CPU kernel that produces its output,
    where that kernel takes one and the output's shape and dtype for these dims are the
    buffer's; None when no buffer fits."""
    producer = {st.outs[0]: i for i, (st, *_r) in enumerate(calls) if st.outs}
    new = list(calls)
    used = False
    for k, buf in buffers.items():
        s = program.output_slots[k]
        i = producer.get(s)
        if i is None or not buf.flags.c_contiguous or not buf.flags.writeable:
            continue
        st, fn, ins, kw, frees, hook = new[i]
        var = st.placement.variant
        if (not var.accepts_out or "out" in kw or st.graphs or st.placement.device != "cpu"
                or var.op.contract.must_alias):
            continue
        v = program.values[s]
        if _run_shape(v.fact.shape, dims) != buf.shape or v.fact.dtype != dtype_name(buf.dtype):
            continue
        if any(isinstance(f, np.ndarray) and np.may_share_memory(f, buf) for f in feeds):
            continue  # the kernel would overwrite what it reads
        new[i] = (st, fn, ins, {**kw, "out": buf}, frees, hook)
        used = True
    return new if used else None


class SessionIOBinding:
    """Inputs and outputs bound to one session (`InferenceSession.io_binding()`)."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._inputs: dict[str, Any] = {}
        # name -> the caller's buffer (an ndarray over its memory) or None: a fresh result
        self._outputs: dict[str, np.ndarray | None] = {}
        self._results: list[OrtValue] = []
        self._bound: BoundOutputs | None = None  # for the current output buffers

    # -- inputs ----------------------------------------------------------------------------
    def _input_name(self, name: Any) -> str:
        names = [a.name for a in self._session.get_inputs()]
        names += [a.name for a in self._session.get_overridable_initializers()]
        if name not in names:
            raise InputError(f"cannot bind input {name!r}: the model's inputs are {names}")
        return name

    def bind_cpu_input(self, name: str, arr_on_cpu: Any) -> None:
        """Bind an input to an array in host memory (used in place, not copied)."""
        self._inputs[self._input_name(name)] = arr_on_cpu

    def bind_input(self, name: str, device_type: str, device_id: int, element_type: Any,
                   shape: Any, buffer_ptr: int) -> None:
        """Bind an input to `shape` elements of `element_type` at host address `buffer_ptr`
        (read in place; the caller keeps the memory alive until the run)."""
        check_host(device_type, device_id)
        self._inputs[self._input_name(name)] = array_at(buffer_ptr, element_type, shape)

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        """Bind an input to an OrtValue's content."""
        if not isinstance(ortvalue, OrtValue):
            raise InputError(f"bind_ortvalue_input({name!r}) needs an OrtValue, got "
                             f"{type(ortvalue).__name__}")
        self._inputs[self._input_name(name)] = ortvalue.value()

    def synchronize_inputs(self) -> None:
        """Nothing to wait for: bound inputs are host memory, read when the run reads them."""

    def clear_binding_inputs(self) -> None:
        """Forget every bound input."""
        self._inputs.clear()

    # -- outputs ---------------------------------------------------------------------------
    def _output_name(self, name: Any) -> str:
        names = [a.name for a in self._session.get_outputs()]
        if name not in names:
            raise InputError(f"cannot bind output {name!r}: the model's outputs are {names}")
        return name

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0,
                    element_type: Any = None, shape: Any = None,
                    buffer_ptr: int | None = None) -> None:
        """Bind an output by name: to a fresh result per run, or (with `buffer_ptr`,
        `element_type` and `shape`) to caller memory the run writes the result into."""
        check_host(device_type, device_id)
        name = self._output_name(name)
        self._bound = None
        if buffer_ptr is None:
            self._outputs[name] = None
            return
        if element_type is None or shape is None:
            raise InputError(f"bind_output({name!r}): element_type and shape are required "
                             "with a pre-allocated buffer_ptr")
        self._outputs[name] = array_at(buffer_ptr, element_dtype(element_type), shape)

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        """Bind an output to an OrtValue: the run writes its result into that value."""
        if not isinstance(ortvalue, OrtValue) or not ortvalue.is_tensor():
            raise InputError(f"bind_ortvalue_output({name!r}) needs a tensor OrtValue")
        self._outputs[self._output_name(name)] = ortvalue.value()
        self._bound = None

    def synchronize_outputs(self) -> None:
        """Nothing to wait for: outputs are complete when the run returns."""

    def clear_binding_outputs(self) -> None:
        """Forget every bound output and the last run's results."""
        self._outputs.clear()
        self._bound = None
        self._results = []

    # -- results ---------------------------------------------------------------------------
    def run(self, run_options: Any = None) -> None:
        """Run the session on the bound inputs, writing the bound outputs."""
        if not self._outputs:
            raise InputError("run_with_iobinding: at least one output must be bound")
        names = list(self._outputs)
        if self._bound is None:
            index = {a.name: k for k, a in enumerate(self._session.get_outputs())}
            self._bound = BoundOutputs({index[n]: b for n, b in self._outputs.items()
                                        if b is not None})
        into = self._bound if self._bound.buffers else None
        results = self._session.run_into(names, self._inputs, run_options, into)
        self._results = [OrtValue(self._store(n, r)) for n, r in zip(names, results)]

    def _store(self, name: str, result: Any) -> Any:
        buf = self._outputs[name]
        if buf is None:
            return result
        if not isinstance(result, np.ndarray) or result.shape != buf.shape or \
                dtype_name(result.dtype) != dtype_name(buf.dtype):
            got = f"{result.dtype}{list(result.shape)}" if isinstance(result, np.ndarray) \
                else type(result).__name__
            raise InputError(f"output {name!r} is {got}, but its bound buffer is "
                             f"{buf.dtype}{list(buf.shape)}")
        if not buf.flags.writeable:
            raise InputError(f"output {name!r}: the bound buffer is read-only")
        if result.__array_interface__["data"][0] != buf.__array_interface__["data"][0]:
            np.copyto(buf, result)  # else the kernel wrote it there (zero copy)
        return buf

    def get_outputs(self) -> list[OrtValue]:
        """The outputs of the last run, as OrtValues (over the bound buffers where bound)."""
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[Any]:
        """The outputs of the last run as NumPy arrays (copies)."""
        return [_copy(v.value()) for v in self._results]


def _copy(x: Any) -> Any:
    return x.copy() if isinstance(x, np.ndarray) else x
