"""§6.2 generated-demand suites (finding_context, finding_demand): files, demo runs, analysis rows.

Directions are asserted only where the mechanism guarantees them: Selected delivers a subset of
each analysis, so every block's input work per root falls; the analysts are given the same
context in both cells of a block and do the same work. Figures are recomputed from the replay
traces, never hard-coded; the paper-row arithmetic is checked on hand-made figures.
"""

from __future__ import annotations

import doctest
import math
from pathlib import Path

import pytest

from maserve_prefect.bench.flow import run_suite
from maserve_prefect.bench.replay import finding_demand as fd
from maserve_prefect.bench.replay.finding_demand import CohortFigures
from maserve_prefect.bench.replay.suite import ReplaySuiteResult
from maserve_prefect.bench.replay.suite_file import ReplaySuite
from maserve_prefect.bench.suite import load_suite
from maserve_prefect.errors import ConfigError
from maserve_prefect.trace.model import OpKind

SUITES = Path(__file__).resolve().parents[2] / "deployments" / "suites"


@pytest.mark.parametrize(
    ("name", "conditions", "full_roots"),
    [("context", {"full", "selected"}, 12), ("demand", {"ordinary", "spawn", "loop"}, 64)],
)
def test_suite_files_follow_the_paper_setup(
    name: str, conditions: set[str], full_roots: int
) -> None:
    suite = load_suite(SUITES / f"finding_{name}.yaml")
    assert isinstance(suite, ReplaySuite) and suite.analysis_fn() is not None
    for scale in ("demo", "full"):
        scenarios = suite.load_scenarios(scale)
        keys = {fd.condition_block(s.name, name) for s in scenarios}
        assert keys == {(c, b) for c in conditions for b in range(3)}  # three blocks per cell
        for sc in scenarios:
            assert {a.pool.name for a in sc.arms if a.pool} == {"pool_910c_qwen3_8b.yaml"}
            assert [a.release for a in sc.arms] == ["dag"] and sc.arrivals.kind == "burst"
            _, block = fd.condition_block(sc.name, name) or ("", -1)
            # a block is one native realization, shared by every condition of the block
            assert {c.native.seed for c in sc.cohorts if c.native} == {block}
            if scale == "full":
                assert sum(c.native.users for c in sc.cohorts if c.native) == full_roots


def _demo(name: str) -> ReplaySuiteResult:
    res = run_suite(SUITES / f"finding_{name}.yaml", scale="demo", prefect=False)
    assert isinstance(res.detail, ReplaySuiteResult)
    return res.detail


def _work(result: ReplaySuiteResult, scenario: str) -> dict[str, tuple[int, int]]:
    """Stage name → (input, output tokens) of each model call, keyed by root and stage."""
    trace = result.results[scenario].results[0].run.trace
    return {
        op.stage_id: (op.num_input_tokens or 0, op.num_output_tokens or 0)
        for op in trace.ops
        if op.kind is OpKind.MODEL
    }


def test_context_demo_suite_selected_delivers_less(prefect_api: None) -> None:
    result = _demo("context")
    rows = {r["figure"]: r for r in result.findings}
    for fig in (fd.CONTEXT_INPUT, fd.CONTEXT_KV, fd.CONTEXT_LATENCY):
        row = rows[fig.figure]
        assert row["paper"] == fig.value and row["blocks"] == 3 and row["verdict"]
    for block in range(3):
        full = _work(result, f"context-full-b{block}")
        selected = _work(result, f"context-selected-b{block}")
        assert full.keys() == selected.keys()
        for stage, (n_in, n_out) in full.items():
            if "analyst" in stage:  # same context, same work
                assert selected[stage] == (n_in, n_out)
            else:  # synthesis and verification are given less and redraw their work
                assert selected[stage][0] < n_in
    lo, hi = (float(x) for x in rows[fd.CONTEXT_INPUT.figure]["measured_range"].split("–", 1))
    assert lo <= hi < 0  # input work falls in every block


def test_demand_demo_suite_spawn_holds_more_state_than_ordinary(prefect_api: None) -> None:
    """The demand suite at demo scale (one user per binding cohort, 3 blocks): every paper row
    has a value in every block, and Spawn's six calls hold more KV memory-time than ordinary
    serving's one call in every block (the paper's sign, by construction of the work)."""
    result = _demo("demand")
    rows = {r["figure"]: r for r in result.findings}
    for fig in (fd.DEMAND_INTENSITY, fd.DEMAND_KV, fd.DEMAND_EXECUTION):
        row = rows[fig.figure]
        assert row["paper"] == fig.value and row["blocks"] == 3 and row["verdict"] != "no value"
    lo, _hi = (float(x) for x in rows[fd.DEMAND_KV.figure]["measured_range"].split("–", 1))
    assert lo > 1.0


def _figs(**over: float) -> CohortFigures:
    base = dict(
        roots=4, calls_per_root=4.0, input_per_root=1000.0, output_per_root=800.0,
        kv_gib_s=10.0, intensity=4.0, execution_s=100.0, mean_latency_s=50.0, completed=4,
    )  # fmt: skip
    return CohortFigures(**{**base, **over})  # type: ignore[arg-type]


def test_context_rows_from_hand_made_figures() -> None:
    figs = {
        "full": {0: _figs(), 1: _figs(), 2: _figs()},
        "selected": {
            0: _figs(input_per_root=700.0, kv_gib_s=7.0, mean_latency_s=47.5),
            1: _figs(input_per_root=710.0, kv_gib_s=8.0, mean_latency_s=48.0),
            2: _figs(input_per_root=690.0, kv_gib_s=7.5, mean_latency_s=49.0),
        },
    }
    rows = {r["figure"]: r for r in fd.context_figure_rows(figs)}
    assert rows[fd.CONTEXT_INPUT.figure]["measured"] == pytest.approx(-30.0)
    assert rows[fd.CONTEXT_INPUT.figure]["measured_range"] == "-31–-29"
    assert rows[fd.CONTEXT_KV.figure]["measured"] == pytest.approx(-25.0)
    assert rows[fd.CONTEXT_LATENCY.figure]["measured"] == pytest.approx(-4.0)
    assert {rows[f.figure]["verdict"] for f in (fd.CONTEXT_INPUT, fd.CONTEXT_KV)} == {"reproduced"}
    assert rows["selected: input tokens per root"]["measured"] == 700.0


def test_demand_rows_from_hand_made_figures() -> None:
    figs = {
        "ordinary": {b: _figs(execution_s=100.0 + b) for b in range(3)},
        "spawn": {b: _figs(intensity=6.8, kv_gib_s=140.0, execution_s=530.0) for b in range(3)},
        "loop": {b: _figs(intensity=4.4, kv_gib_s=60.0, execution_s=400.0) for b in range(3)},
    }
    rows = {r["figure"]: r for r in fd.demand_figure_rows(figs)}
    assert rows[fd.DEMAND_INTENSITY.figure]["measured"] == pytest.approx(1.7)
    assert rows[fd.DEMAND_KV.figure]["measured"] == pytest.approx(14.0)
    assert rows[fd.DEMAND_EXECUTION.figure]["measured"] == pytest.approx(530.0 / 101.0)
    assert rows[fd.ORDINARY_EXECUTION_S.figure]["measured_range"] == "100–102"
    assert rows[fd.SPAWN_EXECUTION_S.figure]["verdict"] == "reproduced"  # 530 s vs 580 s
    assert rows["Loop / ordinary KV memory–time (×)"]["measured"] == pytest.approx(6.0)
    assert rows["Loop / Spawn intensity (×)"]["measured"] == pytest.approx(4.4 / 6.8)
    with pytest.raises(ConfigError, match="no `demand-spawn-b<k>` scenario"):
        fd.demand_figure_rows({"ordinary": figs["ordinary"]})


def test_a_block_missing_from_one_condition_is_left_out_of_the_pairs() -> None:
    figs = {"full": {0: _figs(), 1: _figs()}, "selected": {1: _figs(input_per_root=500.0)}}
    row = fd.context_figure_rows(figs)[0]
    assert row["blocks"] == 1 and row["measured"] == pytest.approx(-50.0)
    assert math.isnan(fd.change_pct(0.0, 1.0))


def test_doctests() -> None:
    assert doctest.testmod(fd, raise_on_error=False).failed == 0
