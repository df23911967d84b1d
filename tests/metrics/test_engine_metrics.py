"""Tests for metrics.engine on hand-built step records, plus one native simulator run."""

from __future__ import annotations

import pytest

from maserve_prefect.engines.catalog.models import ModelSpec
from maserve_prefect.engines.sim.step.records import ScheduledTokens as S
from maserve_prefect.engines.sim.step.records import StepKind, StepRecord, Timeline
from maserve_prefect.errors import ConfigError
from maserve_prefect.metrics.engine import (
    UNKNOWN_CLASS,
    co_batching,
    decode_batch,
    goodput_per_accelerator,
    kv_memory_time,
    preemptions_by_class,
    prefill_factor,
    replica_metrics,
    request_classes,
    run_intensity,
    step_intensity,
)
from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, RootRecord, Trace

# hidden 4, 2 layers, 2 heads x head_dim 2, 1 KV head, intermediate 8, vocab 10, fp16:
# per layer in*out: qkv 4x8 + o 4x4 + gate_up 4x16 + down 8x4 = 144 -> P = 288;
# Σ(in+out) = 52; KV bytes per token = 2 layers * 2 * 1 * 2 * 2 = 16.
TOY = ModelSpec(
    name="toy",
    hidden_size=4,
    num_layers=2,
    num_attention_heads=2,
    num_kv_heads=1,
    head_dim=2,
    intermediate_size=8,
    vocab_size=10,
    tie_word_embeddings=True,
    max_position_embeddings=128,
)


def rec(
    idx: int,
    start: float,
    end: float,
    chunks: tuple[S, ...],
    kind: StepKind = StepKind.DECODE,
    num_steps: int = 1,
    preempted: tuple[str, ...] = (),
) -> StepRecord:
    m = sum(c.num_new_tokens for c in chunks) // num_steps
    return StepRecord(
        "rep", idx, start, end, num_steps, kind, chunks, m, 0.0, 0.0, 0.0, 0.0, preempted
    )


def test_step_intensity_hand_computed() -> None:
    r = rec(0, 0.0, 1.0, (S("a", 2, 3), S("b", 5, 1)), StepKind.MIXED)
    si = step_intensity(r, TOY)
    # F = 2*288*4 + 4*2*2*2*A(=3*2+6 + 5+1 = 18) + 2*4*10*2
    assert si.flops == 2304 + 576 + 160
    # B = weights (288+40)*2 + KV read (5+6)*16 + KV write 4*16 + act 2*(2*4*52 + 2*14 + 4*4)
    assert si.bytes == 656 + 176 + 64 + 920
    assert si.intensity == pytest.approx(3040 / 1816)


def test_fast_forwarded_record_equals_its_steps() -> None:
    run = rec(0, 0.0, 3.0, (S("a", 10, 3), S("b", 4, 3)), num_steps=3)
    steps = [rec(i, i, i + 1.0, (S("a", 10 + i, 1), S("b", 4 + i, 1))) for i in range(3)]
    one = step_intensity(run, TOY)
    many = [step_intensity(s, TOY) for s in steps]
    assert one.flops == pytest.approx(sum(s.flops for s in many), rel=1e-12)
    assert one.bytes == pytest.approx(sum(s.bytes for s in many), rel=1e-12)


def test_run_intensity_is_sum_f_over_sum_d_hand_computed() -> None:
    # Prefill of 8 tokens at c = 0: F = 2*288*8 + 4*2*2*2*A(= 8*9/2 = 36) + 2*4*10*1 = 5840;
    # B = weights 656 + KV read 8*16 + KV write 8*16 + act 2*(2*8*52 + 14 + 8*4) = 2668.
    a = step_intensity(rec(0, 0.0, 1.0, (S("a", 0, 8),), StepKind.PREFILL), TOY)
    assert (a.flops, a.bytes) == (5840, 2668)
    # Decode of 1 token at c = 8: F = 576 + 32*9 + 80 = 944; B = 656 + 9*16 + 16 + 244 = 1060.
    b = step_intensity(rec(1, 1.0, 4.0, (S("a", 8, 1),)), TOY)
    assert (b.flops, b.bytes) == (944, 1060)
    # The paper's aggregate run intensity: ΣF / ΣD = 6784 / 3728 ≈ 1.820, not a duration-weighted
    # mean of the per-step ratios ((5840/2668)*1 + (944/1060)*3) / 4 ≈ 1.215.
    assert run_intensity([a, b]) == pytest.approx(6784 / 3728)
    assert run_intensity([a, b]) != pytest.approx((a.intensity + 3 * b.intensity) / 4)
    assert run_intensity([]) == 0.0


def test_kv_memory_time_holds_samples() -> None:
    tl = Timeline("rep")
    for t, u in [(1.0, 0.5), (3.0, 1.0), (4.0, 0.0)]:
        tl.sample(t, (u, 0.0, 0.0, 0.0, 0.0, 0.0))
    assert kv_memory_time(tl, 1000) == pytest.approx(0.5 * 1000 * 2 + 1000 * 1)
    assert kv_memory_time(tl, 1000, end_s=10.0) == pytest.approx(2000.0)
    with pytest.raises(ConfigError, match="before the timeline's last sample"):
        kv_memory_time(tl, 1000, end_s=2.0)
    assert kv_memory_time(Timeline("empty"), 1000) == 0.0


def make_trace() -> Trace:
    ops = [
        OpRecord(op_id="p", root_id="r1", kind=OpKind.MODEL, num_input_tokens=10,
                 num_output_tokens=5),
        OpRecord(op_id="q", root_id="r2", kind=OpKind.MODEL, num_input_tokens=20,
                 num_cached_tokens=8, num_output_tokens=3),
    ]  # fmt: skip
    roots = [
        RootRecord(root_id="r1", workload_class="chat"),
        RootRecord(root_id="r2", workflow="debate"),
    ]
    return Trace(manifest=Manifest(trace_id="t"), roots=roots, ops=ops)


def test_prefill_factor_counts_recomputation_after_preemption() -> None:
    # p: prompt 10 -> 2 decodes -> preempted -> recompute 13 positions (10 + 3 generated) -> 1
    # decode. 26 positions computed, 4 decode positions needed: 22 processed over 10 source.
    # q: 8 cached, 12 prefilled, 2 decode steps: 12 processed over 12 source.
    records = [
        rec(0, 0.0, 1.0, (S("p", 0, 10), S("q", 8, 12)), StepKind.PREFILL),
        rec(1, 1.0, 2.0, (S("p", 10, 1),)),
        rec(2, 2.0, 3.0, (S("p", 11, 1), S("q", 20, 1)), preempted=("p",)),
        rec(3, 3.0, 4.0, (S("p", 0, 13), S("q", 21, 1)), StepKind.MIXED),
        rec(4, 4.0, 5.0, (S("p", 13, 1), S("ghost", 3, 1))),
    ]
    pf = prefill_factor(records, make_trace())
    assert (pf.num_requests, pf.processed_tokens, pf.source_tokens) == (2, 34, 22)
    assert pf.factor == pytest.approx(34 / 22)
    assert prefill_factor(records[:0], make_trace()).factor != pf.factor  # nan when empty


def test_decode_batch_weights_fast_forwarded_runs_by_duration() -> None:
    records = [
        rec(0, 0.0, 1.0, (S("a", 0, 50),), StepKind.PREFILL),  # no decode: left out
        rec(1, 1.0, 2.0, (S("a", 50, 1), S("b", 0, 30)), StepKind.MIXED),  # 1 decoding
        rec(2, 2.0, 5.0, (S("a", 51, 6), S("b", 30, 6)), num_steps=6),  # 2 decoding for 3 s
    ]
    assert decode_batch(records) == pytest.approx((1 * 1.0 + 2 * 3.0) / 4.0)
    assert decode_batch(records[:1]) == 0.0


def test_co_batching_shares_and_preemptions_by_class() -> None:
    classes = {"x1": "x", "x2": "x", "y1": "y", "z1": "z"}
    records = [
        rec(0, 0.0, 1.0, (S("x1", 0, 1), S("y1", 0, 1))),
        rec(1, 1.0, 3.0, (S("x1", 1, 1), S("x2", 0, 1)), preempted=("y1",)),
        rec(2, 3.0, 4.0, (S("x1", 2, 1), S("z1", 0, 1), S("y1", 0, 1))),
        rec(3, 4.0, 8.0, (S("y1", 1, 1), S("u", 0, 1)), preempted=("u", "x2", "x2")),
    ]
    # x scheduled over [0, 4): with y 2 s, with another x 2 s, with z 1 s
    assert co_batching(records, classes, "x") == {"x": 0.5, "y": 0.5, "z": 0.25}
    # y scheduled 0-1, 3-4, 4-8 (6 s): x 2 s, z 1 s, unknown 4 s
    assert co_batching(records, classes, "y") == pytest.approx(
        {"x": 2 / 6, "z": 1 / 6, UNKNOWN_CLASS: 4 / 6}
    )
    assert co_batching(records, classes, "nobody") == {}
    assert preemptions_by_class(records, classes) == {"x": 2, "y": 1, UNKNOWN_CLASS: 1}


def test_request_classes_and_goodput_per_accelerator() -> None:
    assert request_classes(make_trace()) == {"p": "chat", "q": "debate"}
    assert goodput_per_accelerator(6.0, 3) == 2.0
    with pytest.raises(ConfigError):
        goodput_per_accelerator(1.0, 0)


def test_native_run_engine_metrics(native_run) -> None:
    trace, pool = native_run.trace, native_run.pool
    records = [r for p in pool.pool_replicas() for r in p.engine.records]
    assert records
    assert not any(r.preempted for r in records)
    # no preemption: every computed position is a prompt position not cached, or a decode
    pf = prefill_factor(records, trace)
    assert pf.num_requests == len(trace.ops) and pf.factor == pytest.approx(1.0)
    rows = replica_metrics(pool.pool_replicas())
    assert {r.replica for r in rows} == {r.replica for r in records}
    for row in rows:
        assert row.busy_s > 0 and row.kv_memory_time_byte_s > 0
        assert 1.0 <= row.decode_batch <= 40
        assert row.intensity > 0 and row.num_preemptions == 0
    classes = request_classes(trace)
    # one class only: the share is the time with >= 2 requests over the time with >= 1
    busy = sum(r.duration_s for r in records if r.scheduled)
    shared = sum(r.duration_s for r in records if len(r.scheduled) >= 2)
    assert co_batching(records, classes, "fork_join") == {"fork_join": pytest.approx(shared / busy)}
