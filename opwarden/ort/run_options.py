"""RunOptions: per-run settings, as onnxruntime's, and the stop check `terminate` drives.

`terminate = True`, set from any thread, stops the run before its next step with
`RunTerminated`, as onnxruntime raises Fail. A run given RunOptions runs the compiled lean
loop's variant that checks the flag before each step (one attribute read per step); runs
without RunOptions keep the plain loop, which has nothing to pay. Where the guarded loop runs
(tracing, checks, a run deadline) it checks between steps and before each Loop/Scan
iteration too.
"""

from __future__ import annotations

from typing import Any

from opwarden.errors import InputError, OptionsError, RunTerminated


class RunOptions:
    """onnxruntime's RunOptions. `terminate` stops a run; `log_severity_level`,
    `log_verbosity_level` and `logid` change nothing (opwarden has no native log, it reports
    through exceptions and warnings); `only_execute_path_to_fetches` is accepted and every
    node runs (the outputs asked for are returned either way); run config entries are kept and
    reported, none changes a run."""

    def __init__(self) -> None:
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.terminate = False
        self.only_execute_path_to_fetches = False
        self._config: dict[str, str] = {}

    def add_run_config_entry(self, key: str, value: str) -> None:
        """Set a run configuration entry (both str, as onnxruntime requires)."""
        if not isinstance(key, str) or not isinstance(value, str):
            raise OptionsError(
                f"add_run_config_entry takes (str, str), got ({type(key).__name__}, "
                f"{type(value).__name__})")
        self._config[key] = value

    def get_run_config_entry(self, key: str) -> str:
        """The value set by add_run_config_entry; OptionsError when it was never set."""
        try:
            return self._config[key]
        except KeyError:
            raise OptionsError(f"RunOptions does not have configuration with key: {key}") \
                from None

    def __repr__(self) -> str:
        return (f"RunOptions(terminate={self.terminate}, logid={self.logid!r}, "
                f"config={self._config})")


class RunStop:
    """The per-step check of a run given RunOptions: its terminate flag, then its deadline
    (SessionOptions.run_timeout_ms) if it has one. Duck-types `execute.program.Deadline`, so
    the guarded loop and Loop/Scan bodies call `check(where)` wherever they check a deadline."""

    __slots__ = ("options", "deadline")

    def __init__(self, options: Any, deadline: Any = None) -> None:
        self.options = options
        self.deadline = deadline

    def check(self, where: str) -> None:
        if self.options.terminate:
            raise RunTerminated(
                f"{where}: exiting due to the terminate flag being set to true "
                "(RunOptions.terminate)")
        if self.deadline is not None:
            self.deadline.check(where)


def run_stop(run_options: Any, deadline: Any) -> Any:
    """What the run checks between steps: a RunStop for RunOptions (refused at once when
    terminate is already set, as onnxruntime does), else the deadline (or None)."""
    if run_options is None:
        return deadline
    if not hasattr(run_options, "terminate"):
        raise InputError(
            f"run_options must be opwarden.RunOptions, got {type(run_options).__name__}")
    stop = RunStop(run_options, deadline)
    stop.check("before the run")
    return stop
