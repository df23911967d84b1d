"""Finding 2 (KV pressure and task tails): the suite follows the paper's protocol, its demo runs,
and the analysis computes the paper's figures on hand-made blocks.

Directions at demo scale are asserted only where the mechanism guarantees them: a smaller KV
budget can only add recomputation, so the prefill factor never falls as the budget shrinks.
"""

from __future__ import annotations

import doctest
from collections import Counter
from pathlib import Path

import pytest

from maserve_prefect.bench.flow import run_suite
from maserve_prefect.bench.replay import finding_f2
from maserve_prefect.bench.replay.finding_f2 import (
    FIGURES,
    BlockFigures,
    figure_rows,
    monotone,
    paper_p95,
)
from maserve_prefect.bench.replay.suite import ReplaySuiteResult
from maserve_prefect.bench.replay.suite_file import ReplaySuite
from maserve_prefect.bench.suite import load_suite
from maserve_prefect.replay.scenario import Burst, load_scenario

SUITES = Path(__file__).resolve().parents[2] / "deployments" / "suites"
SUITE = SUITES / "finding_kv_budget.yaml"
MIX7 = {
    "spawn": 10,
    "fork_join": 9,
    "refinement_loop": 9,
    "debate": 9,
    "spawn_fork_join_refinement": 9,
    "fork_join_debate_refinement": 9,
    "research_review_writing": 9,
}
"""The paper's MIX7 cohort: ten Spawn and nine of each other structure (App. G.3)."""


def _fig(factor: float, preemptions: int, p95: float | None) -> BlockFigures:
    return BlockFigures(factor, preemptions, p95, 64, 64, 128)


def _mix7(cohorts: object) -> dict[str, int]:
    return {c.native.workflow: c.native.users for c in cohorts}  # type: ignore[attr-defined]


def test_mix7_cohort_file_is_the_papers_cohort() -> None:
    sc = load_scenario(SUITES / "scenarios" / "mix7_cohort.yaml")
    assert _mix7(sc.cohorts) == MIX7 and sum(MIX7.values()) == 64
    # The list is copied verbatim into every block of the sweep (seed aside).
    text = (SUITES / "scenarios" / "mix7_cohort.yaml").read_text()
    block = text[text.index("# -- MIX7 begin --") : text.index("# -- MIX7 end --")]
    for name in ("f2_kv_budget", "f2_kv_budget_b1", "f2_kv_budget_b2"):
        other = (SUITES / "scenarios" / f"{name}.yaml").read_text()
        seed = load_scenario(SUITES / "scenarios" / f"{name}.yaml").cohorts[0].native
        assert seed is not None
        assert block.replace("seed: 0", f"seed: {seed.seed}") in other


def test_suite_is_the_papers_protocol_at_full_scale() -> None:
    suite = load_suite(SUITE)
    assert isinstance(suite, ReplaySuite)
    assert suite.analysis_fn() is finding_f2.kv_pressure_rows
    scenarios = suite.load_scenarios("full")
    sweeps = [s for s in scenarios if len(s.arms) == 3]
    assert len(sweeps) == 3  # three paired blocks, one native capture each
    assert sorted(s.cohorts[0].native.seed for s in sweeps) == [0, 1, 2]  # type: ignore[union-attr]
    orders = []
    for s in sweeps:
        assert _mix7(s.cohorts) == MIX7
        assert s.arrivals == Burst(at_s=0.0) and s.lock == "length"
        assert {a.pool.name for a in s.arms if a.pool} == {"pool_910c_qwen3_8b.yaml"}
        orders.append([a.overrides["main"].kv_cache_gib for a in s.arms])
    assert orders == [[16, 32, 40], [40, 32, 16], [16, 32, 40]]  # alternating execution order
    (loop,) = [s for s in scenarios if len(s.arms) == 1]
    assert _mix7(loop.cohorts) == {"refinement_loop": 64}
    assert loop.arms[0].overrides == {}  # the pool as written: the paper's 31.99 GiB, rounded
    assert Counter(len(s.arms) for s in suite.load_scenarios("demo")) == {3: 3, 1: 1}


def test_paper_p95_is_the_papers_index() -> None:
    lats = [float(i) for i in range(64)]
    assert paper_p95(lats) == 60.0  # zero-based index ceil(.95 * 63) = 60
    assert paper_p95([5.0, 1.0]) == 5.0 and paper_p95([2.0]) == 2.0


def test_rows_follow_the_papers_within_block_ratios() -> None:
    """The paper's three within-block 40/16 GiB ratios give its medians (−51.97 %, −17.49 %)."""
    factor_ratios = (0.470470, 0.480313, 0.490570)
    p95_ratios = (0.822051, 0.825358, 0.825079)
    blocks = [
        {
            16.0: _fig(2.0, 460, 100.0),
            32.0: _fig(1.8, 450, 90.0),
            40.0: _fig(2.0 * f, 100 + i, 100.0 * p),
        }
        for i, (f, p) in enumerate(zip(factor_ratios, p95_ratios, strict=True))
    ]
    loops = [_fig(1.0, 0, 50.0)] * 3
    rows = figure_rows(blocks, loops, sweep_setup="ours", loop_setup="loop")
    paper = {r["figure"]: r for r in rows[: len(FIGURES)]}
    assert [r["figure"] for r in rows[: len(FIGURES)]] == [f.figure for f in FIGURES]
    factor = paper[finding_f2.FACTOR_CHANGE.figure]
    assert factor["measured"] == pytest.approx(-51.9687, abs=1e-3)
    assert factor["measured_range"] == "-52.95–-50.94" and factor["blocks"] == 3
    assert paper[finding_f2.P95_CHANGE.figure]["measured"] == pytest.approx(-17.4921, abs=1e-3)
    assert paper[finding_f2.FEWER_PREEMPTIONS.figure]["measured"] == 1.0
    assert paper[finding_f2.NATIVE_PREEMPTIONS.figure]["measured"] == 450.0
    assert paper[finding_f2.NATIVE_FACTOR.figure]["measured"] == pytest.approx(1.8)
    assert paper[finding_f2.LOOP_PREEMPTIONS.figure]["measured"] == 0.0
    assert {r["verdict"] for r in rows[: len(FIGURES)]} == {"reproduced"}
    details = rows[len(FIGURES) :]
    assert len(details) == 3 * 3 + 3
    assert [d["monotone_in_budget"] for d in details if "monotone_in_budget" in d] == [True] * 3


def test_rows_say_what_did_not_reproduce() -> None:
    """No preemption anywhere: the changes are zero (not reproduced), the native factor of one
    is not the paper's 1.8×, and a block without a 40 GiB arm has no value."""
    flat = {16.0: _fig(1.0, 0, 10.0), 32.0: _fig(1.0, 0, 10.0), 40.0: _fig(1.0, 0, 10.0)}
    rows = figure_rows([flat, flat], [_fig(1.0, 0, 5.0)])
    verdicts = {r["figure"]: r["verdict"] for r in rows[: len(FIGURES)]}
    assert verdicts[finding_f2.FACTOR_CHANGE.figure] == "not reproduced"
    assert verdicts[finding_f2.P95_CHANGE.figure] == "not reproduced"
    assert verdicts[finding_f2.FEWER_PREEMPTIONS.figure] == "differs"
    assert verdicts[finding_f2.NATIVE_FACTOR.figure] == "not reproduced"
    assert verdicts[finding_f2.LOOP_PREEMPTIONS.figure] == "reproduced"
    missing = figure_rows([{16.0: _fig(2.0, 9, 10.0), 32.0: _fig(1.0, 0, 9.0)}], [])
    assert missing[0]["verdict"] == "no value" and missing[0]["measured"] is None


def test_monotone_needs_both_figures_to_fall() -> None:
    assert monotone({16.0: _fig(2.0, 9, 10.0), 32.0: _fig(1.5, 3, 9.0), 40.0: _fig(1.0, 0, 8.0)})
    assert not monotone({16.0: _fig(2.0, 9, 10.0), 40.0: _fig(1.0, 0, 11.0)})
    assert not monotone({16.0: _fig(2.0, 9, 10.0), 40.0: _fig(1.0, 0, None)})


def test_demo_suite_runs_and_reports_the_paper_rows(prefect_api: None) -> None:
    res = run_suite(SUITE, scale="demo", prefect=False)
    assert isinstance(res.detail, ReplaySuiteResult)
    rows = res.detail.findings
    assert [r["figure"] for r in rows[: len(FIGURES)]] == [f.figure for f in FIGURES]
    assert all(r["blocks"] == 3 for r in rows[:5])  # three paired blocks of the sweep
    assert "3 block(s)" in rows[0]["our_setup"] and "7 roots" in rows[0]["our_setup"]
    details = [r for r in rows[len(FIGURES) :] if r["figure"].startswith("sweep")]
    assert len(details) == 3 * 3
    for i in range(3):
        block = [r for r in details if r["figure"].startswith(f"sweep block {i} ")]
        assert [r["kv_cache_gib"] for r in block] == [16.0, 32.0, 40.0]
        factors = [r["prefill_factor"] for r in block]
        assert all(f >= 1.0 - 1e-12 for f in factors)
        assert factors == sorted(factors, reverse=True)  # more KV never adds recomputation
        assert all(r["completed_roots"] == "7/7" for r in block)
        assert all(0 < r["peak_running_seqs"] <= 128 for r in block)


def test_doctests() -> None:
    assert doctest.testmod(finding_f2).failed == 0
