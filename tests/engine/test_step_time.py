"""Roofline step model: the decode-affine seam identity and the physics it must respect."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maserve_prefect.engine.catalog import get_efficiency, get_gpu, get_model
from maserve_prefect.engine.sim.cost import ScheduledChunk
from maserve_prefect.engine.sim.step_time import RooflineStepModel, make_step_model
from maserve_prefect.errors import ConfigError

MODELS = [
    make_step_model("Qwen3-8B", "H100"),
    make_step_model("Qwen3-32B", "H200", tp=2),
    make_step_model("Qwen3-0.6B", "V100-32GB"),
]


@settings(max_examples=60, deadline=None)
@given(
    which=st.integers(0, len(MODELS) - 1),
    contexts=st.lists(st.integers(0, 40_000), min_size=1, max_size=64),
)
def test_decode_affine_equals_step_cost(which: int, contexts: list[int]) -> None:
    model = MODELS[which]
    cost = model.step_cost([ScheduledChunk(1, c) for c in contexts])
    affine = model.decode_affine(len(contexts)).step_s(sum(contexts))
    assert affine == pytest.approx(cost.total_s, rel=1e-12, abs=0.0)


def test_decode_affine_is_independent_of_the_split() -> None:
    model = MODELS[0]
    a = model.step_cost([ScheduledChunk(1, 1000), ScheduledChunk(1, 3000)]).total_s
    b = model.step_cost([ScheduledChunk(1, 2000), ScheduledChunk(1, 2000)]).total_s
    assert a == pytest.approx(b, rel=1e-12)


def test_costs_grow_with_work() -> None:
    model = MODELS[0]
    one = model.step_cost([ScheduledChunk(1, 100)])
    longer = model.step_cost([ScheduledChunk(1, 10_000)])
    assert longer.attention_s > one.attention_s and longer.linear_s == one.linear_s
    prefill = model.step_cost([ScheduledChunk(2048, 0)])
    assert prefill.linear_s > 2 * one.linear_s  # compute-bound at 2048 tokens
    assert prefill.lm_head_s == one.lm_head_s  # one sequence either way
    later_chunk = model.step_cost([ScheduledChunk(2048, 8192)])
    assert later_chunk.attention_s > prefill.attention_s


def test_decode_is_weight_bandwidth_bound() -> None:
    # One decode token of Qwen3-8B on an H100 reads every weight once: ~16.4 GB / 3.35 TB/s.
    model = MODELS[0]
    step = model.decode_affine(1).step_s(0)
    floor = get_model("Qwen3-8B").weight_bytes / get_gpu("H100").mem_bw_bytes_s
    assert floor < step < 2 * floor


def test_tensor_parallel_speeds_up_linear_layers() -> None:
    tp1 = make_step_model("Qwen3-32B", "H100")
    tp2 = make_step_model("Qwen3-32B", "H100", tp=2)
    assert tp2.decode_affine(8).linear_s < tp1.decode_affine(8).linear_s


def test_bad_inputs_raise() -> None:
    with pytest.raises(ConfigError, match="tensor-parallel degree 3"):
        RooflineStepModel(get_model("Qwen3-8B"), get_gpu("H100"), get_efficiency("H100"), tp=3)
    with pytest.raises(ConfigError, match="invalid scheduled chunk"):
        MODELS[0].step_cost([ScheduledChunk(0, 5)])
    with pytest.raises(ConfigError):
        MODELS[0].decode_affine(0)
    assert MODELS[0].step_cost([]).total_s == 0.0
