"""OrtValue: onnxruntime's value handle, over host memory.

An OrtValue made from a NumPy array shares the array's memory (no copy, as onnxruntime's
does on the CPU); one made from a shape and type owns a zeroed array. Sequences and maps a
run returns are wrapped too (`is_tensor()` False). Only the "cpu" device exists for values:
every opwarden device that computes elsewhere copies in and out itself (DeviceCopy nodes).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from opwarden.dtypes import dtype_name, np_dtype, onnx_type
from opwarden.errors import InputError

_ORT_TYPE = {"float32": "float", "float64": "double"}


def tensor_type_str(dtype: Any) -> str:
    """'tensor(float)' for float32, as onnxruntime spells element types."""
    name = dtype_name(dtype)
    return f"tensor({_ORT_TYPE.get(name, name)})"


def element_dtype(element_type: Any) -> np.dtype:
    """A NumPy dtype from a NumPy type or an ONNX TensorProto element type code."""
    if isinstance(element_type, (int, np.integer)) and not isinstance(element_type, bool):
        try:
            return np.dtype(np_dtype(int(element_type)))
        except KeyError:
            raise InputError(f"unknown ONNX element type {element_type}") from None
    try:
        return np.dtype(element_type)
    except TypeError:
        raise InputError(f"element_type {element_type!r} is not a NumPy or ONNX type") from None


def check_host(device_type: Any, device_id: Any = 0) -> None:
    """Refuse a device other than the host's memory (the only one values live in here)."""
    if str(device_type).lower() != "cpu":
        raise InputError(
            f"device {device_type!r} (id {device_id}) is not available: opwarden's values live "
            "in host memory; use device_type='cpu'")


def array_at(ptr: int, dtype: Any, shape: Sequence[int]) -> np.ndarray:
    """A writable array over `prod(shape)` elements of `dtype` at host address `ptr` (no copy).
    The caller keeps that memory alive, as with onnxruntime's pointer bindings."""
    dt = element_dtype(dtype)
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        raise InputError(f"shape {list(shape)} has a negative dimension")
    if not isinstance(ptr, int) or isinstance(ptr, bool) or ptr <= 0:
        raise InputError(f"buffer_ptr must be a non-null address (an int), got {ptr!r}")
    if dt.kind == "O":
        raise InputError("string tensors cannot be bound by pointer")
    n = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
    buf = (ctypes.c_char * n).from_address(ptr)
    return np.frombuffer(buf, dtype=dt).reshape(dims)


class OrtValue:
    """A tensor (or a sequence/map a run returned) in host memory, as onnxruntime's OrtValue."""

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def ortvalue_from_numpy(cls, numpy_obj: Any, device_type: str = "cpu", device_id: int = 0,
                            vendor_id: int = -1) -> OrtValue:
        """An OrtValue over `numpy_obj`'s memory (no copy: writes to either show in both)."""
        check_host(device_type, device_id)
        if not isinstance(numpy_obj, np.ndarray):
            raise InputError(
                f"ortvalue_from_numpy needs a numpy array, got {type(numpy_obj).__name__}")
        return cls(numpy_obj)

    @classmethod
    def ortvalue_from_numpy_with_onnx_type(cls, data: np.ndarray, onnx_element_type: int
                                           ) -> OrtValue:
        """An OrtValue over `data`'s memory reinterpreted as an ONNX element type of the same
        item size."""
        dt = element_dtype(onnx_element_type)
        if not isinstance(data, np.ndarray) or data.dtype.itemsize != dt.itemsize:
            raise InputError(
                f"cannot view {getattr(data, 'dtype', type(data).__name__)} data as "
                f"{dtype_name(dt)} (item sizes differ)")
        return cls(data.view(dt))

    @classmethod
    def ortvalue_from_shape_and_type(cls, shape: Sequence[int], element_type: Any,
                                     device_type: str = "cpu", device_id: int = 0,
                                     vendor_id: int = -1) -> OrtValue:
        """A new zeroed tensor of `shape` and `element_type` (NumPy type or ONNX code)."""
        check_host(device_type, device_id)
        dt = element_dtype(element_type)
        try:
            dims = [int(d) for d in shape]
        except (TypeError, ValueError):
            raise InputError(f"shape must be a list of ints, got {shape!r}") from None
        if any(d < 0 for d in dims):
            raise InputError(f"shape {dims} has a negative dimension")
        return cls(np.zeros(dims, dt) if dt.kind != "O" else np.full(dims, "", object))

    # -- what it holds ---------------------------------------------------------------------
    def _tensor(self, what: str) -> np.ndarray:
        if not isinstance(self._value, np.ndarray):
            raise InputError(f"{what}: this OrtValue holds a {type(self._value).__name__}, "
                             "not a tensor")
        return self._value

    def numpy(self) -> Any:
        """The tensor as a NumPy array sharing this value's memory."""
        return self._tensor("numpy()").view()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.numpy()
        if copy:
            return np.array(a, dtype=dtype, copy=True)
        return a if dtype is None else np.asarray(a, dtype=dtype)

    def __dlpack__(self, *, stream: Any = None) -> Any:
        """A DLPack capsule over the tensor's memory (no copy)."""
        return self._tensor("__dlpack__()").__dlpack__(stream=stream)

    def __dlpack_device__(self) -> tuple[int, int]:
        """(kDLCPU, 0): host memory."""
        return (1, 0)  # kDLCPU, device 0

    @classmethod
    def from_dlpack(cls, data: Any) -> OrtValue:
        """An OrtValue sharing the memory of a DLPack producer on the CPU (a NumPy array, a
        CPU torch tensor)."""
        try:
            return cls(np.from_dlpack(data))
        except (TypeError, ValueError, RuntimeError, BufferError) as e:
            raise InputError(f"from_dlpack: {type(data).__name__} is not a CPU DLPack "
                             f"tensor NumPy can read: {e}") from None

    def value(self) -> Any:
        """What a run gave or a feed will be: an array, a list (sequence) or a dict (map)."""
        return self._value

    def shape(self) -> list[int]:
        """The tensor's dims."""
        return list(self._tensor("shape()").shape)

    def data_type(self) -> str:
        """'tensor(float)', 'seq(tensor(float))', 'map(int64,tensor(float))' (as onnxruntime)."""
        v = self._value
        if isinstance(v, np.ndarray):
            return tensor_type_str(v.dtype)
        if isinstance(v, list):
            inner = tensor_type_str(v[0].dtype) if v and isinstance(v[0], np.ndarray) else "?"
            return f"seq({inner})"
        if isinstance(v, dict):
            k = next(iter(v), None)
            key = "string" if isinstance(k, str) else "int64"
            val = next(iter(v.values()), None)
            vt = tensor_type_str(np.asarray(val).dtype) if val is not None else "?"
            return f"map({key},{vt})"
        return "optional" if v is None else type(v).__name__

    def element_type(self) -> int:
        """The ONNX TensorProto element type code (1 for float32)."""
        return int(onnx_type(self._tensor("element_type()").dtype))

    def device_name(self) -> str:
        """Where the memory is: always "cpu" (host memory)."""
        return "cpu"

    def data_ptr(self) -> int:
        """The address of the first element."""
        return int(self._tensor("data_ptr()").__array_interface__["data"][0])

    def tensor_size_in_bytes(self) -> int:
        """The tensor's size in bytes."""
        return int(self._tensor("tensor_size_in_bytes()").nbytes)

    def is_tensor(self) -> bool:
        """Does it hold a tensor (not a sequence, map or empty optional)?"""
        return isinstance(self._value, np.ndarray)

    def is_sparse_tensor(self) -> bool:
        """Always False: opwarden's values are dense."""
        return False

    def is_tensor_sequence(self) -> bool:
        """Does it hold a sequence of tensors?"""
        return isinstance(self._value, list)

    def has_value(self) -> bool:
        """False for an empty optional a run returned."""
        return self._value is not None

    def update_inplace(self, data: Any) -> None:
        """Copy `data` (an array or an OrtValue of the same element count and type) into
        this value's memory; its address stays the same."""
        dst = self._tensor("update_inplace()")
        src = data.numpy() if isinstance(data, OrtValue) else data
        if not isinstance(src, np.ndarray):
            raise InputError(f"update_inplace needs a numpy array or an OrtValue, got "
                             f"{type(data).__name__}")
        if src.size != dst.size:
            raise InputError(
                f"update_inplace: the array has {src.size} elements, the OrtValue {dst.size} "
                f"(shape {list(dst.shape)})")
        if dtype_name(src.dtype) != dtype_name(dst.dtype):
            raise InputError(f"update_inplace: the array is {dtype_name(src.dtype)}, the "
                             f"OrtValue {dtype_name(dst.dtype)}")
        if not dst.flags.writeable:
            raise InputError("update_inplace: this OrtValue's memory is read-only")
        np.copyto(dst, src.reshape(dst.shape))

    def __repr__(self) -> str:
        v = self._value
        desc = f"{self.data_type()}{list(v.shape)}" if isinstance(v, np.ndarray) else \
            self.data_type()
        return f"OrtValue({desc})"


def unwrap(x: Any) -> Any:
    """A feed as the run takes it: an OrtValue's content, anything else as given."""
    return x._value if isinstance(x, OrtValue) else x
