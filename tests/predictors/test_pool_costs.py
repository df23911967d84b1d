"""Predictor adapters: bucket tables as cost models, fitted once and cached."""

from __future__ import annotations

from pathlib import Path

import pytest
from maserve_prefect.predictors import GNNPredictor, GraphPredictor, pool_costs
from maserve_prefect.predictors.pool_costs import (
    TrainingRows,
    TrainingSpec,
    bucket_grid,
    fit_cached,
    predictor_cost_model,
    training_rows,
)

from maserve_prefect.errors import ConfigError

MODELS = ("Qwen3-0.6B", "Qwen3-8B")
DEVICES = ("V100-32GB:0", "A100-40GB:1")
GRID = bucket_grid(2048, 512, steps_per_doubling=1, max_batch=8)


@pytest.fixture(scope="module")
def rows(shared_data: Path) -> TrainingRows:
    spec = TrainingSpec(
        profiles=shared_data / "profiles",
        measured_shapes=((1, 16), (128, 1024), (16, 256)),
        sim_models=("Qwen3-0.6B", "Qwen3-4B", "Qwen3-14B"),
        sim_devices=("V100-32GB", "A100-40GB"),
        sim_shapes=((1, 8), (128, 1024), (16, 256)),
        num_trees=20,
    )
    return training_rows(spec)


@pytest.mark.parametrize("kind", ["formula", "graph"])
def test_runtime_grows_with_input_and_output(kind: str, rows: TrainingRows, tmp_path: Path) -> None:
    costs = predictor_cost_model(
        kind, models=MODELS, devices=DEVICES, buckets=GRID, training=rows, num_trees=20,
        cache_dir=tmp_path,
    )  # fmt: skip
    for model in MODELS:
        for gpu in ("V100-32GB", "A100-40GB"):
            small = costs.runtime_s(model, gpu, 1, 100, 10)
            assert small < costs.runtime_s(model, gpu, 1, 2000, 10)
            assert small < costs.runtime_s(model, gpu, 1, 100, 500)
            assert costs.load_s(model, gpu) > 0
            assert costs.peak_mem_bytes(model, gpu, 4, 100, 10) > 0
    # the bigger model is slower; the faster GPU is faster
    assert costs.runtime_s("Qwen3-8B", "V100-32GB", 1, 500, 100) > costs.runtime_s(
        "Qwen3-0.6B", "V100-32GB", 1, 500, 100
    )
    assert costs.runtime_s("Qwen3-8B", "A100-40GB", 1, 500, 100) < costs.runtime_s(
        "Qwen3-8B", "V100-32GB", 1, 500, 100
    )


def test_second_build_reuses_the_saved_fit(
    rows: TrainingRows, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fits: list[int] = []
    real_fit = GraphPredictor.fit

    def counting_fit(self: GraphPredictor, data: object) -> GraphPredictor:
        fits.append(1)
        return real_fit(self, data)  # type: ignore[arg-type]

    monkeypatch.setattr(GraphPredictor, "fit", counting_fit)

    def build() -> object:
        return predictor_cost_model(
            "graph", models=MODELS, devices=DEVICES, buckets=GRID, training=rows,
            num_trees=20, cache_dir=tmp_path,
        )  # fmt: skip

    first = build()
    assert len(fits) == 1
    [saved] = list(tmp_path.glob("graph-*/meta.json"))
    mtime = saved.stat().st_mtime_ns
    second = build()  # table cache
    for table in (tmp_path / "tables").iterdir():
        table.unlink()
    third = build()  # table rebuilt from the saved fit
    assert len(fits) == 1 and saved.stat().st_mtime_ns == mtime
    assert first.entries == second.entries == third.entries  # type: ignore[attr-defined]
    again = fit_cached("graph", rows.all, 20, tmp_path)
    assert not again.fitted and again.path == saved.parent
    # other training rows are another key: fitted afresh
    other = fit_cached("graph", rows.all[:-1], 20, tmp_path)
    assert other.fitted and other.key != again.key and len(fits) == 2


def test_gnn_table_is_built_from_a_saved_fit_that_loads_exactly(
    rows: TrainingRows, tmp_path: Path
) -> None:
    first = predictor_cost_model(
        "gnn", models=MODELS, devices=DEVICES, buckets=GRID, training=rows, cache_dir=tmp_path
    )
    for table in (tmp_path / "tables").iterdir():
        table.unlink()
    again = fit_cached("gnn", rows.all, 20, tmp_path)  # LightGBM's rounds do not enter the key
    assert not again.fitted and isinstance(again.predictor, GNNPredictor)
    second = predictor_cost_model(
        "gnn", models=MODELS, devices=DEVICES, buckets=GRID, training=rows, cache_dir=tmp_path
    )
    assert first.entries == second.entries  # type: ignore[attr-defined]


def test_bad_kinds_and_missing_training_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown predictor 'oracle'"):
        predictor_cost_model("oracle", cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="needs training rows"):
        predictor_cost_model("graph", cache_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"profiles .* not found"):
        training_rows(TrainingSpec(profiles=tmp_path / "none"))
    with pytest.raises(ConfigError, match="not learned"):
        pool_costs.fit_cached("formula", [], 5, tmp_path)


def test_bucket_grid_covers_the_workload() -> None:
    b = bucket_grid(3000, 1500, steps_per_doubling=3, max_batch=512)
    assert b.input[-1] >= 3000 > b.input[-2] and b.output[-1] >= 1500 > b.output[-2]
    assert b.batch == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    ratios = [hi / lo for lo, hi in zip(b.input, b.input[1:], strict=False)]
    assert max(ratios) < 1.35  # 2 ** (1/3) ≈ 1.26, rounded up to whole tokens
