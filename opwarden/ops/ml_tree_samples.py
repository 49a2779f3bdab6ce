"""Random forests as operator attributes, and the tree operators' samples (`opwarden check`).

`random_trees` grows binary trees with mixed comparison modes, thresholds on a small grid (so
inputs drawn from the same grid hit ties for LEQ/LT/EQ/NEQ and BRANCH_MEMBER sets) and
random missing_value_tracks_true; `v3_attrs` and `te5_attrs` write one forest as
TreeEnsembleRegressor/Classifier (v1/v3) or TreeEnsemble-5 attributes. Tests use them too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opwarden.ops.base import Sample
from opwarden.ops.ml import (
    _MODE_NAMES,
    _TRANSFORMS,
    TreeEnsemble,
    TreeEnsembleClassifier,
    TreeEnsembleClassifier_1,
    TreeEnsembleRegressor,
    TreeEnsembleRegressor_1,
)

GRID = np.array([-1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5], dtype=np.float32)
V3_MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ")


def random_trees(rng: np.random.Generator, n_trees: int, max_depth: int, n_feat: int,
                 modes=("BRANCH_LEQ",), p_leaf: float = 0.25, member: bool = False):
    """Per tree a list of nodes in preorder: {"leaf": True} or a dict with feat, mode,
    value, true, false (indices into the tree's list), miss, and for BRANCH_MEMBER a set."""
    trees = []
    for _ in range(n_trees):
        nodes: list[dict[str, Any]] = []

        def grow(depth: int, nodes=nodes) -> int:
            k = len(nodes)
            nodes.append({"leaf": True})
            if depth >= max_depth or (depth > 0 and rng.random() < p_leaf):
                return k
            all_modes = (*modes, "BRANCH_MEMBER") if member else modes
            mode = all_modes[int(rng.integers(len(all_modes)))]
            node = {"leaf": False, "feat": int(rng.integers(n_feat)), "mode": mode,
                    "value": float(rng.choice(GRID)), "miss": int(rng.random() < 0.5),
                    "set": sorted(set(rng.choice(GRID, int(rng.integers(1, 4))).tolist()))}
            node["true"] = grow(depth + 1)
            node["false"] = grow(depth + 1)
            nodes[k] = node
            return k

        grow(0)
        trees.append(nodes)
    return trees


def grid_input(rng: np.random.Generator, n: int, n_feat: int, nan: float = 0.1) -> np.ndarray:
    """[n, n_feat] float32 values from the threshold grid, some NaN."""
    x = rng.choice(GRID, (n, n_feat)).astype(np.float32)
    x[rng.random(x.shape) < nan] = np.nan
    return x


def _leaf_entries(rng, n_out: int) -> list[tuple[int, float]]:
    """A leaf's (target or class, weight) pairs: one or more targets, not always all."""
    k = int(rng.integers(1, n_out + 1))
    return [(int(j), float(np.float32(rng.standard_normal())))
            for j in sorted(rng.choice(n_out, k, replace=False))]


def v3_attrs(rng, trees, n_out: int, kind: str = "regressor", **extra) -> dict[str, Any]:
    """TreeEnsembleRegressor (kind "regressor": target_*) or TreeEnsembleClassifier (kind
    "classifier": class_*, int64 labels) attributes; node ids are shuffled within a tree."""
    a: dict[str, list] = {k: [] for k in (
        "nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes", "nodes_values",
        "nodes_truenodeids", "nodes_falsenodeids", "nodes_missing_value_tracks_true",
        "w_treeids", "w_nodeids", "w_ids", "w_weights")}
    for t, nodes in enumerate(trees):
        ids = (rng.permutation(len(nodes)) + 3).tolist()
        for k, nd in enumerate(nodes):
            a["nodes_treeids"].append(t)
            a["nodes_nodeids"].append(ids[k])
            leaf = nd["leaf"]
            a["nodes_featureids"].append(0 if leaf else nd["feat"])
            a["nodes_modes"].append("LEAF" if leaf else nd["mode"])
            a["nodes_values"].append(0.0 if leaf else nd["value"])
            a["nodes_truenodeids"].append(0 if leaf else ids[nd["true"]])
            a["nodes_falsenodeids"].append(0 if leaf else ids[nd["false"]])
            a["nodes_missing_value_tracks_true"].append(0 if leaf else nd["miss"])
            if leaf:
                for j, w in _leaf_entries(rng, n_out):
                    a["w_treeids"].append(t)
                    a["w_nodeids"].append(ids[k])
                    a["w_ids"].append(j)
                    a["w_weights"].append(w)
    p = "target" if kind == "regressor" else "class"
    out = {k: v for k, v in a.items() if not k.startswith("w_")}
    out.update({f"{p}_{k[2:]}": v for k, v in a.items() if k.startswith("w_")})
    if kind == "regressor":
        out["n_targets"] = n_out
    else:
        out["classlabels_int64s"] = list(range(10, 10 + n_out))
    out.update(extra)
    return out


def te5_attrs(rng, trees, n_out: int, **extra) -> dict[str, Any]:
    """TreeEnsemble-5 attributes (interior nodes and leaves in separate lists, codes for
    the modes, BRANCH_MEMBER sets NaN-delimited in membership_values)."""
    feats, modes, splits, tr, tl, fl_, fll, miss, roots = ([] for _ in range(9))
    leaf_t, leaf_w, members = [], [], []
    for nodes in trees:
        inner = {k: None for k, nd in enumerate(nodes) if not nd["leaf"]}
        leafs = {k: None for k, nd in enumerate(nodes) if nd["leaf"]}
        base_n, base_l = len(feats), len(leaf_t)
        for i, k in enumerate(inner):
            inner[k] = base_n + i
        for i, k in enumerate(leafs):
            leafs[k] = base_l + i
            leaf_t.append(int(rng.integers(n_out)))
            leaf_w.append(float(np.float32(rng.standard_normal())))
        roots.append(inner[0])
        for k in inner:
            nd = nodes[k]
            feats.append(nd["feat"])
            modes.append(_MODE_NAMES[nd["mode"]])
            splits.append(nd["value"])
            miss.append(nd["miss"])
            for child, ids, flags in ((nd["true"], tr, tl), (nd["false"], fl_, fll)):
                ids.append(leafs[child] if nodes[child]["leaf"] else inner[child])
                flags.append(int(nodes[child]["leaf"]))
            if nd["mode"] == "BRANCH_MEMBER":
                members.extend([*nd["set"], np.nan])
    out = {"nodes_featureids": feats, "nodes_modes": np.array(modes, np.uint8),
           "nodes_splits": np.array(splits, np.float32), "nodes_truenodeids": tr,
           "nodes_trueleafs": tl, "nodes_falsenodeids": fl_, "nodes_falseleafs": fll,
           "nodes_missing_value_tracks_true": miss, "tree_roots": roots,
           "leaf_targetids": leaf_t, "leaf_weights": np.array(leaf_w, np.float32),
           "n_targets": n_out}
    if members:
        out["membership_values"] = np.array(members, np.float32)
    out.update(extra)
    return out


@TreeEnsemble.samples
def _tree_ensemble_samples(rng):
    """Every mode with BRANCH_MEMBER and NaN inputs, each aggregate function, each post
    transform, double and float16 inputs, a 1-D X and no rows."""
    x = grid_input(rng, 9, 4)
    for agg in range(4):
        trees = random_trees(rng, 4, 4, 4, V3_MODES, member=True)
        yield Sample([x], te5_attrs(rng, trees, 3, aggregate_function=agg), label=f"agg {agg}")
    for post in range(1, 5):
        trees = random_trees(rng, 3, 3, 4, V3_MODES)
        yield Sample([x], te5_attrs(rng, trees, 2, post_transform=post), label=f"post {post}")
    trees = random_trees(rng, 3, 3, 4, ("BRANCH_LT",))
    yield Sample([x.astype(np.float64)], te5_attrs(rng, trees, 2), label="double X")
    yield Sample([x.astype(np.float16)], te5_attrs(rng, trees, 2), label="float16 X")
    yield Sample([x[0]], te5_attrs(rng, trees, 2), label="1-D X")
    yield Sample([x[:0]], te5_attrs(rng, trees, 2), label="no rows")


@TreeEnsembleRegressor.samples
def _tree_regressor_samples(rng):
    """Each aggregate function over mixed modes, one target and several, post transforms,
    thresholds as a double tensor, int64 and double inputs, a 1-D X."""
    x = grid_input(rng, 8, 3)
    for agg in ("SUM", "AVERAGE", "MIN", "MAX"):
        trees = random_trees(rng, 4, 4, 3, V3_MODES)
        yield Sample([x], v3_attrs(rng, trees, 3, aggregate_function=agg,
                                   base_values=[0.5, -0.25, 1.0]), label=agg)
    trees = random_trees(rng, 3, 3, 3)
    yield Sample([x], v3_attrs(rng, trees, 1, post_transform="PROBIT"), label="1 target")
    yield Sample([x], v3_attrs(rng, trees, 2, post_transform="SOFTMAX"), label="softmax")
    a = v3_attrs(rng, trees, 2)
    a["nodes_values_as_tensor"] = np.array(a.pop("nodes_values"), np.float64)
    yield Sample([x.astype(np.float64)], a, label="double X, thresholds as tensor")
    yield Sample([rng.integers(-2, 2, (5, 3)).astype(np.int64)], v3_attrs(rng, trees, 1),
                 label="int64 X")
    yield Sample([x[0]], v3_attrs(rng, trees, 2), label="1-D X")


@TreeEnsembleClassifier.samples
def _tree_classifier_samples(rng):
    """Binary (one class column, as sklearn writes it) and multiclass, each post transform,
    base values, int32 input."""
    x = grid_input(rng, 8, 3)
    for post in _TRANSFORMS:
        trees = random_trees(rng, 3, 4, 3, V3_MODES)
        yield Sample([x], v3_attrs(rng, trees, 3, "classifier", post_transform=post),
                     noutputs=2, label=f"3 classes, {post}")
    trees = random_trees(rng, 3, 3, 3)
    a = v3_attrs(rng, trees, 2, "classifier", post_transform="LOGISTIC")
    a["class_ids"] = [1] * len(a["class_ids"])
    yield Sample([x], a, noutputs=2, label="binary, one score column")
    yield Sample([x], v3_attrs(rng, trees, 4, "classifier", base_values=[0.1, 0.2, 0.3, 0.4]),
                 noutputs=2, label="base values")
    yield Sample([rng.integers(-2, 2, (5, 3)).astype(np.int32)],
                 v3_attrs(rng, trees, 2, "classifier"), noutputs=2, label="int32 X")


def _v1(samples):
    """The v3 samples a v1 node can express (no *_as_tensor attributes)."""
    return lambda rng: (s for s in samples(rng) if not any(k.endswith("_as_tensor")
                                                            for k in s.attrs))


TreeEnsembleRegressor_1.samples(_v1(_tree_regressor_samples))
TreeEnsembleClassifier_1.samples(_v1(_tree_classifier_samples))
