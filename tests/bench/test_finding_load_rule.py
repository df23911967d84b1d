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
    rungs = ladder_rates()
    assert set(_rates("barrier", scale)) == {rungs[0]}  # low load (every workflow)
    # The rate sweep (finding 3) follows the paper's protocol, not the ladder: its rates are the
    # paper's four on our time scale (tests/bench/test_finding_f3.py).
    assert _rates("kv_budget", scale) == [rungs[-1]]  # limits bind only at the top
    assert _rates("request_limit", scale) == [rungs[-1]]
