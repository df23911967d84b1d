"""The simulator's host-memory KV tier: evicted GPU blocks become CPU-tier hits at a cost."""

from __future__ import annotations

import pytest
from sim_factories import host_tier, make_replica, prefixed

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.catalog import get_gpu, get_model
from maserve_prefect.engines.sim.kv.host_tier import HostTier, HostTierConfig
from maserve_prefect.engines.sim.pool.sim_pool import Deployment, SimPool
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.errors import ConfigError, SimulationError
from maserve_prefect.protocol.controls import Tier
from maserve_prefect.protocol.outcomes import Ticket
from maserve_prefect.protocol.requests import Request

BLOCK_S = 0.001  # host -> GPU seconds per block in these tests


def make_host_replica(
    num_blocks: int = 8, host_blocks: int | None = 16
) -> tuple[Kernel, SimReplica]:
    return make_replica(num_blocks, host_tier=host_tier(host_blocks, BLOCK_S))


def run_in_order(k: Kernel, rep: SimReplica, requests: list[Request]) -> list[Ticket]:
    """Submit each request when the previous one finished; run to the end."""
    tickets: list[Ticket] = []

    def submit(i: int) -> None:
        t = rep.submit(requests[i])
        assert t.accepted, t.reason
        tickets.append(t)
        if i + 1 < len(requests):
            t.on_done(lambda _o: submit(i + 1))

    k.call_at(0.0, lambda: submit(0))
    k.run()
    return tickets


def test_gpu_evicted_blocks_are_cpu_hits_with_the_transfer_in_the_first_step() -> None:
    k, rep = make_host_replica()
    # a: 4 cached blocks; b: 8 blocks, evicting all of a's into the host tier; a2 reuses a
    a, b, a2 = prefixed("a", 1, 4), prefixed("b", 100, 8), prefixed("a2", 1, 4)
    *_, ta2 = run_in_order(k, rep, [a, b, a2])
    out = ta2.outcome
    assert out is not None
    # the lookup hits at most prompt - 1 tokens: 3 of the 4 blocks, all from the host tier
    assert out.num_cached_tokens == out.num_cached_host_tokens == 48
    assert rep.hear.cpu_cached_tokens == {"a2": 48}
    assert rep.hear.host is not None and rep.hear.host.num_hit_tokens == 48
    assert rep.kv.num_hit_tokens == 0 and rep.kv.num_queried_tokens == 64 + 128 + 64
    assert any("host KV tier" in n for n in out.notes)
    # its first step computes 16 tokens (16 ms + 10 ms overhead) plus 3 blocks' transfer
    step = rep.records[-1]
    assert step.overhead_s == pytest.approx(0.010 + 3 * BLOCK_S)
    assert (out.first_token_s or 0.0) - out.arrival_s == pytest.approx(0.016 + 0.010 + 3 * BLOCK_S)
    (load,) = rep.hear.transfers
    assert (load.kind, load.num_blocks, load.request_ids) == ("admission", 3, ("a2",))
    # the loaded hashes moved back: cached on the GPU again, not in the host tier
    assert rep.hear.host is not None
    assert not set(rep.hear.host.hashes()) & set(rep.kv.cached)


def test_without_a_host_tier_the_same_requests_recompute() -> None:
    k, rep = make_host_replica(host_blocks=None)
    *_, ta2 = run_in_order(
        k, rep, [prefixed("a", 1, 4), prefixed("b", 100, 8), prefixed("a2", 1, 4)]
    )
    assert ta2.outcome is not None and ta2.outcome.num_cached_tokens == 0
    assert ta2.outcome.num_cached_host_tokens == 0
    assert rep.capabilities().prefix_caching and rep.hear_capabilities().kv_tiers == (Tier.GPU,)


def test_host_tier_keeps_the_most_recently_evicted_blocks() -> None:
    k, rep = make_host_replica(host_blocks=2)
    *_, ta2 = run_in_order(
        k, rep, [prefixed("a", 1, 4), prefixed("b", 100, 8), prefixed("a2", 1, 4)]
    )
    # a's blocks were freed tail first, so its first two blocks were evicted last and stay
    assert ta2.outcome is not None and ta2.outcome.num_cached_tokens == 32
    assert rep.hear.cpu_cached_tokens == {"a2": 32}
    assert rep.hear.host is not None and len(rep.hear.host) <= 2


def test_lru_bound_and_accounting() -> None:
    tier = HostTier(HostTierConfig(3, 10, 1.0))
    assert tier.offer([1, 2, 3]) == []
    assert tier.offer([4]) == [1]
    assert tier.offer([2]) == []  # stored already: now the most recently used
    assert tier.offer([5]) == [3]
    assert tier.hashes() == [4, 2, 5]
    tier.take([4])
    assert tier.supersede([2, 99]) == 1
    assert tier.offer([6, 7, 8, 9]) == [5, 6]
    assert (tier.num_stored, tier.num_loaded, tier.num_superseded, tier.num_dropped) == (9, 1, 1, 4)
    tier.check_invariants()
    tier.num_stored += 1
    with pytest.raises(SimulationError, match="miscounts"):
        tier.check_invariants()


def test_config_from_the_catalog() -> None:
    model, h100 = get_model("Qwen3-8B"), get_gpu("H100")
    cfg = HostTierConfig.of(1 << 30, model, h100, 16, tp=2)
    assert cfg.block_bytes == 16 * model.kv_bytes_per_token
    assert cfg.capacity_blocks == (1 << 30) // cfg.block_bytes
    assert cfg.transfer_s(10) == pytest.approx(10 * cfg.block_bytes / (2 * h100.host_link_bytes_s))
    with pytest.raises(ConfigError, match="holds no"):
        HostTierConfig.of(1000, model, h100, 16)


def test_pool_gives_replicas_a_host_tier_by_deployment() -> None:
    k = Kernel()
    pool = SimPool(k, ["H100:0", "H100:1"], host_kv_bytes={"small": 4 << 30})
    t1 = pool.load(Deployment("small", "Qwen3-0.6B", gpu_memory_utilization=0.3), "H100:0")
    t2 = pool.load(Deployment("other", "Qwen3-0.6B", gpu_memory_utilization=0.3), "H100:1")
    k.run()
    with_host, without = pool.replica(t1.replica), pool.replica(t2.replica)
    host = with_host.hear.host
    assert host is not None and host.capacity_blocks == (4 << 30) // host.config.block_bytes
    assert with_host.hear_capabilities().kv_tiers == (Tier.GPU, Tier.CPU)
    assert without.hear.host is None
