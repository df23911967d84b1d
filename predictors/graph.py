"""`GraphPredictor`: LightGBM over the request's operator graph, correcting the roofline.

One idea: describe a request by what its operators do on the device — for every operator type
(QKV, O, gate/up, down GEMMs, prefill attention, decode attention, lm_head, elementwise) and
phase, the summed roofline time `max(FLOPs / peak, bytes / bandwidth)` from
`opgraph.request_graph`, each type's share of the total, the number of engine steps, and the
memory terms — and let the trees learn `log(target / formula)`, the ratio between what happened
and the catalog-only formula. Because the features are times on *this* device and the target is
a ratio, a device or model never seen in training still lands on its own physics; the trees only
add how real kernels and schedulers depart from the roofline (efficiency by operator mix, per-step
overheads that scale with the step count).

Examples:
    >>> from maserve_prefect.predictors.rows import Row
    >>> rows = [Row("Qwen3-8B", "H100", b, 128, 16, 0.02 * b, 2e10 + b, 40.0, "sim")
    ...         for b in (1, 2, 4, 8, 16, 32)]
    >>> p = GraphPredictor(num_trees=5, min_data_in_leaf=1).fit(rows)
    >>> 0 < p.predict("Qwen3-8B", Shape(4, 128, 16), "A100-80GB").runtime_s
    True
"""

from __future__ import annotations

import math

from maserve_prefect.predictors.base import (
    DEVICE_FEATURES,
    SHAPE_FEATURES,
    Predictor,
    Shape,
    device_features,
    resolve,
    shape_features,
)
from maserve_prefect.predictors.formula import FormulaPredictor, peak_memory_bytes
from maserve_prefect.predictors.learned import LightGBMPredictor
from maserve_prefect.predictors.opgraph import OP_TYPES, request_graph

# (phase, op) pairs that can be non-zero
PHASE_OPS = tuple(
    (phase, op)
    for phase in ("prefill", "decode")
    for op in OP_TYPES
    if not (phase == "prefill" and op == "attn_decode")
    and not (phase == "decode" and op == "attn_prefill")
)
GRAPH_FEATURES = (
    *(f"log_t_{phase}_{op}" for phase, op in PHASE_OPS),
    *(f"share_{op}" for op in OP_TYPES),
    "log_t_prefill",
    "log_t_decode",
    "log_prefill_steps",
    "log_decode_steps",
    "log_intensity",
    "log_weight_bytes",
    "log_kv_bytes",
    "log_formula_mem_bytes",
)


def _log(x: float) -> float:
    return math.log(max(x, 1e-12))


class GraphPredictor(LightGBMPredictor):
    """LightGBM over operator-graph roofline features, learning the ratio to the formula."""

    name = "graph"
    feature_names = GRAPH_FEATURES + DEVICE_FEATURES + SHAPE_FEATURES

    def __init__(
        self,
        num_trees: int = 300,
        learning_rate: float = 0.05,
        num_leaves: int = 15,
        min_data_in_leaf: int = 5,
        seed: int = 0,
    ) -> None:
        super().__init__(num_trees, learning_rate, num_leaves, min_data_in_leaf, seed)
        self._formula = FormulaPredictor()

    def base(self) -> Predictor:
        return self._formula

    def features(self, model: str, shape: Shape, device: str) -> list[float]:
        spec, gpu = resolve(model, device)
        g = request_graph(spec, gpu, shape)
        total = g.time_s()
        flops = sum(t.flops for t in g.totals.values())
        nbytes = sum(t.bytes for t in g.totals.values())
        out = [_log(g.get(phase, op).time_s) for phase, op in PHASE_OPS]
        out += [g.time_s(op=op) / total for op in OP_TYPES]
        out += [
            _log(g.time_s("prefill")),
            _log(g.time_s("decode")),
            _log(g.num_prefill_steps),
            _log(g.num_decode_steps + 1),
            _log(flops / nbytes),
            _log(spec.weight_bytes),
            _log(spec.kv_bytes_per_token * shape.num_tokens),
            _log(peak_memory_bytes(spec, gpu, shape)),
        ]
        return out + device_features(gpu) + shape_features(shape)
