"""Mode calibration filters a candidate on one check alone: quality only, or stability only.

Each case pits a safe baseline against a candidate that is the fastest by median makespan and
fails exactly one check; it must be filtered before ranking (the baseline wins), and relaxing
that one threshold must let it win (so it was that check, not the ranking, that kept it out).
"""

from __future__ import annotations

import pytest

from maserve_prefect.errors import ConfigError
from maserve_prefect.hear.mode_calibration import Calibration, DevRun, calibrate

# mode -> (makespans, qualities) per development run
RUNS: dict[str, tuple[list[float], list[float]]] = {
    "default": ([10.0, 10.1, 9.9], [1.0, 1.0, 1.0]),
    # fastest and steady, but every run scores under the floor: fails quality only
    "lossy": ([3.0, 3.0, 3.0], [0.4, 0.4, 0.4]),
    # fastest median and perfect scores, but its makespan swings: fails stability only
    "wobbly": ([3.0, 6.0, 3.0], [1.0, 1.0, 1.0]),
    # fastest and steady makespans, good enough scores that disagree: fails stability only
    "uneven": ([3.0, 3.0, 3.0], [1.0, 0.7, 1.0]),
}


def run_fn(role: str, mode: str, i: int) -> DevRun:
    return DevRun(RUNS[mode][0][i], output=i)


def quality_fn(role: str, mode: str, run: DevRun) -> float:
    assert isinstance(run.output, int)
    return RUNS[mode][1][run.output]


def calibrate_critic(
    modes: list[str],
    min_quality: float = 0.5,
    max_quality_spread: float = 0.0,
    max_makespan_cv: float = 0.2,
) -> Calibration:
    """Calibrate the role "critic" over `modes` (3 runs each) under the given thresholds."""
    return calibrate({"critic": modes}, run_fn, quality_fn, 3, version="t",
                     min_quality=min_quality, max_quality_spread=max_quality_spread,
                     max_makespan_cv=max_makespan_cv)  # fmt: skip


def test_a_candidate_failing_only_quality_is_filtered_before_ranking() -> None:
    cal = calibrate_critic(["default", "lossy"])
    by = {r.mode: r for r in cal.reports}
    assert not by["lossy"].passed_quality and by["lossy"].passed_stability
    assert by["lossy"].median_makespan_s < by["default"].median_makespan_s  # it would rank first
    assert by["default"].passed and cal.mapping.lookup("critic") == "default"
    # the quality floor alone kept it out
    relaxed = calibrate_critic(["default", "lossy"], min_quality=0.4)
    assert relaxed.mapping.lookup("critic") == "lossy"
    with pytest.raises(ConfigError, match="lossy: quality failed, stability ok"):
        calibrate_critic(["lossy"])


@pytest.mark.parametrize(
    ("mode", "relaxed_spread", "relaxed_cv"),
    [("wobbly", 0.0, 0.4), ("uneven", 0.5, 0.2)],  # each relaxes only the threshold it fails
)
def test_a_candidate_failing_only_stability_is_filtered_before_ranking(
    mode: str, relaxed_spread: float, relaxed_cv: float
) -> None:
    cal = calibrate_critic(["default", mode])
    by = {r.mode: r for r in cal.reports}
    assert by[mode].passed_quality and not by[mode].passed_stability
    assert by[mode].median_makespan_s < by["default"].median_makespan_s  # it would rank first
    assert by["default"].passed and cal.mapping.lookup("critic") == "default"
    # the one stability threshold alone kept it out
    relaxed = calibrate_critic(
        ["default", mode], max_quality_spread=relaxed_spread, max_makespan_cv=relaxed_cv
    )
    assert relaxed.mapping.lookup("critic") == mode
    if mode == "uneven":
        with pytest.raises(ConfigError, match=f"{mode}: quality ok, stability failed"):
            calibrate_critic([mode])
    else:  # a lone candidate is its own makespan reference: only its scores can be judged
        assert calibrate_critic([mode]).mapping.lookup("critic") == mode


def test_makespan_stability_is_judged_against_the_reference_on_the_same_set() -> None:
    """Development sets differ in size: a mode that halves every set's makespan is dependable
    even though its raw makespans swing (coefficient of variation 0.47) as the reference's do."""
    RUNS["halves"] = ([5.0, 10.0, 2.5], [1.0, 1.0, 1.0])
    RUNS["sized"] = ([10.0, 20.0, 5.0], [1.0, 1.0, 1.0])
    try:
        cal = calibrate_critic(["sized", "halves"])
        by = {r.mode: r for r in cal.reports}
        assert by["halves"].passed_stability and cal.mapping.lookup("critic") == "halves"
        # against a steady reference the same swings are instability
        cal = calibrate_critic(["default", "halves"])
        assert not {r.mode: r for r in cal.reports}["halves"].passed_stability
    finally:
        del RUNS["halves"], RUNS["sized"]
