"""Custom operators with deliberate contract defects (and one correct one) for `check` tests."""

from __future__ import annotations

import numpy as np

import opwarden
from opwarden.contract import TensorFact

DOMAIN = "test.defects"
SAFE = opwarden.Contract(
    thread_safe=True, nan="propagate", mutates=(), overflow=None, workspace_bytes=0
)


def _floats(name):
    return dict(
        domain=DOMAIN,
        inputs=["X: T"],
        outputs=["Y: T"],
        types={"T": ["float32", "float64"]},
        contract=SAFE,
    )


# A correct operator: reference, a faster variant, shape rule and gradient.
@opwarden.op("GoodScaledTanh", attrs={"alpha": 1.0}, **_floats("GoodScaledTanh"))
def GoodScaledTanh(X, *, alpha=1.0):
    return np.tanh(X) * X.dtype.type(alpha)


@GoodScaledTanh.kernel(device="cpu", name="goodscaledtanh.cpu.fast", priority=10)
def _good_fast(X, *, alpha=1.0):
    y = np.tanh(X)
    y *= X.dtype.type(alpha)
    return y


@GoodScaledTanh.infer
def _good_infer(X, *, alpha=1.0):
    return X


@GoodScaledTanh.grad
def _good_grad(ctx, dY, *, alpha=1.0):
    (X,) = ctx.inputs
    return (dY * alpha * (1 - np.tanh(X) ** 2),)


# 1. A variant off by 1e-2 from its reference.
@opwarden.op("OffByOne", **_floats("OffByOne"))
def OffByOne(X):
    return np.tanh(X)


@OffByOne.kernel(device="cpu", name="offbyone.cpu.sloppy", priority=10)
def _sloppy(X):
    return np.tanh(X) + X.dtype.type(1e-2)


# 2. Claims thread safety but shares a module-level scratch buffer.
_SCRATCH = np.empty(1 << 20, np.float64)


@opwarden.op("SharedScratch", **_floats("SharedScratch"))
def SharedScratch(X):
    return X * 2 + 1


@SharedScratch.kernel(device="cpu", name="sharedscratch.cpu.racy", priority=10)
def _racy(X):
    buf = _SCRATCH[: X.size].reshape(X.shape)
    np.multiply(X, 2, out=buf)
    np.add(buf, 1, out=buf)
    return buf.astype(X.dtype)


# 3. Mutates its input while declaring none.
@opwarden.op("Mutator", **_floats("Mutator"))
def Mutator(X):
    X += 1
    return X * 1


# 4. Turns NaN into 0 while declaring NaN propagation.
@opwarden.op("NanEater", **_floats("NanEater"))
def NanEater(X):
    return np.nan_to_num(np.tanh(X), nan=0.0)


# 5. Wraps int8 overflow while declaring saturation.
@opwarden.op(
    "WrapAdd",
    domain=DOMAIN,
    inputs=["A: T", "B: T"],
    outputs=["C: T"],
    types={"T": ["int8"]},
    contract=opwarden.Contract(overflow="saturate", broadcast="multidirectional"),
)
def WrapAdd(A, B):
    return A + B


# 6. A shape rule that disagrees with the output.
@opwarden.op("BadShape", **_floats("BadShape"))
def BadShape(X):
    return np.tanh(X)


@BadShape.infer
def _bad_infer(X):
    return TensorFact(X.dtype, (X.shape or ()) + (1,))


DEFECTS = {
    "OffByOne": "numerics",
    "SharedScratch": "concurrency",
    "Mutator": "mutation",
    "NanEater": "nan",
    "WrapAdd": "overflow",
    "BadShape": "shape",
}
