"""The demand-population summaries (`bench.replay.demand_population`) on hand-made cases, and
the pool a suite's native cohort is realized on (`replay.traceset.realization_pool`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from maserve_prefect.bench.replay import demand_population as dp
from maserve_prefect.errors import ConfigError
from maserve_prefect.replay.scenario import parse_scenario
from maserve_prefect.replay.traceset import realization_pool


def test_paper_g5_figures_are_the_three_blocks_totals() -> None:
    assert dp.PAPER_G5_INPUT_PER_CALL == pytest.approx(276_848 / 402)
    assert dp.PAPER_G5_OUTPUT_PER_CALL == pytest.approx(1_054_088 / 402)
    assert dp.PAPER_G5_CALLS_PER_ROOT == pytest.approx(134 / 64)


def test_weighted_stats_give_each_cohort_its_share_of_the_population() -> None:
    loop = dp.Cohort("refinement_loop", "math", 2, 62.0)
    spawn = dp.Cohort("spawn", "math", 1, 2.0)
    realized = {
        loop: [[(100, 1000), (100, 1000)], [(300, 3000), (300, 3000)]],
        spawn: [[(1000, 100)] * 6],
    }
    s = dp.weighted_stats(realized)
    # 62 roots x 2 calls at mean (200, 2000) and 2 roots x 6 calls at (1000, 100)
    assert s.calls_per_root_mean == pytest.approx((62 * 2 + 2 * 6) / 64)
    assert s.input_mean == pytest.approx((124 * 200 + 12 * 1000) / 136)
    assert s.output_mean == pytest.approx((124 * 2000 + 12 * 100) / 136)
    assert (s.roots, s.calls, s.max_context) == (3, 10, 3300)
    # weighted quantiles: the Spawn calls weigh 12/136 < 10 % of the calls
    assert (s.output_p50, s.output_p90, s.input_p50, s.input_p90) == (1000, 3000, 300, 300)


def test_g5_cohorts_stand_for_the_papers_64_roots() -> None:
    cohorts = dp.g5_cohorts(3)
    assert sum(c.weight_roots for c in cohorts) == pytest.approx(64)
    assert [c.workflow for c in cohorts].count("refinement_loop") == 3
    with pytest.raises(ConfigError):
        dp.g5_cohorts(0)
    with pytest.raises(ConfigError):
        dp.call_stats([])


def test_rows_put_ours_beside_the_papers_with_ratios() -> None:
    s = dp.call_stats([[(689, 2622)]])
    rows = {r[1]: r for r in dp.rows("g5", s, dp.g5_paper())}
    assert rows["output tokens per call, mean"][4] == "1.00x"
    assert rows["input tokens per call, P90"][3:] == ["-", "-"]


def test_native_cohorts_are_realized_on_the_arms_pool_unless_the_recipe_names_one() -> None:
    base = Path("/suites/scenarios")
    sc = parse_scenario(
        {
            "name": "x",
            "cohorts": [
                {"name": "a", "native": {"workflow": "spawn"}},
                {"name": "b", "native": {"workflow": "spawn", "pool": "other.yaml"}},
            ],
            "arms": [{"name": "kv16", "pool": "pool_910c_qwen3_8b.yaml"}],
        },
        base_dir=base,
    )
    assert realization_pool(sc, sc.cohorts[0]) == base / "pool_910c_qwen3_8b.yaml"
    assert realization_pool(sc, sc.cohorts[1]) == base / "other.yaml"
    bare = parse_scenario(
        {
            "name": "y",
            "cohorts": [{"name": "a", "native": {"workflow": "spawn"}}],
            "arms": [{"name": "a"}],
        }
    )
    assert realization_pool(bare, bare.cohorts[0]) is None
