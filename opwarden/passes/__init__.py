"""Graph optimizations run between validation and placement: the pass manager.

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
``disabled_passes``. fp16_islands runs at every level, level 0 included (ORT rounds float16
models the same at every level), and in subgraph bodies too; the other passes rewrite only the
main graph (values subgraphs read from it count as used there).

Each pass is a function of a `Rewriter` returning a `PassResult`, in a module of its own
(basic: constant and shape folding; identity; dead_code; fold_bn: Conv+BN folding and BN as
Mul/Add; scale_into_conv; fusion: the Conv/Gemm/MatMul epilogue, with gelu; gelu: an exact
Gelu chain no epilogue took as one com.microsoft Gelu; conv_branches:
Concat of convolutions; sibling_convs; pool_swap: AveragePool and 1x1 convolution;
pool_activation: activation after MaxPool; transpose; elementwise_chain; qdq_fusion: QDQ groups
as QLinear operators, level 1; dynq_fusion: dynamic quantization as DynamicQuantizeMatMul).
`PASSES` is the one ordered table the manager runs them from; shared pattern tests live in
`match`, editing in `rewrite`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

from opwarden.ir.graph import Model
from opwarden.ir.validate import graphs_of
from opwarden.passes.attention import attention_fusion
from opwarden.passes.basic import constant_folding, shape_folding
from opwarden.passes.conv_branches import concat_conv_merge
from opwarden.passes.dead_code import dead_code_elimination
from opwarden.passes.dynq_fusion import dynamic_quantize_matmul_fusion
from opwarden.passes.elementwise_chain import elementwise_fusion
from opwarden.passes.fold_bn import bn_to_affine, conv_bn_folding
from opwarden.passes.fp16_islands import fp16_islands
from opwarden.passes.fusion import conv_fusion, gemm_fusion
from opwarden.passes.gelu import gelu_fusion
from opwarden.passes.identity import identity_elimination
from opwarden.passes.pool_activation import activation_after_maxpool
from opwarden.passes.pool_swap import avgpool_conv_reorder
from opwarden.passes.qdq_fusion import qdq_fusion
from opwarden.passes.rewrite import PassResult, Rewriter, relink
from opwarden.passes.scale_into_conv import scale_into_conv
from opwarden.passes.se_fusion import spatial_mean_pool
from opwarden.passes.sibling_convs import sibling_conv_merge
from opwarden.passes.transpose import transpose_cancellation


class Pass(NamedTuple):
    """One row of the pass table: the name `disabled_passes` and the report use, the lowest
    optimization level that runs it, and the pass itself. `always`: it also runs at level 0
    (numerics ORT has at every level are not an optimization); `subgraphs`: it also rewrites
    every subgraph body (If/Loop/Scan), as ORT's transformer does."""

    name: str
    level: int
    run: Callable[[Rewriter], PassResult]
    always: bool = False
    subgraphs: bool = False


# In the order they run; level-1 passes run as a group until a fixed point, before and after
# the level-2 passes.
PASSES: list[Pass] = [
    Pass("fp16_islands", 1, fp16_islands, always=True, subgraphs=True),
    Pass("qdq_fusion", 1, qdq_fusion),
    Pass("shape_folding", 1, shape_folding),
    Pass("constant_folding", 1, constant_folding),
    Pass("identity_elimination", 1, identity_elimination),
    Pass("dead_code_elimination", 1, dead_code_elimination),
    Pass("dynamic_quantize_matmul_fusion", 2, dynamic_quantize_matmul_fusion),
    Pass("conv_bn_folding", 2, conv_bn_folding),
    Pass("bn_to_affine", 2, bn_to_affine),
    Pass("scale_into_conv", 2, scale_into_conv),
    Pass("spatial_mean_pool", 2, spatial_mean_pool),
    Pass("conv_fusion", 2, conv_fusion),
    Pass("concat_conv_merge", 2, concat_conv_merge),
    Pass("sibling_conv_merge", 2, sibling_conv_merge),
    Pass("avgpool_conv_reorder", 2, avgpool_conv_reorder),
    Pass("activation_after_maxpool", 2, activation_after_maxpool),
    Pass("attention_fusion", 2, attention_fusion),
    Pass("gemm_fusion", 2, gemm_fusion),
    Pass("gelu_fusion", 2, gelu_fusion),
    Pass("transpose_cancellation", 2, transpose_cancellation),
    Pass("elementwise_fusion", 2, elementwise_fusion),
]
PASS_NAMES = tuple(p.name for p in PASSES)
MAX_ROUNDS = 4


def _check_disabled(disabled: set[str]) -> None:
    unknown = sorted(disabled - set(PASS_NAMES))
    if unknown:
        from opwarden.errors import OptionsError

        raise OptionsError(
            f"disabled_passes names unknown pass(es) {unknown}; the passes are {list(PASS_NAMES)}"
        )


def optimize(model: Model, options: Any) -> list[dict[str, Any]]:
    """Rewrite `model` in place according to `options`; returns what each pass did.

    One entry per pass that ran ({"pass", "level", "changes", "ms", "details"}), one per
    disabled pass ({"pass", "skipped": "disabled"}), and a last {"pass": "total"} entry with the
    node counts before and after.
    """
    level = int(getattr(options, "optimization_level", 3) or 0)
    disabled = set(getattr(options, "disabled_passes", ()) or ())
    _check_disabled(disabled)
    t0 = time.perf_counter()
    before = len(model.graph.nodes)
    report: dict[str, dict[str, Any]] = {}
    active = [p for p in PASSES if (p.level <= level or p.always) and p.name not in disabled]

    def run(p: Pass) -> int:
        t = time.perf_counter()
        entry = report.setdefault(
            p.name, {"pass": p.name, "level": p.level, "changes": 0, "ms": 0.0, "details": {}}
        )
        changes = 0
        for g in graphs_of(model) if p.subgraphs else [model.graph]:
            rw = Rewriter(model, g, p.name)
            res = p.run(rw)
            rw.finish()
            if res.changes:
                relink(model)
            changes += res.changes
            for k, n in res.details.items():
                entry["details"][k] = entry["details"].get(k, 0) + n
        entry["changes"] += changes
        entry["ms"] += (time.perf_counter() - t) * 1e3
        return changes

    basic = [p for p in active if p.level == 1]
    fusions = [p for p in active if p.level >= 2]

    def clean() -> None:
        for _ in range(MAX_ROUNDS):
            if not sum(run(p) for p in basic):
                break

    if active:
        relink(model)  # the loader links subgraph reads before the main graph resets uses
        clean()
        if fusions and sum(run(p) for p in fusions):
            clean()
    out = [report[p.name] for p in PASSES if p.name in report]
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


__all__ = ["PASSES", "PASS_NAMES", "Pass", "PassResult", "optimize"]
