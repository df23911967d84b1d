"""§6.5 / App. G mix suites: the cohort attribution on hand-computed figures, the suite files at
both scales, and the three suites at demo scale (the co-batching metric: `tests/metrics`).

Directions are asserted only where the mechanism guarantees them at demo scale: both temporal
arms replay the same ops with the same tokens, and the targets' work is the same under every
background (one native run per recipe). Other figures are checked for shape and range.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from maserve_prefect.bench.flow import run_suite
from maserve_prefect.bench.replay import finding_mix as fm
from maserve_prefect.bench.replay.paper import PAPER_COLUMNS, VERDICTS
from maserve_prefect.bench.replay.suite import ReplaySuiteResult
from maserve_prefect.bench.replay.suite_file import ReplaySuite
from maserve_prefect.bench.suite import load_suite
from maserve_prefect.replay.scenario import Slots

SUITES = Path(__file__).resolve().parents[2] / "deployments" / "suites"


def test_pre_submission_share_is_a_ratio_of_mean_changes() -> None:
    # block changes: latency +10 / +2 s, pre-submission +6 / 0 s, backend wait +1 / +1 s
    figs = [(10.0, 20.0, 1.0, 7.0, 0.0, 1.0), (10.0, 12.0, 2.0, 2.0, 1.0, 2.0)]
    assert fm.pre_submission_share(figs) == pytest.approx(100 * 3 / 6)
    assert fm.pre_submission_share(figs, with_backend_wait=True) == pytest.approx(100 * 4 / 6)
    assert fm.pre_submission_share([*figs, None]) is None  # a missing block is not skipped
    assert fm.pre_submission_share([(1.0, 1.0, 0.0, 0.5, 0.0, 0.0)]) is None  # no change


@pytest.mark.parametrize("name", ["temporal_mixing", "background", "cohorts"])
def test_suite_files_load_at_both_scales(name: str) -> None:
    suite = load_suite(SUITES / f"finding_{name}.yaml")
    assert isinstance(suite, ReplaySuite) and suite.analysis_fn() is not None
    for scale in ("demo", "full"):
        assert suite.load_scenarios(scale)


def test_full_temporal_population_is_the_papers() -> None:
    suite = load_suite(SUITES / "finding_temporal_mixing.yaml")
    assert isinstance(suite, ReplaySuite)
    (sc,) = suite.load_scenarios("full")
    users: dict[tuple[str, str], int] = {}
    for c in sc.cohorts:
        assert c.native is not None
        key = (c.role, c.native.workflow)
        users[key] = users.get(key, 0) + c.native.users
    assert users == {
        ("target", "refinement_loop"): 9,
        ("background", "refinement_loop"): 19,
        ("background", "spawn"): 18,
        ("background", "fork_join"): 18,
    }
    assert isinstance(sc.arrivals, Slots) and sc.blocks == 3
    assert [sc.placement_of(a) for a in sc.arms] == ["round_robin", "concatenated"]


def _demo(name: str) -> ReplaySuiteResult:
    res = run_suite(SUITES / f"finding_{name}.yaml", scale="demo", prefect=False)
    assert isinstance(res.detail, ReplaySuiteResult)
    rows = res.detail.findings
    assert rows and all(tuple(r) == PAPER_COLUMNS and r["verdict"] in VERDICTS for r in rows)
    return res.detail


def test_temporal_mixing_demo(prefect_api: None) -> None:
    detail = _demo("temporal_mixing")
    res = detail.results["mix-temporal"]
    a, b = res.by_arm()["interleaved"][0].run, res.by_arm()["clustered"][0].run

    def work(run: object) -> list[tuple[str, int, int]]:
        ops = run.trace.ops  # type: ignore[attr-defined]
        return sorted((o.op_id, o.num_input_tokens, o.num_output_tokens) for o in ops)

    assert work(a) == work(b)  # fixed work: only the background's slots differ
    rows = {r["figure"]: r for r in detail.findings}
    for fig in (fm.TEMPORAL["all_a"], fm.TEMPORAL["all_b"]):
        assert 0.0 <= rows[fig.figure]["measured"] <= 100.0
    assert rows[fm.TEMPORAL["batch_a"].figure]["measured"] >= 1.0


def test_background_demo(prefect_api: None) -> None:
    detail = _demo("background")
    rows = {r["figure"]: r for r in detail.findings}
    # one native run per recipe: the targets replay the same work under every background
    assert "targets' work identical" in rows[fm.BACKGROUND["near_root"].figure]["our_setup"]
    assert rows[fm.BACKGROUND["het_tokens"].figure]["measured"] > 1.0  # more background work


def test_cohorts_demo(prefect_api: None) -> None:
    detail = _demo("cohorts")
    ratios = fm.class_ratios(detail.results)
    assert set(ratios) == {
        "spawn", "fork_join", "refinement_loop", "debate", "spawn_fork_join_refinement",
        "fork_join_debate_refinement", "research_review_writing",
    }  # fmt: skip
    assert all(r is not None and r > 0 for v in ratios.values() for r in v["ratio"])
