"""Copying large arrays without holding them twice: chunked copies that hand source pages back."""

from __future__ import annotations

import numpy as np

# Copies that hand their source back go in chunks of this many bytes (the default here and
# memory.hugepages' copies).
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
