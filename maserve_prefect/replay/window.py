"""The declared measurement window `[0, T)` of a scenario's arm run (`metrics.slo` contracts).

One idea: `T` is fixed before any arm runs, by the scenario, never read off the realized
arrivals. A scenario with `window.end_s` declares `T = end_s − start_s`. An open-ended window on
Poisson arrivals declares the offered cohort's nominal arrival period: `T = N / λ − start_s` for
`N` roots (every slot, background included) offered at `λ` roots/s — what `λT` roots at rate `λ`
take, so a finite Poisson cohort of `N` roots is the paper's "roots arriving in [0, T)". Other
arrival processes (burst, explicit times, closed loop) offer no rate: without `end_s` they declare
no window, and goodput, the timely rate and the backlog guards are not reported.

The paper's protocols choose `end_s` as `metrics.slo.sweep_window_s` (a rate sweep sharing one
`T = max(600, 8/λ_min)`) or `metrics.slo.rate_window_s` (`T = max(180, 24/λ)` per rate).

Examples:
    >>> from maserve_prefect.replay.scenario import parse_scenario
    >>> s = parse_scenario({"name": "x", "cohorts": [{"name": "t", "bundle": "b"}],
    ...     "arrivals": {"kind": "poisson", "rate_per_s": 0.5}, "arms": [{"name": "dag"}]})
    >>> declared_period_s(s, num_slots=8)
    16.0
    >>> declared_period_s(s.model_copy(update={"window": s.window.model_copy(
    ...     update={"end_s": 30.0})}), num_slots=8)
    30.0
"""

from __future__ import annotations

from maserve_prefect.replay.scenario import Poisson, Scenario


def declared_period_s(scenario: Scenario, num_slots: int) -> float | None:
    """`T` of the scenario (module docstring); None when it declares none."""
    w = scenario.window
    if w.end_s is not None:
        return w.end_s - w.start_s if w.end_s > w.start_s else None
    if isinstance(scenario.arrivals, Poisson):
        nominal = num_slots / scenario.arrivals.rate_per_s - w.start_s
        return nominal if nominal > 0 else None
    return None


def declared_window(
    scenario: Scenario, num_slots: int, run_start_s: float
) -> tuple[float, float] | None:
    """`[start, start + T)` on the run's clock (arrival offsets count from `run_start_s`)."""
    period = declared_period_s(scenario, num_slots)
    if period is None:
        return None
    start = run_start_s + scenario.window.start_s
    return start, start + period
