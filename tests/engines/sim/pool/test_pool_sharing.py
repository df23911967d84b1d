"""The pool's physical substrate: replicas on one device share its compute and its memory, KV is
sized from `gpu_memory_utilization` as vLLM does, and a lone replica is unchanged.

Compute: with every request submitted at once, each replica steps without a gap until it is
done and takes the same steps as alone (scheduling does not read the clock), so under processor
sharing the device does exactly the two replicas' alone work back to back: the pair's makespan
is the sum of the alone makespans and its token throughput never exceeds the better alone one.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.catalog import get_gpu, get_model
from maserve_prefect.engines.catalog.memory import num_gpu_blocks
from maserve_prefect.engines.sim.pool.sim_pool import Deployment, SimPool
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.errors import ConfigError
from maserve_prefect.pool.state import deployment_info
from maserve_prefect.protocol.outcomes import Acceptance, Ticket
from maserve_prefect.protocol.requests import Request

GIB = 1 << 30
DEVICE = "A100-40GB:0"
Mix = list[tuple[int, int]]  # (prompt tokens, max_tokens) per request

mixes = st.lists(st.tuples(st.integers(16, 1024), st.integers(1, 48)), min_size=1, max_size=6)


@dataclass(frozen=True, slots=True)
class Served:
    """What one replica did with its mix, from the instant the mix was submitted."""

    makespan_s: float
    num_tokens: int
    num_steps: int
    outputs: tuple[int, ...]


def _dep(name: str, model: str = "Qwen3-0.6B") -> Deployment:
    return Deployment(name, model, kv_cache_bytes=GIB)  # small fixed KV: two fit on one GPU


def _serve(mixes_by_dep: dict[str, Mix], devices: dict[str, str]) -> dict[str, Served]:
    """Load one replica per deployment on its device, submit every mix when all are ready."""
    k = Kernel()
    pool = SimPool(k, sorted(set(devices.values())), check_invariants=True)
    names = {}
    for dep, device in devices.items():
        t = pool.load(_dep(dep), device)
        assert t.acceptance is Acceptance.ACCEPTED, t.reason
        names[dep] = t.replica
    k.run()
    t0 = k.now()
    tickets: dict[str, list[Ticket]] = {}
    for dep, mix in mixes_by_dep.items():
        rep = pool.replica(names[dep])
        tickets[dep] = [
            rep.submit(Request(f"{dep}{i}", dep, num_prompt_tokens=p, max_tokens=n))
            for i, (p, n) in enumerate(mix)
        ]
    k.run()
    out = {}
    for dep, ts in tickets.items():
        outcomes = [t.outcome for t in ts]
        assert all(o is not None for o in outcomes)
        outs = tuple(o.num_output_tokens for o in outcomes if o is not None)
        end = max(o.finish_s for o in outcomes if o is not None)
        steps = pool.replica(names[dep]).num_steps
        out[dep] = Served(end - t0, sum(outs), steps, outs)
    return out


@settings(max_examples=12, deadline=None)
@given(a=mixes, b=mixes)
def test_two_replicas_on_one_device_share_its_compute(a: Mix, b: Mix) -> None:
    alone_a = _serve({"a": a}, {"a": DEVICE})["a"]
    alone_b = _serve({"b": b}, {"b": DEVICE})["b"]
    pair = _serve({"a": a, "b": b}, {"a": DEVICE, "b": DEVICE})
    # the same work: outputs and steps as alone
    assert (pair["a"].outputs, pair["a"].num_steps) == (alone_a.outputs, alone_a.num_steps)
    assert (pair["b"].outputs, pair["b"].num_steps) == (alone_b.outputs, alone_b.num_steps)
    # each runs slower than alone
    assert pair["a"].makespan_s > alone_a.makespan_s
    assert pair["b"].makespan_s > alone_b.makespan_s
    # the device does the two alone workloads back to back, never more
    makespan = max(pair["a"].makespan_s, pair["b"].makespan_s)
    assert makespan == pytest.approx(alone_a.makespan_s + alone_b.makespan_s, rel=1e-9)
    rate = (alone_a.num_tokens + alone_b.num_tokens) / makespan
    best_alone = max(
        alone_a.num_tokens / alone_a.makespan_s, alone_b.num_tokens / alone_b.makespan_s
    )
    assert rate <= best_alone * (1 + 1e-9)


@settings(max_examples=6, deadline=None)
@given(a=mixes, b=mixes)
def test_replicas_on_separate_devices_run_exactly_as_alone(a: Mix, b: Mix) -> None:
    alone_a = _serve({"a": a}, {"a": DEVICE})["a"]
    apart = _serve({"a": a, "b": b}, {"a": DEVICE, "b": "A100-40GB:1"})
    assert apart["a"] == alone_a  # bit-identical times


def test_lone_pool_replica_steps_exactly_as_an_unshared_replica() -> None:
    """A pool replica (with a device lane) against a bare `SimReplica` on the same costs."""
    k = Kernel()
    pool = SimPool(k, [DEVICE])
    t = pool.load(_dep("a"), DEVICE)
    k.run()
    rep = pool.replica(t.replica)
    k_bare = Kernel()
    bare = SimReplica(k_bare, rep.cost_model, rep.kv.num_blocks, rep.config, name=t.replica)
    reqs = [Request(f"r{i}", "a", num_prompt_tokens=64 * (i + 1), max_tokens=20 + i)
            for i in range(5)]  # fmt: skip
    t0 = k.now()
    for r in reqs:
        rep.submit(r)
    k.run()
    k_bare.call_at(t0, lambda: [bare.submit(r) for r in reqs])
    k_bare.run()
    assert [(s.start_s, s.end_s, s.num_steps) for s in rep.records] == [
        (s.start_s, s.end_s, s.num_steps) for s in bare.records
    ]


# -- memory ------------------------------------------------------------------------------


@pytest.mark.parametrize("gpu_name", ["A100-40GB", "V100-32GB"])
def test_kv_capacity_follows_gpu_memory_utilization(gpu_name: str) -> None:
    gpu, model = get_gpu(gpu_name), get_model("Qwen3-4B")
    blocks = {}
    for util in (0.5, 0.9):
        k = Kernel()
        pool = SimPool(k, [f"{gpu_name}:0"])
        dep = Deployment("q", "Qwen3-4B", gpu_memory_utilization=util)
        t = pool.load(dep, f"{gpu_name}:0")
        assert t.acceptance is Acceptance.ACCEPTED, t.reason
        k.run()
        cfg = dep.scheduler_config(gpu)
        expected = num_gpu_blocks(
            model, gpu, cfg.block_size, util, cfg.max_num_batched_tokens, cfg.max_num_seqs
        )
        blocks[util] = pool.replica(t.replica).kv.num_blocks
        assert blocks[util] == expected
        # the awake replica holds exactly `util` of the device, as a vLLM process does
        assert pool.memory(f"{gpu_name}:0").used_bytes == pytest.approx(
            util * gpu.memory_bytes, abs=1
        )
    per_block = 16 * model.num_layers * model.kv_bytes_per_token_per_layer(1)
    extra = (int(0.9 * gpu.memory_bytes) - int(0.5 * gpu.memory_bytes)) // per_block
    assert blocks[0.9] - blocks[0.5] in (extra, extra + 1)


def test_model_that_does_not_fit_at_0_9_is_refused_and_infeasible_for_planners() -> None:
    dep = Deployment("Qwen3-14B", "Qwen3-14B")  # vLLM's default utilization, 0.9
    with pytest.raises(ConfigError, match=r"Qwen3-14B needs .* V100-32GB .* at utilization 0.9"):
        dep.kv_bytes(get_gpu("V100-32GB"))
    k = Kernel()
    pool = SimPool(k, ["V100-32GB:0", "A100-40GB:0"])
    refused = pool.load(dep, "V100-32GB:0")
    assert refused.acceptance is Acceptance.REJECTED
    assert refused.reason.startswith("V100-32GB:0: Qwen3-14B needs")
    assert "Use a larger GPU" in refused.reason
    assert pool.load(dep, "A100-40GB:0").acceptance is Acceptance.ACCEPTED
    info = deployment_info(dep, ["V100-32GB", "A100-40GB"])  # what the planners see
    assert info.fit("V100-32GB") is None and info.fit("A100-40GB") is not None


def test_second_replica_at_default_utilization_is_refused_naming_device_and_bytes() -> None:
    k = Kernel()
    pool = SimPool(k, [DEVICE])
    dep = Deployment("q", "Qwen3-0.6B")
    assert pool.load(dep, DEVICE).acceptance is Acceptance.ACCEPTED
    k.run()
    second = pool.load(dep, DEVICE)
    assert second.acceptance is Acceptance.REJECTED
    mem = pool.memory(DEVICE)
    free = (mem.total_bytes - mem.used_bytes) / 1e9
    assert second.reason.startswith(f"{DEVICE} has {mem.total_bytes / 1e9:.2f} GB")
    assert f"{free:.2f} GB free" in second.reason
    assert "needs" in second.reason and "kv_cache_bytes" in second.reason


def test_colocated_replicas_with_fixed_kv_fit_side_by_side() -> None:
    k = Kernel()
    pool = SimPool(k, [DEVICE])
    tickets = [pool.load(_dep(n), DEVICE) for n in ("a", "b", "c")]
    assert all(t.acceptance is Acceptance.ACCEPTED for t in tickets)
    k.run()
    mem = pool.memory(DEVICE)
    assert len(mem.residents) == 3 and mem.used_bytes <= mem.total_bytes
