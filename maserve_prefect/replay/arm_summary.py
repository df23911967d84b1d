"""One arm run summarized: its measured roots, their latency percentiles and deadline attainment.

One idea: an arm is judged only on its measured roots — roots of the target cohorts whose arrival
offset lies in the scenario's window. The per-arm summary is deliberately minimal (root latency
percentiles of the measured roots that completed, deadline attainment, completed / failed /
incomplete roots, early releases); task-level metrics are computed by `maserve_prefect.metrics`
from each arm's replay trace and step records. A measured root *meets* its deadline only when it
completed (`metrics.task` root status: no failed answer op) within it; a failed or unfinished
root counts against attainment. A target root that never arrived (the run ended first) is
measured unless the window surely excludes it (the window ends before the run did). Across blocks
an arm is summarized by the median and range (min, max) of each figure (`median_range`, used by
`replay.arms.ScenarioResult.across_blocks`).

Examples:
    >>> median_range([3.0, 1.0, 2.0])
    (2.0, 1.0, 3.0)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from maserve_prefect.metrics.task import RootStatus, root_class
from maserve_prefect.replay.driver import ReplayRun
from maserve_prefect.replay.scenario import Scenario
from maserve_prefect.replay.traceset import TraceSet

__all__ = [
    "QUANTILES",
    "SIM_INITIAL_STATE",
    "ArmSummary",
    "MeasuredRoot",
    "measured_roots",
    "median_range",
    "summarize_arm",
]

QUANTILES = (50, 95, 99)
SIM_INITIAL_STATE = "fresh simulated pool"
"""`ArmSummary.initial_state` on the simulator: every arm runs on a new kernel and pool."""


@dataclass(slots=True)
class ArmSummary:
    """One arm in one block: the figures the CLI prints.

    Attributes:
        num_roots: roots in the trace set (every cohort).
        num_measured: measured roots (target cohorts, arrival in the window; module docstring).
        num_completed / num_failed_roots / num_incomplete_roots: measured roots by status; they
            sum to `num_measured`. Incomplete: not done when the run ended (or never arrived).
        latency_p*_s: root latency percentiles of the completed measured roots (None if none).
        attainment: share of measured roots with a deadline that completed within it.
        num_failed_ops / num_incomplete_ops: ops of the whole run that failed / never completed.
        initial_state: the state the arm started from (`SIM_INITIAL_STATE`, or what draining
            the real server achieved, `DrainReport.describe`).
    """

    arm: str
    block: int
    rule: str
    non_causal: bool
    num_roots: int
    num_measured: int
    latency_p50_s: float | None
    latency_p95_s: float | None
    latency_p99_s: float | None
    attainment: float | None
    num_early_releases: int
    num_failed_ops: int
    makespan_s: float
    num_completed: int = 0
    num_failed_roots: int = 0
    num_incomplete_roots: int = 0
    num_incomplete_ops: int = 0
    initial_state: str = SIM_INITIAL_STATE


@dataclass(frozen=True, slots=True)
class MeasuredRoot:
    """A measured root of one arm run: its class, status and latency (None unless completed)."""

    root_id: str
    root_class: str
    status: RootStatus
    latency_s: float | None


def median_range(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of `values`."""
    a = np.asarray(values, dtype=float)
    return float(np.median(a)), float(a.min()), float(a.max())


def _quantiles(lat: list[float]) -> list[float | None]:
    if not lat:
        return [None] * len(QUANTILES)
    return [float(v) for v in np.percentile(np.asarray(lat), QUANTILES)]


def measured_roots(run: ReplayRun, ts: TraceSet, scenario: Scenario) -> list[MeasuredRoot]:
    """The arm run's measured roots in slot order, each with its status (module docstring)."""
    roots = {r.root_id: r for r in ts.trace.roots}
    status = run.root_status()
    horizon_s = run.end_s - run.start_s
    window = scenario.window
    out: list[MeasuredRoot] = []
    for rid in ts.targets():
        arrived = run.root_arrival_s.get(rid)
        if arrived is None:
            # The run ended first: the root would have arrived at or after `horizon_s`.
            if window.end_s is not None and window.end_s <= horizon_s:
                continue
            out.append(MeasuredRoot(rid, root_class(roots[rid]), RootStatus.INCOMPLETE, None))
            continue
        if not window.holds(arrived - run.start_s):
            continue
        st = status[rid]
        latency = run.root_latency_s.get(rid) if st is RootStatus.COMPLETED else None
        if st is RootStatus.COMPLETED and latency is None:
            st = RootStatus.INCOMPLETE
        out.append(MeasuredRoot(rid, root_class(roots[rid]), st, latency))
    return out


def summarize_arm(
    run: ReplayRun,
    ts: TraceSet,
    scenario: Scenario,
    deadlines: Mapping[str, float],
    *,
    arm: str,
    block: int,
    initial_state: str = SIM_INITIAL_STATE,
) -> ArmSummary:
    """The arm's summary over the measured roots (window × target cohorts; module docstring)."""
    measured = measured_roots(run, ts, scenario)
    lat = [m.latency_s for m in measured if m.latency_s is not None]
    p50, p95, p99 = _quantiles(lat)
    with_deadline = [m for m in measured if m.root_class in deadlines]
    attainment = None
    if with_deadline:
        met = sum(
            m.latency_s is not None and m.latency_s <= deadlines[m.root_class]
            for m in with_deadline
        )
        attainment = met / len(with_deadline)
    by_status = {st: sum(m.status is st for m in measured) for st in RootStatus}
    return ArmSummary(
        arm=arm,
        block=block,
        rule=run.rule.value,
        non_causal=run.non_causal,
        num_roots=len(ts.trace.roots),
        num_measured=len(measured),
        latency_p50_s=p50,
        latency_p95_s=p95,
        latency_p99_s=p99,
        attainment=attainment,
        num_early_releases=run.num_early_releases,
        num_failed_ops=run.num_failed_ops,
        makespan_s=run.end_s - run.start_s,
        num_completed=by_status[RootStatus.COMPLETED],
        num_failed_roots=by_status[RootStatus.FAILED],
        num_incomplete_roots=by_status[RootStatus.INCOMPLETE],
        num_incomplete_ops=run.num_incomplete_ops,
        initial_state=initial_state,
    )
