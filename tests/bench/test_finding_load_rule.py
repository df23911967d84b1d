"""The seed-finding suites follow one load rule (`bench.replay.findings.LOAD_LADDER`), at both scales."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from maserve_prefect.bench.replay.findings import LOAD_LADDER, MU_SAT_PER_S, ladder_rates
from maserve_prefect.bench.replay.suite_file import ReplaySuite
from maserve_prefect.bench.suite import load_suite
from maserve_prefect.replay.scenario import arrival_process
from maserve_prefect.workloads.arrivals import PoissonArrivals

SUITES = Path(__file__).resolve().parents[2] / "deployments" / "suites"


def _rates(name: str, scale: str) -> list[float]:
    rates = []
    suite = load_suite(SUITES / f"finding_{name}.yaml")
    assert isinstance(suite, ReplaySuite)
    for sc in suite.load_scenarios(scale):
        process = arrival_process(sc.arrivals)
        assert isinstance(process, PoissonArrivals), f"{sc.name}: the rule is Poisson arrivals"
        rates.append(process.rate_per_s)
    return rates


def test_ladder_is_geometric_and_spans_under_to_overload() -> None:
    assert LOAD_LADDER[0] < 1.0 < LOAD_LADDER[-1]
    ratios = {b / a for a, b in pairwise(LOAD_LADDER)}
    assert len(ratios) == 1
    assert ladder_rates() == tuple(round(m * MU_SAT_PER_S, 3) for m in LOAD_LADDER)


@pytest.mark.parametrize("scale", ["demo", "full"])
def test_every_suite_uses_the_rung_its_finding_calls_for(scale: str) -> None:
    # Every finding suite now follows the paper's protocol instead of the ladder: finding 1
    # (frozen traces at the paper's arrivals), 2 (64 concurrent roots), 3 (the paper's four rates
    # on our time scale) are checked in tests/bench/test_finding_f1.py / _f2.py / _f3.py.
    # Finding 4 follows the paper's own rates (App. C.3).
    paper = [0.24, 0.6, 1.2, 0.1, 0.25, 0.5, 0.04, 0.1, 0.2]  # ordinary, Loop, MIX7
    assert sorted(_rates("request_limit", scale)) == sorted(paper)
