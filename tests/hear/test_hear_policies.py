"""HEAR ordering and retention policies: Cache-Aware, Guard-W, compose, Session-Aware."""

from __future__ import annotations

import pytest
from hear_factories import session, waiting

from maserve_prefect.errors import ConfigError
from maserve_prefect.hear.policies import (
    CacheAware,
    ContinuationEstimator,
    Fcfs,
    GuardW,
    SessionRetention,
    compose,
    priority_controls,
)
from maserve_prefect.protocol.controls import CacheRelease, CacheRetain, Force, Priority, Tier
from maserve_prefect.protocol.state import ResidencyView


def gpu(*hashes: int, block_size: int = 10) -> ResidencyView:
    return ResidencyView.of(dict.fromkeys(hashes, Tier.GPU), block_size)


# --- FCFS and Cache-Aware ------------------------------------------------------------------


def test_fcfs_is_arrival_order_whatever_the_input_order() -> None:
    ws = [waiting("c", 3.0), waiting("a", 1.0), waiting("b", 2.0)]
    assert Fcfs().order(ws, gpu(), now_s=5.0) == ["a", "b", "c"]


def test_cache_aware_runs_a_hot_request_before_an_earlier_cold_one() -> None:
    cold = waiting("cold", 0.0, 100, blocks=range(100, 110))
    hot = waiting("hot", 5.0, 100, blocks=range(10))  # 5 of 10 blocks resident: 50%
    res = gpu(0, 1, 2, 3, 4)
    assert Fcfs().order([cold, hot], res, 6.0) == ["cold", "hot"]
    assert CacheAware().order([cold, hot], res, 6.0) == ["hot", "cold"]


def test_cache_aware_treats_49_percent_as_cold_and_50_as_hot() -> None:
    res = ResidencyView.of(dict.fromkeys(range(50), Tier.GPU), block_size=1)
    early = waiting("early", 0.0, 100, blocks=range(1000, 1100))
    r49 = waiting("r49", 1.0, 100, blocks=[*range(49), *range(2000, 2051)])
    r50 = waiting("r50", 1.0, 100, blocks=[*range(50), *range(3000, 3050)])
    policy = CacheAware()
    assert not policy.is_hot(r49, res) and policy.is_hot(r50, res)
    assert policy.order([early, r49], res, 2.0) == ["early", "r49"]
    assert policy.order([early, r50], res, 2.0) == ["r50", "early"]


def test_cache_aware_counts_cpu_tier_and_puts_more_reuse_first() -> None:
    res = ResidencyView.of({0: Tier.GPU, 1: Tier.CPU, 2: Tier.CPU, 3: Tier.GPU}, block_size=10)
    two = waiting("two", 0.0, 40, blocks=[0, 1, 9, 9])  # 2 of 4 blocks (one in CPU)
    four = waiting("four", 1.0, 40, blocks=[0, 1, 2, 3])
    assert CacheAware().order([two, four], res, 2.0) == ["four", "two"]
    assert res.reusable_by_tier(four.block_hashes) == {Tier.GPU: 2, Tier.CPU: 2}


def test_recheck_sends_a_no_longer_hot_request_back_to_its_arrival_slot() -> None:
    policy = CacheAware()
    a, b = waiting("a", 0.0, 40, blocks=[7, 7, 7, 7]), waiting("b", 1.0, 40, blocks=[8, 8, 8, 8])
    c = waiting("c", 2.0, 40, blocks=[1, 2, 3, 4])
    before = gpu(1, 2, 3)
    assert policy.order([a, b, c], before, 3.0) == ["c", "a", "b"]
    after = gpu(1)  # blocks 2 and 3 were evicted before c ran
    assert policy.recheck(c, before) and not policy.recheck(c, after)
    assert policy.order([a, b, c], after, 3.0) == ["a", "b", "c"]


def test_cache_aware_rejects_a_bad_threshold() -> None:
    with pytest.raises(ConfigError, match="hot_fraction"):
        CacheAware(hot_fraction=0.0)


# --- Guard-W and composition ----------------------------------------------------------------


@pytest.mark.parametrize("guard_first", [True, False])
def test_guard_protection_cannot_be_bypassed_by_a_hot_request(guard_first: bool) -> None:
    res = gpu(*range(10))
    old_cold = waiting("old", 0.0, 100, blocks=range(100, 110))
    hot = waiting("hot", 39.0, 100, blocks=range(10))
    policy = (
        compose(GuardW(40.0), CacheAware()) if guard_first else compose(CacheAware(), GuardW(40.0))
    )
    assert policy.order([old_cold, hot], res, now_s=39.5) == ["hot", "old"]  # not protected yet
    assert policy.order([old_cold, hot], res, now_s=40.0) == ["old", "hot"]
    assert policy.name == "guard_w+cache_aware"


def test_guard_orders_protected_requests_by_wait_ahead_of_the_rest() -> None:
    res = gpu(*range(10))
    ws = [
        waiting("p-short", 8.0, blocks=range(10)),  # hot, waited 42
        waiting("p-long", 1.0),  # waited 49
        waiting("p-mid", 5.0),  # waited 45
        waiting("hot-new", 20.0, blocks=range(10)),  # hot, waited 30: unprotected
        waiting("cold-new", 15.0),  # waited 35: unprotected
    ]
    order = compose(CacheAware(), GuardW(40.0)).order(ws, res, now_s=50.0)
    assert order == ["p-long", "p-mid", "p-short", "hot-new", "cold-new"]


def test_a_max_wait_requirement_protects_sooner_than_w() -> None:
    ws = [waiting("a", 0.0), waiting("b", 5.0, max_wait_s=2.0)]
    assert GuardW(40.0).order(ws, gpu(), now_s=6.0) == ["a", "b"]
    assert GuardW(40.0).order(ws, gpu(), now_s=7.0) == ["b", "a"]


def test_compose_needs_a_policy_and_flattens() -> None:
    with pytest.raises(ConfigError):
        compose()
    inner = compose(CacheAware())
    assert [p.name for p in compose(inner, GuardW(1.0)).policies] == ["guard_w", "cache_aware"]


def test_priority_controls_follow_the_order() -> None:
    got = priority_controls(["b", "a"], force=Force.REQUIREMENT)
    assert got == {
        "b": Priority(0, force=Force.REQUIREMENT),
        "a": Priority(1, force=Force.REQUIREMENT),
    }


# --- Session-Aware retention --------------------------------------------------------------


ENDED = [session(f"e{i}", n, ended=True) for i, n in enumerate((1, 2, 2, 3, 5))]


def test_continuation_estimate_ignores_open_sessions() -> None:
    base = ContinuationEstimator.from_sessions(ENDED)
    with_open = ContinuationEstimator.from_sessions([*ENDED, session("open", 9, ended=False)])
    assert [with_open.p_next(k) for k in range(8)] == [base.p_next(k) for k in range(8)]
    # an ended session does move it (the test above could fail)
    more = ContinuationEstimator.from_sessions([*ENDED, session("e9", 9, ended=True)])
    assert more.p_next(5) != base.p_next(5)
    # P(next | 2) from ended sessions: 4 reached 2 turns, 2 went on -> (2 + 1) / (4 + 2)
    assert base.p_next(2) == pytest.approx(0.5)
    assert base.p_next(3) == pytest.approx((1 + 1) / (2 + 2))


def test_retention_priority_decays_with_idle_time_by_the_half_life() -> None:
    policy = SessionRetention(half_life_s=30.0)
    est = ContinuationEstimator.from_sessions(ENDED)
    s = session("open", 2, ended=False, last_active_s=100.0)
    p0 = policy.retention_priority(s, est, now_s=100.0)
    p30 = policy.retention_priority(s, est, now_s=130.0)
    p90 = policy.retention_priority(s, est, now_s=190.0)
    assert p0 == pytest.approx(est.p_next(2))
    assert p30 == pytest.approx(p0 / 2)
    assert p90 == pytest.approx(p0 / 8)


def test_retains_sent_at_different_times_order_as_the_decayed_priorities_do() -> None:
    """The engine compares retains' keys only and is not re-sent them as sessions idle: a
    session retained long ago with a high continuation estimate must still lose to one retained
    recently with a lower estimate once its decay says so (and win before that)."""
    policy = SessionRetention(half_life_s=30.0, release_below=0.0)
    est = ContinuationEstimator.from_sessions(ENDED)
    likely = session("likely", 1, ended=False, last_active_s=0.0, blocks=(1,))
    unlikely = session("unlikely", 3, ended=False, last_active_s=20.0, blocks=(2,))
    assert est.p_next(1) > est.p_next(3)  # the undecayed order says "likely" is kept
    (keep_likely,) = policy.controls([likely], now_s=0.0, estimator=est)
    (keep_unlikely,) = policy.controls([unlikely], now_s=20.0, estimator=est)
    assert isinstance(keep_likely, CacheRetain) and isinstance(keep_unlikely, CacheRetain)
    likely_kept = keep_likely.retention_priority > keep_unlikely.retention_priority
    for t in (20.0, 25.0, 40.0, 100.0, 1000.0):
        decayed = policy.retention_priority(likely, est, t) > policy.retention_priority(
            unlikely, est, t
        )
        assert likely_kept == decayed, t
    assert not likely_kept  # and here decay has already turned the order by t = 20 s
    early = session("likely", 1, ended=False, last_active_s=15.0, blocks=(1,))
    assert policy.eviction_key(early, est) > keep_unlikely.retention_priority


def test_session_retention_retains_open_and_releases_ended_and_stale() -> None:
    policy = SessionRetention(half_life_s=10.0, release_below=0.05)
    fresh = session("fresh", 1, ended=False, last_active_s=95.0, blocks=(1, 2))
    older = session("older", 1, ended=False, last_active_s=80.0, blocks=(3,))
    stale = session("stale", 1, ended=False, last_active_s=0.0, blocks=(4,))
    done = session("done", 3, ended=True, last_active_s=99.0, blocks=(5,))
    controls = policy.controls([stale, done, older, fresh], now_s=100.0, history=ENDED)
    kinds = [(type(c).__name__, c.subject.context_id) for c in controls]  # type: ignore[attr-defined]
    assert kinds == [
        ("CacheRetain", "fresh"),
        ("CacheRetain", "older"),
        ("CacheRelease", "done"),
        ("CacheRelease", "stale"),
    ]
    retain = controls[0]
    assert isinstance(retain, CacheRetain) and retain.block_hashes == (1, 2)
    assert retain.retention_priority > controls[1].retention_priority  # type: ignore[attr-defined]
    assert all(isinstance(c, CacheRelease) for c in controls[2:])
