"""SessionIOBinding: onnxruntime's IO binding over host memory.

Inputs are bound as arrays (`bind_cpu_input`), OrtValues or host pointers (`bind_input`: the
memory is read in place through a NumPy view, no copy). Outputs are bound by name, to a fresh
result each run, or to caller memory (a pointer with its type and shape, or an OrtValue): the
run's result is written into that memory, which the OrtValues `get_outputs()` returns then
view. A result whose shape or type differs from a bound buffer is an `InputError` naming the
output. Devices other than "cpu" do not exist for bindings (values live in host memory).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden.dtypes import dtype_name
from opwarden.errors import InputError
from opwarden.ort.values import OrtValue, array_at, check_host, element_dtype


class SessionIOBinding:
    """Inputs and outputs bound to one session (`InferenceSession.io_binding()`)."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._inputs: dict[str, Any] = {}
        # name -> the caller's buffer (an ndarray over its memory) or None: a fresh result
        self._outputs: dict[str, np.ndarray | None] = {}
        self._results: list[OrtValue] = []

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

    def synchronize_outputs(self) -> None:
        """Nothing to wait for: outputs are complete when the run returns."""

    def clear_binding_outputs(self) -> None:
        """Forget every bound output and the last run's results."""
        self._outputs.clear()
        self._results = []

    # -- results ---------------------------------------------------------------------------
    def run(self, run_options: Any = None) -> None:
        """Run the session on the bound inputs, writing the bound outputs."""
        if not self._outputs:
            raise InputError("run_with_iobinding: at least one output must be bound")
        names = list(self._outputs)
        results = self._session.run(names, self._inputs, run_options)
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
        np.copyto(buf, result)
        return buf

    def get_outputs(self) -> list[OrtValue]:
        """The outputs of the last run, as OrtValues (over the bound buffers where bound)."""
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[Any]:
        """The outputs of the last run as NumPy arrays (copies)."""
        return [_copy(v.value()) for v in self._results]


def _copy(x: Any) -> Any:
    return x.copy() if isinstance(x, np.ndarray) else x
