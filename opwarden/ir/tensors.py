"""TensorProto -> NumPy without needless copies (views over raw bytes, mmapped external data)."""

from __future__ import annotations

import os
import stat

import numpy as np
import onnx
from onnx import numpy_helper

from opwarden.dtypes import np_dtype
from opwarden.errors import ModelError
from opwarden.memory.pages import copy_in_chunks, drop_pages

# Packed sub-byte types need unpacking, so they cannot be plain views.
_PACKED = {
    onnx.TensorProto.INT4,
    onnx.TensorProto.UINT4,
    onnx.TensorProto.FLOAT4E2M1,
}
for _n in ("INT2", "UINT2"):
    if hasattr(onnx.TensorProto, _n):
        _PACKED.add(getattr(onnx.TensorProto, _n))


def external_path(base_dir: str | None, location: str, where: str) -> str:
    """Resolve an external-data location, refusing anything outside the model's folder.

    `where` names the tensor in errors ("initializer 'w'", "node 'c' (Constant) attribute
    'value' tensor 'c'"). Symlinks are resolved first, so one that leaves the folder is refused.
    """
    if base_dir is None:
        raise ModelError(
            f"{where} stores its data in external file {location!r}, but the model was not "
            "loaded from a path, so there is no model folder to read it from (load the model "
            "from its file)"
        )
    if not location or "\x00" in location:
        raise ModelError(f"{where}: external data location {location!r} is not a file name")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or os.path.splitdrive(
            location)[0]:
        raise ModelError(
            f"{where}: external data path {location!r} is absolute; only paths inside the "
            "model's folder are allowed"
        )
    base = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(base, location))
    if os.path.commonpath([base, path]) != base:
        raise ModelError(
            f"{where}: external data path {location!r} leaves the model's folder "
            f"{base_dir!r} (resolves to {path!r}); refused"
        )
    return path


# O_NONBLOCK: opening a FIFO must not wait for a writer; O_NOFOLLOW: the resolved path's last
# component may not have been swapped for a symlink since it was checked.
_OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))


def _open_regular(path: str, location: str, where: str) -> tuple[int, int]:
    """(fd, size) of a regular file; ModelError for anything else (FIFO, device, directory)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise ModelError(f"{where}: external data file {location!r} not found") from None
    except OSError as e:
        raise ModelError(
            f"{where}: external data file {location!r} cannot be opened: {e.strerror}"
        ) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ModelError(
            f"{where}: external data file {location!r} is not a regular file "
            f"({_file_kind(st.st_mode)}); refused"
        )
    return fd, st.st_size


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def _int_field(info: dict[str, str], key: str, where: str) -> int | None:
    if key not in info:
        return None
    try:
        n = int(info[key])
    except ValueError:
        raise ModelError(
            f"{where}: external data {key} {info[key]!r} is not an integer"
        ) from None
    if n < 0:
        raise ModelError(f"{where}: external data {key} {n} is negative")
    return n


def _external(t: onnx.TensorProto, base_dir: str | None, where: str) -> np.ndarray:
    info = {e.key: e.value for e in t.external_data}
    if "location" not in info:
        raise ModelError(f"{where}: external data without a location")
    location = info["location"]
    path = external_path(base_dir, location, where)
    dtype = _dtype(t)
    if t.data_type in _PACKED or dtype.kind == 'O':
        raise ModelError(f"{where}: external data of packed or string type is not supported")
    shape = tuple(int(d) for d in t.dims)
    if any(d < 0 for d in shape):
        raise ModelError(f"{where}: negative dimension in shape {list(shape)}")
    count = int(np.prod(shape, dtype=object))
    offset = _int_field(info, "offset", where) or 0
    nbytes = count * dtype.itemsize
    length = _int_field(info, "length", where)
    if length is None:
        length = nbytes
    fd, size = _open_regular(path, location, where)
    with os.fdopen(fd, "rb") as f:
        if length < nbytes or offset + max(length, nbytes) > size:
            raise ModelError(
                f"{where}: external data (offset {offset}, length {length}, {nbytes} bytes "
                f"needed for shape {list(shape)} of {dtype}) runs past file {location!r} of "
                f"{size} bytes"
            )
        if count == 0:
            return np.zeros(shape, dtype)
        return np.memmap(f, dtype=dtype, mode="r", offset=offset, shape=shape)


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


def to_array(t: onnx.TensorProto, base_dir: str | None = None, owned: bool = False,
             where: str | None = None) -> np.ndarray:
    """NumPy array for a TensorProto: a read-only view over its bytes where possible.

    External data is read only from inside `base_dir` (the model's folder; None: refused),
    whoever holds the tensor (initializer, Constant attribute, sparse tensor, subgraph,
    function body); `where` names the holder in errors. With ``owned`` (the loader parsed the
    protobuf itself) the raw bytes are moved out of the message so the weights are not held
    twice.
    """
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return _external(t, base_dir, where or f"tensor {t.name!r}")
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


def _aligned_copy(buffer, src: np.ndarray, offset: int) -> np.ndarray:
    """An aligned copy of `src`, made in chunks whose file pages are dropped as they are read,
    so the largest weight is never held twice."""
    out = np.empty(src.shape, src.dtype)
    copy_in_chunks(src, out, lambda o, n: drop_pages(buffer, offset + o, n))
    return out


