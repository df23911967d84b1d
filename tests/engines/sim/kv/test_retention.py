"""Retention pins in the simulator: requirement pins hold, preference pins go lowest priority
first after unpinned blocks, releases and TTLs make blocks evictable again; the eviction order
is the reference engine's; blocks are conserved across tiers under random controls."""

from __future__ import annotations

import functools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_factories import LinearCost, finish, host_tier, make_replica, prefixed

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.sim.hear.side import prompt_block_hashes
from maserve_prefect.engines.sim.kv.host_tier import HostTierConfig
from maserve_prefect.engines.sim.kv.manager import KVCacheManager
from maserve_prefect.engines.sim.kv.retention import HARD, NONE, SOFT
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.engines.sim.request import SimRequest
from maserve_prefect.engines.sim.step.scheduler import SchedulerConfig
from maserve_prefect.protocol.controls import CacheRelease, CacheRetain, Force, Tier
from maserve_prefect.protocol.fake import ReferenceEngine
from maserve_prefect.protocol.outcomes import Acceptance, Ticket
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.subjects import ContextRef

CTX = ContextRef("session", 0)


def make(num_blocks: int = 8, host_blocks: int | None = None) -> tuple[Kernel, SimReplica]:
    return make_replica(num_blocks, host_tier=host_tier(host_blocks, 0.001))


def test_requirement_pin_survives_pressure_and_a_release_frees_it() -> None:
    k, rep = make()
    a = prefixed("a", 1, 4)
    finish(k, rep, a)
    h = prompt_block_hashes(a, 16)
    res = rep.control([CacheRetain(CTX, h[:2], 0.5, force=Force.REQUIREMENT)])
    assert res.acceptance is Acceptance.ACCEPTED
    assert rep.kv.num_free_blocks == 6  # two hard-pinned free blocks cannot be allocated
    finish(k, rep, prefixed("b", 100, 6))  # takes every other block, a's unpinned ones too
    assert set(h[:2]) <= set(rep.kv.cached) and not set(h[2:]) & set(rep.kv.cached)
    t = rep.submit(prefixed("c", 200, 8))  # needs all 8 blocks: waits on the pins, no error
    assert t.accepted
    k.run()
    assert t.outcome is None and rep.state().num_waiting == 1
    rep.control([CacheRelease(CTX)])
    k.run()
    assert t.outcome is not None and not set(h) & set(rep.kv.cached)


def test_preference_pins_go_after_unpinned_blocks_lowest_priority_first() -> None:
    k, rep = make()
    a = prefixed("a", 1, 4)
    finish(k, rep, a)
    h = prompt_block_hashes(a, 16)
    rep.control(
        [
            CacheRetain(ContextRef("x"), (h[0],), 0.9),
            CacheRetain(ContextRef("y"), (h[1],), 0.1),
            CacheRetain(ContextRef("z"), (h[2],), 0.5),
        ]
    )
    finish(k, rep, prefixed("b", 100, 5))  # 4 never-used blocks + a's unpinned block 3
    assert [x in rep.kv.cached for x in h] == [True, True, True, False]
    finish(k, rep, prefixed("c", 200, 6))  # 5 unpinned free blocks, then the 0.1 pin
    assert [x in rep.kv.cached for x in h] == [True, False, True, False]
    finish(k, rep, prefixed("d", 300, 7))  # 6 unpinned, then the 0.5 pin
    assert [x in rep.kv.cached for x in h] == [True, False, False, False]


def test_release_and_ttl_make_blocks_evictable_again() -> None:
    k, rep = make()
    a = prefixed("a", 1, 4)
    finish(k, rep, a)
    h = prompt_block_hashes(a, 16)
    rep.control([CacheRetain(CTX, h, 1.0, force=Force.REQUIREMENT, ttl_s=5.0)])
    assert rep.kv.num_hard_pinned_free == 4
    k.run()  # the TTL event fires
    assert rep.kv.num_hard_pinned_free == 0 and len(rep.hear.retention) == 0
    rep.control([CacheRetain(CTX, h, 1.0)])
    rep.control([CacheRetain(ContextRef("other"), h[:1], 0.2)])  # one call: they would conflict
    rep.control([CacheRelease(CTX, h)])  # the other context's pin on h[0] stays
    assert [int(rep.kv.pin_level[rep.kv.block_of(x)]) for x in h] == [SOFT, NONE, NONE, NONE]


def test_requirement_retain_of_blocks_not_resident_is_unsupported() -> None:
    _, rep = make()
    res = rep.control([CacheRetain(CTX, (123,), 0.5, force=Force.REQUIREMENT)])
    assert res.acceptance is Acceptance.UNSUPPORTED and "not resident" in res.reason
    res = rep.control([CacheRetain(CTX, (123,), 0.5)])
    assert res.acceptance is Acceptance.ACCEPTED and "no-op" in res.notes()[0]
    assert len(rep.hear.retention) == 0


def _kv_with_free_hashed_blocks(n: int) -> tuple[KVCacheManager, list[int]]:
    """A KV cache whose n blocks are all free and hashed; their hashes oldest first."""
    kv = KVCacheManager(n, 4)
    owner = SimRequest(
        Request("o", "", num_prompt_tokens=4 * n, prefix_block_hashes=tuple(range(n)),
                prefix_block_size=4),
        0, 0.0, 0, 4, Ticket("o", Acceptance.ACCEPTED),
    )  # fmt: skip
    assert kv.ensure_slots(owner, 4 * n) is not None
    kv.free(owner)
    block_hash = kv.block_hash
    return kv, [block_hash[b] for b in kv.free_queue]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(3, 12).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.lists(st.sampled_from((NONE, SOFT, HARD)), min_size=n, max_size=n),
            st.lists(st.sampled_from((0.1, 0.5, 0.9)), min_size=n, max_size=n),
            st.integers(1, n),
        )
    )
)
def test_eviction_order_is_the_reference_engines(case: tuple[int, list, list, int]) -> None:
    n, levels, prios, want = case
    kv, hashes = _kv_with_free_hashed_blocks(n)
    ref = ReferenceEngine("ref", tiers={Tier.GPU: n})
    ref.admit_blocks(hashes)
    for i, (h, level, prio) in enumerate(zip(hashes, levels, prios, strict=True)):
        if level != NONE:
            kv.set_pin(kv.block_of(h), level, prio)
            force = Force.REQUIREMENT if level == HARD else Force.PREFERENCE
            ref.control([CacheRetain(ContextRef(f"c{i}"), (h,), prio, force=force)])
    take = min(want, kv.num_free_blocks)
    evicted: list[int] = []
    kv.on_evict = evicted.extend
    if take:
        taker = SimRequest(
            Request("t", "", num_prompt_tokens=4 * take), 1, 0.0, 0, 4,
            Ticket("t", Acceptance.ACCEPTED),
        )  # fmt: skip
        assert kv.ensure_slots(taker, 4 * take) is not None
    assert evicted == ref.evict(take)
    kv.check_invariants()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # which shared prefix
            st.integers(1, 6),  # its blocks
            st.integers(1, 4),  # output tokens
            st.one_of(
                st.none(),
                st.tuples(
                    st.sampled_from(("retain", "release")),
                    st.sampled_from((Force.PREFERENCE, Force.REQUIREMENT)),
                    st.sampled_from((Tier.GPU, Tier.CPU)),
                    st.floats(0.0, 1.0),
                ),
            ),
        ),
        min_size=1,
        max_size=14,
    ),
    st.booleans(),
)
def test_blocks_are_conserved_across_tiers_under_random_retention(
    ops: list[tuple], fast_forward: bool
) -> None:
    k = Kernel()
    rep = SimReplica(
        k, LinearCost(per_context_s=1e-5), 12,
        SchedulerConfig(fast_forward=fast_forward, max_num_batched_tokens=48),
        check_invariants=True,  # KV, scheduler and HEAR invariants after every step
        host_tier=HostTierConfig(6, 1000, 1e6),
    )  # fmt: skip
    hard_gpu: set[int] = set()
    inner = rep.kv.on_evict
    assert inner is not None

    def on_evict(hashes: list[int]) -> None:
        assert not hard_gpu & set(hashes), "a requirement-pinned block was evicted"
        inner(hashes)

    rep.kv.on_evict = on_evict

    def act(i: int, prefix: int, nb: int, out: int, ctl: tuple | None) -> None:
        r = prefixed(f"r{i}", 1000 * prefix, nb, out)
        rep.submit(r)
        if ctl is None:
            return
        what, force, tier, prio = ctl
        ctx = ContextRef(f"p{prefix}")
        h = prompt_block_hashes(r, 16)
        c = CacheRetain(ctx, h, prio, tier=tier, force=force) if what == "retain" else None
        res = rep.control([c if c is not None else CacheRelease(ctx)])
        hard_gpu.clear()
        for x in rep.hear.retention.hashes():
            if rep.hear.retention.gpu_level(x)[0] == HARD:
                hard_gpu.add(x)
        assert res.acceptance in (Acceptance.ACCEPTED, Acceptance.UNSUPPORTED)

    for i, (prefix, nb, out, ctl) in enumerate(ops):
        k.call_at(0.004 * i, functools.partial(act, i, prefix, nb, out, ctl))
    k.run()
    rep.control([CacheRelease(ContextRef(f"p{p}")) for p in range(4)])
    hard_gpu.clear()
    k.run()
    rep.hear.check_invariants()
    rep.scheduler.check_invariants()
    assert rep.is_idle
    host = rep.hear.host
    assert host is not None
    assert host.num_stored == len(host) + host.num_loaded + host.num_superseded + host.num_dropped
