"""Operators: activation family."""

import numpy as np

from ..contract import UNARY
from .base import op


@op("Relu", since=14, contract=UNARY)
def Relu(X):
    """max(X, 0) (ONNX Relu-14)."""
    return np.maximum(X, X.dtype.type(0))
