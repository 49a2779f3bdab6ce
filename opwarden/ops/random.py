"""Operators: random family (RandomNormal/Uniform[Like], Bernoulli, Multinomial).

A node with a `seed` attribute draws from a generator seeded from it afresh on every call, so its
output is a deterministic function of the seed (and the input); without a seed each call draws
from fresh OS entropy. Values are sampled in float64 and cast to the requested dtype.
"""

import struct

import numpy as np

from opwarden.contract import Contract, such_that
from opwarden.dtypes import np_dtype
from opwarden.errors import KernelError
from opwarden.ops.base import op

_FLOAT_CODES = (1, 10, 11, 16)  # float, float16, double, bfloat16


_SEEDED: list[np.random.Generator] = []  # the generator set_seed made, for unseeded nodes


def set_seed(seed: int) -> None:
    """Unseeded random nodes draw from one generator seeded with `seed` from now on
    (onnxruntime.set_seed; opwarden.ort.module)."""
    _SEEDED[:] = [np.random.default_rng(seed)]


def _rng(seed):
    if seed is None:
        return _SEEDED[0] if _SEEDED else np.random.default_rng()
    # The attribute is a float: seed from its exact bit pattern so that e.g. 0.5 and 0.0 differ.
    return np.random.default_rng(struct.unpack("<Q", struct.pack("<d", float(seed)))[0])


def _out_dtype(dtype, like, allowed=_FLOAT_CODES):
    if dtype is None:
        if like is None:
            raise KernelError("no dtype attribute and no input to take the dtype from")
        return np.dtype(like.dtype)
    if int(dtype) not in allowed:
        raise KernelError(f"dtype {dtype} is not an allowed output type here")
    return np_dtype(int(dtype))


def _contract(nan, codes=_FLOAT_CODES):
    rule = such_that(lambda v: v is None or int(v) in codes, f"a TensorProto code in {codes}")
    return Contract(nan=nan, deterministic=False, allowed={"dtype": rule})


def _shape(shape):
    if shape is None:
        raise KernelError("the shape attribute is required")
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise KernelError(f"shape must not have negative dimensions, got {list(dims)}")
    return dims


@op("RandomNormal", since=1, contract=_contract("propagate"))
def RandomNormal(*, dtype=1, mean=0.0, scale=1.0, seed=None, shape=None):
    """Samples of N(mean, scale^2) with the shape attribute (ONNX RandomNormal-1)."""
    dt = _out_dtype(dtype, None)
    return _rng(seed).normal(mean, scale, _shape(shape)).astype(dt)


@op("RandomUniform", since=1, contract=_contract("propagate"))
def RandomUniform(*, dtype=1, high=1.0, low=0.0, seed=None, shape=None):
    """Samples of U[low, high) with the shape attribute (ONNX RandomUniform-1)."""
    dt = _out_dtype(dtype, None)
    return _rng(seed).uniform(low, high, _shape(shape)).astype(dt)


@op("RandomNormalLike", since=1, contract=_contract("suppress"))
def RandomNormalLike(input, *, dtype=None, mean=0.0, scale=1.0, seed=None):
    """Samples of N(mean, scale^2) shaped like the input (ONNX RandomNormalLike-1)."""
    dt = _out_dtype(dtype, input)
    if dt.kind not in "fV":
        raise KernelError(f"output dtype {dt} is not a floating type; set the dtype attribute")
    return _rng(seed).normal(mean, scale, np.shape(input)).astype(dt)


@op("RandomUniformLike", since=1, contract=_contract("suppress"))
def RandomUniformLike(input, *, dtype=None, high=1.0, low=0.0, seed=None):
    """Samples of U[low, high) shaped like the input (ONNX RandomUniformLike-1)."""
    dt = _out_dtype(dtype, input)
    if dt.kind not in "fV":
        raise KernelError(f"output dtype {dt} is not a floating type; set the dtype attribute")
    return _rng(seed).uniform(low, high, np.shape(input)).astype(dt)


_BERNOULLI_CODES = (1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 16)


@op("Bernoulli", since=15, contract=_contract("suppress", _BERNOULLI_CODES))
def Bernoulli(input, *, dtype=None, seed=None):
    """1 with probability p, else 0, for each input probability p (ONNX Bernoulli-15)."""
    dt = _out_dtype(dtype, input, _BERNOULLI_CODES)
    p = np.asarray(input, dtype=np.float64)
    return (_rng(seed).random(p.shape) < p).astype(dt)


@op("Multinomial", since=7, contract=_contract("suppress", (6, 7)))
def Multinomial(input, *, dtype=6, sample_size=1, seed=None):
    """Class indices drawn from each row's unnormalized log-probabilities (ONNX Multinomial-7)."""
    dt = _out_dtype(dtype, None, (6, 7))
    if input.ndim != 2:
        raise KernelError(f"input must be [batch_size, class_size], got shape {input.shape}")
    if sample_size < 0:
        raise KernelError(f"sample_size must be non-negative, got {sample_size}")
    logits = np.asarray(input, dtype=np.float64)
    batch, classes = logits.shape
    if classes == 0:
        raise KernelError("input has no classes to sample from")
    # Gumbel-max trick: argmax(logits + Gumbel noise) samples softmax(logits), vectorised.
    u = _rng(seed).random((batch, int(sample_size), classes))
    gumbel = -np.log(-np.log(np.maximum(u, np.finfo(np.float64).tiny)))
    return np.argmax(logits[:, None, :] + gumbel, axis=-1).astype(dt)
