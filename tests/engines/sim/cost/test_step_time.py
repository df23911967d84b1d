"""Roofline step model: the decode-affine seam identity and the physics it must respect."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maserve_prefect.engines.catalog import get_efficiency, get_gpu, get_model
from maserve_prefect.engines.catalog.efficiency import DeviceEfficiency
from maserve_prefect.engines.catalog.gpus import GpuSpec
from maserve_prefect.engines.sim.cost.roofline import (
    mixed_attention_time,
    mixed_attention_time_scalar,
    prefill_attention_time,
    prefill_attention_time_scalar,
)
from maserve_prefect.engines.sim.cost.step_cost import ScheduledChunk
from maserve_prefect.engines.sim.cost.step_time import RooflineStepModel, make_step_model
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


# --- mixed prefill + decode attention: the tile/wave model, hand-computed -----------------------
# Qwen3-0.6B: 16 query heads, 8 KV heads (GQA 2), head_dim 128, bf16 -> 512 KV bytes/token/head.
_SMALL = get_model("Qwen3-0.6B")
# 24 SMs; peak chosen so one padded 128-row tile costs 1 ns per KV token: 4*128*128*24 / 1e-9.
_TOY = GpuSpec("toy", 1 << 30, 4 * 128 * 128 * 24 / 1e-9, 1e18, 1e9, 1e9, num_sms=24, l2_bytes=1)
_TOY_EFF = DeviceEfficiency().updated(
    {"attn_cta_s": 1e-6, "attn_tile_comp": 1.0, "attn_empty_cta_s": 2.4e-6}
)


def test_mixed_attention_counts_waves_of_per_query_head_tiles() -> None:
    # 1 decode = 16 CTAs = 1 wave of 24; 2 or 3 decodes = 32 / 48 CTAs = 2 waves; 4 = 3 waves.
    # Each CTA: 1 us + 1000 ctx * 1 ns = 2 us. Prefill roofline passed in: 5 us. No empty CTAs.
    def t(n: int) -> float:
        return float(mixed_attention_time(n, 1000.0 * n, 5e-6, 0.0, _SMALL, 1, _TOY, _TOY_EFF))

    assert t(1) == pytest.approx(5e-6 + 1 * 2e-6)
    assert t(2) == pytest.approx(5e-6 + 2 * 2e-6)
    assert t(3) == pytest.approx(t(2))  # same wave count: the step the profiles show
    assert t(4) == pytest.approx(5e-6 + 3 * 2e-6)
    # 10 empty CTAs at 2.4 us spread over 24 SMs add 1 us.
    with_empty = float(mixed_attention_time(1, 1000.0, 5e-6, 10.0, _SMALL, 1, _TOY, _TOY_EFF))
    assert with_empty == pytest.approx(t(1) + 1e-6)


def test_mixed_attention_dram_bound_counts_gqa_rereads() -> None:
    # Slow memory makes the DRAM bound win. 2 decodes, 4000 ctx total: unique KV bytes
    # U = 8 heads * 4000 * 512 = 16.384 MB. Same-wave hit = 0.5 * (1 - 3/24) = 0.4375 (reach
    # 1 TB: no fade; L2 of 1 byte: no persistence), so bytes = U * (1 + 1 * 0.5625).
    gpu = GpuSpec("slow", 1 << 30, 1e18, 1e9, 1e9, 1e9, num_sms=24, l2_bytes=1)
    eff = _TOY_EFF.updated(
        {"attn_l2_reuse": 0.5, "attn_kv_reach_bytes": 1e12, "attn_mixed_decode_mem": 0.5}
    )
    got = float(mixed_attention_time(2, 4000.0, 0.0, 0.0, _SMALL, 1, gpu, eff))
    expected = 16.384e6 * 1.5625 / (1e9 * 0.5)
    assert got == pytest.approx(expected, rel=1e-6)
    # Without GQA sharing (hit 0) every query head reads its own copy: 2x the unique bytes.
    none = float(
        mixed_attention_time(
            2, 4000.0, 0.0, 0.0, _SMALL, 1, gpu, eff.updated({"attn_l2_reuse": 0.005})
        )
    )
    assert none > got and none == pytest.approx(16.384e6 * (2 - 0.005 * 0.875) / 0.5e9, rel=1e-6)


def test_step_cost_uses_the_varlen_grid_for_mixed_steps() -> None:
    model = RooflineStepModel(_SMALL, _TOY, _TOY_EFF)
    chunks = [ScheduledChunk(300, 0), ScheduledChunk(1, 500), ScheduledChunk(1, 700)]
    # max query 300 -> 3 m-blocks per (sequence, head); own blocks 3 + 1 + 1; 16 heads.
    empty = 16 * (3 * 3 - 5)
    prefill = prefill_attention_time(300.0, 0.0, _SMALL, 1, _TOY, _TOY_EFF)
    layer = mixed_attention_time(2, 1200.0, prefill, empty, _SMALL, 1, _TOY, _TOY_EFF)
    cost = model.step_cost(chunks)
    assert cost.attention_s == pytest.approx(_SMALL.num_layers * float(layer), rel=1e-12)


def test_rtx_pro_6000_mixed_decodes_step_like_the_profiles() -> None:
    # Measured (Llama-3.1-8B, 16-token chunk, 16k ctx): 1-4 decodes cost the same, 8 about 2x.
    model = make_step_model("Llama-3.1-8B", "RTX PRO 6000")

    def attn(n: int) -> float:
        chunks = [ScheduledChunk(16, 0)] + [ScheduledChunk(1, 16384)] * n
        return model.step_cost(chunks).attention_s

    assert attn(4) == pytest.approx(attn(1), rel=0.05)
    assert 1.7 < attn(8) / attn(1) < 2.3


@settings(deadline=None)  # bit identity, not speed: a loaded machine must not fail it
@given(
    st.integers(0, 400),
    st.integers(0, 3000),
    st.floats(0.0, 1e-2),
    st.integers(0, 100_000),
    st.integers(1, 20_000),
    st.integers(0, 5000),
)
def test_scalar_roofline_twins_are_bit_identical(
    num_decode: int, ctx_per: int, prefill_s: float, empty: int, new: int, prior: int
) -> None:
    for gpu_name in ("H100", "RTX PRO 6000"):
        sm = make_step_model("Qwen3-8B", gpu_name)
        args = (sm.model, 1, sm.gpu, sm.eff)
        n, ctx = float(num_decode), float(num_decode * ctx_per)
        assert mixed_attention_time_scalar(n, ctx, prefill_s, float(empty), *args) == float(
            mixed_attention_time(n, ctx, prefill_s, float(empty), *args)
        )
        # with the prefill's CTAs shifting the decode waves (its tiles x 32 heads, prior + new)
        shift = (32.0 * -(-new // 64), float(prior + new))
        assert mixed_attention_time_scalar(n, ctx, prefill_s, float(empty), *args, *shift) == float(
            mixed_attention_time(n, ctx, prefill_s, float(empty), *args, *shift)
        )
        assert prefill_attention_time_scalar(float(new), float(prior), *args) == float(
            prefill_attention_time(float(new), float(prior), *args)
        )
