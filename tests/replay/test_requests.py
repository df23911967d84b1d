"""Request-level replay of traces onto a SimPool (Arrival rule)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sim_factories import loaded_sim_pool

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.sim.pool.sim_pool import Deployment, SimPool
from maserve_prefect.errors import ConfigError
from maserve_prefect.replay.requests import ReplayResult, replay_requests
from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, OpTimes, RootRecord, Trace
from maserve_prefect.trace.mooncake import import_mooncake


def mooncake_slice(shared_data: Path, tmp_path: Path, n: int) -> Trace:
    """The first `n` requests of the shared trace that fit Qwen3's 40,960-token context."""
    src = shared_data / "traces" / "mooncake_synthetic_trace.jsonl"
    fits = [
        line
        for line in src.read_text().splitlines()
        if (r := json.loads(line))["input_length"] + r["output_length"] <= 40960
    ]
    lines = fits[:n]
    dst = tmp_path / "slice.jsonl"
    dst.write_text("\n".join(lines) + "\n")
    return import_mooncake(dst).trace


def loaded_pool(num: int, model: str = "Qwen3-8B") -> SimPool:
    return loaded_sim_pool(num, model, "q")


def test_mooncake_slice_replays_every_request(shared_data: Path, tmp_path: Path) -> None:
    trace = mooncake_slice(shared_data, tmp_path, 60)
    pool = loaded_pool(2)
    start = pool.clock.now()
    res = replay_requests(trace, pool, "q")
    assert res.status_counts() == {"completed": 60}
    assert res.start_s == start
    ops = {op.op_id: op for op in trace.ops}
    for r in res.requests:
        op = ops[r.op_id]
        assert r.num_output_tokens == max(op.num_output_tokens, 1)  # length-locked
        assert r.submit_s == pytest.approx(start + (op.times.submitted_s or 0.0))
        assert r.ttft_s is not None and r.e2e_s is not None and r.e2e_s >= r.ttft_s > 0
    # step rows join back to ops through request ids
    joined = {row["request_id"] for row in pool.step_rows()}
    assert joined == set(ops)
    assert 0 <= res.prefix_hits_tokens <= res.prefix_queries_tokens
    assert res.prefix_queries_tokens >= sum(op.num_input_tokens for op in trace.ops)
    assert 0 < res.kv_usage_mean <= res.kv_usage_max <= 1
    assert res.ttft().count == 60 and res.ttft().p50 <= res.ttft().p99
    assert res.num_events == 60 + res.num_step_records


def _summary(res: ReplayResult) -> tuple[object, ...]:
    return (res.requests, res.prefix_hits_tokens, res.num_preemptions, res.kv_usage_mean)


def test_same_trace_twice_gives_identical_results(shared_data: Path, tmp_path: Path) -> None:
    trace = mooncake_slice(shared_data, tmp_path, 40)
    a = replay_requests(trace, loaded_pool(1), "q")
    b = replay_requests(trace, loaded_pool(1), "q")
    assert _summary(a) == _summary(b)


def two_op_trace() -> Trace:
    root = RootRecord(root_id="r", arrival_s=5.0)
    ops = [
        OpRecord(op_id="r/a", root_id="r", kind=OpKind.MODEL, num_input_tokens=64,
                 num_output_tokens=4),
        OpRecord(op_id="r/t", root_id="r", kind=OpKind.TOOL, tool_name="search"),
        OpRecord(op_id="r/b", root_id="r", kind=OpKind.MODEL, num_input_tokens=32,
                 num_output_tokens=0, times=OpTimes(ready_s=7.5)),
    ]  # fmt: skip
    return Trace(manifest=Manifest(trace_id="t"), roots=[root], ops=ops)


def test_times_fall_back_and_multi_op_roots_are_flagged() -> None:
    pool = loaded_pool(1, "Qwen3-0.6B")
    start = pool.clock.now()
    res = replay_requests(two_op_trace(), pool, "q")
    by_id = {r.op_id: r for r in res.requests}
    assert by_id["r/a"].submit_s == pytest.approx(start)  # root arrival 5.0 is the origin
    assert by_id["r/b"].submit_s == pytest.approx(start + 2.5)  # ready_s 7.5
    assert by_id["r/b"].num_output_tokens == 1 and res.num_padded_outputs == 1
    assert (res.num_multi_op_roots, res.num_skipped_ops) == (1, 1)
    assert any("dependency-aware" in n for n in res.notes)


def test_no_ready_replica_is_a_config_error_and_refusals_are_reported() -> None:
    k = Kernel()
    pool = SimPool(k, ["H100:0"])
    pool.load(Deployment("q", "Qwen3-0.6B"), "H100:0")  # still loading at t=0
    with pytest.raises(ConfigError, match="no READY replica of 'q'"):
        replay_requests(two_op_trace(), pool, "q")
    k.run()
    trace = two_op_trace()
    long_op = trace.ops[0].model_copy(update={"num_input_tokens": 10**6})  # past the context
    too_long = trace.model_copy(update={"ops": [long_op, *trace.ops[1:]]})
    res = replay_requests(too_long, pool, "q")
    by_id = {r.op_id: r for r in res.requests}
    assert by_id["r/a"].status == "rejected"
    assert "This model's maximum context length is 40960 tokens" in by_id["r/a"].reason
    assert by_id["r/a"].replica == "q@H100:0" and by_id["r/b"].status == "completed"
    with pytest.raises(ConfigError, match="unknown release policy"):
        replay_requests(two_op_trace(), pool, "q", policy="flat")
