"""The planning window: ready / near-ready sets and predicted releases through the DAG."""

from __future__ import annotations

import pytest

from maserve_prefect.errors import ConfigError
from maserve_prefect.pool.window import (
    UnitStatus,
    WorkUnit,
    build_window,
    dag_stats,
    predict_times,
    units_by_id,
)

P, R, RUN, D = UnitStatus.PENDING, UnitStatus.READY, UnitStatus.RUNNING, UnitStatus.DONE


def dag(edges: list[tuple[str, str]], nodes: str, dep: dict[str, str] | None = None) -> dict:
    """Units named by single letters, root "r", deployment "m" unless `dep` says otherwise."""
    preds = {n: tuple(a for a, b in edges if b == n) for n in nodes}
    succs = {n: tuple(b for a, b in edges if a == n) for n in nodes}
    dep = dep or {}
    return units_by_id(WorkUnit(n, "r", dep.get(n, "m"), 10, 10, preds[n], succs[n]) for n in nodes)


RUNTIME = {"a": 2.0, "b": 3.0, "c": 1.0, "d": 4.0, "e": 5.0}


def rt(u: WorkUnit) -> float:
    return RUNTIME[u.unit_id]


def test_near_ready_needs_every_predecessor_done_or_running_and_one_running() -> None:
    # a, b -> c ; a -> d ; b -> e (e also waits for d)
    units = dag([("a", "c"), ("b", "c"), ("a", "d"), ("b", "e"), ("d", "e")], "abcde")
    status = {"a": RUN, "b": D, "c": P, "d": P, "e": P}
    w = build_window(units, status, 5.0, rt, started_s={"a": 4.0}, done_s={"b": 3.0})
    assert [x.unit.unit_id for x in w.near_ready] == ["c", "d"]
    assert w.ready == ()
    # c waits for a: 4.0 + 2.0; b is done already
    assert {x.unit.unit_id: x.release_s for x in w.near_ready} == {"c": 6.0, "d": 6.0}


def test_ready_units_are_not_near_ready_and_keep_their_ready_time() -> None:
    units = dag([("a", "b")], "abc")
    w = build_window(units, {"a": D, "b": R, "c": R}, 10.0, rt, ready_s={"b": 7.0, "c": 2.0})
    assert [(x.unit.unit_id, x.release_s) for x in w.ready] == [("c", 2.0), ("b", 7.0)]
    assert w.near_ready == ()


def test_predicted_releases_propagate_through_pending_units() -> None:
    units = dag([("a", "b"), ("b", "c"), ("a", "d"), ("c", "e"), ("d", "e")], "abcde")
    times = predict_times(units, {"a": RUN}, 1.0, rt, started_s={"a": 0.0})
    assert times["a"] == (0.0, 2.0)
    assert times["b"] == (2.0, 5.0)
    assert times["c"] == (5.0, 6.0)
    assert times["d"] == (2.0, 6.0)
    assert times["e"] == (6.0, 11.0)  # the join waits for its latest predecessor


def test_a_late_running_unit_is_predicted_to_finish_now_not_in_the_past() -> None:
    units = dag([("a", "b")], "ab")
    w = build_window(units, {"a": RUN, "b": P}, 9.0, rt, started_s={"a": 0.0})
    assert w.near_ready[0].release_s == 9.0
    assert w.near_ready[0].completion_s == 12.0


def test_next_use_and_remaining_work_per_root() -> None:
    units = dag([("a", "b"), ("b", "c")], "abc", dep={"b": "x", "c": "y"})
    w = build_window(units, {"a": RUN}, 1.0, rt, started_s={"a": 0.0}, root_arrival_s={"r": 0.0})
    assert w.next_use_s == {"x": 2.0, "y": 5.0}
    assert w.root_remaining_s["r"] == pytest.approx(1.0 + 3.0 + 1.0)
    assert w.root_arrival_s == {"r": 0.0}


def test_dag_stats_on_a_diamond() -> None:
    units = dag([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], "abcd")
    stats = dag_stats(units, rt)
    assert stats["a"].critical_path_s == 2.0 + 3.0 + 4.0
    assert stats["a"].downstream_work_s == 2.0 + 3.0 + 1.0 + 4.0
    assert (stats["a"].num_descendants, stats["d"].num_descendants) == (3, 0)


def test_malformed_dags_raise_config_errors() -> None:
    units = dag([("a", "b"), ("b", "a")], "ab")
    with pytest.raises(ConfigError, match="cycle"):
        dag_stats(units, rt)
    one_sided = {
        "a": WorkUnit("a", "r", "m", 1, 1, succs=("b",)),
        "b": WorkUnit("b", "r", "m", 1, 1),
    }
    with pytest.raises(ConfigError, match="successor"):
        dag_stats(one_sided, rt)
    with pytest.raises(ConfigError, match="twice"):
        units_by_id([WorkUnit("a", "r", "m", 1, 1), WorkUnit("a", "r", "m", 1, 1)])
