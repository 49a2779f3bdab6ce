"""Constants: the arrays the runtime declares fixed for as long as they live.

Kernels cache work derived from a weight's values (a packed or transformed copy, a finiteness
scan, a device upload) and reuse it on the next call with the same array. That is only sound
for an array whose values cannot change between calls. Read-only is not that: the executor
hands every intermediate to the next kernel read-only, and a planned buffer's view is the same
array object on every run with new values in it (a Conv whose weights are computed by an
earlier node would reuse the first run's packed weights forever). So constness is declared,
not inferred: the runtime marks a program's initializers (`freeze`), and kernels ask
`is_constant` before caching.

`freeze` also makes an initializer read-only for good: a kernel can set `flags.writeable = True` on
any array whose memory an array or a writable buffer owns, so a weight copied or computed at
load is handed out as a view through a read-only buffer (`readonly_view`), which no kernel can
make writeable; views of the read-only file mapping or of bytes already are.

Entries are weak: a mark dies with its array, so an id reused by a later array is never taken
for a constant.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

_MARKED: dict[int, weakref.ref] = {}
_FROZEN: dict[int, weakref.ref] = {}  # id(array) -> its read-only-based view


def mark(a: Any) -> Any:
    """Declare `a` constant for its whole life (and make it read-only); returns `a`. Anything
    that is not an ndarray is returned unchanged."""
    if type(a) is not np.ndarray:
        return a
    if a.flags.writeable:
        a.flags.writeable = False
    _register(a)
    return a


def freeze(a: Any) -> Any:
    """`mark(a)`, returning the array to hand to kernels: `a` itself when nothing can make it
    writeable again (a view of the read-only file mapping or of bytes), else its
    `readonly_view`, declared constant too (one per array: a weight behind several values is
    packed once)."""
    if type(a) is not np.ndarray:
        return a
    mark(a)
    key = id(a)
    ref = _FROZEN.get(key)
    frozen = ref() if ref is not None else None
    if frozen is None:
        frozen = readonly_view(a)
        if frozen is a:
            return a
        # The view holds `a` alive, so while this entry lives its id cannot be reused.
        _FROZEN[key] = weakref.ref(frozen, lambda r, key=key, d=_FROZEN: _pop_if(d, key, r))
    _register(frozen)
    return frozen


def _register(a: np.ndarray) -> None:
    key = id(a)
    ref = _MARKED.get(key)
    if ref is not None and ref() is a:
        return
    _MARKED[key] = weakref.ref(a, lambda r, key=key, d=_MARKED: _pop_if(d, key, r))


def _pop_if(d: dict, key: int, r: weakref.ref) -> None:
    # (d bound at definition: at interpreter exit module globals may already be None)
    if d.get(key) is r:
        del d[key]


def locked(a: np.ndarray) -> bool:
    """Whether nothing can make `a` writeable again: its memory's owner is a read-only buffer
    (bytes, a read-only mapping, a read-only memoryview). An array that owns its memory, or
    views memory an array or writable buffer owns, can always be flipped back (NumPy allows
    `flags.writeable = True` there), whatever its flags say now."""
    b = a
    while type(b) is np.ndarray or isinstance(b, np.ndarray):
        if b.base is None:
            return False
        b = b.base
    if type(b) is bytes:
        return True
    try:
        with memoryview(b) as m:
            return m.readonly
    except TypeError:
        return False


def readonly_view(a: np.ndarray) -> np.ndarray:
    """`a`, or a view of its memory through a read-only buffer, which no one holding only
    the view can make writeable (`a` itself and its own flags are left as they are). A
    dtype with no buffer form, even through an unsigned integer of its size, comes back
    unchanged."""
    if locked(a):
        return a
    try:
        v = np.asarray(memoryview(a).toreadonly())
        if v.dtype == a.dtype and v.shape == a.shape:
            return v
    except (TypeError, ValueError, BufferError):
        pass
    # Dtypes without a buffer format (ml_dtypes' bfloat16/float8, datetimes) through the
    # unsigned integer of their size, then viewed back.
    n = a.dtype.itemsize
    if a.dtype.kind != "O" and n in (1, 2, 4, 8):
        try:
            u = a.view(np.dtype(f"u{n}"))
            return np.asarray(memoryview(u).toreadonly()).view(a.dtype)
        except (TypeError, ValueError, BufferError):
            pass
    return a


def is_constant(a: Any) -> bool:
    """Whether `a` itself (not a view of it, not its base) was declared constant."""
    ref = _MARKED.get(id(a))
    return ref is not None and ref() is a
