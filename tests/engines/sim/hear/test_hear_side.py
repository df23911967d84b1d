"""The simulator's HEAR engine side: resolution against its capabilities, control(), prepare,
state reports, request-scoped controls, intents, and fast-forward agreeing with stepping."""

from __future__ import annotations

import functools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_factories import LinearCost, finish, host_tier, make_replica, prefixed

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.sim.hear.side import prompt_block_hashes
from maserve_prefect.engines.sim.kv.host_tier import HostTierConfig
from maserve_prefect.engines.sim.loop import LogEntry
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.engines.sim.step.scheduler import Policy, SchedulerConfig
from maserve_prefect.protocol.controls import (
    CachePrepare,
    CacheRelease,
    CacheRetain,
    Control,
    ExecutionMode,
    Force,
    MaxWait,
    OrderingKey,
    Priority,
    Tier,
)
from maserve_prefect.protocol.intents import RoleIntent
from maserve_prefect.protocol.outcomes import Acceptance, Ticket
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.subjects import ContextRef, RequestRef

CTX = ContextRef("session", 3)
BLOCK_S = 0.002


def make(
    num_blocks: int = 8,
    host_blocks: int | None = 16,
    log: list[LogEntry] | None = None,
    **config: object,
) -> tuple[Kernel, SimReplica]:
    return make_replica(num_blocks, log=log, host_tier=host_tier(host_blocks, BLOCK_S), **config)


def evict_a_to_host(k: Kernel, rep: SimReplica) -> tuple[int, ...]:
    """Run `a` (4 blocks), then `b` (8 blocks) so a's blocks move to the host tier."""
    a = prefixed("a", 1, 4)
    finish(k, rep, a)
    finish(k, rep, prefixed("b", 100, 8))
    h = prompt_block_hashes(a, 16)
    assert rep.hear.host is not None and set(h) <= set(rep.hear.host.hashes())
    return h


def test_cpu_tier_requirement_is_unsupported_without_a_host_tier() -> None:
    _, rep = make(host_blocks=None)
    keep = CacheRetain(CTX, (1, 2), 0.7, tier=Tier.CPU, force=Force.REQUIREMENT)
    res = rep.control([keep])
    assert res.acceptance is Acceptance.UNSUPPORTED
    assert "KV tier CPU is not among the engine's tiers" in res.reason
    assert len(rep.hear.retention) == 0
    ticket = rep.submit(prefixed("r", 1, 2), [keep])
    assert ticket.acceptance is Acceptance.UNSUPPORTED and "CPU" in ticket.reason


def test_allowed_fallback_to_the_gpu_tier_is_used() -> None:
    k, rep = make(host_blocks=None)
    a = prefixed("a", 1, 4)
    finish(k, rep, a)
    h = prompt_block_hashes(a, 16)
    gpu = CacheRetain(CTX, h, 0.7, tier=Tier.GPU)
    res = rep.control(
        [CacheRetain(CTX, h, 0.7, tier=Tier.CPU, force=Force.REQUIREMENT, fallback=(gpu,))]
    )
    assert res.acceptance is Acceptance.ACCEPTED and len(res.fallbacks) == 1
    assert rep.kv.num_hard_pinned_free == 4  # the fallback keeps the requirement's force


def test_prepare_moves_host_blocks_to_the_gpu_and_holds_the_replica() -> None:
    log: list[LogEntry] = []
    k, rep = make(log=log)
    h = evict_a_to_host(k, rep)
    t0 = k.now()
    res = rep.control([CachePrepare(CTX, h)])
    assert res.acceptance is Acceptance.ACCEPTED and not res.dropped
    ticket = rep.submit(prefixed("a2", 1, 4))  # arrives with the prepare: runs after its load
    k.run()
    assert set(h) <= set(rep.kv.cached)
    assert rep.hear.host is not None and not set(h) & set(rep.hear.host.hashes())
    (load,) = [x for x in rep.hear.transfers if x.kind == "prepare"]
    assert (load.num_blocks, load.seconds) == (4, pytest.approx(4 * BLOCK_S))
    out = ticket.outcome
    assert out is not None and out.first_scheduled_s == pytest.approx(t0 + 4 * BLOCK_S)
    # the prefix was on the GPU by then: GPU hits, no host-tier hit for the request
    assert out.num_cached_tokens == 48 and "a2" not in rep.hear.cpu_cached_tokens


def test_prepare_with_nothing_in_the_host_tier_is_a_noted_noop() -> None:
    k, rep = make()
    a = prefixed("a", 1, 4)
    finish(k, rep, a)
    h = prompt_block_hashes(a, 16)  # on the GPU: nothing to load
    res = rep.control([CachePrepare(CTX, h)])
    assert res.acceptance is Acceptance.ACCEPTED and not res.honoured
    assert "no-op" in res.notes()[0]
    k.run()
    assert rep.hear.transfers == []
    missing = rep.control([CachePrepare(CTX, (424242,), force=Force.REQUIREMENT)])
    assert missing.acceptance is Acceptance.UNSUPPORTED and "no tier" in missing.reason


def test_state_report_residency_matches_the_kv_cache() -> None:
    k, rep = make()
    h = evict_a_to_host(k, rep)
    rep.submit(prefixed("w", 300, 6, out=50))
    k.run(until=k.now() + 0.05)  # mid-flight
    report = rep.hear_state()
    view = report.residency_view()
    host = rep.hear.host
    assert host is not None
    gpu = {x for x, t in view.tiers.items() if t is Tier.GPU}
    cpu = {x for x, t in view.tiers.items() if t is Tier.CPU}
    assert gpu == set(rep.kv.cached) and cpu == set(host.hashes())
    assert set(h) <= cpu
    st_ = rep.state()
    caps = {c.tier: c for c in report.capacity}
    assert caps[Tier.GPU].num_free_blocks == st_.num_free_blocks
    assert caps[Tier.CPU].num_total_blocks == 16 and caps[Tier.CPU].num_free_blocks == 16 - len(
        host
    )
    assert (report.queue.num_running, report.queue.num_waiting) == (st_.num_running, 0)
    assert report.pressure.kv_usage == st_.kv_usage
    assert report.costs[0].op == "load_cpu_block" and report.costs[0].seconds.is_prediction


def test_state_query_reports_the_asked_hashes_as_the_full_report_does() -> None:
    k, rep = make()
    evict_a_to_host(k, rep)
    rep.submit(prefixed("w", 300, 6, out=50))
    k.run(until=k.now() + 0.05)
    full = rep.hear_state().residency_view().tiers
    gpu = [h for h, t in full.items() if t is Tier.GPU][:3]
    cpu = [h for h, t in full.items() if t is Tier.CPU][:3]
    assert gpu and cpu
    absent = [h for h in range(1, 10_000) if h not in full][:2]
    asked = {*gpu, *cpu, *absent}
    part = rep.hear_state(asked).residency_view().tiers
    assert dict(part) == {h: full[h] for h in asked if h in full}
    assert rep.hear_state(set()).residency_view().tiers == {}


def test_request_scoped_controls_need_a_request() -> None:
    _, rep = make()
    res = rep.control([OrderingKey(1.0), MaxWait(2.0, force=Force.REQUIREMENT)])
    assert res.acceptance is Acceptance.UNSUPPORTED and "submit()" in res.reason
    assert "submit()" in res.dropped[0].reason


def test_ordering_key_and_max_wait_reorder_waiting_requests_under_fcfs() -> None:
    log: list[LogEntry] = []
    k, rep = make(num_blocks=64, log=log, max_num_seqs=1)
    rep.submit(prefixed("first", 1, 2, out=20))
    k.call_at(0.001, lambda: rep.submit(prefixed("plain", 10, 1)))
    k.call_at(0.002, lambda: rep.submit(prefixed("late", 20, 1), [MaxWait(0.05)]))
    k.call_at(0.003, lambda: rep.submit(prefixed("keyed", 30, 1), [OrderingKey(-1.0)]))
    k.run()
    # "late" waited 50 ms before "first" finished: protected, it runs ahead of everyone;
    # "keyed" (key -1) runs ahead of "plain" (key 0)
    assert [e[2] for e in log if e[1] == "schedule"] == ["first", "late", "keyed", "plain"]


def test_ordering_key_breaks_priority_ties() -> None:
    log: list[LogEntry] = []
    k, rep = make(num_blocks=64, log=log, max_num_seqs=1, policy=Policy.PRIORITY)
    rep.submit(prefixed("first", 1, 2, out=5))
    k.call_at(0.001, lambda: rep.submit(prefixed("b", 10, 1), [Priority(1), OrderingKey(2.0)]))
    k.call_at(0.002, lambda: rep.submit(prefixed("c", 20, 1), [Priority(1), OrderingKey(1.0)]))
    k.call_at(0.003, lambda: rep.submit(prefixed("d", 30, 1), [Priority(0)]))
    k.run()
    assert [e[2] for e in log if e[1] == "schedule"] == ["first", "d", "c", "b"]


def test_cache_controls_ride_a_submission() -> None:
    k, rep = make(host_blocks=None)
    a = prefixed("a", 1, 4)
    finish(k, rep, a)
    h = prompt_block_hashes(a, 16)
    t = finish(k, rep, prefixed("a2", 1, 4), (CacheRetain(CTX, h, 0.3, force=Force.REQUIREMENT),))
    assert t.outcome is not None and t.outcome.num_cached_tokens == 48
    assert rep.kv.num_hard_pinned_free == 4
    assert rep.hear.effects[-1].num_applied == 4


def test_typed_intents_are_logged_and_change_nothing() -> None:
    def run(inform: bool) -> list[LogEntry]:
        log: list[LogEntry] = []
        k, rep = make(num_blocks=16, log=log)
        for i in range(3):
            r = prefixed(f"r{i}", 10 * i, 2, out=3)
            k.call_at(0.002 * i, functools.partial(rep.submit, r))
            if inform:
                rep.inform(RoleIntent(RequestRef(r.request_id), "critic"))
        k.run()
        if inform:
            assert len(rep.hear.intents) == 3 and rep.intents == []
        return log

    assert run(True) == run(False)


def test_a_control_inside_a_fast_forwarded_run_sees_what_stepping_sees() -> None:
    def run(fast_forward: bool) -> tuple[str, float]:
        k, rep = make(num_blocks=5, host_blocks=None, fast_forward=fast_forward)
        a = prefixed("a", 1, 2)
        finish(k, rep, a)  # a's blocks 0, 1 are free and cached: queue [2, 3, 4, 1, 0]
        ticket = rep.submit(prefixed("d", 50, 2, out=40))  # takes 2, 3; decodes from 0.084 s
        # decode step 16 starts at 0.084 + 16 * 0.011 = 0.26 s and takes block 1, evicting
        # a's second block: a retain of it at 0.265 s finds it gone, fast-forwarded or not
        answers: list[Acceptance] = []
        keep = CacheRetain(CTX, prompt_block_hashes(a, 16)[1:], 1.0, force=Force.REQUIREMENT)
        k.call_at(0.265, lambda: answers.append(rep.control([keep]).acceptance))
        k.run()
        assert ticket.outcome is not None
        return answers[0].value, ticket.outcome.finish_s

    stepped, forwarded = run(False), run(True)
    assert stepped[0] == "unsupported"
    assert forwarded == (stepped[0], pytest.approx(stepped[1], abs=1e-9))


def _scenario(seed: int, fast_forward: bool) -> list[tuple]:
    """Requests with ordering keys, waits and modes; cache controls at random times."""
    rnd = random.Random(seed)
    k = Kernel()
    rep = SimReplica(
        k, LinearCost(per_context_s=1e-5), 16,
        SchedulerConfig(fast_forward=fast_forward, max_num_batched_tokens=48),
        check_invariants=True, host_tier=HostTierConfig(6, 1000, 1e6),
    )  # fmt: skip
    tickets: list[Ticket] = []

    def control(r: Request, ctx: ContextRef) -> None:
        h = prompt_block_hashes(r, 16)
        x = rnd.random()
        c: Control
        if x < 0.5 and h:
            force = rnd.choice((Force.PREFERENCE, Force.REQUIREMENT))
            c = CacheRetain(
                ctx, h, rnd.random(), tier=rnd.choice((Tier.GPU, Tier.CPU)), force=force
            )
        elif x < 0.7 and h:
            c = CachePrepare(ctx, h)
        else:
            c = CacheRelease(ctx)
        rep.control([c])

    def submit(i: int) -> None:
        p, nb = rnd.randrange(4), rnd.randint(1, 6)
        r = prefixed(f"r{i}", 1000 * p, nb, out=rnd.randint(1, 60), extra=rnd.randrange(16))
        ctl: list = []
        if rnd.random() < 0.3:
            ctl.append(OrderingKey(rnd.choice((-1.0, 0.0, 1.0))))
        if rnd.random() < 0.3:
            ctl.append(MaxWait(rnd.choice((0.0, 0.01, 0.05))))
        if rnd.random() < 0.3:
            ctl.append(ExecutionMode(rnd.choice(("kv_budget", "sparse_attention", "dense"))))
        tickets.append(rep.submit(r, ctl))
        k.call_at(k.now() + rnd.random() * 0.5, lambda: control(r, ContextRef(f"p{p}")))

    for i in range(16):
        k.call_at(rnd.random() * 0.3, functools.partial(submit, i))
    k.run()
    rep.control([CacheRelease(ContextRef(f"p{p}")) for p in range(4)])
    k.run()
    assert all(t.outcome is not None for t in tickets)
    return sorted(
        (t.request_id, round(o.first_token_s or 0.0, 9), round(o.finish_s, 9),
         o.num_cached_tokens, o.num_preemptions, o.realized_mode)
        for t in tickets
        if (o := t.outcome) is not None
    )  # fmt: skip


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_fast_forward_agrees_with_stepping_under_hear_controls(seed: int) -> None:
    assert _scenario(seed, True) == _scenario(seed, False)
