"""Fuzzing: mutated model bytes and feeds only ever raise OpwardenError subclasses."""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opwarden as ow
from tests.models import small_cnn

BASE = small_cnn(batch=2).SerializeToString()
X = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)

mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, len(BASE) - 1), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, len(BASE) - 1), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, len(BASE) - 1), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, len(BASE) - 1), st.integers(1, 16)),
)


def _mutate(data: bytes, muts) -> bytes:
    b = bytearray(data)
    for kind, pos, val in muts:
        pos = min(pos, max(len(b) - 1, 0))
        if kind == "flip" and b:
            b[pos] ^= val
        elif kind == "cut":
            b = b[:pos]
        elif kind == "insert":
            b.insert(pos, val)
        elif kind == "delete":
            del b[pos : pos + val]
    return bytes(b)


def _try(data: bytes, feeds) -> None:
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            sess = ow.InferenceSession(data)
            sess.run(None, feeds)
    except ow.OpwardenError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutation, min_size=1, max_size=4))
def test_mutated_model_bytes_raise_only_opwarden_errors(muts):
    _try(_mutate(BASE, muts), {"x": X})


dtypes = st.sampled_from([np.float32, np.float64, np.int64, np.int8, np.bool_, np.float16])
shapes = st.lists(st.integers(0, 9), min_size=0, max_size=5)


@settings(max_examples=150, deadline=None)
@given(dtypes, shapes, st.sampled_from(["x", "y", "", "xx"]))
def test_fuzzed_feeds_raise_only_opwarden_errors(dtype, shape, name):
    _try(BASE, {name: np.zeros(shape, dtype=dtype)})


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=0, max_size=400))
def test_random_bytes_raise_only_opwarden_errors(data):
    _try(data, {"x": X})
