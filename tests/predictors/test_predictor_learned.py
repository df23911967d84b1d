"""GBDT and graph predictors: fit on a tiny simulator sweep, finite output, exact save/load,
deterministic fits, honest NaN for targets never observed."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from maserve_prefect.predictors import GBDTPredictor, GraphPredictor, Row, Shape
from maserve_prefect.predictors.learned import LightGBMPredictor
from maserve_prefect.predictors.profiling import shape_grid, simulator_rows
from maserve_prefect.predictors.rows import NAN

from maserve_prefect.errors import ConfigError

CLASSES = [GBDTPredictor, GraphPredictor]
QUERIES = [
    ("Qwen3-0.6B", Shape(2, 256, 32), "H100"),
    ("Qwen3-4B", Shape(8, 1024, 64), "L40S"),
    ("Qwen3-1.7B", Shape(3, 300, 20), "A100-80GB"),  # unseen model and device
]


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    sweep = simulator_rows(
        ["Qwen3-0.6B", "Qwen3-4B"], ["H100", "L40S"], shape_grid((1, 8), (128, 1024), (16, 64))
    )
    assert len(sweep.rows) == 32 and not sweep.notes
    return sweep.rows


def make(cls: type[LightGBMPredictor]) -> LightGBMPredictor:
    return cls(num_trees=20, min_data_in_leaf=2)


@pytest.mark.parametrize("cls", CLASSES)
def test_fit_predicts_finite_positive_values(cls: type[LightGBMPredictor], rows: list[Row]) -> None:
    p = make(cls).fit(rows)
    assert p.fitted_targets == ("runtime_s", "peak_mem_bytes", "load_s")
    for pred in p.predict_batch(QUERIES):
        for value in (pred.runtime_s, pred.peak_mem_bytes, pred.load_s):
            assert math.isfinite(value) and value > 0
    # the trees learned something: a seen row is predicted within a factor of 2
    r = rows[0]
    assert 0.5 < p.predict(r.model, r.shape, r.device).runtime_s / r.runtime_s < 2.0


@pytest.mark.parametrize("cls", CLASSES)
def test_save_load_round_trip_is_exact(
    cls: type[LightGBMPredictor], rows: list[Row], tmp_path: Path
) -> None:
    p = make(cls).fit(rows)
    p.save(tmp_path / "m")
    q = cls.load(tmp_path / "m")
    assert q.predict_batch(QUERIES) == p.predict_batch(QUERIES)
    assert q.hyper == p.hyper
    meta = json.loads((tmp_path / "m" / "meta.json").read_text())
    assert meta["features"] == list(cls.feature_names)


@pytest.mark.parametrize("cls", CLASSES)
def test_fits_are_deterministic(cls: type[LightGBMPredictor], rows: list[Row]) -> None:
    a, b = make(cls).fit(rows), make(cls).fit(list(rows))
    assert a.predict_batch(QUERIES) == b.predict_batch(QUERIES)
    for target in a.fitted_targets:
        assert a.boosters[target].model_to_string() == b.boosters[target].model_to_string()


def test_unobserved_targets_stay_nan(rows: list[Row]) -> None:
    runtime_only = [dataclasses.replace(r, peak_mem_bytes=NAN, load_s=NAN) for r in rows]
    p = make(GraphPredictor).fit(runtime_only)
    assert p.fitted_targets == ("runtime_s",)
    pred = p.predict(*QUERIES[0])
    assert pred.runtime_s > 0 and math.isnan(pred.peak_mem_bytes) and math.isnan(pred.load_s)


def test_load_refuses_other_folders(rows: list[Row], tmp_path: Path) -> None:
    make(GBDTPredictor).fit(rows).save(tmp_path / "g")
    with pytest.raises(ConfigError, match="saved by predictor 'gbdt'"):
        GraphPredictor.load(tmp_path / "g")
    meta_path = tmp_path / "g" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["features"] = meta["features"][:-1]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="refit"):
        GBDTPredictor.load(tmp_path / "g")
    with pytest.raises(ConfigError, match="not found"):
        GBDTPredictor.load(tmp_path / "missing")


def test_unfitted_predictor_refuses_to_predict() -> None:
    with pytest.raises(ConfigError, match="not fitted"):
        make(GBDTPredictor).predict(*QUERIES[0])
    with pytest.raises(ConfigError, match="observes"):
        make(GBDTPredictor).fit([Row("Qwen3-8B", "H100", 1, 8, 8, NAN, NAN, NAN, "x")])
