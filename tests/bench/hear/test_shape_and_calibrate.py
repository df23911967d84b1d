"""Shape comparison against the paper's tables, and the FCFS-only SCBench calibration sweep."""

from __future__ import annotations

import doctest
import math
from pathlib import Path

import pytest

from maserve_prefect.bench.hear import calibrate, shape
from maserve_prefect.bench.hear.calibrate import choose, grid_points, run_calibration, score_row
from maserve_prefect.bench.hear.mooncake_suite import PAPER_TABLE4, SHAPE_METRICS, shape_table
from maserve_prefect.bench.hear.shape import effect, shape_rows, sign
from maserve_prefect.bench.hear.suite_file import Calibration, FcfsTarget, MooncakeSuite
from maserve_prefect.bench.runner import execute_suite
from maserve_prefect.bench.suite import load_suite
from maserve_prefect.errors import ConfigError

SUITES = Path(__file__).resolve().parents[3] / "deployments" / "suites"
TARGET = FcfsTarget(makespan_s=481, ttft_p50_s=63.1, ttft_p95_s=74.2, ttft_max_s=79.0,
                    followup_reuse=0.192)  # fmt: skip


def test_doctests() -> None:
    for mod in (shape, calibrate):
        res = doctest.testmod(mod)
        assert res.attempted > 0 and res.failed == 0


def test_effects_are_oriented_so_that_above_one_is_better() -> None:
    assert effect(163.9, 86.8, lower_is_better=True) == pytest.approx(1.888, abs=1e-3)
    assert effect(122.7, 128.3, lower_is_better=False) == pytest.approx(1.0456, abs=1e-4)
    assert math.isnan(effect(1.0, 0.0, lower_is_better=True))
    assert [sign(x) for x in (1.03, 0.97, 1.0, math.nan)] == ["+", "-", "=", "?"]


def test_the_papers_own_table_agrees_with_itself_in_shape() -> None:
    """Comparing Table 4 with itself: every order identical (tau 1 where it is defined) and
    every sign agreeing — the comparison cannot disagree for a reason of its own."""
    rows = [{"load": load, "policy": arm, **vals}
            for load, arms in PAPER_TABLE4.items() for arm, vals in arms.items()]  # fmt: skip
    table = shape_table(rows)
    assert len(table) == 3 * len(SHAPE_METRICS)
    for r in table:
        assert r["measured_order"] == r["paper_order"]
        assert math.isnan(r["kendall_tau"]) or r["kendall_tau"] == pytest.approx(1.0)
        assert r["signs_agree"] == "4/4"


def test_shape_rows_report_a_reversed_effect() -> None:
    measured = {"fcfs": {"t": 10.0}, "ca": {"t": 20.0}, "g": {"t": 10.1}}
    paper = {"fcfs": {"t": 10.0}, "ca": {"t": 5.0}, "g": {"t": 7.0}}
    (row,) = shape_rows(measured, paper, {"t": True})
    assert row["signs"] == "ca -/+, g =/+" and row["signs_agree"] == "0/2"
    assert row["measured_order"] == "fcfs = g > ca" and row["paper_order"] == "ca > g > fcfs"
    assert row["kendall_tau"] < 0


def test_calibration_score_and_choice() -> None:
    near = score_row({"makespan_s": 500.0, "ttft_p50_s": 60.0, "ttft_p95_s": 70.0,
                      "ttft_max_s": 80.0, "followup_reuse": 0.3}, TARGET, 0.15)  # fmt: skip
    far = score_row({"makespan_s": 600.0, "ttft_p50_s": 63.1, "ttft_p95_s": 74.2,
                     "ttft_max_s": 79.0, "followup_reuse": 0.192}, TARGET, 0.15)  # fmt: skip
    assert near["within"] and not far["within"]
    assert near["score"] == pytest.approx(max(19 / 481, 3.1 / 63.1))
    assert choose([far, near]) == 1
    with pytest.raises(ConfigError, match="no points"):
        choose([])


def test_calibration_sweep_runs_fcfs_only_and_marks_the_frozen_point() -> None:
    suite = load_suite(SUITES / "hear_scbench.yaml")
    small = suite.model_copy(update={"calibration": Calibration(
        target=TARGET, grid={"num_sessions": (16, 32)})})  # fmt: skip
    seen: list[str] = []
    report = run_calibration(small, "demo", lambda d, t, label: seen.append(label))
    rows = report.tables["calibration"].rows
    assert seen == ["num_sessions=16", "num_sessions=32"] and len(rows) == 2
    assert [r["frozen"] for r in rows] == [False, True]  # the demo runs 32 sessions
    assert sum(r["chosen"] for r in rows) == 1
    assert report.summary["chosen"] == {"num_sessions": rows[choose(rows)]["num_sessions"]}
    # more sessions, more load: the sweep is not a constant
    assert rows[1]["makespan_s"] > rows[0]["makespan_s"]


def test_the_frozen_full_workload_is_the_committed_sweeps_choice() -> None:
    suite = load_suite(SUITES / "hear_scbench.yaml")
    cal = suite.calibration  # type: ignore[union-attr]
    assert cal is not None and len(grid_points(cal)) == 90
    text = (SUITES / "hear_scbench.calibration.md").read_text()
    chosen = [
        line for line in text.splitlines() if line.startswith("| ") and "| True | True |" in line
    ]
    assert len(chosen) == 1  # the chosen point is the suite file's (frozen) workload
    w = suite.scaled("full").workload  # type: ignore[union-attr]
    cells = [c.strip() for c in chosen[0].strip("|").split("|")]
    assert (int(cells[0]), int(cells[1]), float(cells[2])) == (
        w.num_sessions, w.max_context_tokens, w.arrival_rate_per_s)  # fmt: skip


def test_calibrate_and_trace_apply_to_their_suites_only(tmp_path: Path) -> None:
    mooncake = load_suite(SUITES / "hear_mooncake.yaml")
    with pytest.raises(ConfigError, match="--calibrate applies to a HEAR scbench suite"):
        execute_suite(mooncake, "demo", prefect=False, calibrate=True)
    scbench = load_suite(SUITES / "hear_scbench.yaml")
    with pytest.raises(ConfigError, match="--trace applies to a HEAR mooncake suite"):
        execute_suite(scbench, "demo", prefect=False, trace=tmp_path / "t.jsonl")
    assert isinstance(mooncake, MooncakeSuite)
    with pytest.raises(ConfigError, match="no such file"):
        mooncake.with_trace(tmp_path / "missing.jsonl")


def test_a_mooncake_suite_reads_the_trace_it_is_given(tmp_path: Path) -> None:
    rows = [f'{{"timestamp": {1000 * i}, "input_length": {600 + 700 * i}, "output_length": 20, '
            f'"hash_ids": {list(range(2 + i))}}}' for i in range(3)]  # fmt: skip
    trace = tmp_path / "mine.jsonl"
    trace.write_text("\n".join(rows) + "\n")
    suite = load_suite(SUITES / "hear_mooncake.yaml")
    res = execute_suite(suite, "demo", prefect=False, trace=trace)
    assert f"trace {trace}" in res.report.header[0]
    arms = res.tables()["arms"]
    assert {r["num_completed"] for r in arms} == {3} and len(arms) == 15
    assert all(r["paper_ttft_p50_s"] == PAPER_TABLE4[r["load"]][r["policy"]]["ttft_p50_s"]
               for r in arms)  # fmt: skip
