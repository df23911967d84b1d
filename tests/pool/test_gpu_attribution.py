"""GPU-seconds per completed session by scenario: shared lifecycle time follows each scenario's
share of each model's generation time, and nothing is lost or counted twice."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pool_factories import POOL_PLANS, THREE_FORK_JOINS

from maserve_prefect.engines.sim.pool.export import ReplicaTimeRow
from maserve_prefect.pool.executor import run_pool
from maserve_prefect.pool.gpu_attribution import PARTS, gpu_seconds_by_scenario

TWO = ["V100-32GB:0", "A100-40GB:0"]
NAMED = [replace(wf, name="fork" if wf.root_id != "r2" else "big") for wf in THREE_FORK_JOINS]


@st.composite
def replica_rows(draw: st.DrawFn) -> tuple[list[ReplicaTimeRow], dict[str, str]]:
    models = draw(st.lists(st.sampled_from(["0.6B", "4B", "8B", "14B"]), min_size=1, max_size=5))
    rows, scenario = [], {}
    for i, m in enumerate(models):
        reqs = {}
        for j in range(draw(st.integers(0, 4))):
            rid = f"r{i}/{j}"
            reqs[rid] = draw(st.floats(0.01, 50.0))
            scenario[rid] = draw(st.sampled_from(["a", "b", "c"]))
        gen = sum(reqs.values())
        rows.append(ReplicaTimeRow(f"p{i}", m, (f"GPU:{i}",), gen, draw(st.floats(0, 40)),
                                   draw(st.floats(0, 90)), reqs))  # fmt: skip
    return rows, scenario


@given(replica_rows(), st.floats(0.0, 100.0))
def test_every_second_is_attributed_once(
    case: tuple[list[ReplicaTimeRow], dict[str, str]], other_s: float
) -> None:
    rows, scenario = case
    sessions = {"a": 2, "b": 3, "c": 1}
    out = gpu_seconds_by_scenario(rows, other_s, scenario, sessions)
    served = {m for r in rows for m in [r.deployment] if r.request_s}
    for part, field in (("generation", "generation_s"), ("loading", "loading_s"),
                        ("idle_resident", "idle_resident_s")):  # fmt: skip
        got = sum(out[s][part] * n for s, n in sessions.items())
        # a model that generated for nobody has no shares: its time is left out, said plainly
        want = sum(getattr(r, field) for r in rows if r.deployment in served)
        assert got == pytest.approx(want, abs=1e-6)
    if any(r.request_s for r in rows):
        assert sum(out[s]["other"] * n for s, n in sessions.items()) == pytest.approx(other_s)
    for row in out.values():
        assert row["total"] == pytest.approx(sum(row[p] for p in PARTS))


def test_a_model_used_by_one_scenario_charges_it_all() -> None:
    rows = [ReplicaTimeRow("p0", "14B", ("A100:0",), 9.0, 30.0, 1.0, {"x/1": 9.0}),
            ReplicaTimeRow("p1", "4B", ("V100:0",), 4.0, 10.0, 6.0, {"x/2": 1.0, "y/1": 3.0})]  # fmt: skip
    out = gpu_seconds_by_scenario(rows, 0.0, {"x/1": "x", "x/2": "x", "y/1": "y"}, {"x": 1, "y": 1})
    assert out["x"]["loading"] == pytest.approx(30.0 + 10.0 * 0.25)
    assert out["y"]["loading"] == pytest.approx(10.0 * 0.75)
    assert out["y"]["idle_resident"] == pytest.approx(6.0 * 0.75)


@pytest.mark.parametrize("plan", POOL_PLANS)
def test_a_pool_run_splits_its_device_time_among_scenarios(plan: str) -> None:
    """One replica per GPU: the scenarios' parts add up to the devices' parts exactly."""
    res = run_pool(NAMED, TWO, plan)
    by = res.gpu_s_by_scenario
    sessions = {"fork": 2, "big": 1}
    assert set(by) == set(sessions)
    for part in PARTS:
        got = sum(by[s][part] * n for s, n in sessions.items())
        assert got == pytest.approx(res.gpu_s_per_session[part] * 3, rel=1e-9, abs=1e-6), part
    # the 14B root's session generated more than a small fork-join one did
    assert by["big"]["generation"] > by["fork"]["generation"] > 0
