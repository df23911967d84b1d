"""Figures of one arm run (one block), and their median and range across a scenario's blocks.

One idea: a scenario's paired blocks are replications, so a finding reports each figure *per
block* — computed by `maserve_prefect.metrics` from that block's replay trace and step records —
and then its median and range (min–max) across blocks, never a figure of the blocks pooled
together. Root outcomes are `replay.arm_summary.measured_roots` (statuses as `metrics.task` defines
them: a root whose answer ops include a failed or unfinished op is `failed` / `incomplete`, with
no latency), and every SLO figure comes from `metrics.slo` under the paper's contracts: a root that
did not complete never meets its deadline, a timely completion during the drain counts, goodput
divides by the declared window `T` (`replay.window`), the timely rate and output TPS by
`max(T, T_cohort)`, and λ* takes the minimum attainment across blocks and classes at α = 0.95
with the completion and backlog guards.

Measured roots of an arm run: roots of the target cohorts whose arrival offset (from the replay's
start) lies in the scenario's window (`replay.arm_summary.measured_roots`).

Examples:
    >>> spread([3.0, 1.0, 2.0])
    (2.0, 1.0, 3.0)
    >>> range_text([3.0, 1.0, 2.0]), range_text([None, 1.5])
    ('1–3', 'none–1.5')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from maserve_prefect.metrics.engine import prefill_factor
from maserve_prefect.metrics.slo import (
    ALPHA,
    LoadResult,
    attainment,
    backlog_guards,
    lambda_star,
    observation_period_s,
    task_goodput,
    timely_rate,
)
from maserve_prefect.metrics.task import RootLatency, RootStatus
from maserve_prefect.replay.arm_summary import measured_roots
from maserve_prefect.replay.arms import ScenarioResult
from maserve_prefect.replay.driver import ReplayRun
from maserve_prefect.replay.window import declared_window
from maserve_prefect.trace.model import OpKind, OpStatus

Row = dict[str, Any]


# -- median and range across blocks -----------------------------------------------------------


def spread(values: Sequence[float | None]) -> tuple[float, float, float] | None:
    """(median, min, max) of the per-block `values`; None when a block has no value (or none
    are given), since a median over the blocks that happen to have one would hide the gap."""
    if not values or any(v is None or np.isnan(v) for v in values):
        return None
    a = np.asarray(values, dtype=float)
    return float(np.median(a)), float(a.min()), float(a.max())


def range_text(values: Sequence[float | None]) -> str:
    """`"min–max"` of per-block `values` (4 significant digits; a missing value reads `none` and
    sorts first)."""
    if not values:
        return "none"
    known = sorted(v for v in values if v is not None and not np.isnan(v))
    lo = "none" if len(known) < len(values) else f"{known[0]:.4g}"
    hi = f"{known[-1]:.4g}" if known else "none"
    return f"{lo}–{hi}"


def put(row: Row, key: str, values: Sequence[float | None]) -> float | None:
    """Set `row[key]` to the median of the per-block `values` and `row[key + "_range"]` to their
    range (`range_text`); returns the median (None when a block has no value)."""
    s = spread(values)
    row[key] = s[0] if s is not None else None
    row[f"{key}_range"] = range_text(values)
    return row[key]


# -- one arm run (one block) ------------------------------------------------------------------


def measured_outcomes(result: ScenarioResult, run: ReplayRun) -> list[RootLatency]:
    """Outcomes of the measured roots of `run`, in slot order.

    The measured roots and their status are `replay.arm_summary.measured_roots` (a root the run ended
    before it arrived counts as incomplete, arriving at the run's end); each becomes a
    `metrics.task.RootLatency` on the run's clock, the form `metrics.slo` takes.
    """
    out = []
    for m in measured_roots(run, result.trace_set, result.scenario):
        arrival_s = run.root_arrival_s.get(m.root_id, run.end_s)
        done_s = arrival_s + m.latency_s if m.latency_s is not None else None
        out.append(RootLatency(m.root_id, m.root_class, arrival_s, m.status, None, done_s))
    return out


def latencies(outcomes: Sequence[RootLatency], cls: str | None = None) -> list[float]:
    """Latencies of the completed roots among `outcomes` (of class `cls` when given)."""
    return [
        r.latency_s
        for r in outcomes
        if r.latency_s is not None and (cls is None or r.workload_class == cls)
    ]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q`-th percentile of `values` (None for no values)."""
    return float(np.percentile(np.asarray(values), q)) if values else None


@dataclass(frozen=True, slots=True)
class DeadlineFigures:
    """SLO figures of one arm run's measured roots against the locked deadlines.

    Attributes:
        attainment: roots that met their class deadline / roots (all classes; nan for none).
        per_class: class → attainment (`metrics.slo.attainment`).
        goodput_per_s: `metrics.slo.task_goodput` — timely roots (drain completions included)
            per second of the declared window `T` (nan when the scenario declares none).
        completion_ratio: completed roots / roots (λ*'s completion guard).
        num_roots: measured roots with a deadline.
        timely_rate_per_s: `metrics.slo.timely_rate` — the same timely roots per second of
            `max(T, T_cohort)` (nan without a declared window).
        backlog: roots remaining at the end of the window (inf without a declared window, so
            λ*'s backlog guard cannot pass on an undeclared window).
        backlog_growth: backlog at the window's end minus at its midpoint.
    """

    attainment: float
    per_class: dict[str, float]
    goodput_per_s: float
    completion_ratio: float
    num_roots: int
    timely_rate_per_s: float = float("nan")
    backlog: float = 0.0
    backlog_growth: float = 0.0


def measurement_window(result: ScenarioResult, run: ReplayRun) -> tuple[float, float] | None:
    """The declared window `[start, start + T)` on `run`'s clock (`replay.window`); None when
    the scenario declares no `T`."""
    return declared_window(result.scenario, len(result.trace_set.slots), run.start_s)


def deadline_figures(
    outcomes: Sequence[RootLatency],
    deadlines: Mapping[str, float],
    window: tuple[float, float] | None = None,
    last_completion_s: float | None = None,
) -> DeadlineFigures | None:
    """SLO figures of `outcomes` (measured roots) against `deadlines`; None without deadlines.

    Roots of a class without a deadline are left out. Goodput, the timely rate and the backlog
    guards need the declared `window` (nan / inf without one); `last_completion_s` is the
    cohort's last completion (default: the last among `outcomes`).

    Examples:
        >>> done = RootLatency("a", "x", 0.0, RootStatus.COMPLETED, "a/0", 1.0)
        >>> failed = RootLatency("b", "x", 2.0, RootStatus.FAILED, None, None)
        >>> f = deadline_figures([done, failed], {"x": 5.0}, window=(0.0, 4.0))
        >>> f.attainment, f.goodput_per_s, f.completion_ratio, f.backlog
        (0.5, 0.25, 0.5, 1)
    """
    lats = [r for r in outcomes if r.workload_class in deadlines]
    if not lats:
        return None
    per_class = attainment(lats, deadlines)
    num_met = sum(a.num_met for a in per_class.values())
    goodput = rate = float("nan")
    end_backlog, growth = float("inf"), float("inf")
    if window is not None:
        goodput = task_goodput(lats, deadlines, window=window)
        rate = timely_rate(lats, deadlines, window=window, last_completion_s=last_completion_s)
        guards = backlog_guards(lats, window)
        end_backlog, growth = guards.end_backlog, guards.growth
    completed = sum(r.status is RootStatus.COMPLETED for r in lats)
    return DeadlineFigures(
        attainment=num_met / len(lats),
        per_class={c: a.attainment for c, a in per_class.items()},
        goodput_per_s=goodput,
        completion_ratio=completed / len(lats),
        num_roots=len(lats),
        timely_rate_per_s=rate,
        backlog=end_backlog,
        backlog_growth=growth,
    )


def run_deadline_figures(result: ScenarioResult, run: ReplayRun) -> DeadlineFigures | None:
    """`deadline_figures` of `run`'s measured roots against the scenario's locked deadlines
    (declared window; the cohort's last completion is the run's end)."""
    return deadline_figures(
        measured_outcomes(result, run),
        result.deadlines_s,
        measurement_window(result, run),
        last_completion_s=run.end_s,
    )


def output_tps(result: ScenarioResult, run: ReplayRun) -> float:
    """Output tokens of the completed model ops per second of `max(T, T_cohort)`
    (`metrics.slo.observation_period_s`; without a declared window, replay start → last
    completion)."""
    tokens = sum(
        op.num_output_tokens or 0
        for op in run.trace.ops
        if op.kind is OpKind.MODEL and op.status is OpStatus.COMPLETED
    )
    window = measurement_window(result, run)
    span = (
        observation_period_s(window, run.end_s) if window is not None else run.end_s - run.start_s
    )
    return tokens / span if span > 0 else float("nan")


def run_prefill_factor(run: ReplayRun) -> float:
    """Processed / source prefill tokens of `run` (`metrics.engine.prefill_factor`)."""
    return prefill_factor(run.step_records(), run.trace).factor


def num_preemptions(run: ReplayRun) -> int:
    """Requests preempted in `run`'s engine steps (0 without step records)."""
    return sum(len(r.preempted) for r in run.step_records())


def peak_running_seqs(run: ReplayRun) -> int:
    """The most requests one engine step of `run` scheduled (0 without step records)."""
    return max((len(r.scheduled) for r in run.step_records()), default=0)


# -- λ* over a rate sweep ---------------------------------------------------------------------


def sweep_lambda_star(
    by_load: Mapping[float, Sequence[DeadlineFigures | None]], alpha: float = ALPHA
) -> tuple[float | None, list[float | None]]:
    """λ* of a sweep (`metrics.slo.lambda_star`, the paper's guards), from per-block figures.

    Args:
        by_load: tested load (e.g. arrival rate) → that load's figures, one per block, blocks in
            the same order for every load (block b of every load is one sweep).
        alpha: the attainment target (0.95).

    Returns:
        (λ* of the blocks together — `A(λ)` the *minimum* attainment across blocks and classes,
        every guard in every block —, λ* of each block's own sweep). A load with a block without
        figures (no measured root with a deadline) cannot qualify.

    Examples:
        >>> f = lambda a, c=1.0: DeadlineFigures(a, {"x": a}, 1.0, c, 4)
        >>> sweep_lambda_star({1.0: [f(1.0), f(0.96)], 2.0: [f(1.0), f(0.9)],
        ...                    4.0: [f(1.0, c=0.5), f(1.0)]})
        (1.0, [2.0, 4.0])
    """
    loads = sorted(by_load)
    num_blocks = min((len(by_load[x]) for x in loads), default=0)

    def result(load: float, f: DeadlineFigures | None) -> LoadResult:
        if f is None:
            return LoadResult(load, {})  # no attainment: never passes
        return LoadResult(
            load,
            f.per_class,
            completion_ratio=f.completion_ratio,
            backlog=f.backlog,
            backlog_growth=f.backlog_growth,
        )

    together = lambda_star([result(x, f) for x in loads for f in by_load[x]], alpha)
    per_block = [
        lambda_star([result(x, by_load[x][b]) for x in loads], alpha) for b in range(num_blocks)
    ]
    return together, per_block
