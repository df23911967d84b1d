"""Finding 4 as the paper runs it: request limit 64 vs 128 on ordinary serving, Loop and MIX7.

One idea: the paper's request-limit study (App. C.3, Figures C.5–C.8) is a grid of paired
comparisons — workload × arrival rate × block, the two request limits replaying the same
Poisson arrivals — and its headline is the *ratio* 128 / 64 of two drain-inclusive rates at the
highest tested rate of each workload, taken per block and reported as the median across the
paired blocks. So the analysis pairs each block's two arm runs, forms the ratios there, and
hands the per-block values to `paper.paper_row`; every figure is computed by `block_figures` /
`metrics.slo` under the paper's contracts (declared window `T = max(180, 24/λ)`, drain
completions counted, output TPS and the timely rate over `max(T, T_cohort)`).

Scenarios (one per workload and rate) are recognized by their cohorts: one `ordinary` cohort is
ordinary serving, one `refinement_loop` cohort is Loop, several cohorts are the mixed (MIX7)
cohort (`workload_of`). Arms are recognized by the `max_num_seqs` override they set (64 and 128).

Paper figures (C.3, "At the highest tested ordinary-serving load, increasing the request limit
from 64 to 128 raises output TPS by 14.6% but reduces deadline-compliant task rate by 22.5%
(paired-block medians). Loop shows the same direction of change, while the mixed median
timely-task-rate ratio is approximately unchanged."):

- ordinary, 1.2 roots/s: output TPS +14.6 %, timely-task rate −22.5 % (`change_pct`);
- Loop, 0.5 roots/s: the same signs, no value stated — a sign-only row (`sign_verdict`: the
  sign matches → `direction`, the best a figure without a size can get; else `not reproduced`);
- MIX7, 0.2 roots/s: timely-task-rate ratio ≈ 1.0 (`value` figure: a ratio within the one
  rule's factor of two of 1.0).

Detail rows (Figures C.6–C.8: every workload, rate and limit): output TPS, the timely rate,
arrival-window goodput, attainment, the least-attained class's attainment (per block, then the
median), root P95, peak running requests and preemptions; and per workload and rate the two
ratios.

Examples:
    >>> sign_verdict(1.0, 0.5), sign_verdict(-1.0, 3.0), sign_verdict(1.0, None)
    ('direction', 'not reproduced', 'no value')
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from maserve_prefect.bench.replay import block_figures as bf
from maserve_prefect.bench.replay.block_figures import Row
from maserve_prefect.bench.replay.paper import PAPER_COLUMNS, PaperFigure, paper_row
from maserve_prefect.errors import ConfigError
from maserve_prefect.replay.arms import ArmResult, ScenarioResult
from maserve_prefect.replay.window import declared_period_s

LOW_LIMIT, HIGH_LIMIT = 64, 128
"""The two request limits (`max_num_seqs`) the paper compares."""

ORDINARY, LOOP, MIXED = "ordinary", "loop", "mixed"
WORKLOAD_OF_WORKFLOW = {"ordinary": ORDINARY, "refinement_loop": LOOP, "loop": LOOP}
"""A single-cohort scenario's workload, by its workflow; several cohorts are `MIXED`."""

_SETUP = "Qwen3-8B/910C, limit 128 vs 64, Poisson arrivals shared across limits, T=max(180,24/λ)"

ORDINARY_TPS = PaperFigure(
    "F4 request limit",
    "ordinary output TPS change, limit 128 vs 64 (%)",
    14.6,
    f"{_SETUP}, ordinary serving 1.2 roots/s, 3 blocks",
    "App. C.3, Fig. C.5(a)",
)
ORDINARY_TIMELY = PaperFigure(
    "F4 request limit",
    "ordinary drain-inclusive timely-task-rate change, limit 128 vs 64 (%)",
    -22.5,
    f"{_SETUP}, ordinary serving 1.2 roots/s, deadline 1.5×low-load P95, 3 blocks",
    "App. C.3, Fig. C.5(b)",
)
MIXED_TIMELY = PaperFigure(
    "F4 request limit",
    "MIX7 timely-task-rate ratio, limit 128 / 64 (≈ unchanged)",
    1.0,
    f"{_SETUP}, MIX7 0.2 roots/s, per-class deadlines 1.5×low-load P95, 3 blocks",
    "App. C.3, Fig. C.5(b)",
    kind="value",
)


@dataclass(frozen=True, slots=True)
class SignFigure:
    """A figure the paper states by its sign only (Loop: "the same direction of change")."""

    finding: str
    figure: str
    sign: int
    setup: str
    source: str


LOOP_TPS = SignFigure(
    "F4 request limit",
    "Loop output TPS change, limit 128 vs 64 (%)",
    +1,
    f"{_SETUP}, Loop 0.5 roots/s, 3 blocks (same direction as ordinary, no value stated)",
    "App. C.3, Fig. C.5(a)",
)
LOOP_TIMELY = SignFigure(
    "F4 request limit",
    "Loop timely-task-rate change, limit 128 vs 64 (%)",
    -1,
    f"{_SETUP}, Loop 0.5 roots/s, 3 blocks (same direction as ordinary, no value stated)",
    "App. C.3, Fig. C.5(b)",
)


def sign_verdict(sign: float, measured: float | None) -> str:
    """The verdict of a sign-only figure: `direction` when `measured` (a change) has the
    paper's sign, `not reproduced` when it does not or is zero, `no value` without one."""
    if measured is None or math.isnan(measured):
        return "no value"
    return "direction" if measured * sign > 0 else "not reproduced"


def sign_row(fig: SignFigure, our_setup: str, per_block: Sequence[float | None]) -> Row:
    """A paper row (`paper.PAPER_COLUMNS`) for a sign-only figure: `paper` reads `up` / `down`."""
    row: Row = {
        "finding": fig.finding,
        "figure": fig.figure,
        "paper": "up (sign only)" if fig.sign > 0 else "down (sign only)",
        "paper_setup": fig.setup,
        "our_setup": our_setup,
    }
    measured = bf.put(row, "measured", per_block)
    row["blocks"] = len(per_block)
    row["verdict"] = sign_verdict(fig.sign, measured)
    row["source"] = fig.source
    return {k: row[k] for k in PAPER_COLUMNS}


# -- one scenario: its workload, its two arms, per-block figures -------------------------------


def workload_of(result: ScenarioResult) -> str:
    """`mixed` for several cohorts; else `ordinary` or `loop` from the single cohort's workflow
    (a bundle cohort: its name), any other workflow or name as it is (detail rows only)."""
    cohorts = result.scenario.cohorts
    if len(cohorts) > 1:
        return MIXED
    native = cohorts[0].native
    name = native.workflow if native is not None else cohorts[0].name
    return WORKLOAD_OF_WORKFLOW.get(name, name)


def limit_arms(result: ScenarioResult) -> tuple[list[ArmResult], list[ArmResult]]:
    """The runs of the limit-64 and limit-128 arms, blocks in order.

    Raises:
        ConfigError: the scenario has no arm setting one of the two limits.
    """
    by_limit: dict[int, str] = {}
    for arm in result.scenario.arms:
        for over in arm.overrides.values():
            if over.max_num_seqs is not None:
                by_limit[over.max_num_seqs] = arm.name
    missing = [n for n in (LOW_LIMIT, HIGH_LIMIT) if n not in by_limit]
    if missing:
        raise ConfigError(
            f"scenario {result.scenario.source}: no arm sets max_num_seqs {missing[0]}; finding 4 "
            f"needs one arm per limit ({LOW_LIMIT}, {HIGH_LIMIT}) via overrides"
        )
    by_arm = result.by_arm()
    return by_arm[by_limit[LOW_LIMIT]], by_arm[by_limit[HIGH_LIMIT]]


@dataclass(frozen=True, slots=True)
class BlockFigures:
    """One arm run's figures (one block)."""

    output_tps: float
    timely_rate_per_s: float | None
    goodput_per_s: float | None
    attainment: float | None
    min_class_attainment: float | None
    root_p95_s: float | None
    peak_running_seqs: int
    num_preemptions: int


def block_figures(result: ScenarioResult, arm: ArmResult) -> BlockFigures:
    """`BlockFigures` of one arm run (`block_figures` and `metrics.slo` contracts)."""
    f = bf.run_deadline_figures(result, arm.run)
    classes = [v for v in (f.per_class.values() if f is not None else []) if not np.isnan(v)]
    return BlockFigures(
        output_tps=bf.output_tps(result, arm.run),
        timely_rate_per_s=f.timely_rate_per_s if f is not None else None,
        goodput_per_s=f.goodput_per_s if f is not None else None,
        attainment=f.attainment if f is not None else None,
        min_class_attainment=min(classes) if classes else None,
        root_p95_s=bf.percentile(bf.latencies(bf.measured_outcomes(result, arm.run)), 95),
        peak_running_seqs=bf.peak_running_seqs(arm.run),
        num_preemptions=bf.num_preemptions(arm.run),
    )


def change_pct(low: float | None, high: float | None) -> float | None:
    """`100 × (high / low − 1)`: the change from the low limit to the high one (None when
    either is missing or `low` is zero, where a ratio has no value).

    Examples:
        >>> change_pct(100.0, 114.6), change_pct(0.0, 1.0), change_pct(None, 1.0)
        (14.6, None, None)
    """
    if low is None or high is None or low == 0 or math.isnan(low) or math.isnan(high):
        return None
    return round(100.0 * (high / low - 1.0), 10)


def ratio(low: float | None, high: float | None) -> float | None:
    """`high / low` (None as `change_pct`)."""
    c = change_pct(low, high)
    return None if c is None else 1.0 + c / 100.0


@dataclass(frozen=True, slots=True)
class Cell:
    """One workload and rate: per-block figures of both limits, blocks paired in order."""

    scenario: str
    workload: str
    rate_per_s: float
    window_s: float | None
    num_roots: int
    low: list[BlockFigures]
    high: list[BlockFigures]
    pool: str = "910c_qwen3_8b"
    lock: str = "length"

    def tps_change_pct(self) -> list[float | None]:
        return [change_pct(a.output_tps, b.output_tps) for a, b in self._pairs()]

    def timely_change_pct(self) -> list[float | None]:
        return [change_pct(a.timely_rate_per_s, b.timely_rate_per_s) for a, b in self._pairs()]

    def timely_ratio(self) -> list[float | None]:
        return [ratio(a.timely_rate_per_s, b.timely_rate_per_s) for a, b in self._pairs()]

    def _pairs(self) -> list[tuple[BlockFigures, BlockFigures]]:
        return list(zip(self.low, self.high, strict=True))

    def setup(self) -> str:
        """Our setup in a line."""
        window = f"T={self.window_s:g} s" if self.window_s is not None else "no declared T"
        return (
            f"simulated {self.pool}, {self.workload} {self.rate_per_s:g} roots/s, "
            f"{self.num_roots} roots, {window}, {self.lock}-locked, {len(self.low)} blocks"
        )


def cell_of(name: str, result: ScenarioResult) -> Cell:
    """The `Cell` of one scenario (its workload, rate, window and both limits' block figures).

    Raises:
        ConfigError: no arm per limit (`limit_arms`), or arrivals that are not Poisson.
    """
    rate = getattr(result.scenario.arrivals, "rate_per_s", None)
    if rate is None:
        raise ConfigError(
            f"scenario {result.scenario.source}: finding 4 needs Poisson arrivals (a rate)"
        )
    low, high = limit_arms(result)
    return Cell(
        scenario=name,
        workload=workload_of(result),
        rate_per_s=float(rate),
        window_s=declared_period_s(result.scenario, len(result.trace_set.slots)),
        num_roots=len(result.trace_set.slots),
        low=[block_figures(result, r) for r in low],
        high=[block_figures(result, r) for r in high],
        pool=_pool_name(result),
        lock=result.scenario.lock,
    )


def _pool_name(result: ScenarioResult) -> str:
    pool = result.scenario.arms[0].pool
    return pool.stem.removeprefix("pool_") if pool is not None else "default pool"


# -- the suite's analysis -----------------------------------------------------------------------


def request_limit_rows(results: Mapping[str, ScenarioResult]) -> list[Row]:
    """Finding 4's rows from the suite's results: `rows_of_cells` of every scenario's `Cell`.

    Examples:
        >>> request_limit_rows({})
        []
    """
    return rows_of_cells([cell_of(n, r) for n, r in results.items()])


def rows_of_cells(cells: Sequence[Cell]) -> list[Row]:
    """The paper rows at each workload's highest rate (ordinary: TPS and timely-rate change;
    Loop: their signs; mixed: the timely-rate ratio), then every cell's detail rows (workload,
    then rate). A workload without cells gets no paper row (a partial suite)."""
    top: dict[str, Cell] = {}
    for c in cells:
        if c.workload not in top or c.rate_per_s > top[c.workload].rate_per_s:
            top[c.workload] = c
    rows: list[Row] = []
    if ORDINARY in top:
        c = top[ORDINARY]
        rows.append(paper_row(ORDINARY_TPS, c.setup(), c.tps_change_pct()))
        rows.append(paper_row(ORDINARY_TIMELY, c.setup(), c.timely_change_pct()))
    if LOOP in top:
        c = top[LOOP]
        rows.append(sign_row(LOOP_TPS, c.setup(), c.tps_change_pct()))
        rows.append(sign_row(LOOP_TIMELY, c.setup(), c.timely_change_pct()))
    if MIXED in top:
        c = top[MIXED]
        rows.append(paper_row(MIXED_TIMELY, c.setup(), c.timely_ratio()))
    order = sorted(cells, key=lambda c: (c.workload, c.rate_per_s))
    return rows + [r for c in order for r in detail_rows(c)]


def detail_rows(cell: Cell) -> list[Row]:
    """Figures C.5–C.8 of one workload and rate: one row per limit, then the paired changes."""
    rows: list[Row] = []
    for limit, figs in ((LOW_LIMIT, cell.low), (HIGH_LIMIT, cell.high)):
        row: Row = {
            "finding": "F4 detail",
            "scenario": cell.scenario,
            "workload": cell.workload,
            "rate_per_s": cell.rate_per_s,
            "max_num_seqs": limit,
            "blocks": len(figs),
        }
        bf.put(row, "output_tps", [f.output_tps for f in figs])
        bf.put(row, "timely_tasks_per_s", [f.timely_rate_per_s for f in figs])
        bf.put(row, "goodput_per_s", [f.goodput_per_s for f in figs])
        bf.put(row, "attainment", [f.attainment for f in figs])
        bf.put(row, "min_class_attainment", [f.min_class_attainment for f in figs])
        bf.put(row, "root_p95_s", [f.root_p95_s for f in figs])
        bf.put(row, "peak_running_seqs", [float(f.peak_running_seqs) for f in figs])
        bf.put(row, "num_preemptions", [float(f.num_preemptions) for f in figs])
        rows.append(row)
    change: Row = {
        "finding": "F4 detail",
        "scenario": cell.scenario,
        "workload": cell.workload,
        "rate_per_s": cell.rate_per_s,
        "max_num_seqs": f"{HIGH_LIMIT} vs {LOW_LIMIT}",
        "blocks": len(cell.low),
    }
    bf.put(change, "tps_change_pct", cell.tps_change_pct())
    bf.put(change, "timely_change_pct", cell.timely_change_pct())
    rows.append(change)
    return rows
