"""FormulaPredictor and its operator graph: monotone in the shape, physical in memory and load."""

from __future__ import annotations

import pytest
from maserve_prefect.predictors import FormulaPredictor, Shape
from maserve_prefect.predictors.opgraph import prefill_steps, request_graph

from maserve_prefect.engines.catalog import get_gpu, get_model
from maserve_prefect.engines.catalog.lifecycle import load_plan
from maserve_prefect.errors import ConfigError

MODEL, DEVICE = "Qwen3-8B", "H100"


@pytest.fixture(scope="module")
def formula() -> FormulaPredictor:
    return FormulaPredictor()


@pytest.mark.parametrize(
    ("small", "large"),
    [
        (Shape(4, 256, 64), Shape(4, 1024, 64)),  # input
        (Shape(4, 256, 64), Shape(4, 256, 256)),  # output
        (Shape(4, 256, 64), Shape(16, 256, 64)),  # batch
        (Shape(1, 20_000, 8), Shape(1, 20_001, 8)),  # one more token, across a chunk edge
    ],
)
def test_runtime_and_memory_grow_with_the_shape(
    formula: FormulaPredictor, small: Shape, large: Shape
) -> None:
    a = formula.predict(MODEL, small, DEVICE)
    b = formula.predict(MODEL, large, DEVICE)
    assert b.runtime_s > a.runtime_s
    assert b.peak_mem_bytes > a.peak_mem_bytes
    assert b.load_s == a.load_s  # the shape does not change how long a load takes


def test_memory_holds_weights_and_the_batch_kv(formula: FormulaPredictor) -> None:
    spec = get_model(MODEL)
    shape = Shape(8, 1000, 200)
    mem = formula.predict(MODEL, shape, DEVICE).peak_mem_bytes
    assert mem > spec.weight_bytes + spec.kv_bytes_per_token * shape.num_tokens


def test_higher_bandwidth_device_is_faster(formula: FormulaPredictor) -> None:
    # same peak FLOPS (312 TFLOPS), 1,555 vs 2,039 GB/s: decode is bandwidth-bound
    shape = Shape(4, 512, 128)
    slow = formula.predict(MODEL, shape, "A100-40GB").runtime_s
    fast = formula.predict(MODEL, shape, "A100-80GB").runtime_s
    assert fast < slow
    assert slow / fast == pytest.approx(2039 / 1555, rel=0.05)


def test_load_is_the_catalog_load_plan(formula: FormulaPredictor) -> None:
    spec, gpu = get_model(MODEL), get_gpu(DEVICE)
    want = load_plan(spec, gpu, 0).total_s
    assert formula.predict(MODEL, Shape(1, 8, 8), DEVICE).load_s == want
    assert (
        FormulaPredictor(weight_source="network").predict(MODEL, Shape(1, 8, 8), DEVICE).load_s
        > want
    )  # 10 Gb/s object store is slower than NVMe


def test_batch_one_decode_step_reads_the_weights() -> None:
    spec, gpu = get_model(MODEL), get_gpu(DEVICE)
    g = request_graph(spec, gpu, Shape(1, 16, 2))  # one decode step
    linear_bytes = sum(g.get("decode", op).bytes for op in ("qkv", "o", "gate_up", "down"))
    layer_weights = spec.num_layers * sum(x.in_dim * x.out_dim for x in spec.layer_gemms()) * 2
    assert linear_bytes == pytest.approx(layer_weights, rel=1e-3)
    assert g.num_decode_steps == 1 and g.num_prefill_steps == 1


def test_prefill_chunks_follow_the_budget() -> None:
    assert prefill_steps(2, 300, 256) == [[(256, 0)], [(44, 256), (212, 0)], [(88, 212)]]
    assert prefill_steps(1, 10, 256) == [[(10, 0)]]


def test_unknown_names_and_bad_shapes_raise(formula: FormulaPredictor) -> None:
    with pytest.raises(ConfigError, match="unknown model"):
        formula.predict("no-such-model", Shape(1, 1, 1), DEVICE)
    with pytest.raises(ConfigError, match="unknown GPU"):
        formula.predict(MODEL, Shape(1, 1, 1), "no-such-gpu")
    with pytest.raises(ConfigError, match="output_len"):
        Shape(1, 1, 0)
