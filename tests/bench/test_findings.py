"""The four seed-finding suites at demo scale, and their analysis rows.

Directions are asserted only where the mechanism guarantees them at demo scale: barrier edges only
add waits (Barrier ≥ DAG root latency at low load); a smaller KV budget can only add
recomputation (prefill factor non-increasing in the budget). Other rows are checked for shape and
range only. Figures are never hard-coded.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from maserve_prefect.bench import findings
from maserve_prefect.bench.runner import run_suite
from maserve_prefect.bench.suite import load_suite

SUITES = Path(__file__).resolve().parents[2] / "deployments" / "suites"
NAMES = ("barrier", "kv_budget", "rate_sweep", "request_limit")


@pytest.mark.parametrize("name", NAMES)
def test_suite_files_load_at_both_scales(name: str) -> None:
    suite = load_suite(SUITES / f"finding_{name}.yaml")
    assert suite.analysis is not None and suite.analysis_fn() is not None
    for scale in ("demo", "full"):
        scenarios = suite.load_scenarios(scale)
        assert scenarios
        # One serving setup for every suite: the shared pool file.
        for sc in scenarios:
            assert {a.pool.name for a in sc.arms if a.pool} == {"pool_h100_qwen3_8b.yaml"}


def _run(name: str) -> list[dict[str, object]]:
    return run_suite(SUITES / f"finding_{name}.yaml", scale="demo", prefect=False).findings


def test_barrier_suite_barrier_adds_latency(prefect_api: None) -> None:
    rows = _run("barrier")
    assert {r["class"] for r in rows} == {"four_call_full", "hierarchical_summary"}
    for r in rows:
        assert r["num_roots"] > 0
        assert r["barrier_p50_s"] >= r["dag_p50_s"]
        assert r["mean_paired_delta_s"] > 0  # serialized branches cannot finish earlier
        assert r["holds"] is True and r["measured"] == "up"


def test_kv_budget_suite_factor_non_increasing(prefect_api: None) -> None:
    rows = _run("kv_budget")
    assert [r["kv_cache_gib"] for r in rows] == [16.0, 32.0, 40.0]
    factors = [r["prefill_factor"] for r in rows]
    assert all(f >= 1.0 - 1e-12 for f in factors)
    assert factors == sorted(factors, reverse=True)
    assert all(r["root_p95_s"] > 0 for r in rows)
    assert {"factor_vs_smaller", "p95_vs_smaller", "holds"} <= set(rows[1])


def test_rate_sweep_suite_rows(prefect_api: None) -> None:
    rows = _run("rate_sweep")
    rates = [r["rate_per_s"] for r in rows]
    assert rates == sorted(rates) and len(set(rates)) == 4
    assert {r["kv_cache_gib"] for r in rows} == {16.0, 40.0}
    for r in rows:
        assert 0.0 <= r["barrier_attainment"] <= 1.0 and 0.0 <= r["dag_attainment"] <= 1.0
        assert r["holds"] == (
            r["dag_attainment"] >= r["barrier_attainment"]
            and r["dag_goodput_per_s"] >= r["barrier_goodput_per_s"]
        )
        assert not math.isnan(r["dag_goodput_per_s"])


def test_request_limit_suite_rows(prefect_api: None) -> None:
    rows = _run("request_limit")
    assert [r["max_num_seqs"] for r in rows] == [64, 128]
    for r in rows:
        assert r["output_tps"] > 0 and 0.0 <= r["attainment"] <= 1.0
        assert 0 < r["peak_running_seqs"] <= r["max_num_seqs"]  # the engine honours the limit
    assert rows[1]["tps_vs_smaller"] in {"up", "down", "flat"}


def test_direction_and_kv_helpers() -> None:
    assert findings.direction(2.0, 1.0) == "down"
    assert findings.direction(1.0, 1.0) == "flat"
    assert findings.direction(None, 1.0) == "n/a"
    assert findings.kv_gib_of({"main": {"max_num_seqs": 4}}) is None
