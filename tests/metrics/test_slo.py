"""Tests for metrics.slo: attainment, task goodput and λ* on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from maserve_prefect.errors import ConfigError
from maserve_prefect.metrics.slo import (
    LoadResult,
    arrival_window,
    attainment,
    lambda_star,
    task_goodput,
)
from maserve_prefect.metrics.task import RootLatency, RootStatus


def lat(rid: str, cls: str, arrival: float, latency: float | None, status=None) -> RootLatency:
    st = status or (RootStatus.COMPLETED if latency is not None else RootStatus.INCOMPLETE)
    done = None if latency is None else arrival + latency
    return RootLatency(rid, cls, arrival, st, "op" if done is not None else None, done)


ROOTS = [
    lat("a", "chat", 0.0, 1.0),  # met (deadline 2)
    lat("b", "chat", 1.0, 3.0),  # missed
    lat("c", "chat", 2.0, None),  # incomplete -> miss
    lat("d", "debate", 2.5, 9.0),  # met (deadline 10)
    lat("e", "debate", 3.0, 10.0),  # met: latency == deadline counts
    lat("f", "chat", 4.0, 0.5),  # outside window [0, 4)
    lat("g", "debate", 1.5, None, RootStatus.FAILED),  # failed -> miss
]
DEADLINES = {"chat": 2.0, "debate": 10.0}


def test_attainment_per_class_in_window() -> None:
    res = attainment(ROOTS, DEADLINES, window=(0.0, 4.0))
    assert (res["chat"].num_roots, res["chat"].num_met) == (3, 1)
    assert res["chat"].attainment == pytest.approx(1 / 3)
    assert (res["debate"].num_roots, res["debate"].num_met) == (3, 2)
    assert list(res) == ["chat", "debate"]


def test_attainment_without_window_takes_all_roots() -> None:
    res = attainment(ROOTS, DEADLINES)
    assert (res["chat"].num_roots, res["chat"].num_met) == (4, 2)


def test_goodput_counts_met_roots_per_window_second() -> None:
    assert task_goodput(ROOTS, DEADLINES, window=(0.0, 4.0)) == pytest.approx(3 / 4.0)
    # default window = [first arrival, last arrival) = [0, 4): same roots
    assert arrival_window(ROOTS) == (0.0, 4.0)
    assert task_goodput(ROOTS, DEADLINES) == pytest.approx(3 / 4.0)


def test_zero_length_window_is_an_error_for_goodput_but_not_attainment() -> None:
    same = [lat("a", "chat", 5.0, 1.0), lat("b", "chat", 5.0, 3.0)]
    assert attainment(same, DEADLINES, window=(5.0, 5.0))["chat"].num_roots == 2
    with pytest.raises(ConfigError, match="no length"):
        task_goodput(same, DEADLINES)


def test_missing_or_bad_deadline_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="'debate'"):
        attainment(ROOTS, {"chat": 2.0})
    assert attainment(ROOTS, {"chat": 2.0}, default_s=100.0)["debate"].num_met == 2
    with pytest.raises(ConfigError, match="must be > 0"):
        attainment(ROOTS, {"chat": 0.0, "debate": 1.0})


def test_lambda_star_guards_and_alpha() -> None:
    rs = [
        LoadResult(1.0, {"chat": 1.0, "debate": 0.97}),
        LoadResult(2.0, {"chat": 0.96, "debate": 0.95}),
        LoadResult(3.0, {"chat": 0.99, "debate": 0.91}),
        LoadResult(4.0, {"chat": 1.0, "debate": 1.0}, completion_ratio=0.8),  # completion guard
        LoadResult(5.0, {"chat": 1.0, "debate": 1.0}, backlog=30.0),  # backlog guard
    ]
    assert lambda_star(rs, alpha=0.95, max_backlog=10.0) == 2.0
    assert lambda_star(rs, alpha=0.9, max_backlog=10.0) == 3.0
    assert lambda_star(rs, alpha=0.9) == 5.0  # no backlog guard
    assert lambda_star(rs, alpha=0.9, min_completion=0.5, max_backlog=10.0) == 4.0
    assert lambda_star(rs, alpha=0.99, max_backlog=10.0) is None


def test_lambda_star_non_monotone_and_contiguous() -> None:
    rs = [
        LoadResult(1.0, {"x": 0.99}),
        LoadResult(2.0, {"x": 0.5}),
        LoadResult(3.0, {"x": 0.95}),
    ]
    assert lambda_star(list(reversed(rs)), alpha=0.9) == 3.0
    assert lambda_star(rs, alpha=0.9, contiguous=True) == 1.0


def test_lambda_star_skips_empty_classes_and_rejects_bad_input() -> None:
    assert LoadResult(1.0, {"x": math.nan, "y": 0.9}).min_attainment == 0.9
    assert lambda_star([LoadResult(1.0, {"x": math.nan})], alpha=0.0) is None
    with pytest.raises(ConfigError, match="alpha"):
        lambda_star([], alpha=1.5)
    with pytest.raises(ConfigError, match="tested once"):
        lambda_star([LoadResult(1.0, {}), LoadResult(1.0, {})], alpha=0.5)
