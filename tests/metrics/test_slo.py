"""Tests for metrics.slo on hand-computed cases following the seed paper's contracts (App. C):
declared window [0, T), drain completions counted, goodput over T, the drain-inclusive timely
rate over max(T, T_cohort), and λ* = max admissible load whose minimum attainment across blocks
and classes is ≥ 0.95 under the completion and backlog guards."""

from __future__ import annotations

import math

import pytest

from maserve_prefect.errors import ConfigError
from maserve_prefect.metrics.slo import (
    ALPHA,
    LoadResult,
    attainment,
    backlog,
    backlog_guards,
    combine_blocks,
    lambda_star,
    observation_period_s,
    rate_window_s,
    sweep_window_s,
    task_goodput,
    timely_rate,
)
from maserve_prefect.metrics.task import RootLatency, RootStatus


def lat(rid: str, cls: str, arrival: float, latency: float | None, status=None) -> RootLatency:
    st = status or (RootStatus.COMPLETED if latency is not None else RootStatus.INCOMPLETE)
    done = None if latency is None else arrival + latency
    return RootLatency(rid, cls, arrival, st, "op" if done is not None else None, done)


# Declared window [0, 4) s; chat deadline 2 s, debate 10 s.
ROOTS = [
    lat("a", "chat", 0.0, 1.0),  # met, done at 1
    lat("b", "chat", 1.0, 3.0),  # missed
    lat("c", "chat", 2.0, None),  # incomplete -> a miss that still counts as an attempt
    lat("d", "debate", 2.5, 9.0),  # met, done at 11.5: in the drain after T = 4
    lat("e", "debate", 3.0, 10.0),  # met at exactly the deadline, done at 13: drain
    lat("f", "chat", 4.0, 0.5),  # arrives at T: outside [0, 4)
    lat("g", "debate", 1.5, None, RootStatus.FAILED),  # failed -> miss
]
DEADLINES = {"chat": 2.0, "debate": 10.0}
WINDOW = (0.0, 4.0)


def test_declared_windows_are_the_papers() -> None:
    # C.2: one T for the whole sweep, from its lowest rate: 8 / 0.00677316 = 1181.13 s.
    assert sweep_window_s([0.00677316, 0.01625559, 0.02709266, 0.04334825]) == pytest.approx(
        1181.132588, abs=1e-6
    )
    assert sweep_window_s([0.5, 1.0]) == 600.0  # the 600 s floor
    # C.3: T = max(180, 24 / λ) per rate: 1.2 roots/s -> 180 s, 0.04 -> 600 s, 0.10 -> 240 s.
    assert (rate_window_s(1.2), rate_window_s(0.04), rate_window_s(0.1)) == (180.0, 600.0, 240.0)
    with pytest.raises(ConfigError, match="positive"):
        sweep_window_s([0.5, 0.0])


def test_attainment_counts_drain_completions_of_roots_arriving_in_the_window() -> None:
    res = attainment(ROOTS, DEADLINES, window=WINDOW)
    # chat: a, b, c arrived in [0, 4) (f at 4.0 did not); only a met 2 s.
    assert (res["chat"].num_roots, res["chat"].num_met) == (3, 1)
    assert res["chat"].attainment == pytest.approx(1 / 3)
    # debate: d, e (both finishing after T = 4, in the drain) met; g failed.
    assert (res["debate"].num_roots, res["debate"].num_met) == (3, 2)
    assert list(res) == ["chat", "debate"]


def test_attainment_without_window_takes_all_roots() -> None:
    res = attainment(ROOTS, DEADLINES)
    assert (res["chat"].num_roots, res["chat"].num_met) == (4, 2)


def test_goodput_is_timely_roots_per_declared_second_drain_included() -> None:
    # timely roots arriving in [0, 4): a, d, e = 3 -> 3 / T = 0.75 roots/s
    assert task_goodput(ROOTS, DEADLINES, window=WINDOW) == pytest.approx(3 / 4.0)
    # The same cohort with a longer declared T: the count is unchanged, the rate is not.
    assert task_goodput(ROOTS, DEADLINES, window=(0.0, 6.0)) == pytest.approx(4 / 6.0)


def test_timely_rate_divides_by_max_of_window_and_cohort_drain() -> None:
    # The cohort's last completion is e at 13 s (f's at 4.5): max(T, T_cohort) = max(4, 13) = 13.
    assert observation_period_s(WINDOW, 13.0) == 13.0
    assert timely_rate(ROOTS, DEADLINES, window=WINDOW) == pytest.approx(3 / 13.0)
    # a background root finishing at 20 s extends the cohort: 3 / 20
    assert timely_rate(ROOTS, DEADLINES, window=WINDOW, last_completion_s=20.0) == 3 / 20.0
    # a cohort done before T keeps T in the denominator
    early = [lat("a", "chat", 0.0, 1.0)]
    assert timely_rate(early, DEADLINES, window=WINDOW) == pytest.approx(1 / 4.0)


def test_a_window_without_length_is_an_error() -> None:
    same = [lat("a", "chat", 5.0, 1.0), lat("b", "chat", 5.0, 3.0)]
    with pytest.raises(ConfigError, match="no length"):
        task_goodput(same, DEADLINES, window=(5.0, 5.0))
    with pytest.raises(ConfigError, match="no length"):
        timely_rate(same, DEADLINES, window=(5.0, 5.0))


def test_missing_or_bad_deadline_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="'debate'"):
        attainment(ROOTS, {"chat": 2.0})
    assert attainment(ROOTS, {"chat": 2.0}, default_s=100.0)["debate"].num_met == 2
    with pytest.raises(ConfigError, match="must be > 0"):
        attainment(ROOTS, {"chat": 0.0, "debate": 1.0})


def test_backlog_guards_hand_computed() -> None:
    # Window [0, 4): midpoint 2 s. Remaining at 2 s: b (arr 1, done 4), g (failed, never done)
    # -> 2 (a done at 1, c arrives at 2.0 -> not yet arrived before 2). At 4 s: c, d, e, g
    # (b finished exactly at 4) -> 4; growth 4 - 2 = 2.
    assert backlog(ROOTS, 2.0, since_s=0.0) == 2
    assert backlog(ROOTS, 4.0, since_s=0.0) == 4
    g = backlog_guards(ROOTS, WINDOW)
    assert (g.end_backlog, g.growth) == (4, 2)


def test_lambda_star_takes_the_minimum_across_blocks_at_alpha_095() -> None:
    assert ALPHA == 0.95
    rs = [
        # rate 1: blocks 1.0 / 0.96 / 0.97 -> A = 0.96 >= 0.95: passes
        LoadResult(1.0, {"chat": 1.0, "debate": 1.0}),
        LoadResult(1.0, {"chat": 0.96, "debate": 1.0}),
        LoadResult(1.0, {"chat": 0.97, "debate": 0.99}),
        # rate 2: medians 0.97 would pass, but one block's debate is 0.94 -> A = 0.94: fails
        LoadResult(2.0, {"chat": 0.97, "debate": 0.99}),
        LoadResult(2.0, {"chat": 0.98, "debate": 0.94}),
        LoadResult(2.0, {"chat": 0.97, "debate": 0.97}),
    ]
    assert lambda_star(rs) == 1.0
    assert lambda_star(rs, alpha=0.9) == 2.0
    assert combine_blocks(rs[3:]).attainment == {"chat": 0.97, "debate": 0.94}
    # a class without roots in a block (nan) is skipped, not a failure
    assert LoadResult(1.0, {"x": math.nan, "y": 0.96}).min_attainment == 0.96


def test_lambda_star_guards_completion_end_backlog_and_growth() -> None:
    ok = {"x": 1.0}
    rs = [
        LoadResult(1.0, ok, backlog=4, backlog_growth=0),  # 4 left at T: allowed
        LoadResult(2.0, ok, backlog=5),  # 5 left at T: fails the end-backlog guard
        LoadResult(3.0, ok, backlog_growth=1),  # backlog grew over the second half: fails
        LoadResult(4.0, ok, completion_ratio=63 / 64),  # one root never completed: fails
    ]
    assert lambda_star(rs) == 1.0
    # Λ_adm is judged per load, not as a prefix: a later admissible load still counts ...
    rs.append(LoadResult(5.0, ok, backlog=2, backlog_growth=-3))
    assert lambda_star(rs) == 5.0
    # ... unless contiguous is asked for
    assert lambda_star(rs, contiguous=True) == 1.0
    # a guard failing in any one block fails the load
    assert lambda_star([LoadResult(1.0, ok), LoadResult(1.0, ok, backlog=9)]) is None


def test_lambda_star_rejects_bad_alpha_and_handles_no_classes() -> None:
    assert lambda_star([LoadResult(1.0, {"x": math.nan})], alpha=0.0) is None
    with pytest.raises(ConfigError, match="alpha"):
        lambda_star([], alpha=1.5)
