"""The operator data-flow graph and the message-passing predictor: graph structure and work that
adds up to the formula's, fit / predict on a tiny sweep, exact save/load, deterministic fits,
honest NaN for unobserved targets, and the `gnn` kind in the pool's registry."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from maserve_prefect.predictors import GNNPredictor, Row, Shape
from maserve_prefect.predictors.dataflow import NODE_FEATURES, NODE_KINDS, operator_graph
from maserve_prefect.predictors.opgraph import PHASES
from maserve_prefect.predictors.pool_costs import KINDS, new_learned
from maserve_prefect.predictors.profiling import shape_grid, simulator_rows
from maserve_prefect.predictors.rows import NAN

from maserve_prefect.engines.catalog import get_gpu, get_model
from maserve_prefect.errors import ConfigError

QUERIES = [
    ("Qwen3-0.6B", Shape(2, 256, 32), "H100"),
    ("Qwen3-4B", Shape(8, 1024, 64), "L40S"),
    ("Qwen3-1.7B", Shape(3, 300, 20), "A100-80GB"),  # unseen model and device
]


def make() -> GNNPredictor:
    return GNNPredictor(hidden=8, head_hidden=8, epochs=150, learning_rate=1e-2)


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    sweep = simulator_rows(
        ["Qwen3-0.6B", "Qwen3-4B"], ["H100", "L40S"], shape_grid((1, 8), (128, 1024), (16, 64))
    )
    assert len(sweep.rows) == 32 and not sweep.notes
    return sweep.rows


@pytest.mark.parametrize(
    ("model", "num_nodes", "has_qk_norm"), [("Qwen3-8B", 13, True), ("Llama-2-7B", 12, False)]
)
def test_operator_graph_structure(model: str, num_nodes: int, has_qk_norm: bool) -> None:
    og = operator_graph(get_model(model), get_gpu("H100"), Shape(2, 512, 64))
    assert len(og.kinds) == num_nodes and ("qk_norm" in og.kinds) is has_qk_norm
    assert og.graph.node_x.shape == (num_nodes, len(NODE_FEATURES))
    named = {(og.kinds[a], og.kinds[b]) for a, b in og.graph.edges}
    assert ("qkv", "attention") in named  # V skips rope
    assert ("down", "add_norm_attn") in named  # the next layer
    assert (("qkv", "rope") in named) is not has_qk_norm
    assert {k for e in named for k in e} == set(og.kinds)  # every node is connected
    one_hot = og.graph.node_x[:, : len(NODE_KINDS)]
    assert (one_hot.sum(axis=1) == 1).all()


def test_node_work_adds_up_to_the_formula_per_phase() -> None:
    og = operator_graph(get_model("Qwen3-8B"), get_gpu("A100-80GB"), Shape(4, 1000, 50))
    col = {name: i for i, name in enumerate(NODE_FEATURES)}
    for phase in PHASES:
        node_time = np.exp(og.graph.node_x[:, col[f"{phase}_log_time"]]).sum()
        assert node_time == pytest.approx(og.totals.time_s(phase), rel=1e-9)
        assert og.graph.node_x[:, col[f"{phase}_time_share"]].sum() == pytest.approx(1.0)


def test_fit_predicts_finite_positive_values(rows: list[Row]) -> None:
    p = make().fit(rows)
    assert p.fitted_targets == ("runtime_s", "peak_mem_bytes", "load_s")
    for pred in p.predict_batch(QUERIES):
        for value in (pred.runtime_s, pred.peak_mem_bytes, pred.load_s):
            assert math.isfinite(value) and value > 0
    r = rows[0]
    assert 0.5 < p.predict(r.model, r.shape, r.device).runtime_s / r.runtime_s < 2.0


def test_save_load_round_trip_is_exact(rows: list[Row], tmp_path: Path) -> None:
    p = make().fit(rows)
    p.save(tmp_path / "m")
    q = GNNPredictor.load(tmp_path / "m")
    assert q.predict_batch(QUERIES) == p.predict_batch(QUERIES)
    assert q.hyper == p.hyper
    meta = json.loads((tmp_path / "m" / "meta.json").read_text())
    assert meta["features"] == list(GNNPredictor.feature_names)
    meta["features"] = meta["features"][:-1]
    (tmp_path / "m" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="refit"):
        GNNPredictor.load(tmp_path / "m")


def test_fits_are_deterministic(rows: list[Row]) -> None:
    a, b = make().fit(rows), make().fit(list(rows))
    assert a.predict_batch(QUERIES) == b.predict_batch(QUERIES)


def test_unobserved_targets_stay_nan(rows: list[Row]) -> None:
    runtime_only = [dataclasses.replace(r, peak_mem_bytes=NAN, load_s=NAN) for r in rows]
    p = make().fit(runtime_only)
    assert p.fitted_targets == ("runtime_s",)
    pred = p.predict(*QUERIES[0])
    assert pred.runtime_s > 0 and math.isnan(pred.peak_mem_bytes) and math.isnan(pred.load_s)
    with pytest.raises(ConfigError, match="observes"):
        make().fit([dataclasses.replace(r, runtime_s=NAN) for r in runtime_only])
    with pytest.raises(ConfigError, match="not fitted"):
        make().predict(*QUERIES[0])


def test_gnn_is_a_registered_kind() -> None:
    assert "gnn" in KINDS and KINDS[:3] == ("formula", "gbdt", "graph")
    assert isinstance(new_learned("gnn", 20), GNNPredictor)
    with pytest.raises(ConfigError, match="not learned"):
        new_learned("formula", 20)


def test_a_pool_arm_can_choose_gnn() -> None:
    from maserve_prefect.bench.pool.suite_file import ArmSpec

    assert ArmSpec(plan="joint", predictor="gnn").predictor == "gnn"
