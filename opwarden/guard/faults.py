"""Fault records, per-variant counters and the quarantine of unstable variants."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import OptionsError


@dataclass
class FaultRecord:
    """Everything known about one operator fault."""

    node: str
    op_type: str
    variant: str
    device: str
    check: str  # exception | nan | inf | shape | dtype | mutation | alias | deadline | outputs
    detail: str
    input_shapes: list[Any]
    input_dtypes: list[str]
    attrs: dict[str, Any]
    time: float = field(default_factory=time.time)
    action: str = "fallback"  # fallback | raise | recorded

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class VariantStats:
    calls: int = 0
    fallbacks: int = 0
    faults: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "fallbacks": self.fallbacks, "faults": dict(self.faults)}


class Quarantine:
    """Variants marked unstable (name -> reason); optionally persisted to a JSON file."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.entries: dict[str, str] = {}
        self._lock = threading.Lock()
        if path and os.path.exists(path):
            try:
                with open(path, encoding="utf-8") as f:
                    data = json.load(f)
                self.entries = {str(k): str(v) for k, v in data.get("variants", {}).items()}
            except (OSError, ValueError, AttributeError) as e:
                raise OptionsError(f"quarantine_file {path!r} cannot be read: {e}") from None

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def reason(self, name: str) -> str:
        return self.entries.get(name, "")

    def add(self, name: str, reason: str) -> None:
        with self._lock:
            self.entries[name] = reason
            if self.path:
                tmp = self.path + ".tmp"
                with open(tmp, "w", encoding="utf-8") as f:
                    json.dump({"variants": self.entries}, f, indent=1)
                os.replace(tmp, self.path)
