"""HEAR policies: Cache-Aware (order and engine priority), Guard-W (order and MaxWait), compose,
Session-Aware (continuation forecasts from depth and intervals, told as intents)."""

from __future__ import annotations

import pytest
from hear_factories import session, waiting

from maserve_prefect.errors import ConfigError
from maserve_prefect.hear.policies import (
    CacheAware,
    ContinuationModel,
    Fcfs,
    GuardW,
    SessionAware,
    compose,
)
from maserve_prefect.protocol.controls import Force, MaxWait, Tier
from maserve_prefect.protocol.intents import ContinuationIntent
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


def test_cache_aware_priority_is_minus_reusable_blocks_when_hot_else_default() -> None:
    """Appendix A.2: priority = -N_reuse for a hot request; a cold one keeps the default."""
    res = ResidencyView.of({0: Tier.GPU, 1: Tier.CPU, 2: Tier.GPU}, block_size=10)
    hot = waiting("hot", 0.0, 40, blocks=[0, 1, 2, 9])  # 3 of 4 blocks reusable (one in CPU)
    cold = waiting("cold", 0.0, 40, blocks=[0, 9, 9, 9])  # 1 of 4: under 50 %
    gap = waiting("gap", 0.0, 40, blocks=[9, 1, 2, 0])  # matching stops at the first miss
    assert CacheAware().priority(hot, res) == -3
    assert CacheAware().priority(cold, res) is None
    assert CacheAware().priority(gap, res) is None
    # smaller runs first: the priority order is the Cache-Aware order
    more = waiting("more", 1.0, 40, blocks=[0, 1, 2, 3])
    res4 = ResidencyView.of(dict.fromkeys(range(4), Tier.GPU), block_size=10)
    assert CacheAware().priority(more, res4) < CacheAware().priority(hot, res4)  # type: ignore[operator]


def test_guard_sends_a_waiting_requirement() -> None:
    assert GuardW(40.0).control() == MaxWait(40.0, force=Force.REQUIREMENT)


# --- Session-Aware ---------------------------------------------------------------------------


ENDED = [session(f"e{i}", n, ended=True) for i, n in enumerate((1, 2, 2, 3, 5))]


def test_continuation_model_ignores_open_sessions() -> None:
    base = ContinuationModel.fit(ENDED)
    with_open = ContinuationModel.fit([*ENDED, session("open", 9, ended=False)])
    probe = [session("p", k, ended=False) for k in range(8)]
    assert [with_open.p_return(v) for v in probe] == [base.p_return(v) for v in probe]
    # a completed session does move it (the test above could fail)
    more = ContinuationModel.fit([*ENDED, session("e9", 9, ended=True)])
    assert more.p_return(probe[5]) != base.p_return(probe[5])
    # P(next | 2): 4 reached 2 turns, 2 went on -> (2 + 1) / (4 + 2) (Laplace)
    assert base.p_return(probe[2]) == pytest.approx(0.5)
    assert base.p_return(probe[3]) == pytest.approx((1 + 1) / (2 + 2))


def test_continuation_model_reads_prior_intervals() -> None:
    """Depth and prior inter-turn intervals (the paper): quick returners are compared with
    completed quick conversations, slow ones with slow conversations."""
    done = [session("q1", 6, True, gaps_s=(2.0,) * 5), session("q2", 5, True, gaps_s=(3.0,) * 4),
            session("s1", 2, True, gaps_s=(300.0,)), session("s2", 2, True, gaps_s=(200.0,))]  # fmt: skip
    model = ContinuationModel.fit(done)
    quick = session("o", 2, False, gaps_s=(2.5,))
    slow = session("o", 2, False, gaps_s=(250.0,))
    fresh = session("o", 2, False)  # no interval yet: compared with every conversation
    assert model.p_return(quick) == pytest.approx((2 + 1) / (2 + 2))
    assert model.p_return(slow) == pytest.approx((0 + 1) / (2 + 2))
    assert model.p_return(fresh) == pytest.approx((2 + 1) / (4 + 2))
    assert ContinuationModel.fit([]).p_return(quick) == 0.5  # no data: no opinion


def test_session_aware_tells_a_prediction_never_a_control() -> None:
    model = ContinuationModel.fit(ENDED)
    view = session("open", 2, False, blocks=(4, 5, 6))
    intent = SessionAware().intent(view, model)
    assert isinstance(intent, ContinuationIntent)
    assert intent.p_return.value == pytest.approx(model.p_return(view))
    assert intent.p_return.is_prediction and intent.block_hashes == (4, 5, 6)
    assert intent.subject == view.context
