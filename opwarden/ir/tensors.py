"""TensorProto -> NumPy without needless copies (views over raw bytes, mmapped external data)."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import numpy_helper

from ..dtypes import np_dtype
from ..errors import ModelError

# Packed sub-byte types need unpacking, so they cannot be plain views.
_PACKED = {
    onnx.TensorProto.INT4,
    onnx.TensorProto.UINT4,
    onnx.TensorProto.FLOAT4E2M1,
}
for _n in ("INT2", "UINT2"):
    if hasattr(onnx.TensorProto, _n):
        _PACKED.add(getattr(onnx.TensorProto, _n))


def external_path(base_dir: str | None, location: str, tensor_name: str) -> str:
    """Resolve an external-data location, refusing anything outside the model's folder."""
    if base_dir is None:
        raise ModelError(
            f"initializer {tensor_name!r} stores its data in external file {location!r}, "
            "but the model was not loaded from a path (load it from its file)"
        )
    if os.path.isabs(location) or location.startswith(("/", "\\")):
        raise ModelError(
            f"initializer {tensor_name!r}: external data path {location!r} is absolute; "
            "only paths inside the model's folder are allowed"
        )
    base = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(base, location))
    if os.path.commonpath([base, path]) != base:
        raise ModelError(
            f"initializer {tensor_name!r}: external data path {location!r} leaves the model's "
            f"folder {base_dir!r}; refused"
        )
    if not os.path.isfile(path):
        raise ModelError(f"initializer {tensor_name!r}: external data file {location!r} not found")
    return path


def _external(t: onnx.TensorProto, base_dir: str | None) -> np.ndarray:
    info = {e.key: e.value for e in t.external_data}
    if "location" not in info:
        raise ModelError(f"initializer {t.name!r}: external data without a location")
    path = external_path(base_dir, info["location"], t.name)
    dtype = np_dtype(t.data_type)
    shape = tuple(int(d) for d in t.dims)
    count = int(np.prod(shape, dtype=np.int64))
    offset = int(info.get("offset", 0))
    nbytes = count * dtype.itemsize
    length = int(info.get("length", nbytes))
    size = os.path.getsize(path)
    if t.data_type in _PACKED or dtype.kind == 'O':
        raise ModelError(f"initializer {t.name!r}: external data of packed type is not supported")
    if length < nbytes or offset + nbytes > size:
        raise ModelError(
            f"initializer {t.name!r}: external data ({offset}+{nbytes} bytes) exceeds "
            f"file {info['location']!r} of {size} bytes"
        )
    if count == 0:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def _dtype(t: onnx.TensorProto) -> np.dtype:
    try:
        return np_dtype(t.data_type)
    except KeyError:
        raise ModelError(f"tensor {t.name!r}: unknown data type {t.data_type}") from None


def _raw_layout(t: onnx.TensorProto, dtype: np.dtype, nbytes: int) -> tuple[tuple, int]:
    """(shape, element count) of a raw payload, checked against its byte length."""
    shape = tuple(int(d) for d in t.dims)
    count = int(np.prod(shape, dtype=np.int64))
    if nbytes != count * dtype.itemsize:
        raise ModelError(
            f"tensor {t.name!r}: raw_data has {nbytes} bytes, shape {list(shape)} of "
            f"{dtype} needs {count * dtype.itemsize}"
        )
    return shape, count


def to_array(t: onnx.TensorProto, base_dir: str | None = None, owned: bool = False) -> np.ndarray:
    """NumPy array for a TensorProto: a read-only view over its bytes where possible.

    With ``owned`` (the loader parsed the protobuf itself) the raw bytes are moved out of the
    message so the weights are not held twice.
    """
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return _external(t, base_dir)
    dtype = _dtype(t)
    if t.HasField("raw_data") and t.data_type not in _PACKED and dtype.kind != 'O':
        raw = t.raw_data
        shape, _ = _raw_layout(t, dtype, len(raw))
        arr = np.frombuffer(raw, dtype=dtype).reshape(shape)
        if owned:
            t.ClearField("raw_data")
        return arr
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:  # noqa: BLE001 - onnx raises assorted errors on corrupt tensors
        raise ModelError(f"tensor {t.name!r} cannot be decoded: {e}") from None
    if arr.dtype != dtype and dtype.kind != 'O':
        arr = arr.astype(dtype)
    return arr


def payload_array(t: onnx.TensorProto, buffer, pl) -> np.ndarray:
    """A read-only view over an initializer's raw bytes left in the serialized model."""
    dtype = _dtype(t)
    if t.data_type in _PACKED or dtype.kind == "O":
        full = onnx.TensorProto()
        full.CopyFrom(t)
        full.raw_data = bytes(buffer[pl.offset : pl.offset + pl.length])
        return to_array(full)
    shape, count = _raw_layout(t, dtype, pl.length)
    arr = np.frombuffer(buffer, dtype=dtype, count=count, offset=pl.offset).reshape(shape)
    if pl.offset % dtype.alignment:
        # Protobuf puts payloads at arbitrary offsets. NumPy (and BLAS) copy misaligned
        # operands on every call, so a misaligned weight is copied once here, and its file
        # pages are handed back so the weight is not held twice.
        arr = _aligned_copy(buffer, arr, pl.offset)
    if arr.flags.writeable:
        arr.flags.writeable = False
    return arr


COPY_CHUNK = 16 << 20


def copy_in_chunks(src: np.ndarray, dst: np.ndarray, release=None,
                   chunk: int = COPY_CHUNK) -> None:
    """dst[...] = src (same size) in chunks of about `chunk` bytes, calling
    release(byte offset, byte count) after each chunk is copied: the caller hands the source's
    pages back as it goes, so a large array is never resident twice."""
    flat_src, flat_dst = src.reshape(-1), dst.reshape(-1)
    e = src.dtype.itemsize
    step = max(chunk // max(e, 1), 1)
    for i in range(0, flat_src.size, step):
        j = min(i + step, flat_src.size)
        flat_dst[i:j] = flat_src[i:j]
        if release is not None:
            release(i * e, (j - i) * e)


def _aligned_copy(buffer, src: np.ndarray, offset: int) -> np.ndarray:
    """An aligned copy of `src`, made in chunks whose file pages are dropped as they are read,
    so the largest weight is never held twice."""
    out = np.empty(src.shape, src.dtype)
    copy_in_chunks(src, out, lambda o, n: drop_pages(buffer, offset + o, n))
    return out


def drop_pages(buffer, offset: int, length: int) -> None:
    """Hand back the memory-mapped file `buffer`'s pages under [offset, offset + length) (they
    are re-read from the file if touched again); nothing for other buffers."""
    import mmap

    if not isinstance(buffer, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = offset // mmap.PAGESIZE * mmap.PAGESIZE
    try:
        buffer.madvise(mmap.MADV_DONTNEED, start, offset + length - start)
    except (OSError, ValueError):
        pass
