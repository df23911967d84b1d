"""Arrival processes: deterministic per seed; closed loop waits for a user's previous root."""

from __future__ import annotations

import pytest
from replay_factories import make_trace

from maserve_prefect.errors import ConfigError
from maserve_prefect.replay.driver import replay_trace
from maserve_prefect.workloads.arrivals import (
    ClosedLoopArrivals,
    ExplicitArrivals,
    PoissonArrivals,
    ThinkTime,
    TraceArrivals,
)


def test_poisson_is_deterministic_per_seed() -> None:
    a, b = PoissonArrivals(2.0, 5).offsets(20), PoissonArrivals(2.0, 5).offsets(20)
    assert a == b and a[0] == 0.0 and a == sorted(a)
    assert PoissonArrivals(2.0, 6).offsets(20) != a


def test_explicit_needs_one_time_per_root() -> None:
    with pytest.raises(ConfigError, match="one time per root"):
        ExplicitArrivals((0.0,)).offsets(2)


def test_open_loop_replay_places_roots_at_their_offsets() -> None:
    run = replay_trace(
        make_trace(3), None, arrivals=ExplicitArrivals((0.0, 5.0, 7.5)), lock="length"
    )
    offsets = [run.root_arrival_s[r] - run.start_s for r in ("r0", "r1", "r2")]
    assert offsets == [0.0, 5.0, 7.5]
    # a and b run in parallel: a root takes its longest tool op
    assert set(run.root_latency_s.values()) == {2.0}


def test_trace_arrivals_keep_recorded_gaps() -> None:
    run = replay_trace(make_trace(3), None, arrivals=TraceArrivals(), lock="length")
    assert [run.root_arrival_s[r] - run.start_s for r in ("r0", "r1", "r2")] == [0.0, 1.0, 2.0]


def test_closed_loop_starts_next_root_after_previous_plus_think() -> None:
    process = ClosedLoopArrivals(users=2, think_time=ThinkTime("exponential", 1.0), seed=3)
    run = replay_trace(make_trace(6), None, arrivals=process, lock="length")
    think = process.think_times(6)
    order = [f"r{i}" for i in range(6)]
    for i in range(2, 6):  # slot i follows slot i - 2 of the same user
        prev = order[i - 2]
        finish = run.root_arrival_s[prev] + run.root_latency_s[prev]
        assert run.root_arrival_s[order[i]] == pytest.approx(finish + think[i])
    again = replay_trace(make_trace(6), None, arrivals=process, lock="length")
    assert again.root_arrival_s == run.root_arrival_s
