"""Operators: string family (StringNormalizer, StringConcat, StringSplit, RegexFullMatch,
TfIdfVectorizer). String tensors are NumPy object arrays of Python str."""

import re

import numpy as np

from opwarden.contract import Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import op

_STRINGS = Contract(nan="none")


def _str_array(values, shape):
    """An object array of `shape` holding `values` (a flat iterable of str)."""
    out = np.empty(shape, dtype=object)
    out.reshape(-1)[:] = list(values) if out.size else []
    return out


def _as_str(s):
    return s.decode("utf-8") if isinstance(s, bytes) else str(s)


@op("StringNormalizer", since=10, contract=Contract(
    nan="none", allowed={"case_change_action": one_of("NONE", "LOWER", "UPPER")}))
def StringNormalizer(X, *, case_change_action="NONE", is_case_sensitive=0, locale=None,
                     stopwords=None):
    """Drops stopwords, then lower/upper-cases; en_US rules for any locale (StringNormalizer-10)."""
    if not (X.ndim == 1 or (X.ndim == 2 and X.shape[0] == 1)):
        raise KernelError(f"X must have shape [C] or [1, C], got {X.shape}")
    words = [_as_str(s) for s in X.reshape(-1)]
    if stopwords:
        if is_case_sensitive:
            stop = set(stopwords)
            words = [w for w in words if w not in stop]
        else:
            stop = {s.lower() for s in stopwords}
            words = [w for w in words if w.lower() not in stop]
    if case_change_action == "LOWER":
        words = [w.lower() for w in words]
    elif case_change_action == "UPPER":
        words = [w.upper() for w in words]
    elif case_change_action != "NONE":
        raise KernelError(f"case_change_action must be NONE, LOWER or UPPER, got "
                          f"{case_change_action!r}")
    if not words:
        words = [""]  # all dropped: one empty string, shape [1] or [1, 1]
    shape = (len(words),) if X.ndim == 1 else (1, len(words))
    return _str_array(words, shape)


@op("StringConcat", since=20, contract=Contract(nan="none", broadcast="multidirectional"))
def StringConcat(X, Y):
    """Elementwise X + Y with NumPy broadcasting (ONNX StringConcat-20)."""
    try:
        a, b = np.broadcast_arrays(X, Y)
    except ValueError:
        raise KernelError(f"cannot broadcast shapes {X.shape} and {Y.shape}") from None
    return _str_array((_as_str(x) + _as_str(y) for x, y in zip(a.flat, b.flat)), a.shape)


@op("StringSplit", since=20, contract=_STRINGS)
def StringSplit(X, *, delimiter=None, maxsplit=None):
    """Splits each string on a delimiter (whitespace runs if unset), padded (StringSplit-20)."""
    sep = delimiter if delimiter else None  # "" behaves like unset: split on whitespace runs
    limit = -1 if maxsplit is None else int(maxsplit)
    parts = [_as_str(s).split(sep, limit) for s in X.reshape(-1)]
    width = max((len(p) for p in parts), default=0)
    Y = np.full(X.shape + (width,), "", dtype=object)
    if Y.size:
        flat = Y.reshape(-1, width)
        for i, p in enumerate(parts):
            flat[i, : len(p)] = p
    Z = np.array([len(p) for p in parts], dtype=np.int64).reshape(X.shape)
    return Y, Z


@op("RegexFullMatch", since=20, contract=_STRINGS)
def RegexFullMatch(X, *, pattern=None):
    """True where the whole string matches the pattern (Python re for RE2) (RegexFullMatch-20)."""
    if pattern is None:
        raise KernelError("the pattern attribute is required")
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise KernelError(f"invalid regular expression {pattern!r}: {e}") from None
    out = np.array([rx.fullmatch(_as_str(s)) is not None for s in X.reshape(-1)], dtype=bool)
    return out.reshape(X.shape)


# ---------------------------------------------------------------------------------------------
# TfIdfVectorizer


def _ngram_table(pool, ngram_counts, ngram_indexes):
    """Maps each pool n-gram (a tuple) to its ordinal; ngram_counts[k] starts the (k+1)-grams."""
    table = {}
    starts = list(ngram_counts) + [len(pool)]
    ordinal = 0
    for k in range(len(ngram_counts)):
        n = k + 1
        lo, hi = int(starts[k]), int(starts[k + 1])
        if (hi - lo) % n:
            raise KernelError(f"pool segment for {n}-grams has {hi - lo} items, not a multiple")
        for pos in range(lo, hi, n):
            table[tuple(pool[pos : pos + n])] = ordinal
            ordinal += 1
    if ordinal != len(ngram_indexes):
        raise KernelError(f"pool holds {ordinal} n-grams but ngram_indexes has "
                          f"{len(ngram_indexes)} entries")
    return table


def _count_row(row, table, min_n, max_n, max_skip, counts):
    """Adds to counts[ordinal] every pool n-gram found in `row` for all lengths and skips."""
    L = len(row)
    for n in range(min_n, max_n + 1):
        # A 1-gram is the same item whatever the skip: count it once.
        for skip in range(max_skip + 1 if n > 1 else 1):
            span = (n - 1) * (skip + 1) + 1
            if span > L:
                break
            idx = np.arange(L - span + 1)[:, None] + np.arange(n)[None, :] * (skip + 1)
            for gram in map(tuple, row[idx].tolist()):
                k = table.get(gram)
                if k is not None:
                    counts[k] += 1


@op("TfIdfVectorizer", since=9, contract=Contract(
    nan="none", allowed={"mode": one_of("TF", "IDF", "TFIDF")}))
def TfIdfVectorizer(X, *, max_gram_length=None, max_skip_count=None, min_gram_length=None,
                    mode=None, ngram_counts=None, ngram_indexes=None, pool_int64s=None,
                    pool_strings=None, weights=None):
    """Counts pool n-grams (with skips) per row, weighted by mode (ONNX TfIdfVectorizer-9)."""
    if (pool_int64s is None) == (pool_strings is None):
        raise KernelError("exactly one of pool_int64s and pool_strings must be set")
    if None in (max_gram_length, min_gram_length, max_skip_count, mode, ngram_counts,
                ngram_indexes):
        raise KernelError("max/min_gram_length, max_skip_count, mode, ngram_counts and "
                          "ngram_indexes are required")
    if mode not in ("TF", "IDF", "TFIDF"):
        raise KernelError(f"mode must be TF, IDF or TFIDF, got {mode!r}")
    if not 1 <= min_gram_length <= max_gram_length:
        raise KernelError(f"need 1 <= min_gram_length <= max_gram_length, got "
                          f"{min_gram_length}, {max_gram_length}")
    if X.ndim not in (1, 2):
        raise KernelError(f"X must be 1-D or 2-D, got shape {X.shape}")
    if pool_strings is not None:
        pool = [_as_str(s) for s in pool_strings]
        rows = np.vectorize(_as_str, otypes=[object])(X) if X.size else X.astype(object)
    else:
        if X.dtype.kind not in "iu":
            raise KernelError(f"pool_int64s needs an integer input, got {X.dtype}")
        pool = [int(v) for v in pool_int64s]
        rows = X.astype(np.int64)
    table = _ngram_table(pool, ngram_counts, ngram_indexes)
    cols = np.asarray(ngram_indexes, dtype=np.int64)
    width = int(cols.max()) + 1 if cols.size else 0
    w = np.ones(len(cols)) if not weights else np.asarray(weights, dtype=np.float64)
    if w.shape != cols.shape:
        raise KernelError(f"weights has {w.size} entries, ngram_indexes {cols.size}")
    rows2 = rows.reshape(1, -1) if X.ndim == 1 else rows
    out = np.zeros((rows2.shape[0], width), dtype=np.float32)
    for r, row in enumerate(rows2):
        counts = np.zeros(len(cols), dtype=np.float64)
        _count_row(row, table, min_gram_length, max_gram_length, max_skip_count, counts)
        if mode == "IDF":
            counts = np.minimum(counts, 1) * w
        elif mode == "TFIDF":
            counts = counts * w
        # Several pool n-grams may share an output coordinate: accumulate.
        np.add.at(out[r], cols, counts.astype(np.float32))
    return out[0] if X.ndim == 1 else out
