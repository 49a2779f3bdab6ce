"""Weights in transparent huge pages.

Every run streams each layer's weights from memory once (ResNet-50: ~100 MB), and with 4 KiB
pages that is one TLB miss per 4 KiB, a two-level page walk under a hypervisor: GEMMs whose
weights stream from memory run faster from huge pages (figures in benchmarks/NOTES.md).

`move_weights` copies a model's large initializers into one anonymous mapping advised
MADV_HUGEPAGE (2 MiB aligned, so the kernel backs it with huge pages on first touch) and points
the graph at views of it through a read-only buffer (so no kernel can make them writeable);
once filled, the whole mapping is made read-only (mprotect), so a raw-pointer write faults
instead of changing the weights of every later run. The copy is made before the kernels pack
anything, so packed forms are built from it. When the weights were views of the memory-mapped
model file, each source range's file pages are dropped as soon as it is copied, so the weights
are never resident twice. Weights that are views of a model given as bytes (its caller's, which
stay alive, read-only) are not copied: the whole 2 MiB pages under them are collapsed into huge
pages in place (MADV_COLLAPSE, Linux 6.1+; as fast as the copy).

Linux only, and only where transparent huge pages are enabled ("always" or "madvise");
elsewhere it does nothing.
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
from typing import Any

import numpy as np

from opwarden.memory.constants import readonly_view
from opwarden.memory.pages import COPY_CHUNK, copy_in_chunks, drop_pages

HUGE_PAGE = 2 << 20
# Initializers smaller than this stay where they are (a bias, a BatchNorm vector).
MIN_BYTES = 64 << 10
_ALIGN = 64
_THP_PATH = "/sys/kernel/mm/transparent_hugepage/enabled"


def enabled() -> bool:
    """Huge pages are available and not turned off (OPWARDEN_HUGE_PAGES=0)."""
    if not _STATE:
        off = os.environ.get("OPWARDEN_HUGE_PAGES", "1").strip().lower() in (
            "0", "false", "no", "off")
        _STATE.append(not off and available())
    return _STATE[0]


_STATE: list[bool] = []


def available() -> bool:
    """Transparent huge pages can back an madvised mapping here."""
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open(_THP_PATH, encoding="ascii") as f:
            mode = f.read()
    except OSError:
        return False
    return "[always]" in mode or "[madvise]" in mode


def huge_page_buffer(nbytes: int) -> np.ndarray:
    """A uint8 array of `nbytes` at a 2 MiB boundary of an anonymous mapping advised
    MADV_HUGEPAGE (the array keeps the mapping alive)."""
    m = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE)
    raw = np.frombuffer(m, dtype=np.uint8)
    off = (-raw.ctypes.data) % HUGE_PAGE
    return raw[off:off + nbytes]


def _candidates(graph: Any) -> list[Any]:
    out = []
    for v in graph.initializers.values():
        a = v.const
        if (isinstance(a, np.ndarray) and a.nbytes >= MIN_BYTES and a.dtype.kind in "fiub"
                and a.dtype != object):
            out.append(v)
    return out


def _offset_in(a: np.ndarray, buffer: Any) -> int | None:
    """The byte offset of array a inside the model's buffer (a memory-mapped file or the bytes
    it was given as), or None when a is not a contiguous view of it."""
    if buffer is None or not a.flags.c_contiguous:
        return None
    try:
        base = np.frombuffer(buffer, dtype=np.uint8)
    except (TypeError, ValueError):
        return None
    off = a.ctypes.data - base.ctypes.data
    return off if 0 <= off and off + a.nbytes <= base.nbytes else None


# References to a private source inside move_weights: the Value's, the loop's, getrefcount's.
_PRIVATE_REFS = 3
_LIBC: dict[str, Any] = {}


def _libc(name: str, argtypes: list, restype: Any) -> Any:
    """glibc's function `name` (cached), or None where there is no such library."""
    if name not in _LIBC:
        try:
            import ctypes

            fn = getattr(ctypes.CDLL("libc.so.6"), name)
            fn.argtypes, fn.restype = argtypes, restype
        except (OSError, AttributeError):
            fn = None
        _LIBC[name] = fn
    return _LIBC[name]


def _madvise():
    """libc's madvise(addr, length, advice) -> int, or None."""
    import ctypes

    return _libc("madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int)


def _malloc_trim():
    """glibc's malloc_trim(pad) -> int, or None."""
    import ctypes

    return _libc("malloc_trim", [ctypes.c_size_t], ctypes.c_int)


def _discard(addr: int, nbytes: int) -> None:
    """Hand back the whole pages inside [addr, addr + nbytes) of anonymous memory whose
    contents are not needed again (they read back as zeros)."""
    fn = _madvise()
    if fn is None:
        return
    page = mmap.PAGESIZE
    start = -(-addr // page) * page
    end = (addr + nbytes) // page * page
    if end > start:
        fn(start, end - start, mmap.MADV_DONTNEED)


def move_weights(model: Any) -> int:
    """Put the main graph's initializers of at least MIN_BYTES in huge pages; returns their
    bytes (0 where huge pages are unavailable). Views of a model given as bytes are collapsed
    in place (MADV_COLLAPSE, Linux 6.1+; copying them would hold the weights twice, since the
    bytes stay with their caller), everything else is copied into one huge-page store."""
    if not enabled():
        return 0
    buffer = getattr(model, "buffer", None)
    # A memory-mapped file's pages are ours to drop after a copy; bytes stay with the caller.
    mapped = isinstance(buffer, mmap.mmap)
    values, in_place, shared = [], [], {}
    for v in _candidates(model.graph):
        if not mapped and _offset_in(v.const, buffer) is not None:
            in_place.append(v)
        elif id(v.const) in shared:  # one array behind several values is copied once
            shared[id(v.const)].append(v)
        else:
            shared[id(v.const)] = []
            values.append(v)
    done = _collapse_views([v.const for v in in_place]) if in_place else 0
    if not values:
        return done
    sizes = [-(-v.const.nbytes // _ALIGN) * _ALIGN for v in values]
    try:
        store = huge_page_buffer(sum(sizes))
    except (OSError, ValueError):
        return done
    # The graph gets views through a read-only buffer (no kernel can make them writeable);
    # `store` itself is written only here, then the OS makes the whole mapping read-only.
    frozen = np.asarray(memoryview(store).toreadonly())
    trim = _malloc_trim()
    off = freed = 0
    for v, size in zip(values, sizes):
        a = v.const
        dst = store[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
        src = _offset_in(a, buffer) if mapped else None
        # Only this graph holds a private source (an aligned copy the loader made, or a weight
        # a pass folded): its pages can be discarded as they are copied.
        private = (src is None and a.flags.owndata and a.base is None
                   and sys.getrefcount(a) <= _PRIVATE_REFS)
        if src is not None:
            # In chunks, each one's source pages handed back once copied: a 400 MB weight is
            # never resident twice.
            copy_in_chunks(a, dst, lambda o, n, at=src: drop_pages(buffer, at + o, n),
                           COPY_CHUNK)
        elif private:
            copy_in_chunks(a, dst, lambda o, n, at=a.ctypes.data: _discard(at + o, n),
                           COPY_CHUNK)
        else:
            np.copyto(dst, a)
            freed += a.nbytes
        ro = frozen[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
        for w in shared[id(a)]:
            w.const = ro
        v.const = ro
        del a
        off += size
        if trim is not None and freed >= TRIM_BYTES:
            # Weights the passes made (folded BatchNorms) sit in malloc's heap once freed; hand
            # their pages back as we go, or the store and they would peak together.
            trim(0)
            freed = 0
    if trim is not None and freed:
        trim(0)
    protect(store)
    return done + off


def _mapping(a: np.ndarray) -> Any:
    """The mmap object under an array of `huge_page_buffer` memory."""
    b = a
    while isinstance(b, np.ndarray):
        b = b.base
    return b.obj if isinstance(b, memoryview) else b  # (np.frombuffer's base is a memoryview)


def protect(a: np.ndarray) -> bool:
    """Make the whole anonymous mapping under `a` (a `huge_page_buffer`) read-only
    (mprotect PROT_READ): a write through a raw pointer then faults instead of changing
    weights for every later run. The whole mapping, so no huge page is split. False where
    mprotect is unavailable (not glibc) or refused; nothing changes then."""
    import ctypes

    m = _mapping(a)
    fn = _libc("mprotect", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int)
    if fn is None or not isinstance(m, mmap.mmap):
        return False
    start = np.frombuffer(m, dtype=np.uint8, count=1).ctypes.data
    return fn(start, len(m), mmap.PROT_READ) == 0


MADV_COLLAPSE = 25  # Linux 6.1+ (not in Python's mmap module before 3.13)


def _collapse_views(arrays: list[np.ndarray]) -> int:
    """Collapse the whole 2 MiB pages under `arrays` into huge pages in place; returns the
    bytes of those arrays now covered (0 where the kernel cannot collapse)."""
    fn = _madvise()
    if fn is None:
        return 0
    lo = min(a.ctypes.data for a in arrays)
    hi = max(a.ctypes.data + a.nbytes for a in arrays)
    start = -(-lo // HUGE_PAGE) * HUGE_PAGE
    end = hi // HUGE_PAGE * HUGE_PAGE
    if end <= start:
        return 0
    fn(start, end - start, mmap.MADV_HUGEPAGE)
    if fn(start, end - start, MADV_COLLAPSE) != 0:
        return 0
    return sum(max(0, min(a.ctypes.data + a.nbytes, end) - max(a.ctypes.data, start))
               for a in arrays)


# Bytes of freed source weights between malloc_trim calls (each walks the heap, ~1 ms).
TRIM_BYTES = 4 << 20


# Packed weights (kernels.util.packed) are bump-allocated from huge-page slabs: each packing is
# made once per weight, and a slab lives while any array in it does.
SLAB_BYTES = 32 << 20
PACKED = True  # (a switch for measurements)
_SLAB: list = [None, 0]
_SLAB_LOCK = threading.Lock()


def huge_copy(a: np.ndarray, private: bool = False) -> np.ndarray:
    """`a` copied into huge-page memory, or `a` itself when it is small or huge pages are off.
    `private`: nothing else will read `a`, so its pages are handed back chunk by chunk as they
    are copied (and malloc's freed heap first), and the two are never resident together."""
    if a.nbytes < MIN_BYTES or not PACKED or not enabled():
        return a
    size = -(-a.nbytes // _ALIGN) * _ALIGN
    with _SLAB_LOCK:
        buf, off = _SLAB
        if buf is None or off + size > buf.size:
            try:
                buf = huge_page_buffer(max(SLAB_BYTES, -(-size // HUGE_PAGE) * HUGE_PAGE))
            except (OSError, ValueError):
                return a
            off = 0
        _SLAB[0], _SLAB[1] = buf, off + size
    out = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    # Handed out through a read-only buffer: no kernel can make a packing writeable. (The
    # slab stays writable to the OS: later packings are still copied into it, and protecting
    # part of it would split its huge pages.)
    if not (private and a.flags.c_contiguous):
        np.copyto(out, a)
        return readonly_view(out)
    release_heap(a.nbytes)  # large packings: the temporaries they freed (a float64 product)
    copy_in_chunks(a, out, lambda o, n, at=a.ctypes.data: _discard(at + o, n), COPY_CHUNK)
    return readonly_view(out)


def release_heap(nbytes: int) -> None:
    """After freeing an array of `nbytes` that came from malloc's heap: hand its pages back
    when it was large (TRIM_BYTES or more), so a copy moved to huge pages is not held twice."""
    if nbytes >= TRIM_BYTES:
        trim = _malloc_trim()
        if trim is not None:
            trim(0)
