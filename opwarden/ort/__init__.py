"""onnxruntime's Python API on opwarden: what code written for onnxruntime calls.

Session level, below `session` (which builds on it): providers by onnxruntime's names with
their fallback (providers.py), OrtValue over host memory (values.py), IO binding (binding.py),
RunOptions and the terminate check (run_options.py), logging severity, version and seed
(module.py), feeds converted as onnxruntime converts
them (feeds.py), model metadata and type strings (meta.py), free dimension overrides
(dims.py), the optimized model file (optimized.py), and the session methods beyond `run`
(surface.py).
"""

from __future__ import annotations

from opwarden.ort.binding import SessionIOBinding
from opwarden.ort.meta import ModelMetadata
from opwarden.ort.module import (
    disable_telemetry_events,
    enable_telemetry_events,
    get_build_info,
    get_version_string,
    preload_dlls,
    set_default_logger_severity,
    set_default_logger_verbosity,
    set_seed,
)
from opwarden.ort.providers import get_all_providers, get_available_providers, get_device
from opwarden.ort.run_options import RunOptions
from opwarden.ort.values import OrtValue

IOBinding = SessionIOBinding

__all__ = [
    "IOBinding",
    "ModelMetadata",
    "OrtValue",
    "RunOptions",
    "SessionIOBinding",
    "disable_telemetry_events",
    "enable_telemetry_events",
    "get_all_providers",
    "get_available_providers",
    "get_build_info",
    "get_device",
    "get_version_string",
    "preload_dlls",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
    "set_seed",
]
