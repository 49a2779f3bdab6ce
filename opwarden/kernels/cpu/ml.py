"""Tree ensembles through the compiled walk (opwarden.native): TreeEnsemble-5 and
TreeEnsembleRegressor/TreeEnsembleClassifier (v1, v3) as `*.cpu.native` variants.

The attributes are parsed and checked by the reference's own steps (ops/ml.py), then the
forest is flattened once into the node records the C walk reads (opwarden.native.Forest); a
session binds the variant to its node (specialize), so the flattening runs at the first call
only, cached per input dtype and feature count. Aggregation happens in C in tree order; the
base values, post transforms and the classifier's label rules stay the reference's NumPy code.
The variants are registered only where the compiled extension imported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from opwarden import native
from opwarden.errors import KernelError
from opwarden.ops.base import REGISTRY
from opwarden.ops.ml import (
    ML,
    attr_values,
    classifier_labels,
    classifier_output,
    index_forest,
    leaf_table,
    post_transform_scores,
    regressor_output,
    tree_ensemble_parts,
    tree_input,
)


def _check_acyclic(n_nodes: int, t_child, t_leaf, f_child, f_leaf, roots, root_leaf,
                   opname: str) -> None:
    """Every walk from a root ends at a leaf: descend level by level from the roots; a forest
    that still has nodes to visit after n_nodes levels loops (the C walk has no step limit)."""
    frontier = np.unique(roots[~root_leaf])
    for _ in range(n_nodes + 1):
        if frontier.size == 0:
            return
        frontier = np.unique(np.concatenate([t_child[frontier][~t_leaf[frontier]],
                                             f_child[frontier][~f_leaf[frontier]]]))
    raise KernelError(f"{opname}: tree ensemble contains a cycle")


def _check_ids(ids, leaf, n_nodes: int, n_leaves: int, what: str, opname: str) -> None:
    bad_node = (~leaf) & ((ids < 0) | (ids >= n_nodes))
    bad_leaf = leaf & ((ids < 0) | (ids >= n_leaves))
    if bad_node.any() or bad_leaf.any():
        raise KernelError(f"{opname}: {what} out of range ({n_nodes} nodes, {n_leaves} leaves)")


def flatten(*, n_feat: int, n_targets: int, agg: int, feats, thr, modes, miss, t_child, t_leaf,
            f_child, f_leaf, members: Mapping[int, np.ndarray], roots, root_leaf, leaf_off,
            leaf_tgt, leaf_w, opname: str) -> native.Forest:
    """The node records of a forest given per node (feature, threshold, mode, missing flag and
    both children, each a node index or, where its leaf flag is set, a leaf index) and per leaf
    its (target, weight) entries in CSR form; indices are checked, cycles refused."""
    n, n_leaves = int(feats.size), int(leaf_off.size) - 1
    _check_ids(t_child, t_leaf, n, n_leaves, "true child", opname)
    _check_ids(f_child, f_leaf, n, n_leaves, "false child", opname)
    _check_ids(roots, root_leaf, n, n_leaves, "tree root", opname)
    _check_acyclic(n, t_child, t_leaf, f_child, f_leaf, roots, root_leaf, opname)
    rec = np.zeros(n, dtype=native.NODE_DTYPE)
    rec["thr"], rec["feat"], rec["mode"], rec["miss"] = thr, feats, modes, miss
    rec["child_true"] = np.where(t_leaf, -t_child - 1, t_child)
    rec["child_false"] = np.where(f_leaf, -f_child - 1, f_child)
    # A BRANCH_MEMBER record keeps its set's [begin, end) in `members` in the threshold slot.
    sets, at = [], 0
    slots = rec.view(np.int32).reshape(n, -1)
    for k in np.flatnonzero(modes == native.MEMBER).tolist():
        vals = np.asarray(members.get(k, ()), dtype=np.float64)
        slots[k, 0], slots[k, 1] = at, at + vals.size
        sets.append(vals)
        at += vals.size
    return native.Forest(
        nodes=rec, members=np.concatenate(sets) if sets else np.zeros(1),
        roots=np.where(root_leaf, -roots - 1, roots).astype(np.int32),
        leaf_off=np.ascontiguousarray(leaf_off, dtype=np.int32),
        leaf_tgt=np.ascontiguousarray(leaf_tgt, dtype=np.int32),
        leaf_w=np.ascontiguousarray(leaf_w, dtype=np.float64),
        n_feat=int(n_feat), n_targets=int(n_targets), agg=int(agg))


def _finish_scores(S: np.ndarray, agg: int, n_trees: int) -> np.ndarray:
    """AVERAGE divides by the tree count; MIN/MAX report 0 where the result is the reference's
    +-inf starting value (no tree voted, or every vote was that infinity)."""
    if agg == 0 and n_trees:
        S /= n_trees
    elif agg in (2, 3):
        S[S == (np.inf if agg == 2 else -np.inf)] = 0.0
    return S


# ---------------------------------------------------------------- TreeEnsemble-5 -----------

def _te5_forest(X: np.ndarray, attrs: Mapping[str, Any]) -> native.Forest:
    p = tree_ensemble_parts(
        X, attrs.get("leaf_targetids"), attrs.get("membership_values"), attrs.get("n_targets"),
        attrs.get("nodes_falseleafs"), attrs.get("nodes_falsenodeids"),
        attrs.get("nodes_featureids"), attrs.get("nodes_missing_value_tracks_true"),
        attrs.get("nodes_modes"), attrs.get("nodes_splits"), attrs.get("nodes_trueleafs"),
        attrs.get("nodes_truenodeids"), attrs.get("tree_roots"))
    weights = np.asarray(attrs.get("leaf_weights"), dtype=np.float64).reshape(-1)
    leaf_t = p["leaf_t"]
    if weights.size != leaf_t.size:
        raise KernelError(f"TreeEnsemble: {weights.size} leaf_weights for {leaf_t.size} "
                          "leaf_targetids")
    n = p["featureids"].size
    for name in ("modes", "splits", "true_ids", "true_leaf", "false_ids", "false_leaf",
                 "missing"):
        if p[name].size != n:
            raise KernelError(f"TreeEnsemble: {p[name].size} values of nodes_{name} for {n} "
                              "nodes")
    return flatten(
        n_feat=X.shape[1], n_targets=p["n_out"], agg=int(attrs.get("aggregate_function", 1)),
        feats=p["featureids"], thr=p["splits"], modes=p["modes"], miss=p["missing"],
        t_child=p["true_ids"], t_leaf=p["true_leaf"], f_child=p["false_ids"],
        f_leaf=p["false_leaf"], members=p["members"], roots=p["roots"],
        root_leaf=np.zeros(p["roots"].size, bool), leaf_off=np.arange(leaf_t.size + 1),
        leaf_tgt=leaf_t, leaf_w=weights, opname="TreeEnsemble")


def _te5_run(forest: native.Forest, X: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    S, _ = forest.eval(X)
    S = _finish_scores(S, forest.agg, forest.roots.size)
    return post_transform_scores(S, int(attrs.get("post_transform", 0))).astype(X.dtype)


def tree_ensemble_native(X, **attrs):
    """TreeEnsemble-5 through the compiled walk (the forest flattened on this call)."""
    X = tree_input(X, "TreeEnsemble")
    return _te5_run(_te5_forest(X, attrs), X, attrs)


# ---------------------------------------------------------------- v1 / v3 ------------------

def _v3_forest(X: np.ndarray, a: Mapping[str, Any], opname: str, ids, n_out: int,
               agg: int, prefix: str) -> native.Forest:
    """Flatten a v1/v3 node list; its leaves are its LEAF nodes (leaf index = node index),
    each with the combined weights per target or class the reference's leaf table gives."""
    values = attr_values(a.get("nodes_values"), a.get("nodes_values_as_tensor"), "nodes_values")
    f = index_forest(X.shape[1], a.get("nodes_treeids"), a.get("nodes_nodeids"),
                     a.get("nodes_featureids"), a.get("nodes_modes"), values,
                     a.get("nodes_truenodeids"), a.get("nodes_falsenodeids"),
                     a.get("nodes_missing_value_tracks_true"), opname)
    weights = attr_values(a.get(f"{prefix}_weights"), a.get(f"{prefix}_weights_as_tensor"),
                          f"{prefix}_weights")
    table, has = leaf_table(f["key"], a.get(f"{prefix}_treeids"), a.get(f"{prefix}_nodeids"),
                            ids, weights, n_out, agg, opname)
    node_k, tgt = np.nonzero(has)  # row-major: by node, then target
    is_leaf, code = f["is_leaf"], f["code"].copy()
    if (~is_leaf).any():
        # Leaf records are never compared; giving them an interior mode keeps an all-LEQ
        # (or all-LT) forest on the walk without a per-node mode switch.
        code[is_leaf] = code[~is_leaf][0]
    return flatten(
        n_feat=X.shape[1], n_targets=n_out, agg=agg, feats=f["feats"], thr=f["values"],
        modes=code, miss=f["missing"], t_child=f["true_ids"], t_leaf=is_leaf[f["true_ids"]],
        f_child=f["false_ids"], f_leaf=is_leaf[f["false_ids"]], members={},
        roots=f["roots"], root_leaf=is_leaf[f["roots"]],
        leaf_off=np.concatenate([[0], np.cumsum(np.bincount(node_k, minlength=is_leaf.size))]),
        leaf_tgt=tgt, leaf_w=table[node_k, tgt], opname=opname)


def _v3_input(X, opname: str) -> np.ndarray:
    X = tree_input(X, opname)
    # Integer inputs compare as float32 against the float thresholds, as ONNX Runtime does.
    return X if X.dtype.kind == "f" else X.astype(np.float32)


def _regressor_forest(X: np.ndarray, a: Mapping[str, Any]) -> native.Forest:
    if not a.get("n_targets"):
        raise KernelError("TreeEnsembleRegressor needs n_targets")
    agg = native.AGGREGATES[a.get("aggregate_function", "SUM")]
    return _v3_forest(X, a, "TreeEnsembleRegressor", a.get("target_ids"), int(a["n_targets"]),
                      agg, "target")


def _regressor_run(forest: native.Forest, X: np.ndarray, a: Mapping[str, Any]) -> np.ndarray:
    S, got = forest.eval(X)
    S = _finish_scores(S, forest.agg, forest.roots.size)
    base = attr_values(a.get("base_values"), a.get("base_values_as_tensor"), "base_values")
    return regressor_output(S, got, base, a["n_targets"], a.get("post_transform", "NONE"))


def tree_regressor_native(X, **attrs):
    """TreeEnsembleRegressor (v1, v3) through the compiled walk."""
    X = _v3_input(X, "TreeEnsembleRegressor")
    return _regressor_run(_regressor_forest(X, attrs), X, attrs)


def _classifier_forest(X: np.ndarray, a: Mapping[str, Any]) -> native.Forest:
    labels, _ = classifier_labels(a.get("classlabels_int64s"), a.get("classlabels_strings"))
    return _v3_forest(X, a, "TreeEnsembleClassifier", a.get("class_ids"), labels.size, 1,
                      "class")


def _classifier_run(forest: native.Forest, X: np.ndarray, a: Mapping[str, Any]):
    labels, strings = classifier_labels(a.get("classlabels_int64s"),
                                        a.get("classlabels_strings"))
    S, got = forest.eval(X)
    weights = attr_values(a.get("class_weights"), a.get("class_weights_as_tensor"),
                          "class_weights")
    base = attr_values(a.get("base_values"), a.get("base_values_as_tensor"), "base_values")
    return classifier_output(S, got, labels, strings, a.get("class_ids"), weights, base,
                             a.get("post_transform", "NONE"))


def tree_classifier_native(X, **attrs):
    """TreeEnsembleClassifier (v1, v3) through the compiled walk."""
    X = _v3_input(X, "TreeEnsembleClassifier")
    return _classifier_run(_classifier_forest(X, attrs), X, attrs)


# ---------------------------------------------------------------- binding ------------------

def _bound(prepare: Callable, build: Callable, run: Callable) -> Callable:
    """specialize(): a kernel for one node that flattens its forest at the first call and
    keeps it per (input dtype, feature count), the facts the flattening depends on."""

    def specialize(kwargs: Mapping[str, Any]) -> Callable[..., Any]:
        cache: dict[tuple, native.Forest] = {}

        def bound(X, **attrs):
            X = prepare(X)
            key = (X.dtype.str, X.shape[1])
            forest = cache.get(key)
            if forest is None:
                forest = cache[key] = build(X, attrs)
            return run(forest, X, attrs)

        return bound

    return specialize


def _rank_ok(x: Any) -> bool:
    return x.ndim is None or x.ndim in (1, 2)


def _te5_when(x: Any, *_: Any, **__: Any) -> bool:
    """TreeEnsemble-5 on float inputs of rank 1 or 2 (the types its schema allows)."""
    return _rank_ok(x) and x.dtype in (None, "float32", "float64", "float16")


def _v3_when(x: Any, *_: Any, **__: Any) -> bool:
    """v1/v3 forests on float or int inputs of rank 1 or 2."""
    return _rank_ok(x) and x.dtype in (None, "float32", "float64", "int64", "int32")


def register() -> None:
    """Register the compiled tree variants on every version of the tree operators, where the
    compiled extension is in use (opwarden.native.status() says why not)."""
    if not native.available():
        return
    te5 = REGISTRY.latest("TreeEnsemble", ML)
    if te5 is not None:
        te5.kernel("cpu", priority=10, when=_te5_when, name="treeensemble.cpu.native",
                   specialize=_bound(lambda X: tree_input(X, "TreeEnsemble"), _te5_forest,
                                     _te5_run))(tree_ensemble_native)
    for op_type, fn, build, run in (
        ("TreeEnsembleRegressor", tree_regressor_native, _regressor_forest, _regressor_run),
        ("TreeEnsembleClassifier", tree_classifier_native, _classifier_forest,
         _classifier_run),
    ):
        for opdef in REGISTRY.versions(op_type, ML):
            opdef.kernel("cpu", priority=10, when=_v3_when, name=f"{op_type.lower()}.cpu.native",
                         specialize=_bound(lambda X, o=op_type: _v3_input(X, o), build,
                                           run))(fn)
