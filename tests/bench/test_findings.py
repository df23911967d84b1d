"""The four seed-finding suites at demo scale, and their analysis rows.

Directions are asserted only where the mechanism guarantees them at demo scale: barrier edges only
add waits (Barrier ≥ DAG root latency at low load); a smaller KV budget can only add
recomputation (prefill factor non-increasing in the budget). Other rows are checked for shape and
range only. Figures are never hard-coded: where a figure is checked, the test computes it again
from the replay traces with the metrics library.
"""

from __future__ import annotations

import doctest
import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from bench_factories import make_trace

from maserve_prefect.bench.flow import run_suite
from maserve_prefect.bench.replay import block_figures, finding_f4, findings
from maserve_prefect.bench.replay.block_figures import DeadlineFigures, deadline_figures
from maserve_prefect.bench.replay.paper import VERDICTS
from maserve_prefect.bench.replay.suite import ReplaySuiteResult
from maserve_prefect.bench.replay.suite_file import ReplaySuite
from maserve_prefect.bench.suite import load_suite
from maserve_prefect.metrics.task import RootStatus, root_latencies
from maserve_prefect.replay.arms import run_scenario
from maserve_prefect.replay.scenario import load_scenario
from maserve_prefect.trace.bundle import export_bundle
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    Manifest,
    OpKind,
    OpRecord,
    OpStatus,
    OpTimes,
    RootRecord,
    Trace,
)

SUITES = Path(__file__).resolve().parents[2] / "deployments" / "suites"
NAMES = ("barrier", "kv_budget", "rate_sweep", "request_limit")
PAPER_POOLS = {
    "barrier": {"pool_910c_qwen3_8b.yaml", "pool_rtxpro5000_qwen3_8b.yaml"},
    "kv_budget": {"pool_910c_qwen3_8b.yaml"},
    "rate_sweep": {"pool_910c_qwen3_8b.yaml"},
    "request_limit": {"pool_910c_qwen3_8b.yaml"},
}
"""Suites that follow the paper's protocol → the paper's pool files their scenarios use (their
own tests: tests/bench/test_finding_f1.py, test_finding_f2.py, test_finding_f3.py, test_finding_f4.py)."""


def _range(text: str) -> tuple[float, float]:
    lo, hi = text.split("–")
    return float(lo), float(hi)


@pytest.mark.parametrize("name", NAMES)
def test_suite_files_load_at_both_scales(name: str) -> None:
    suite = load_suite(SUITES / f"finding_{name}.yaml")
    assert isinstance(suite, ReplaySuite)
    assert suite.analysis is not None and suite.analysis_fn() is not None
    for scale in ("demo", "full"):
        scenarios = suite.load_scenarios(scale)
        assert scenarios
        # One serving setup for every suite: the shared pool file, or the paper's pool files
        # for a suite that follows the paper's protocol (PAPER_POOLS).
        for sc in scenarios:
            pools = {a.pool.name for a in sc.arms if a.pool}
            assert len(pools) == 1 and pools <= PAPER_POOLS.get(name, {"pool_h100_qwen3_8b.yaml"})


def _replay(name: str) -> ReplaySuiteResult:
    res = run_suite(SUITES / f"finding_{name}.yaml", scale="demo", prefect=False)
    assert isinstance(res.detail, ReplaySuiteResult)
    assert res.tables().get("findings", []) == res.detail.findings
    return res.detail


def _run(name: str) -> list[dict[str, object]]:
    return _replay(name).findings


def test_request_limit_suite_rows(prefect_api: None) -> None:
    """Finding 4 at demo scale: the paper rows (ordinary, Loop, MIX7 at their highest rate) and a
    detail row per workload, rate and limit, with the engine honouring each limit."""
    result = _replay("request_limit")
    rows = result.findings
    paper = [r for r in rows if r["finding"] != "F4 detail"]
    assert [r["figure"] for r in paper] == [
        f.figure
        for f in (
            finding_f4.ORDINARY_TPS,
            finding_f4.ORDINARY_TIMELY,
            finding_f4.LOOP_TPS,
            finding_f4.LOOP_TIMELY,
            finding_f4.MIXED_TIMELY,
        )
    ]
    assert all(r["blocks"] == 1 and r["verdict"] in VERDICTS for r in paper)
    details = [r for r in rows if r["finding"] == "F4 detail" and r["max_num_seqs"] in (64, 128)]
    assert len(details) == 3 * 3 * 2
    for r in details:
        assert r["output_tps"] > 0 and 0.0 <= r["attainment"] <= 1.0
        assert 0 < r["peak_running_seqs"] <= r["max_num_seqs"]  # the engine honours the limit
    # The mixed cohort has the seven classes, each with its own locked deadline.
    assert len(result.results["f4-mix7-r0.2"].deadlines_s) == 7


def test_rows_give_the_median_and_range_across_blocks(tmp_path: Path) -> None:
    """Three paired blocks of a small bundle scenario: each figure is the median of the
    per-block figures (recomputed here from each block's replay trace), not a pooled one."""
    export_bundle(make_trace(8, side=True), MemoryStore(), tmp_path / "bundle")
    scenario = {
        "name": "toy-blocks",
        "cohorts": [{"name": "t", "bundle": "bundle"}],
        "lock": "length",
        "arrivals": {"kind": "poisson", "rate_per_s": 4.0, "seed": 0},
        "blocks": 3,
        "arms": [
            {"name": "dag", "release": "dag"},
            {"name": "barrier", "release": "barrier", "barrier": [{"src": "r0/c", "dst": "r0/b"}]},
        ],
    }
    (tmp_path / "toy.yaml").write_text(yaml.safe_dump(scenario))
    result = run_scenario(load_scenario(tmp_path / "toy.yaml"), prefect=False)
    (row,) = findings.barrier_rows({"toy": result})
    assert row["blocks"] == 3 and row["class"] == "toy"
    for arm in ("dag", "barrier"):
        per_block = [
            float(np.percentile([r.latency_s for r in root_latencies(res.run.trace)], 95))
            for res in result.by_arm()[arm]
        ]
        assert row[f"{arm}_p95_s"] == pytest.approx(float(np.median(per_block)))
        pooled = [
            r.latency_s for res in result.by_arm()[arm] for r in root_latencies(res.run.trace)
        ]
        assert row[f"{arm}_p95_s"] != pytest.approx(float(np.percentile(pooled, 95)))
        lo, hi = _range(row[f"{arm}_p95_s_range"])
        assert lo == pytest.approx(min(per_block), rel=1e-3)
        assert hi == pytest.approx(max(per_block), rel=1e-3)


def _op(op_id: str, status: OpStatus, done_s: float | None, *deps: str) -> OpRecord:
    return OpRecord(
        op_id=op_id,
        root_id=op_id.split("/")[0],
        kind=OpKind.MODEL,
        status=status,
        times=OpTimes(ready_s=0.0, completed_s=done_s),
        deps=tuple(Dep(op_id=d, kind=EdgeKind.CONTROL) for d in deps),
    )


def test_failed_or_unfinished_roots_never_meet_their_deadline() -> None:
    """Each root's ops finish well within the deadline, but `b` has a failed op and `c` one
    that never completed: only `a` meets the deadline, and only `a` counts as completed."""
    C, F, P = OpStatus.COMPLETED, OpStatus.FAILED, OpStatus.INCOMPLETE
    trace = Trace(
        manifest=Manifest(trace_id="t"),
        roots=[RootRecord(root_id=r, workflow="w", arrival_s=t) for r, t in (("a", 0), ("b", 1), ("c", 2))],
        ops=[
            _op("a/0", C, 1.0), _op("a/1", C, 1.5, "a/0"),
            _op("b/0", C, 2.0), _op("b/1", F, 2.5, "b/0"),
            _op("c/0", C, 3.0), _op("c/1", P, None, "c/0"),
        ],
    )  # fmt: skip
    outcomes = root_latencies(trace)
    assert [r.status for r in outcomes] == [
        RootStatus.COMPLETED,
        RootStatus.FAILED,
        RootStatus.INCOMPLETE,
    ]
    figs = deadline_figures(outcomes, {"w": 10.0}, window=(0.0, 4.0), last_completion_s=8.0)
    assert figs is not None
    assert figs.attainment == pytest.approx(1 / 3) and figs.per_class == {"w": pytest.approx(1 / 3)}
    assert figs.completion_ratio == pytest.approx(1 / 3)
    # declared T = 4 s: one timely root (a) per 4 s; drain-inclusive over max(4, 8 - 0) = 8 s
    assert figs.goodput_per_s == pytest.approx(0.25)
    assert figs.timely_rate_per_s == pytest.approx(1 / 8)
    # backlog at 4 s: b failed and c never finished -> 2; at 2 s: only b (arrived at 1) -> 1
    assert (figs.backlog, figs.backlog_growth) == (2, 1)
    # without a declared window: no goodput, and λ*'s backlog guard cannot pass
    bare = deadline_figures(outcomes, {"w": 10.0})
    assert bare is not None and math.isnan(bare.goodput_per_s) and bare.backlog == math.inf
    assert deadline_figures(outcomes, {"other": 10.0}) is None


def _figs(att: float, completion: float = 1.0, backlog: float = 0.0) -> DeadlineFigures:
    return DeadlineFigures(
        att, {"x": att, "y": min(1.0, att + 0.05)}, 1.0, completion, 10, backlog=backlog
    )


def test_lambda_star_of_a_sweep_is_the_minimum_across_blocks() -> None:
    by_load = {
        1.0: [_figs(1.0), _figs(0.95), _figs(0.97)],  # min x 0.95: passes at 0.95
        2.0: [_figs(0.97), _figs(0.96), _figs(0.94)],  # median 0.96, but min x 0.94: fails
        4.0: [_figs(0.99, 0.5), _figs(0.99), _figs(0.99)],  # one block fails completion
        8.0: [_figs(0.99), _figs(0.99, backlog=5), _figs(0.99)],  # one block: 5 left at T
        16.0: [_figs(0.5), _figs(0.4), _figs(0.3)],
    }
    together, per_block = block_figures.sweep_lambda_star(by_load)  # α = 0.95
    assert together == 1.0
    # Each block's own sweep: block 0 passes 1, 2 and 8 (4 fails completion); block 1 passes 1,
    # 2, 4 (8 fails its backlog); block 2 passes 1, 4, 8 (2 has 0.94).
    assert per_block == [8.0, 4.0, 8.0]
    assert block_figures.sweep_lambda_star(by_load, alpha=0.9)[0] == 2.0
    missing = {1.0: [_figs(1.0)], 2.0: [None]}
    assert block_figures.sweep_lambda_star(missing) == (1.0, [1.0])


def test_range_text_and_spread() -> None:
    assert block_figures.range_text([2.0, 1.0]) == "1–2"
    assert block_figures.range_text([None, None]) == "none–none"
    assert block_figures.spread([1.0, None]) is None
    assert re.fullmatch(r"[0-9.]+–[0-9.]+", block_figures.range_text([1 / 3, 2 / 3]))


def test_direction_and_kv_helpers() -> None:
    assert findings.direction(2.0, 1.0) == "down"
    assert findings.direction(1.0, 1.0) == "flat"
    assert findings.direction(None, 1.0) == "n/a"
    assert findings.kv_gib_of({"main": {"max_num_seqs": 4}}) is None


@pytest.mark.parametrize("module", [findings, block_figures])
def test_doctests(module: object) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert result.attempted > 0 and result.failed == 0
