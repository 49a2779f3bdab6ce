"""Constants: the arrays the runtime declares fixed for as long as they live.

Kernels cache work derived from a weight's values (a packed or transformed copy, a finiteness
scan, a device upload) and reuse it on the next call with the same array. That is only sound
for an array whose values cannot change between calls. Read-only is not that: the executor
hands every intermediate to the next kernel read-only, and a planned buffer's view is the same
array object on every run with new values in it (a Conv whose weights are computed by an
earlier node would reuse the first run's packed weights forever). So constness is declared,
not inferred: the runtime marks a program's initializers (`mark`), and kernels ask
`is_constant` before caching.

Entries are weak: a mark dies with its array, so an id reused by a later array is never taken
for a constant.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

_MARKED: dict[int, weakref.ref] = {}


def mark(a: Any) -> Any:
    """Declare `a` constant for its whole life (and make it read-only); returns `a`. Anything
    that is not an ndarray is returned unchanged."""
    if type(a) is not np.ndarray:
        return a
    if a.flags.writeable:
        a.flags.writeable = False
    key = id(a)
    ref = _MARKED.get(key)
    if ref is not None and ref() is a:
        return a

    def _drop(r: weakref.ref, key: int = key, marked: dict = _MARKED) -> None:
        # (bound now: at interpreter exit module globals may already be None)
        if marked.get(key) is r:
            del marked[key]

    _MARKED[key] = weakref.ref(a, _drop)
    return a


def is_constant(a: Any) -> bool:
    """Whether `a` itself (not a view of it, not its base) was declared constant."""
    ref = _MARKED.get(id(a))
    return ref is not None and ref() is a
