"""`GBDTPredictor`: LightGBM on scalar model, device and shape features — the learned baseline.

One idea: the trees see only sizes (parameters, weight bytes, layers, hidden, KV bytes per
token), datasheet numbers (bandwidth, FLOPS, memory, host link) and the request shape, all on a
log scale, and learn `log(target)` directly. Nothing tells them how these combine, so they
interpolate well between seen devices and models and cannot extrapolate to a device or model
outside the ranges they saw (the evaluation's held-out splits measure exactly that).

Examples:
    >>> from maserve_prefect.predictors.rows import Row
    >>> rows = [Row("Qwen3-8B", "H100", b, 128, 16, 0.01 * b, 2e10 + b, 40.0, "sim")
    ...         for b in (1, 2, 4, 8, 16, 32)]
    >>> p = GBDTPredictor(num_trees=5, min_data_in_leaf=1).fit(rows)
    >>> p.predict("Qwen3-8B", Shape(4, 128, 16), "H100").runtime_s > 0
    True
"""

from __future__ import annotations

from maserve_prefect.predictors.base import (
    DEVICE_FEATURES,
    MODEL_FEATURES,
    SHAPE_FEATURES,
    Shape,
    device_features,
    model_features,
    resolve,
    shape_features,
)
from maserve_prefect.predictors.learned import LightGBMPredictor


class GBDTPredictor(LightGBMPredictor):
    """One LightGBM regressor per target over scalar features (module docstring)."""

    name = "gbdt"
    feature_names = MODEL_FEATURES + DEVICE_FEATURES + SHAPE_FEATURES

    def features(self, model: str, shape: Shape, device: str) -> list[float]:
        spec, gpu = resolve(model, device)
        return model_features(spec) + device_features(gpu) + shape_features(shape)
