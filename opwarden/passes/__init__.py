"""Graph optimizations run between validation and placement (issue 8).

Levels (``SessionOptions(optimization_level=...)``): 0 none; 1 shape folding, constant folding,
identity elimination, dead-code elimination (repeated until nothing changes); 2 adds
Conv+BatchNormalization folding, BatchNormalization as Mul/Add (a positive scale before a Relu
moves into the convolutions reading it), Conv/Gemm/MatMul + bias +
activation fusion (the activation also the exact Gelu exporters spell out in Div/Erf/Add/Mul
nodes), a Concat of sibling convolutions of one input as one FusedConv with
branches, merging sibling 1x1 convolutions of one input (then a Split), an AveragePool and a
1x1 convolution swapped when the other order costs less, a non-decreasing
activation moved after the MaxPool that reads it (it then runs on the smaller tensor), transpose
cancellation and elementwise-chain fusion (then a level-1 clean-up); 3 is everything (the
layout pass runs later, at placement). Any pass can be switched off by name with
``disabled_passes``. Only the main graph is rewritten; subgraph bodies are left as they are
(values they read from the main graph count as used there).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from opwarden.ir.graph import Model
from opwarden.passes.basic import (
    constant_folding,
    dead_code_elimination,
    identity_elimination,
    shape_folding,
)
from opwarden.passes.fusion import (
    activation_after_maxpool,
    avgpool_conv_reorder,
    bn_to_affine,
    concat_conv_merge,
    conv_bn_folding,
    conv_fusion,
    elementwise_fusion,
    gemm_fusion,
    scale_into_conv,
    sibling_conv_merge,
    transpose_cancellation,
)
from opwarden.passes.rewrite import Rewriter, relink

# (name, level, function); level-1 passes run as a group until a fixed point.
PASSES: list[tuple[str, int, Callable[[Rewriter], None]]] = [
    ("shape_folding", 1, shape_folding),
    ("constant_folding", 1, constant_folding),
    ("identity_elimination", 1, identity_elimination),
    ("dead_code_elimination", 1, dead_code_elimination),
    ("conv_bn_folding", 2, conv_bn_folding),
    ("bn_to_affine", 2, bn_to_affine),
    ("scale_into_conv", 2, scale_into_conv),
    ("conv_fusion", 2, conv_fusion),
    ("concat_conv_merge", 2, concat_conv_merge),
    ("sibling_conv_merge", 2, sibling_conv_merge),
    ("avgpool_conv_reorder", 2, avgpool_conv_reorder),
    ("activation_after_maxpool", 2, activation_after_maxpool),
    ("gemm_fusion", 2, gemm_fusion),
    ("transpose_cancellation", 2, transpose_cancellation),
    ("elementwise_fusion", 2, elementwise_fusion),
]
PASS_NAMES = tuple(name for name, _, _ in PASSES)
MAX_ROUNDS = 4


def optimize(model: Model, options: Any) -> list[dict[str, Any]]:
    """Rewrite `model` in place according to `options`; returns what each pass did.

    One entry per pass that ran ({"pass", "level", "changes", "ms", "details"}), one per
    disabled pass ({"pass", "skipped": "disabled"}), and a last {"pass": "total"} entry with the
    node counts before and after.
    """
    level = int(getattr(options, "optimization_level", 3) or 0)
    disabled = set(getattr(options, "disabled_passes", ()) or ())
    unknown = sorted(disabled - set(PASS_NAMES))
    if unknown:
        from opwarden.errors import OptionsError

        raise OptionsError(
            f"disabled_passes names unknown pass(es) {unknown}; the passes are {list(PASS_NAMES)}"
        )
    t0 = time.perf_counter()
    before = len(model.graph.nodes)
    report: dict[str, dict[str, Any]] = {}
    active = [(n, lv, fn) for n, lv, fn in PASSES if lv <= level and n not in disabled]

    def run(name: str, lv: int, fn: Callable[[Rewriter], None]) -> int:
        t = time.perf_counter()
        rw = Rewriter(model, model.graph)
        fn(rw)
        rw.finish()
        if rw.changes:
            relink(model)
        entry = report.setdefault(
            name, {"pass": name, "level": lv, "changes": 0, "ms": 0.0, "details": {}}
        )
        entry["changes"] += rw.changes
        entry["ms"] += (time.perf_counter() - t) * 1e3
        for k, n in rw.stats.items():
            entry["details"][k] = entry["details"].get(k, 0) + n
        return rw.changes

    basic = [p for p in active if p[1] == 1]
    fusions = [p for p in active if p[1] >= 2]

    def clean() -> None:
        for _ in range(MAX_ROUNDS):
            if not sum(run(*p) for p in basic):
                break

    if active:
        relink(model)  # the loader links subgraph reads before the main graph resets uses
        clean()
        if fusions and sum(run(*p) for p in fusions):
            clean()
    out = [report[n] for n, _, _ in PASSES if n in report]
    for entry in out:
        entry["ms"] = round(entry["ms"], 3)
    out.extend({"pass": n, "changes": 0, "skipped": "disabled"}
               for n in PASS_NAMES if n in disabled)
    out.append({
        "pass": "total",
        "level": level,
        "changes": sum(e["changes"] for e in out),
        "nodes_before": before,
        "nodes_after": len(model.graph.nodes),
        "ms": round((time.perf_counter() - t0) * 1e3, 3),
    })
    return out


__all__ = ["PASSES", "PASS_NAMES", "optimize"]
