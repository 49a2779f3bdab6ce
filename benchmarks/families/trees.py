"""Tree ensembles: scikit-learn (skl2onnx), LightGBM and XGBoost (onnxmltools), run on 1k rows.

Each model is trained on a seeded synthetic task (make_classification / make_regression, 20
features) so that its trees have real depth and split structure, then converted to the ONNX-ML
TreeEnsemble operators. Classifiers are converted without ZipMap, so both outputs are tensors
(label int64, probabilities float32).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from families.base import Case, Feeds, normal, register

FEATURES = 20


def _data(rows: int, classify: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import make_classification, make_regression

    if classify:
        x, y = make_classification(rows, FEATURES, n_informative=12, n_classes=3,
                                   random_state=seed)
    else:
        x, y = make_regression(rows, FEATURES, n_informative=12, noise=0.5, random_state=seed)
    return x.astype(np.float32), y


def _skl(model: Any, classify: bool, rows: int) -> bytes:
    from skl2onnx import to_onnx

    x, y = _data(rows, classify)
    model.fit(x, y)
    opts = {id(model): {"zipmap": False}} if classify else None
    onx = to_onnx(model, x[:1], options=opts, target_opset={"": 17, "ai.onnx.ml": 3})
    return onx.SerializeToString()


def _onnxmltools(model: Any, convert: str, rows: int) -> bytes:
    import onnxmltools
    from onnxconverter_common.onnx_ex import get_maximum_opset_supported
    from onnxmltools.convert.common.data_types import FloatTensorType

    x, y = _data(rows, True)
    model.fit(x, y)
    kw = {"zipmap": False} if convert == "convert_lightgbm" else {}  # XGBoost's has no ZipMap
    onx = getattr(onnxmltools, convert)(
        model, initial_types=[("input", FloatTensorType([None, FEATURES]))],
        target_opset=min(17, get_maximum_opset_supported()), **kw)
    return onx.SerializeToString()


def _feeds(name: str) -> Any:
    def feeds(b: int, seed: int) -> Feeds:
        return {name: normal((b, FEATURES), seed, "rows", scale=1.5)}

    return feeds


def random_forest(trees: int, depth: int, rows: int) -> bytes:
    from sklearn.ensemble import RandomForestClassifier

    return _skl(RandomForestClassifier(trees, max_depth=depth, random_state=0, n_jobs=1),
                True, rows)


def gradient_boosting(trees: int, depth: int, rows: int) -> bytes:
    from sklearn.ensemble import GradientBoostingRegressor

    return _skl(GradientBoostingRegressor(n_estimators=trees, max_depth=depth, random_state=0),
                False, rows)


def lightgbm(trees: int, leaves: int, rows: int) -> bytes:
    import lightgbm as lgb

    m = lgb.LGBMClassifier(n_estimators=trees, num_leaves=leaves, random_state=0, n_jobs=1,
                           verbose=-1)
    return _onnxmltools(m, "convert_lightgbm", rows)


def xgboost(trees: int, depth: int, rows: int) -> bytes:
    import xgboost as xgb

    m = xgb.XGBClassifier(n_estimators=trees, max_depth=depth, random_state=0, n_jobs=1)
    return _onnxmltools(m, "convert_xgboost", rows)


def register_all() -> None:
    """Full cases (100 trees on 1k-row batches) and their smoke versions (5 trees, 64 rows)."""
    skl = ("sklearn", "skl2onnx")
    for name, fn, size, needs, feed in [
        ("sklearn_rf", random_forest, (100, 10), skl, "X"),
        ("sklearn_gbr", gradient_boosting, (100, 5), skl, "X"),
        ("lightgbm", lightgbm, (100, 31), ("lightgbm", "onnxmltools"), "input"),
        ("xgboost", xgboost, (100, 6), ("xgboost", "onnxmltools"), "input"),
    ]:
        register(Case(name, "trees", lambda fn=fn, size=size: fn(*size, 5000), _feeds(feed),
                      needs=needs, kind="tree", config={"size": size, "train_rows": 5000},
                      batches=(1000,), note=f"{size[0]} trees, 1k rows"))
        register(Case(f"tiny_{name}", "trees", lambda fn=fn: fn(5, 3, 300), _feeds(feed),
                      needs=needs, kind="tree", batches=(64,), smoke=True, cache=False,
                      note="5 trees, 64 rows"))
