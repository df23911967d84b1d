"""BucketTable and OutputTracker: covering buckets, p90 over a bounded window, admission at the
limit, and entries equal to the predictor at bucket points."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from maserve_prefect.predictors import (
    Buckets,
    BucketTable,
    FormulaPredictor,
    OutputTracker,
    Prediction,
    Shape,
)

from maserve_prefect.errors import ConfigError

BUCKETS = Buckets((1, 4, 16), (256, 1024, 4096), (32, 128, 512))


class Recording:
    """A predictor that encodes the shape it was asked about and counts its calls."""

    name = "recording"

    def __init__(self) -> None:
        self.calls = 0

    def predict(self, model: str, shape: Shape, device: str) -> Prediction:
        self.calls += 1
        return Prediction(float(shape.batch), float(shape.input_len), float(shape.output_len))


@pytest.fixture(scope="module")
def table() -> BucketTable:
    return BucketTable.build(Recording(), ["Qwen3-8B"], ["H100", "L40S"], BUCKETS)


def test_build_asks_once_per_bucket_point() -> None:
    rec = Recording()
    t = BucketTable.build(rec, ["Qwen3-8B", "Phi-2"], ["H100"], BUCKETS)
    assert rec.calls == len(t.entries) == 2 * 27
    t.lookup("Qwen3-8B", "H100", 2, 300, 40)
    assert rec.calls == 54  # lookups never call the predictor


@pytest.mark.parametrize(
    ("size", "want"),
    [((1, 1, 1), (1, 256, 32)), ((2, 256, 33), (4, 256, 128)), ((16, 257, 512), (16, 1024, 512))],
)
def test_lookup_uses_the_smallest_covering_bucket(
    table: BucketTable, size: tuple[int, int, int], want: tuple[int, int, int]
) -> None:
    p = table.lookup("Qwen3-8B", "H100", *size)
    assert (p.runtime_s, p.peak_mem_bytes, p.load_s) == want


def test_sizes_past_the_largest_bucket_raise(table: BucketTable) -> None:
    with pytest.raises(ConfigError, match="input 4097 exceeds the largest input bucket 4096"):
        table.lookup("Qwen3-8B", "H100", 1, 4097, 1)
    with pytest.raises(ConfigError, match="no entry for Phi-2"):
        table.lookup("Phi-2", "H100", 1, 1, 1)


def test_aliases_resolve_to_the_same_entry(table: BucketTable) -> None:
    a = table.lookup("Qwen/Qwen3-8B", "h100-sxm", 3, 900, 100)
    assert a == table.lookup("Qwen3-8B", "H100", 3, 900, 100)


def test_tracker_p90_over_a_bounded_window() -> None:
    t = OutputTracker("node", output_limit=500, window=10)
    assert t.p90() is None and t.expected_output() == 500
    for n in [1000, *range(1, 11)]:  # the 1000 falls out of the 10-wide window
        t.observe(n)
    assert t.num_observed == 10
    assert t.p90() == 9  # nearest rank: ceil(0.9 * 10) = 9th of 1..10
    t.observe(10_000)
    assert t.p90() == 10 and t.expected_output() == 10  # one outlier in ten is above the p90
    t.observe(10_000)
    assert t.p90() == 10_000 and t.expected_output() == 500  # capped at the limit


def test_running_uses_p90_and_admission_uses_the_limit(table: BucketTable) -> None:
    t = OutputTracker("solver", output_limit=500)
    for n in (20, 25, 30, 31, 100):
        t.observe(n)
    assert t.p90() == 100
    running = table.running_prediction("Qwen3-8B", "H100", 2, 300, t)
    assert running.load_s == 128  # output bucket covering the p90 (100)
    admission = table.admission_prediction("Qwen3-8B", "H100", 2, 300, t.output_limit)
    assert admission.load_s == 512  # output bucket covering the limit (500)
    fresh = OutputTracker("new", output_limit=500)
    assert table.running_prediction("Qwen3-8B", "H100", 2, 300, fresh) == admission


def test_entries_equal_the_predictor_at_bucket_points(tmp_path: Path) -> None:
    formula = FormulaPredictor()
    small = Buckets((1, 8), (128, 2048), (16, 256))
    t = BucketTable.build(formula, ["Qwen3-0.6B"], ["A100-80GB"], small)
    for shape in small.shapes():
        got = t.lookup("Qwen3-0.6B", "A100-80GB", shape.batch, shape.input_len, shape.output_len)
        assert got == formula.predict("Qwen3-0.6B", shape, "A100-80GB")
    again = BucketTable.load(t.save(tmp_path / "table.json"))
    assert again.entries == t.entries and again.buckets == small


def test_bad_buckets_raise() -> None:
    with pytest.raises(ConfigError, match="strictly increasing"):
        Buckets((4, 1), (1,), (1,))
    with pytest.raises(ConfigError, match="output_limit"):
        OutputTracker("n", output_limit=0)


def test_table_answers_the_cost_model_seam() -> None:
    formula = FormulaPredictor()
    t = BucketTable.build(formula, ["Qwen3-8B"], ["H100"], BUCKETS)
    want = formula.predict("Qwen3-8B", Shape(4, 1024, 128), "H100")
    assert t.runtime_s("Qwen3-8B", "H100", 3, 1000, 100) == want.runtime_s
    assert t.peak_mem_bytes("Qwen3-8B", "H100", 3, 1000, 100) == math.ceil(want.peak_mem_bytes)
    assert t.load_s("Qwen3-8B", "H100") == want.load_s
    runtime_only = BucketTable(
        BUCKETS, {k: Prediction(1.0, math.nan, math.nan) for k in t.entries}, "runtime-only"
    )
    with pytest.raises(ConfigError, match="no peak_mem_bytes estimate"):
        runtime_only.peak_mem_bytes("Qwen3-8B", "H100", 1, 1, 1)
