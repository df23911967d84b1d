"""Finding 4's analysis (`bench.replay.finding_f4`): paired-block ratios, paper rows, arm pairing.

Hand-made `Cell`s check what the rows compute (per-block change, then the median across blocks,
the verdict); a small replay on the paper's pool checks that the two arms are told apart by
their request limit and that each figure is the block's own (recomputed here from its trace).
"""

from __future__ import annotations

import doctest
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from maserve_prefect.bench.replay import block_figures as bf
from maserve_prefect.bench.replay import finding_f4 as f4
from maserve_prefect.bench.replay.finding_f4 import BlockFigures, Cell
from maserve_prefect.errors import ConfigError
from maserve_prefect.replay.arms import ScenarioResult, run_scenario
from maserve_prefect.replay.scenario import load_scenario
from maserve_prefect.trace.bundle import export_bundle
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.model import (
    GenerationSettings,
    Manifest,
    OpKind,
    OpRecord,
    RootRecord,
    Trace,
)

POOL = Path(__file__).resolve().parents[2] / "deployments/suites/scenarios/pool_910c_qwen3_8b.yaml"


def test_doctests() -> None:
    assert doctest.testmod(f4).failed == 0


def _figs(tps: float, timely: float | None, min_class: float | None = 1.0) -> BlockFigures:
    return BlockFigures(tps, timely, timely, 1.0, min_class, 10.0, 64, 0)


def _cell(workload: str, rate: float, low: list[BlockFigures], high: list[BlockFigures]) -> Cell:
    return Cell(f"{workload}-{rate}", workload, rate, 180.0, 216, low, high)


def test_ordinary_rows_are_medians_of_per_block_changes() -> None:
    low = [_figs(100.0, 1.0), _figs(200.0, 2.0), _figs(50.0, 0.5)]
    high = [_figs(110.0, 0.8), _figs(240.0, 1.4), _figs(57.3, 0.3875)]
    # Per block: TPS +10 %, +20 %, +14.6 %; timely −20 %, −30 %, −22.5 %.
    lower_rate = _cell("ordinary", 0.6, [_figs(1.0, 1.0)] * 3, [_figs(1.0, 1.0)] * 3)
    rows = f4.rows_of_cells([lower_rate, _cell("ordinary", 1.2, low, high)])
    tps, timely = rows[0], rows[1]
    assert tps["figure"] == f4.ORDINARY_TPS.figure and tps["paper"] == 14.6
    assert tps["measured"] == pytest.approx(14.6) and tps["measured_range"] == "10–20"
    assert tps["verdict"] == "reproduced" and tps["blocks"] == 3
    assert timely["measured"] == pytest.approx(-22.5) and timely["verdict"] == "reproduced"
    assert "1.2 roots/s" in tps["our_setup"]  # the highest rate, not the first cell
    # No Loop or mixed cells: no rows for them; detail rows follow, by rate.
    details = rows[2:]
    assert {r["finding"] for r in details} == {"F4 detail"}
    assert [(r["rate_per_s"], r["max_num_seqs"]) for r in details] == [
        (0.6, 64), (0.6, 128), (0.6, "128 vs 64"), (1.2, 64), (1.2, 128), (1.2, "128 vs 64")
    ]  # fmt: skip
    assert details[3]["output_tps"] == 100.0 and details[4]["output_tps"] == 110.0
    assert details[5]["timely_change_pct"] == pytest.approx(-22.5)


def test_loop_rows_check_the_sign_only_and_mixed_the_ratio() -> None:
    loop = _cell("loop", 0.5, [_figs(100.0, 1.0)] * 3, [_figs(101.0, 1.2)] * 3)
    mixed = _cell("mixed", 0.2, [_figs(100.0, 1.0)] * 3, [_figs(100.0, 0.4)] * 3)
    rows = {r["figure"]: r for r in f4.rows_of_cells([loop, mixed]) if r["finding"] != "F4 detail"}
    assert rows[f4.LOOP_TPS.figure]["verdict"] == "direction"  # up, as the paper's sign
    assert rows[f4.LOOP_TPS.figure]["paper"] == "up (sign only)"
    assert rows[f4.LOOP_TIMELY.figure]["verdict"] == "not reproduced"  # +20 %, paper: down
    ratio = rows[f4.MIXED_TIMELY.figure]
    assert ratio["measured"] == pytest.approx(0.4) and ratio["verdict"] == "differs"


def test_a_block_without_a_timely_rate_gives_no_value() -> None:
    cell = _cell("ordinary", 1.2, [_figs(1.0, 1.0), _figs(1.0, 0.0)], [_figs(1.0, 1.0)] * 2)
    timely = f4.rows_of_cells([cell])[1]
    assert timely["measured"] is None and timely["verdict"] == "no value"


def _burst_trace(num_roots: int, out_tokens: int) -> Trace:
    roots = [RootRecord(root_id=f"r{i}", workflow="ordinary") for i in range(num_roots)]
    ops = [
        OpRecord(op_id=f"r{i}/m", root_id=f"r{i}", kind=OpKind.MODEL,
                 generation=GenerationSettings(deployment="main"),
                 num_input_tokens=64, num_output_tokens=out_tokens)
        for i in range(num_roots)
    ]  # fmt: skip
    return Trace(manifest=Manifest(trace_id="burst"), roots=roots, ops=ops)


def _scenario(tmp_path: Path, arms: list[dict[str, object]]) -> Path:
    export_bundle(_burst_trace(160, 32), MemoryStore(), tmp_path / "bundle")
    data = {
        "name": "toy-f4",
        "cohorts": [{"name": "ordinary", "bundle": "bundle"}],
        "lock": "length",
        "arrivals": {"kind": "poisson", "rate_per_s": 400.0, "seed": 0},
        "window": {"end_s": 0.4},
        "deadlines": {"classes": {"ordinary": 30.0}},
        "blocks": 2,
        "arms": arms,
    }
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _arm(name: str, limit: int) -> dict[str, object]:
    return {"name": name, "pool": str(POOL), "overrides": {"main": {"max_num_seqs": limit}}}


def test_cell_pairs_the_arms_by_their_limit_and_keeps_each_block(tmp_path: Path) -> None:
    """160 single-call roots in 0.4 s: the limit binds, so the two arms differ, whatever their
    names or order in the file."""
    path = _scenario(tmp_path, [_arm("big", 128), _arm("small", 64)])
    result = run_scenario(load_scenario(path), prefect=False)
    cell = f4.cell_of("toy", result)
    assert cell.workload == "ordinary" and cell.rate_per_s == 400.0 and cell.window_s == 0.4
    assert [f.peak_running_seqs for f in cell.low] == [64, 64]
    assert [f.peak_running_seqs for f in cell.high] == [128, 128]
    by_arm = result.by_arm()
    for figs, arm in ((cell.low, "small"), (cell.high, "big")):
        for f, run in zip(figs, by_arm[arm], strict=True):
            assert f.output_tps == bf.output_tps(result, run.run)
            dl = bf.run_deadline_figures(result, run.run)
            assert dl is not None and f.timely_rate_per_s == dl.timely_rate_per_s
    # Blocks differ (fresh arrival seed per block) and the change is per block.
    assert cell.tps_change_pct() == [
        f4.change_pct(a.output_tps, b.output_tps) for a, b in zip(cell.low, cell.high, strict=True)
    ]
    assert cell.low[0].output_tps != cell.low[1].output_tps


def test_a_scenario_without_both_limits_is_refused(tmp_path: Path) -> None:
    path = _scenario(tmp_path, [_arm("small", 64), _arm("other", 32)])
    result = ScenarioResult(load_scenario(path), cast(Any, None), {}, {})  # nothing replayed
    with pytest.raises(ConfigError, match="no arm sets max_num_seqs 128"):
        f4.cell_of("toy", result)
