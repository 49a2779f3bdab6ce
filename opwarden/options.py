"""SessionOptions: every knob of a session, settable by keyword or attribute, checked on set."""

from __future__ import annotations

from typing import Any

from opwarden.errors import OptionsError

# name -> (default, validator description, validator)
_CHECKS = ("nan", "inf", "shape", "dtype", "contract", "all")


def _checks(v: Any) -> bool:
    items = [v] if isinstance(v, str) else list(v or ())
    return all(i in _CHECKS for i in items)


_OPTIONS: dict[str, tuple[Any, str, Any]] = {
    "optimization_level": (3, "an int 0..3", lambda v: isinstance(v, int) and 0 <= v <= 3),
    "disabled_passes": ((), "a list of pass names", lambda v: isinstance(v, (list, tuple, set))),
    "checks": (("contract",), f"names from {_CHECKS}", _checks),
    "on_fault": ("fallback", "'fallback' or 'raise'", lambda v: v in ("fallback", "raise")),
    "trace": (False, "a bool", lambda v: isinstance(v, bool)),
    "enable_profiling": (False, "a bool", lambda v: isinstance(v, bool)),
    "profile_file_prefix": ("opwarden_profile", "a str", lambda v: isinstance(v, str)),
    "op_timeout_ms": (
        None,
        "None, a number or {op_type: ms}",
        lambda v: v is None or isinstance(v, (int, float, dict)),
    ),
    "memory_limit_bytes": (
        None,
        "None or an int > 0",
        lambda v: v is None or (isinstance(v, int) and v > 0),
    ),
    # A whole run's deadline, checked between steps and at every Loop/Scan iteration; runs
    # with one take the guarded loop.
    "run_timeout_ms": (
        None,
        "None or a number > 0",
        lambda v: v is None
        or (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and v == v),
    ),
    "fallback": ("allow", "'allow' or 'forbid'", lambda v: v in ("allow", "forbid")),
    # A device's compute precision (the openvino device); anything but f32 is a degrade.
    "precision": ("f32", "'f32', 'bf16', 'f16' or 'int8'",
                  lambda v: v in ("f32", "bf16", "f16", "int8")),
    "intra_op_num_threads": (0, "an int >= 0", lambda v: isinstance(v, int) and v >= 0),
    "inter_op_num_threads": (0, "an int >= 0", lambda v: isinstance(v, int) and v >= 0),
    "plan_cache_size": (64, "an int >= 1", lambda v: isinstance(v, int) and v >= 1),
    "quarantine_file": (None, "None or a path", lambda v: v is None or isinstance(v, str)),
    "debug_memory": (False, "a bool", lambda v: isinstance(v, bool)),
    # Variants (by name, or "custom": every user-registered one) run in a worker process, so
    # a native crash there is a fault of the node, not the end of the process (guard.isolate).
    "isolate": (
        (),
        "a list of kernel variant names and/or 'custom'",
        lambda v: isinstance(v, str)
        or (isinstance(v, (list, tuple, set, frozenset)) and all(isinstance(i, str) for i in v)),
    ),
    # Large initializers copied into transparent huge pages (memory.hugepages; Linux only).
    "huge_page_weights": (True, "a bool", lambda v: isinstance(v, bool)),
    # Accepted for onnxruntime compatibility; opwarden maps or ignores them.
    "graph_optimization_level": (None, "an int or an ORT GraphOptimizationLevel", lambda v: True),
    "log_severity_level": (2, "an int", lambda v: isinstance(v, int)),
    "log_verbosity_level": (0, "an int", lambda v: isinstance(v, int)),
    "execution_mode": (None, "any", lambda v: True),
    "logid": ("", "a str", lambda v: isinstance(v, str)),
}


class SessionOptions:
    """Options for an InferenceSession; ``SessionOptions(trace=True)`` or ``o.trace = True``."""

    def __init__(self, **kwargs: Any) -> None:
        for name, (default, _, _) in _OPTIONS.items():
            object.__setattr__(self, name, default)
        for k, v in kwargs.items():
            setattr(self, k, v)

    def __setattr__(self, name: str, value: Any) -> None:
        spec = _OPTIONS.get(name)
        if spec is None:
            known = ", ".join(sorted(_OPTIONS))
            raise OptionsError(f"unknown session option {name!r}; known options: {known}")
        if not spec[2](value):
            raise OptionsError(f"session option {name!r} must be {spec[1]}, got {value!r}")
        object.__setattr__(self, name, value)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _OPTIONS}

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.as_dict().items() if v != _OPTIONS[k][0]}
        return f"SessionOptions({', '.join(f'{k}={v!r}' for k, v in changed.items())})"
