"""Operators: training optimizers (domain ai.onnx.preview.training: Adagrad, Adam, Momentum)."""

from __future__ import annotations

import numpy as np

from opwarden.contract import Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import op

TRAINING = "ai.onnx.preview.training"


# --------------------------------------------------------------------------------------------
# Training optimizers (domain ai.onnx.preview.training)
# --------------------------------------------------------------------------------------------


def _groups(tensors: tuple, k: int, opname: str) -> list[tuple]:
    """Split the variadic inputs [X1..Xn, G1..Gn, ...] (k groups) into per-tensor tuples."""
    if not tensors or len(tensors) % k:
        raise KernelError(f"{opname} expects {k} groups of equal size, got {len(tensors)} tensors")
    n = len(tensors) // k
    return [tuple(tensors[g * n + i] for g in range(k)) for i in range(n)]


def _scalar(x, opname: str, what: str) -> float:
    a = np.asarray(x)
    if a.size != 1:
        raise KernelError(f"{opname}: {what} must be a scalar, got shape {a.shape}")
    return a.reshape(()).item()


@op("Adagrad", since=1, domain=TRAINING, contract=Contract(nan="produce"))
def Adagrad(R, T, *inputs, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
    """One ADAGRAD step for each (X, G, H) (ai.onnx.preview.training Adagrad-1)."""
    r = _scalar(R, "Adagrad", "R") / (1.0 + _scalar(T, "Adagrad", "T") * decay_factor)
    xs, hs = [], []
    for X, G, H in _groups(inputs, 3, "Adagrad"):
        g = norm_coefficient * X + G
        h_new = H + g * g
        xs.append((X - r * g / (np.sqrt(h_new) + epsilon)).astype(X.dtype))
        hs.append(h_new.astype(H.dtype))
    return tuple(xs + hs)


@op("Adam", since=1, domain=TRAINING, contract=Contract(nan="produce"))
def Adam(R, T, *inputs, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0,
         norm_coefficient_post=0.0):
    """One Adam step for each (X, G, V, H) (ai.onnx.preview.training Adam-1)."""
    r, t = _scalar(R, "Adam", "R"), _scalar(T, "Adam", "T")
    if t > 0:
        r = r * np.sqrt(1.0 - beta**t) / (1.0 - alpha**t)
    xs, vs, hs = [], [], []
    for X, G, V, H in _groups(inputs, 4, "Adam"):
        g = norm_coefficient * X + G
        v_new = alpha * V + (1.0 - alpha) * g
        h_new = beta * H + (1.0 - beta) * g * g
        x_new = X - r * v_new / (np.sqrt(h_new) + epsilon)
        xs.append(((1.0 - norm_coefficient_post) * x_new).astype(X.dtype))
        vs.append(v_new.astype(V.dtype))
        hs.append(h_new.astype(H.dtype))
    return tuple(xs + vs + hs)


@op("Momentum", since=1, domain=TRAINING, contract=Contract(
    nan="propagate", allowed={"mode": one_of("standard", "nesterov")}))
def Momentum(R, T, *inputs, alpha=None, beta=None, mode=None, norm_coefficient=None):
    """One SGD-with-momentum step, standard or Nesterov (ai.onnx.preview.training Momentum-1)."""
    if None in (alpha, beta, mode, norm_coefficient):
        raise KernelError("Momentum needs the alpha, beta, mode and norm_coefficient attributes")
    r = _scalar(R, "Momentum", "R")
    b = beta if _scalar(T, "Momentum", "T") > 0 else 1.0  # the first step uses the raw gradient
    xs, vs = [], []
    for X, G, V in _groups(inputs, 3, "Momentum"):
        g = norm_coefficient * X + G
        v_new = alpha * V + b * g
        step = g + alpha * v_new if mode == "nesterov" else v_new
        xs.append((X - r * step).astype(X.dtype))
        vs.append(v_new.astype(V.dtype))
    return tuple(xs + vs)
