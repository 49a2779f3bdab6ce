"""SessionOptions: every knob of a session, settable by keyword or attribute, checked on set.

onnxruntime's names work too, with onnxruntime's meaning: `graph_optimization_level` (a
`GraphOptimizationLevel`) sets `optimization_level`, `execution_mode` (an `ExecutionMode`)
the wavefront mode, `add_session_config_entry`, `add_free_dimension_override_by_name` and
`optimized_model_filepath` act as there. The few that cannot change anything here say so in
their description (`describe_option`), never silently.
"""

from __future__ import annotations

import enum
from typing import Any

from opwarden.errors import OptionsError


class GraphOptimizationLevel(enum.IntEnum):
    """onnxruntime's optimization levels, mapped onto opwarden's (`optimization_level`):
    ORT_DISABLE_ALL 0 (no rewrite at all: the session runs the model's own nodes),
    ORT_ENABLE_BASIC 1 (constant/shape folding, identity and dead-code elimination: standard
    ops only), ORT_ENABLE_EXTENDED 2 (adds the fusions), ORT_ENABLE_LAYOUT and ORT_ENABLE_ALL 3
    (everything; the layout pass runs at placement)."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    """onnxruntime's execution modes: ORT_PARALLEL runs independent branches together (the
    wavefront loop, `execute.parallel`), on `inter_op_num_threads` threads (0: every core)."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    """onnxruntime's node orders. opwarden runs nodes in the model's topological order (file
    order where dependencies allow) or by wavefronts (ORT_PARALLEL); its memory plan already
    minimises the arena for that order, so the choice changes nothing here."""

    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


def execution_order(value: Any) -> ExecutionOrder:
    """An ExecutionOrder from ours, onnxruntime's own enum (by name) or an int."""
    name = getattr(value, "name", None)
    if isinstance(name, str) and name in ExecutionOrder.__members__:
        return ExecutionOrder[name]
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2:
        return ExecutionOrder(value)
    raise OptionsError(
        f"session option 'execution_order' must be an ExecutionOrder, got {value!r}")


_GOL_TO_LEVEL = {0: 0, 1: 1, 2: 2, 3: 3, 99: 3}


def graph_level(value: Any) -> GraphOptimizationLevel:
    """A GraphOptimizationLevel from ours, an int or onnxruntime's own enum (by its name)."""
    name = getattr(value, "name", None)
    if isinstance(name, str) and name in GraphOptimizationLevel.__members__:
        return GraphOptimizationLevel[name]
    if isinstance(value, str) and value.upper() in GraphOptimizationLevel.__members__:
        return GraphOptimizationLevel[value.upper()]
    if isinstance(value, int) and not isinstance(value, bool) and value in _GOL_TO_LEVEL:
        return GraphOptimizationLevel(value)
    raise OptionsError(
        "session option 'graph_optimization_level' must be a GraphOptimizationLevel "
        f"({', '.join(GraphOptimizationLevel.__members__)}) or one of 0, 1, 2, 3, 99; "
        f"got {value!r}")


def execution_mode(value: Any) -> ExecutionMode:
    """An ExecutionMode from ours, onnxruntime's own enum, an int or "sequential"/"parallel"."""
    name = str(getattr(value, "name", value)).upper()
    if name in ("0", "SEQUENTIAL", "ORT_SEQUENTIAL"):
        return ExecutionMode.ORT_SEQUENTIAL
    if name in ("1", "PARALLEL", "ORT_PARALLEL"):
        return ExecutionMode.ORT_PARALLEL
    raise OptionsError(
        f"session option 'execution_mode' must be ORT_SEQUENTIAL or ORT_PARALLEL, got {value!r}")


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


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
    # onnxruntime's names. graph_optimization_level and execution_mode are converted on set
    # (SessionOptions.__setattr__); the rest are described in _NO_EFFECT where they change
    # nothing here.
    "graph_optimization_level": (GraphOptimizationLevel.ORT_ENABLE_ALL,
                                 "a GraphOptimizationLevel", lambda v: True),
    "execution_mode": (ExecutionMode.ORT_SEQUENTIAL, "an ExecutionMode", lambda v: True),
    "execution_order": (ExecutionOrder.DEFAULT, "an ExecutionOrder", lambda v: True),
    "log_severity_level": (-1, "an int", lambda v: isinstance(v, int)),
    "log_verbosity_level": (0, "an int", lambda v: isinstance(v, int)),
    "logid": ("", "a str", lambda v: isinstance(v, str)),
    # The optimized graph (after the passes, before placement) is written here as ONNX.
    "optimized_model_filepath": ("", "a path (str)",
                                 lambda v: isinstance(v, str) or hasattr(v, "__fspath__")),
    "enable_mem_pattern": (True, "a bool", _bool),
    "enable_cpu_mem_arena": (True, "a bool", _bool),
    "enable_mem_reuse": (True, "a bool", _bool),
    "use_deterministic_compute": (False, "a bool", _bool),
    "use_per_session_threads": (True, "a bool", _bool),
}

# What onnxruntime's options that change nothing here would do, and why they need not.
_NO_EFFECT = {
    "log_severity_level": "opwarden reports through Python warnings and exceptions; it has no "
                          "native log to filter",
    "log_verbosity_level": "opwarden has no native log",
    "logid": "opwarden has no native log to tag",
    "enable_mem_pattern": "opwarden always plans memory per input-shape signature (plan/): the "
                          "plan is computed from the shapes, not recorded from a first run",
    "enable_cpu_mem_arena": "opwarden's arena is its memory plan (plan/), which the executor "
                            "needs; memory_limit_bytes bounds it",
    "enable_mem_reuse": "buffer reuse is part of the memory plan (plan/), always on",
    "use_deterministic_compute": "opwarden's kernels are deterministic already (no atomics, "
                                 "fixed reduction orders)",
    "use_per_session_threads": "opwarden's thread pools are the process's (BLAS, torch); "
                               "intra_op_num_threads sizes them",
    "execution_order": "nodes run in topological order (or by wavefronts with ORT_PARALLEL), "
                       "and the memory plan is made for that order",
}


def describe_option(name: str) -> str:
    """What option `name` does in opwarden, or why it does nothing here."""
    if name not in _OPTIONS:
        raise OptionsError(f"unknown session option {name!r}")
    note = _NO_EFFECT.get(name)
    return f"{name}: no effect in opwarden ({note})" if note else f"{name}: {_OPTIONS[name][1]}"


class SessionOptions:
    """Options for an InferenceSession; ``SessionOptions(trace=True)`` or ``o.trace = True``.

    onnxruntime's options work with onnxruntime's meaning (see the module docstring);
    options that cannot change anything in opwarden are listed by `describe_option`:
    log_severity_level, log_verbosity_level, logid (no native log), enable_mem_pattern,
    enable_cpu_mem_arena, enable_mem_reuse (memory is always planned per shape signature),
    use_deterministic_compute (the kernels are deterministic), use_per_session_threads,
    execution_order (one order, planned for).
    """

    def __init__(self, **kwargs: Any) -> None:
        for name, (default, _, _) in _OPTIONS.items():
            object.__setattr__(self, name, default)
        object.__setattr__(self, "_config", {})
        object.__setattr__(self, "_dim_names", {})
        object.__setattr__(self, "_dim_denotations", {})
        object.__setattr__(self, "_initializers", {})
        for k, v in kwargs.items():
            setattr(self, k, v)

    def __setattr__(self, name: str, value: Any) -> None:
        spec = _OPTIONS.get(name)
        if spec is None:
            known = ", ".join(sorted(_OPTIONS))
            raise OptionsError(f"unknown session option {name!r}; known options: {known}")
        if name == "graph_optimization_level":
            value = graph_level(value)
            object.__setattr__(self, "optimization_level", _GOL_TO_LEVEL[int(value)])
        elif name == "execution_mode":
            value = execution_mode(value)
        elif name == "execution_order":
            value = execution_order(value)
        elif name == "optimization_level" and spec[2](value):
            # keep graph_optimization_level telling the truth about the level that runs
            gol = self.__dict__.get("graph_optimization_level")
            if gol is None or _GOL_TO_LEVEL[int(gol)] != value:
                object.__setattr__(self, "graph_optimization_level", GraphOptimizationLevel(
                    99 if value == 3 else value))
        if not spec[2](value):
            raise OptionsError(f"session option {name!r} must be {spec[1]}, got {value!r}")
        if name == "optimized_model_filepath":
            value = str(value.__fspath__()) if hasattr(value, "__fspath__") else value
        object.__setattr__(self, name, value)

    # -- onnxruntime's methods -------------------------------------------------------------
    def add_session_config_entry(self, key: str, value: str) -> None:
        """Set a configuration entry (both str, as onnxruntime requires). opwarden reads
        "session.optimized_model_external_initializers_file_name" and
        "session.optimized_model_external_initializers_min_size_in_bytes" (weights of the
        optimized model in an external file) and "opwarden.optimized_model_standard_ops"
        ("1": the optimized model written with standard ops only, see
        `optimized_model_filepath`); others are kept and reported, changing nothing."""
        if not isinstance(key, str) or not isinstance(value, str):
            raise OptionsError(
                f"add_session_config_entry takes (str, str), got ({type(key).__name__}, "
                f"{type(value).__name__})")
        self._config[key] = value

    def get_session_config_entry(self, key: str) -> str:
        """The value set by add_session_config_entry; OptionsError when it was never set."""
        try:
            return self._config[key]
        except KeyError:
            raise OptionsError(
                f"SessionOptions does not have configuration with key: {key}") from None

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        """Fix the symbolic dim `dim_name` of the model's inputs to `dim_value`: the inputs
        report it, feeds must match it, and shapes downstream are inferred with it."""
        self._dim_names[_dim_key(dim_name)] = _dim_size(dim_name, dim_value)

    def add_free_dimension_override_by_denotation(self, dim_denotation: str,
                                                  dim_value: int) -> None:
        """Fix every input dim whose denotation (e.g. "DATA_BATCH") is `dim_denotation`."""
        self._dim_denotations[_dim_key(dim_denotation)] = _dim_size(dim_denotation, dim_value)

    def add_initializer(self, name: str, ortvalue: Any) -> None:
        """Use `ortvalue` (an OrtValue or array of the initializer's type and shape) as the
        value of the model's initializer `name`, for every session made with these options."""
        value = ortvalue.numpy() if hasattr(ortvalue, "numpy") else ortvalue
        if not isinstance(name, str) or not hasattr(value, "dtype"):
            raise OptionsError(f"add_initializer takes (name, OrtValue), got ({name!r}, "
                               f"{type(ortvalue).__name__})")
        self._initializers[name] = value

    @property
    def initializers(self) -> dict[str, Any]:
        """The initializer values set by add_initializer (name -> array)."""
        return dict(self._initializers)

    @property
    def free_dimension_overrides(self) -> tuple[dict[str, int], dict[str, int]]:
        """(by name, by denotation): the dims fixed by add_free_dimension_override_*."""
        return dict(self._dim_names), dict(self._dim_denotations)

    @property
    def config_entries(self) -> dict[str, str]:
        """Every entry set by add_session_config_entry."""
        return dict(self._config)

    def as_dict(self) -> dict[str, Any]:
        """Every option with its current value."""
        return {k: getattr(self, k) for k in _OPTIONS}

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.as_dict().items() if v != _OPTIONS[k][0]}
        return f"SessionOptions({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


def _dim_key(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise OptionsError(f"a free dimension override needs a non-empty name, got {name!r}")
    return name


def _dim_size(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise OptionsError(
            f"free dimension override {name!r} must be an int >= 0, got {value!r}")
    return int(value)
