"""Operators: ml family (domain ai.onnx.ml), the tree ensembles (TreeEnsemble,
TreeEnsembleRegressor, TreeEnsembleClassifier) and the helpers the ml ops share (string
tensors, post transforms); encoders, preprocessing and linear models live in ml_features.py.
"""

from __future__ import annotations

import numpy as np

from opwarden.contract import Contract, one_of
from opwarden.errors import KernelError
from opwarden.ops.base import op
from opwarden.ops.ml_probit import probit as _probit

ML = "ai.onnx.ml"

_STR = np.dtype(object)

# Post transforms of the classifier and regressor scores, by name.
_TRANSFORMS = {"NONE": 0, "SOFTMAX": 1, "LOGISTIC": 2, "SOFTMAX_ZERO": 3, "PROBIT": 4}
_TRANSFORM_NAMES = one_of(*_TRANSFORMS)


def _strings(values) -> np.ndarray:
    """A 1-D object array of Python str (how the runtime represents string tensors)."""
    out = np.empty(len(values), dtype=object)
    out[:] = [str(v) for v in values]
    return out


# --------------------------------------------------------------------------------------------
# Trees
# --------------------------------------------------------------------------------------------

# Node comparison modes of TreeEnsemble-5 (and the string names the v3 ops use).
_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)
_MODE_NAMES = {"BRANCH_LEQ": _LEQ, "BRANCH_LT": _LT, "BRANCH_GTE": _GTE, "BRANCH_GT": _GT,
               "BRANCH_EQ": _EQ, "BRANCH_NEQ": _NEQ, "BRANCH_MEMBER": _MEMBER}


def _compare(mode: np.ndarray, x: np.ndarray, split: np.ndarray) -> np.ndarray:
    """The branch condition for each (sample, tree) given its node's mode (MEMBER excluded)."""
    with np.errstate(invalid="ignore"):
        return np.select(
            [mode == _LEQ, mode == _LT, mode == _GTE, mode == _GT, mode == _EQ, mode == _NEQ],
            [x <= split, x < split, x >= split, x > split, x == split, x != split],
            default=False,
        )


def _member_sets(modes: np.ndarray, membership_values) -> dict[int, np.ndarray]:
    """node index -> its BRANCH_MEMBER set; the sets are NaN-delimited, in node order."""
    member_nodes = np.flatnonzero(modes == _MEMBER)
    if member_nodes.size == 0:
        return {}
    if membership_values is None:
        raise KernelError("BRANCH_MEMBER nodes need the membership_values attribute")
    vals = np.asarray(membership_values, dtype=np.float64).reshape(-1)
    cuts = np.flatnonzero(np.isnan(vals))
    groups = np.split(vals, cuts)
    groups = [g[~np.isnan(g)] for g in groups]
    if len(groups) < member_nodes.size:
        raise KernelError(
            f"membership_values holds {len(groups)} sets for {member_nodes.size} "
            "BRANCH_MEMBER nodes"
        )
    return {int(n): groups[i] for i, n in enumerate(member_nodes)}


def _walk_trees(X, roots, featureids, modes, splits, true_ids, true_leaf, false_ids, false_leaf,
                missing_true, members) -> np.ndarray:
    """Leaf index reached by every (sample, tree): shape (N, n_trees).

    All samples and trees descend together one level per step, so the loop runs once per level.
    """
    n = X.shape[0]
    node = np.broadcast_to(np.asarray(roots, dtype=np.int64), (n, len(roots))).copy()
    leaf = np.full(node.shape, -1, dtype=np.int64)
    active = np.ones(node.shape, dtype=bool)
    rows = np.broadcast_to(np.arange(n)[:, None], node.shape)
    for _ in range(len(featureids) + 1):
        if not active.any():
            return leaf
        r, nd = rows[active], node[active]
        x = X[r, featureids[nd]].astype(np.float64)
        cond = _compare(modes[nd], x, splits[nd])
        for m, values in members.items():
            at = nd == m
            if at.any():
                cond[at] = np.isin(x[at], values)
        nan = np.isnan(x)
        cond[nan] = missing_true[nd[nan]]
        nxt = np.where(cond, true_ids[nd], false_ids[nd])
        is_leaf = np.where(cond, true_leaf[nd], false_leaf[nd])
        leaf_now = leaf[active]
        leaf_now[is_leaf] = nxt[is_leaf]
        leaf[active] = leaf_now
        node_now = node[active]
        node_now[~is_leaf] = nxt[~is_leaf]
        node[active] = node_now
        active[active] = ~is_leaf
    raise KernelError("tree ensemble contains a cycle")


def _aggregate(leaves, leaf_targets, leaf_weights, n_targets, agg: int, n: int) -> np.ndarray:
    """Combine the leaf values of every tree per target: AVERAGE 0, SUM 1, MIN 2, MAX 3."""
    tgt = leaf_targets[leaves]  # (N, trees)
    w = leaf_weights[leaves].astype(np.float64)
    rows = np.broadcast_to(np.arange(n)[:, None], tgt.shape)
    if agg in (0, 1):
        out = np.zeros((n, n_targets), dtype=np.float64)
        np.add.at(out, (rows, tgt), w)
        if agg == 0:
            out /= leaves.shape[1]
        return out
    fill = np.inf if agg == 2 else -np.inf
    out = np.full((n, n_targets), fill, dtype=np.float64)
    (np.minimum if agg == 2 else np.maximum).at(out, (rows, tgt), w)
    out[np.isinf(out) & (out == fill)] = 0.0  # targets no tree voted for
    return out


def _post_transform(scores: np.ndarray, kind: int) -> np.ndarray:
    """NONE 0, SOFTMAX 1, LOGISTIC 2, SOFTMAX_ZERO 3, PROBIT 4 (row-wise where it applies)."""
    if kind == 0:
        return scores
    if kind == 1:
        e = np.exp(scores - scores.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if kind == 2:
        return 1.0 / (1.0 + np.exp(-scores))
    if kind == 3:
        # Softmax over the nonzero entries only; zeros stay zero.
        nz = scores != 0
        m = np.max(np.where(nz, scores, -np.inf), axis=1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        e = np.where(nz, np.exp(scores - m), 0.0)
        s = e.sum(axis=1, keepdims=True)
        return np.where(s > 0, e / np.where(s > 0, s, 1.0), 0.0)
    if kind == 4:
        return _probit(scores)
    raise KernelError(f"unknown post_transform {kind}")


@op("TreeEnsemble", since=5, domain=ML, contract=Contract(
    nan="produce",  # PROBIT of a score outside (0, 1)
    allowed={"aggregate_function": one_of(0, 1, 2, 3), "post_transform": one_of(0, 1, 2, 3, 4)}))
def TreeEnsemble(X, *, aggregate_function=1, leaf_targetids=None, leaf_weights=None,
                 membership_values=None, n_targets=None, nodes_falseleafs=None,
                 nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                 nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_splits=None,
                 nodes_trueleafs=None, nodes_truenodeids=None, post_transform=0,
                 tree_roots=None):
    """Evaluate a forest; leaves add into targets (ai.onnx.ml TreeEnsemble-5)."""
    X = _tree_input(X, "TreeEnsemble")
    p = tree_ensemble_parts(
        X, leaf_targetids, membership_values, n_targets, nodes_falseleafs, nodes_falsenodeids,
        nodes_featureids, nodes_missing_value_tracks_true, nodes_modes, nodes_splits,
        nodes_trueleafs, nodes_truenodeids, tree_roots)
    leaves = _walk_trees(X, p["roots"], p["featureids"], p["modes"], p["splits"],
                         p["true_ids"], p["true_leaf"], p["false_ids"], p["false_leaf"],
                         p["missing"], p["members"])
    weights = np.asarray(leaf_weights).reshape(-1)
    scores = _aggregate(leaves, p["leaf_t"], weights, p["n_out"], int(aggregate_function),
                        X.shape[0])
    return _post_transform(scores, int(post_transform)).astype(X.dtype)


def tree_ensemble_parts(X, leaf_targetids, membership_values, n_targets, nodes_falseleafs,
                        nodes_falsenodeids, nodes_featureids, nodes_missing_value_tracks_true,
                        nodes_modes, nodes_splits, nodes_trueleafs, nodes_truenodeids,
                        tree_roots) -> dict:
    """TreeEnsemble-5's attributes checked and as arrays (splits rounded to X's dtype, the
    precision they compare at); shared with the compiled variant (kernels/cpu/ml.py)."""
    featureids = np.asarray(nodes_featureids, dtype=np.int64)
    if featureids.size and featureids.max() >= X.shape[1]:
        raise KernelError(f"feature id {featureids.max()} out of range for {X.shape[1]} features")
    modes = np.asarray(nodes_modes, dtype=np.int64).reshape(-1)
    nnodes = len(featureids)
    missing = (np.zeros(nnodes, bool) if nodes_missing_value_tracks_true is None
               else np.asarray(nodes_missing_value_tracks_true, dtype=bool))
    leaf_t = np.asarray(leaf_targetids, dtype=np.int64)
    n_out = int(n_targets) if n_targets else int(leaf_t.max()) + 1
    if leaf_t.size and (leaf_t.min() < 0 or leaf_t.max() >= n_out):
        raise KernelError(f"leaf_targetids out of range [0, {n_out})")
    splits = np.asarray(nodes_splits, dtype=np.float64).reshape(-1)
    return {
        "roots": np.asarray(tree_roots, dtype=np.int64), "featureids": featureids,
        "modes": modes, "missing": missing, "leaf_t": leaf_t, "n_out": n_out,
        "splits": splits.astype(X.dtype).astype(np.float64),
        "true_ids": np.asarray(nodes_truenodeids, dtype=np.int64),
        "true_leaf": np.asarray(nodes_trueleafs, dtype=bool),
        "false_ids": np.asarray(nodes_falsenodeids, dtype=np.int64),
        "false_leaf": np.asarray(nodes_falseleafs, dtype=bool),
        "members": _member_sets(modes, membership_values),
    }



# --------------------------------------------------------------------------------------------
# TreeEnsembleRegressor / TreeEnsembleClassifier (v1, v3): node lists keyed by (tree, node)
# --------------------------------------------------------------------------------------------

_AGGREGATES = {"AVERAGE": 0, "SUM": 1, "MIN": 2, "MAX": 3}
_V3_MODES = one_of("LEAF", *_MODE_NAMES)


def _attr_values(plain, as_tensor, what: str, dtype=np.float32) -> np.ndarray | None:
    """A float list attribute or its *_as_tensor twin (which keeps its own dtype)."""
    if plain is not None and as_tensor is not None:
        raise KernelError(f"set only one of {what} and {what}_as_tensor")
    if as_tensor is not None:
        return np.asarray(as_tensor).reshape(-1)
    return None if plain is None else np.asarray(plain, dtype=dtype).reshape(-1)


def _forest(X, treeids, nodeids, featureids, modes, values, truenodeids, falsenodeids,
            missing_true, opname: str):
    """Index the nodes and walk every sample through every tree.

    Returns (leaf node index per (sample, tree) [N, n_trees], node key -> index map).
    """
    f = index_forest(X.shape[1], treeids, nodeids, featureids, modes, values, truenodeids,
                     falsenodeids, missing_true, opname)
    roots, is_leaf = f["roots"], f["is_leaf"]
    # Integer inputs compare as float32 against the float thresholds, as ONNX Runtime does.
    x = X if X.dtype.kind == "f" else X.astype(np.float32)
    leaves = np.broadcast_to(roots, (X.shape[0], roots.size)).copy()
    inner = ~is_leaf[roots]
    if inner.any():
        leaves[:, inner] = _walk_trees(
            x, roots[inner], f["feats"], f["code"], f["values"], f["true_ids"],
            is_leaf[f["true_ids"]], f["false_ids"], is_leaf[f["false_ids"]], f["missing"], {},
        )
    return leaves, f["key"]


def index_forest(nf: int, treeids, nodeids, featureids, modes, values, truenodeids,
                 falsenodeids, missing_true, opname: str) -> dict:
    """The v1/v3 node lists checked and indexed: node key -> index, per tree its root (trees
    by id), per node leaf flag, mode code, feature (0 at leaves), threshold, child indices
    and missing flag; shared with the compiled variant (kernels/cpu/ml.py)."""
    tids = np.asarray(treeids, dtype=np.int64)
    nids = np.asarray(nodeids, dtype=np.int64)
    n = tids.size
    key = {(int(t), int(i)): k for k, (t, i) in enumerate(zip(tids.tolist(), nids.tolist()))}
    if len(key) != n:
        raise KernelError(f"{opname}: repeated (tree id, node id) pairs among the nodes")
    mode_names = list(modes)
    bad = sorted({m for m in mode_names if m != "LEAF" and m not in _MODE_NAMES})
    if bad or len(mode_names) != n:
        raise KernelError(f"{opname}: nodes_modes must list one known mode per node, got {bad}")
    is_leaf = np.array([m == "LEAF" for m in mode_names], dtype=bool)
    code = np.array([_MODE_NAMES.get(m, _LEQ) for m in mode_names], dtype=np.int64)
    feats = np.asarray(featureids, dtype=np.int64)
    if (feats[~is_leaf] >= nf).any() or (feats[~is_leaf] < 0).any():
        raise KernelError(f"{opname}: feature id out of range for {nf} features")

    def child(ids, what):
        out = np.zeros(n, dtype=np.int64)
        for k, (t, c) in enumerate(zip(tids.tolist(), np.asarray(ids, np.int64).tolist())):
            if is_leaf[k]:
                continue
            if (t, c) not in key:
                raise KernelError(f"{opname}: {what} {c} of tree {t} is not a node")
            out[k] = key[(t, c)]
        return out

    true_ids = child(truenodeids, "true node")
    false_ids = child(falsenodeids, "false node")
    missing = (np.zeros(n, bool) if not missing_true
               else np.asarray(missing_true, dtype=bool).reshape(-1))
    # A tree's root is its node that no other node points to; trees are ordered by id.
    pointed = np.zeros(n, dtype=bool)
    pointed[true_ids[~is_leaf]] = True
    pointed[false_ids[~is_leaf]] = True
    roots = []
    for t in sorted(set(tids.tolist())):
        cands = np.flatnonzero((tids == t) & ~pointed)
        if cands.size == 0:
            raise KernelError(f"{opname}: tree {t} has no root (a cycle)")
        roots.append(int(cands[np.argmin(nids[cands])]))
    return {"key": key, "roots": np.asarray(roots, dtype=np.int64), "is_leaf": is_leaf,
            "code": code, "feats": np.where(is_leaf, 0, feats),
            "values": np.asarray(values).astype(np.float64), "true_ids": true_ids,
            "false_ids": false_ids, "missing": missing}


def _leaf_table(key, treeids, nodeids, ids, weights, n_out: int, agg: int, opname: str):
    """Per node: the combined weight for each target/class and whether any was given."""
    n = len(key)
    fill = {2: np.inf, 3: -np.inf}.get(agg, 0.0)
    table = np.full((n, n_out), fill, dtype=np.float64)
    has = np.zeros((n, n_out), dtype=bool)
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= n_out):
        raise KernelError(f"{opname}: target/class id out of range [0, {n_out})")
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    for t, nd, j, v in zip(np.asarray(treeids).tolist(), np.asarray(nodeids).tolist(),
                           ids.tolist(), w.tolist()):
        k = key.get((int(t), int(nd)))
        if k is None:
            raise KernelError(f"{opname}: weight for missing node {nd} of tree {t}")
        if agg == 2:
            table[k, j] = min(table[k, j], v)
        elif agg == 3:
            table[k, j] = max(table[k, j], v)
        else:
            table[k, j] += v
        has[k, j] = True
    return table, has


def _combine(leaves, table, has, agg: int):
    """Scores [N, n_out] over the trees' leaves, and whether each got any weight."""
    got = has[leaves]  # (N, trees, out)
    vals = table[leaves]
    any_ = got.any(axis=1)
    if agg == 2:
        return np.where(any_, np.where(got, vals, np.inf).min(axis=1), 0.0), any_
    if agg == 3:
        return np.where(any_, np.where(got, vals, -np.inf).max(axis=1), 0.0), any_
    s = np.where(got, vals, 0.0).sum(axis=1)
    return (s / leaves.shape[1] if agg == 0 else s), any_


def _tree_input(X, opname: str) -> np.ndarray:
    if X.ndim == 1:
        return X.reshape(1, -1)
    if X.ndim != 2:
        raise KernelError(f"{opname} input must be [N, F], got shape {X.shape}")
    return X


def _tree_regressor(X, *, aggregate_function, base_values, n_targets, nodes_falsenodeids,
                    nodes_featureids, nodes_missing_value_tracks_true, nodes_modes,
                    nodes_nodeids, nodes_treeids, nodes_truenodeids, nodes_values,
                    post_transform, target_ids, target_nodeids, target_treeids,
                    target_weights):
    X = _tree_input(X, "TreeEnsembleRegressor")
    if not n_targets:
        raise KernelError("TreeEnsembleRegressor needs n_targets")
    agg = _AGGREGATES[aggregate_function]
    leaves, key = _forest(X, nodes_treeids, nodes_nodeids, nodes_featureids, nodes_modes,
                          nodes_values, nodes_truenodeids, nodes_falsenodeids,
                          nodes_missing_value_tracks_true, "TreeEnsembleRegressor")
    table, has = _leaf_table(key, target_treeids, target_nodeids, target_ids, target_weights,
                             int(n_targets), agg, "TreeEnsembleRegressor")
    scores, got = _combine(leaves, table, has, agg)
    return regressor_output(scores, got, base_values, n_targets, post_transform)


def regressor_output(scores, got, base_values, n_targets, post_transform) -> np.ndarray:
    """TreeEnsembleRegressor's output from the aggregated scores and which targets got any
    leaf weight: base values and post transform as ONNX Runtime applies them."""
    base = np.asarray(base_values if base_values is not None else [], np.float64).reshape(-1)
    post = _TRANSFORMS[post_transform]
    if int(n_targets) == 1:
        # ONNX Runtime: one target always gets its base value and only PROBIT applies.
        scores = scores + (base[0] if base.size == 1 else 0.0)
        return (_probit(scores) if post == _TRANSFORMS["PROBIT"] else scores).astype(np.float32)
    # Several targets: base values (one per target) go only to targets some leaf scored;
    # a target no leaf scored stays 0 before the transform, as in ONNX Runtime.
    if base.size == int(n_targets):
        scores = scores + base
    scores = np.where(got, scores, 0.0)
    return _post_transform(scores, post).astype(np.float32)


def _classifier_finalize(S, has, base, binary_case: bool, all_positive: bool, post: int):
    """Labels (class indices) and scores from summed class weights, following ONNX Runtime.

    More than two classes: base values are added and the label is the best class that got
    a weight. Two classes follow ORT's binary rules: one score column is completed into two
    (1 - s, s) or (-s, s), and the label comes from the positive-class score.
    """
    n, c = S.shape
    S, has = S.copy(), has.copy()
    if c != 2:
        if base.size:
            S[:, :base.size] += base
            has[:, :base.size] = True
        pick = np.argmax(np.where(has, S, -np.inf), axis=1)
        return pick, _post_transform(S, post)
    s0, s1, h0, h1 = S[:, 0], S[:, 1], has[:, 0], has[:, 1]
    add = np.full(n, -1)
    if base.size >= 2:
        # ORT: with a class-1 score, class 1 gets base[1] + s0 and class 0 its negation.
        s1 = np.where(h1, base[1] + s0, s1 + base[1])
        s0 = np.where(h1, -s1, s0 + base[0])
        two = np.ones(n, dtype=bool)
    else:
        if base.size == 1:
            s0 = s0 + base[0]
        else:
            add[:] = 3
        two = h1.copy()
    pos = np.where(two & h1, s1, np.where(h0, s0, 0.0))
    if binary_case:
        cut = 0.5 if all_positive else 0.0
        pick = (pos > cut).astype(np.int64)
        add = np.where(pick == 1, 0, 1) if all_positive else np.where(pick == 1, 2, 3)
    else:
        pick = (pos > 0).astype(np.int64)
    Z = np.zeros((n, 2), dtype=np.float64)
    if two.any():
        # A class no leaf scored reports 0 before the transform (ORT), base value or not.
        pair = np.stack([np.where(h0, s0, 0.0), np.where(h1 | (base.size >= 2), s1, 0.0)], 1)
        pair[~h1 & (base.size >= 2), 1] = 0.0
        Z[two] = _post_transform(pair[two], post)
    one = ~two
    if one.any():
        s, a = s0[one], add[one]
        z = np.zeros((s.size, 2))
        if post == _TRANSFORMS["PROBIT"]:
            z[:, 0] = _probit(s)
        else:
            pos_form = (a == 0) | (a == 1)
            neg_form = (a == 2) | (a == 3)
            if post == _TRANSFORMS["LOGISTIC"]:
                # Both forms become (logistic(-s), logistic(s)).
                pair = 1.0 / (1.0 + np.exp(-np.stack([-s, s], axis=1)))
                z[pos_form | neg_form] = pair[pos_form | neg_form]
            else:
                z[pos_form] = np.stack([1.0 - s, s], axis=1)[pos_form]
                z[neg_form] = np.stack([-s, s], axis=1)[neg_form]
            z[a == -1, 0] = s[a == -1]
        Z[one] = z
    return pick, Z


def classifier_labels(classlabels_int64s, classlabels_strings) -> tuple[np.ndarray, bool]:
    """The class labels as an array, and whether they are strings."""
    if (classlabels_int64s is None) == (classlabels_strings is None):
        raise KernelError("TreeEnsembleClassifier needs exactly one of classlabels_int64s, "
                          "classlabels_strings")
    if classlabels_strings is not None:
        return _strings(classlabels_strings), True
    return np.asarray(classlabels_int64s, np.int64), False


def _tree_classifier(X, *, base_values, class_ids, class_nodeids, class_treeids,
                     class_weights, classlabels_int64s, classlabels_strings,
                     nodes_falsenodeids, nodes_featureids, nodes_missing_value_tracks_true,
                     nodes_modes, nodes_nodeids, nodes_treeids, nodes_truenodeids,
                     nodes_values, post_transform):
    X = _tree_input(X, "TreeEnsembleClassifier")
    labels, strings = classifier_labels(classlabels_int64s, classlabels_strings)
    leaves, key = _forest(X, nodes_treeids, nodes_nodeids, nodes_featureids, nodes_modes,
                          nodes_values, nodes_truenodeids, nodes_falsenodeids,
                          nodes_missing_value_tracks_true, "TreeEnsembleClassifier")
    table, has = _leaf_table(key, class_treeids, class_nodeids, class_ids, class_weights,
                             labels.size, 1, "TreeEnsembleClassifier")
    S, got = _combine(leaves, table, has, 1)
    return classifier_output(S, got, labels, strings, class_ids, class_weights, base_values,
                             post_transform)


def classifier_output(S, got, labels, strings: bool, class_ids, class_weights, base_values,
                      post_transform):
    """TreeEnsembleClassifier's (labels, scores) from the summed class weights and which
    classes got any: base values, the binary rules and the post transform of ONNX Runtime."""
    ids = np.asarray(class_ids, dtype=np.int64).reshape(-1)
    w = np.asarray(class_weights, dtype=np.float64).reshape(-1)
    binary_case = labels.size == 2 and np.unique(ids).size == 1
    base = np.asarray(base_values if base_values is not None else [], np.float64).reshape(-1)
    pick, Z = _classifier_finalize(S, got, base, binary_case, bool((w >= 0).all()),
                                   _TRANSFORMS[post_transform])
    if labels.size == 2 and not binary_case and not strings:
        # ORT reports the raw 0/1 decision here rather than a label from the list.
        return pick.astype(np.int64), Z.astype(np.float32)
    return labels[pick], Z.astype(np.float32)


_TREE_ALLOWED = {"post_transform": _TRANSFORM_NAMES, "aggregate_function": one_of(*_AGGREGATES)}


@op("TreeEnsembleRegressor", since=3, domain=ML, contract=Contract(
    nan="produce",  # PROBIT of a score outside (0, 1)
    allowed=_TREE_ALLOWED))
def TreeEnsembleRegressor(X, *, aggregate_function="SUM", base_values=None,
                          base_values_as_tensor=None, n_targets=None, nodes_falsenodeids=None,
                          nodes_featureids=None, nodes_hitrates=None,
                          nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=None,
                          nodes_modes=None, nodes_nodeids=None, nodes_treeids=None,
                          nodes_truenodeids=None, nodes_values=None,
                          nodes_values_as_tensor=None, post_transform="NONE", target_ids=None,
                          target_nodeids=None, target_treeids=None, target_weights=None,
                          target_weights_as_tensor=None):
    """Forest regression; thresholds/weights may come as tensors
    (ai.onnx.ml TreeEnsembleRegressor-3)."""
    return _tree_regressor(
        X, aggregate_function=aggregate_function,
        base_values=_attr_values(base_values, base_values_as_tensor, "base_values"),
        n_targets=n_targets, nodes_falsenodeids=nodes_falsenodeids,
        nodes_featureids=nodes_featureids,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_nodeids=nodes_nodeids, nodes_treeids=nodes_treeids,
        nodes_truenodeids=nodes_truenodeids,
        nodes_values=_attr_values(nodes_values, nodes_values_as_tensor, "nodes_values"),
        post_transform=post_transform, target_ids=target_ids, target_nodeids=target_nodeids,
        target_treeids=target_treeids,
        target_weights=_attr_values(target_weights, target_weights_as_tensor,
                                    "target_weights"),
    )


@op("TreeEnsembleRegressor", since=1, domain=ML, contract=Contract(
    nan="produce", allowed=_TREE_ALLOWED))
def TreeEnsembleRegressor_1(X, *, aggregate_function="SUM", base_values=None, n_targets=None,
                            nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                            nodes_missing_value_tracks_true=None, nodes_modes=None,
                            nodes_nodeids=None, nodes_treeids=None, nodes_truenodeids=None,
                            nodes_values=None, post_transform="NONE", target_ids=None,
                            target_nodeids=None, target_treeids=None, target_weights=None):
    """Forest regression with float attributes (ai.onnx.ml TreeEnsembleRegressor-1)."""
    return TreeEnsembleRegressor(
        X, aggregate_function=aggregate_function, base_values=base_values,
        n_targets=n_targets, nodes_falsenodeids=nodes_falsenodeids,
        nodes_featureids=nodes_featureids, nodes_hitrates=nodes_hitrates,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_nodeids=nodes_nodeids, nodes_treeids=nodes_treeids,
        nodes_truenodeids=nodes_truenodeids, nodes_values=nodes_values,
        post_transform=post_transform, target_ids=target_ids, target_nodeids=target_nodeids,
        target_treeids=target_treeids, target_weights=target_weights,
    )


@op("TreeEnsembleClassifier", since=3, domain=ML, contract=Contract(
    nan="produce", allowed={"post_transform": _TRANSFORM_NAMES}))
def TreeEnsembleClassifier(X, *, base_values=None, base_values_as_tensor=None, class_ids=None,
                           class_nodeids=None, class_treeids=None, class_weights=None,
                           class_weights_as_tensor=None, classlabels_int64s=None,
                           classlabels_strings=None, nodes_falsenodeids=None,
                           nodes_featureids=None, nodes_hitrates=None,
                           nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=None,
                           nodes_modes=None, nodes_nodeids=None, nodes_treeids=None,
                           nodes_truenodeids=None, nodes_values=None,
                           nodes_values_as_tensor=None, post_transform="NONE"):
    """Forest classification: labels and per-class scores
    (ai.onnx.ml TreeEnsembleClassifier-3)."""
    return _tree_classifier(
        X, base_values=_attr_values(base_values, base_values_as_tensor, "base_values"),
        class_ids=class_ids, class_nodeids=class_nodeids, class_treeids=class_treeids,
        class_weights=_attr_values(class_weights, class_weights_as_tensor, "class_weights"),
        classlabels_int64s=classlabels_int64s, classlabels_strings=classlabels_strings,
        nodes_falsenodeids=nodes_falsenodeids, nodes_featureids=nodes_featureids,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_nodeids=nodes_nodeids, nodes_treeids=nodes_treeids,
        nodes_truenodeids=nodes_truenodeids,
        nodes_values=_attr_values(nodes_values, nodes_values_as_tensor, "nodes_values"),
        post_transform=post_transform,
    )


@op("TreeEnsembleClassifier", since=1, domain=ML, contract=Contract(
    nan="produce", allowed={"post_transform": _TRANSFORM_NAMES}))
def TreeEnsembleClassifier_1(X, *, base_values=None, class_ids=None, class_nodeids=None,
                             class_treeids=None, class_weights=None, classlabels_int64s=None,
                             classlabels_strings=None, nodes_falsenodeids=None,
                             nodes_featureids=None, nodes_hitrates=None,
                             nodes_missing_value_tracks_true=None, nodes_modes=None,
                             nodes_nodeids=None, nodes_treeids=None, nodes_truenodeids=None,
                             nodes_values=None, post_transform="NONE"):
    """Forest classification with float attributes (ai.onnx.ml TreeEnsembleClassifier-1)."""
    return TreeEnsembleClassifier(
        X, base_values=base_values, class_ids=class_ids, class_nodeids=class_nodeids,
        class_treeids=class_treeids, class_weights=class_weights,
        classlabels_int64s=classlabels_int64s, classlabels_strings=classlabels_strings,
        nodes_falsenodeids=nodes_falsenodeids, nodes_featureids=nodes_featureids,
        nodes_hitrates=nodes_hitrates,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_nodeids=nodes_nodeids, nodes_treeids=nodes_treeids,
        nodes_truenodeids=nodes_truenodeids, nodes_values=nodes_values,
        post_transform=post_transform,
    )


# Public for the compiled variants (kernels/cpu/ml.py), which parse and finish the same way.
attr_values, leaf_table, post_transform_scores, tree_input = (
    _attr_values, _leaf_table, _post_transform, _tree_input)
