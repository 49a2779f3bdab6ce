"""One record per executed operator, and the Chrome-trace export."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class OpRecord:
    """What one executed operator did in one run: node, kernel, shapes, times, checks."""
    node: str
    op_type: str
    device: str
    variant: str
    input_shapes: list[Any]
    input_dtypes: list[str]
    output_shapes: list[Any] = field(default_factory=list)
    output_dtypes: list[str] = field(default_factory=list)
    # Per output: a view of an input (a Reshape, a NumPy transpose), which moved no data; the
    # roofline and bytes-moved figures count nothing for it.
    output_views: list[bool] = field(default_factory=list)
    workspace_bytes: int = 0
    start_us: float = 0.0
    exec_us: float = 0.0  # the kernel alone (a quarantined variant's: the reference kernel)
    guard_us: float = 0.0  # the guard around it: scans, contract checks, a fallback rerun
    status: str = "ok"  # ok | fallback | error
    checks: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    run: int = 0
    # The model nodes this executed node stands for (Node.origins: a fused node's parts).
    origin: list[str] = field(default_factory=list)
    # A compiled region's nodes: [{node, op_type, exec_us, device}] (OpenVINO's profiling).
    covers: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The record as plain data (a Chrome-trace event's ``args``)."""
        return asdict(self)


def chrome_trace(records: list[OpRecord], path: str) -> str:
    """Write records as Chrome-trace JSON (one complete 'X' event per operator); returns path."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "opwarden"}},
    ]
    for r in records:
        events.append(
            {
                "name": r.node,
                "cat": r.op_type,
                "ph": "X",
                "ts": r.start_us,
                "dur": max(r.exec_us, 0.001),
                "pid": 1,
                "tid": r.run,
                "args": r.as_dict(),
            }
        )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f, default=str)
    return path


def default_trace_path(prefix: str) -> str:
    """`prefix` + time stamp + process id + .json: a trace file name no other run takes."""
    return f"{prefix}_{time.strftime('%Y%m%d_%H%M%S')}_{os.getpid()}.json"
