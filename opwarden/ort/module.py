"""onnxruntime's module-level functions beyond providers: logging severity, version, seed.

opwarden reports what onnxruntime logs (a declared output shape a run contradicts, a model's
inconsistent declarations) as RuntimeWarnings starting "opwarden: ". The default logger
severity decides whether they show, as onnxruntime's decides whether its log lines print:
3 (ERROR) or 4 (FATAL) silences them, 0-2 (VERBOSE, INFO, WARNING) shows them. Warnings about
what the caller asked for (ProviderFallbackWarning) always show, as onnxruntime's Python
warnings do.
"""

from __future__ import annotations

import warnings

from opwarden.errors import OptionsError

_SILENCE = ("ignore", r"opwarden: ", RuntimeWarning)
_state = {"severity": 2, "verbosity": 0}


def _remove_filter() -> None:
    action, message, category = _SILENCE
    warnings.filters[:] = [f for f in warnings.filters
                           if not (f[0] == action and f[2] is category and f[1] is not None
                                   and f[1].pattern == message)]


def set_default_logger_severity(severity: int) -> None:
    """0 VERBOSE .. 4 FATAL; 3 and 4 silence opwarden's log-like RuntimeWarnings."""
    if isinstance(severity, bool) or not isinstance(severity, int) or not 0 <= severity <= 4:
        raise OptionsError(f"logger severity must be an int 0..4, got {severity!r}")
    _state["severity"] = severity
    _remove_filter()
    if severity >= 3:
        action, message, category = _SILENCE
        warnings.filterwarnings(action, message=message, category=category)


def set_default_logger_verbosity(verbosity: int) -> None:
    """Kept for onnxruntime code; opwarden has no verbose log levels to choose between."""
    if isinstance(verbosity, bool) or not isinstance(verbosity, int) or verbosity < 0:
        raise OptionsError(f"logger verbosity must be an int >= 0, got {verbosity!r}")
    _state["verbosity"] = verbosity


def get_version_string() -> str:
    """opwarden's version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("opwarden")
    except PackageNotFoundError:
        return "0.1.0"


def get_build_info() -> str:
    """A line naming this build (opwarden is pure Python over NumPy)."""
    import numpy as np

    return f"opwarden {get_version_string()}, numpy {np.__version__}"


def set_seed(seed: int) -> None:
    """Seed the random operators (RandomNormal, RandomUniform, Bernoulli, Multinomial, ...)
    that have no seed attribute: their draws then repeat from run to run of the process."""
    from opwarden.ops.random import set_seed as seed_ops

    if isinstance(seed, bool) or not isinstance(seed, int):
        raise OptionsError(f"seed must be an int, got {seed!r}")
    seed_ops(seed)


def preload_dlls(cuda: bool = True, cudnn: bool = True, msvc: bool = True,
                 directory: str | None = None) -> None:
    """onnxruntime loads CUDA/cuDNN libraries here; opwarden has no native libraries of its
    own to load (the torch device loads torch's when first used), so there is nothing to do."""


def disable_telemetry_events() -> None:
    """opwarden sends no telemetry; there is nothing to disable."""


def enable_telemetry_events() -> None:
    """opwarden sends no telemetry; there is nothing to enable."""
