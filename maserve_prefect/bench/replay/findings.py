"""Analysis of the four seed-finding suites: one function per suite, results → finding rows.

One idea: every figure here is read from the replays the suite ran — root outcomes of the
measured roots, the locked deadlines (`ScenarioResult.deadlines_s`) and the simulator's step
records — computed *per block* and reported as the median and range across the scenario's
paired blocks (`bench.replay.block_figures`); each row states the *direction* the issue expects next to
what was measured, so a table of rows is the finding. Nothing is fitted or hard-coded.

Load rule (one for all four suites, stated here once and in the README): Poisson arrivals at the
rungs of `LOAD_LADDER` × `MU_SAT_PER_S` (μ_sat: the four-call's saturated service rate on the
suites' pool). The low-load finding (Barrier vs DAG) runs at the lowest rung, the rate sweep at
every rung, and the findings about resource limits (KV budget, request limit) at the highest,
the only rung where those limits can bind. `tests/bench` checks every suite file against it.

Figures (per block, over the measured roots: target cohorts whose arrival lies in the scenario
window; a figure `f` is the median across blocks and `f_range` its min–max):

- root latency P50 / P95 per arm (and per workload class for the barrier suite), over the roots
  that completed (`metrics.task.root_latencies`);
- **prefill factor** = processed / source prefill tokens (`metrics.engine.prefill_factor`);
- **attainment** = share of measured roots that completed within their class's locked deadline
  (`metrics.slo.attainment`: a failed or unfinished root never meets it, a timely completion
  during the drain counts);
- **goodput** = `metrics.slo.task_goodput`: those timely roots per second of the declared window
  `T` (`replay.window`: the scenario's `window.end_s`, else `N / λ` of its Poisson arrivals);
- **λ\\*** (rate sweep) = `metrics.slo.lambda_star` over the four rates, per KV budget and arm,
  at α = `LAMBDA_ALPHA` (0.95), `A(λ)` the minimum attainment across blocks and classes, with the
  paper's guards (every root completed, ≤ 4 roots left at the window's end, no backlog growth
  over its second half);
- **output TPS** = output tokens of every completed model op / `max(T, T_cohort)`;
- **timely-task rate** = the drain-inclusive timely rate (`metrics.slo.timely_rate`): timely
  roots / `max(T, T_cohort)`;
- **peak running sequences** = the most requests one engine step scheduled (shows whether a
  `max_num_seqs` limit bound).

Each function has the signature the suite runner's `analysis:` hook calls,
`fn(results: dict[str, ScenarioResult]) -> list[dict]` (scenario name → result).

Examples:
    >>> kv_gib_of({"main": {"kv_cache_gib": 16.0}})
    16.0
    >>> direction(1.0, 2.0)
    'up'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from maserve_prefect.bench.replay import block_figures as bf
from maserve_prefect.bench.replay.block_figures import Row
from maserve_prefect.metrics.slo import ALPHA
from maserve_prefect.metrics.task import root_class
from maserve_prefect.replay.arms import ArmResult, ScenarioResult

MU_SAT_PER_S = 1.488
"""μ_sat in roots/s: N / makespan of a 32-root `four_call_full` DAG burst on
`pool_h100_qwen3_8b.yaml` (32 / 21.50 s, the same at 16, 32 and 40 GiB)."""

LOAD_LADDER: tuple[float, ...] = (0.25, 1.0, 4.0, 16.0)
"""Arrival rates as multiples of μ_sat: a ratio-4 geometric ladder from under-load (¼ μ_sat)
through saturation to 16× overload, where a whole cohort arrives within seconds."""

LAMBDA_ALPHA = ALPHA
"""α of the rate sweep's λ*: 0.95, the paper's target (`metrics.slo.ALPHA`): the largest tested
rate at which every class meets its deadline in at least 95 % of measured roots in every block."""


def ladder_rates() -> tuple[float, ...]:
    """The load ladder in roots/s, rounded to the millisecond as the scenario files write them.

    Examples:
        >>> ladder_rates()
        (0.372, 1.488, 5.952, 23.808)
    """
    return tuple(round(m * MU_SAT_PER_S, 3) for m in LOAD_LADDER)


def direction(before: float | None, after: float | None, tol: float = 1e-9) -> str:
    """`up`, `down` or `flat` from `before` to `after` (`n/a` when either is missing)."""
    if before is None or after is None or np.isnan(before) or np.isnan(after):
        return "n/a"
    if after > before + tol:
        return "up"
    if after < before - tol:
        return "down"
    return "flat"


def kv_gib_of(overrides: Mapping[str, Any]) -> float | None:
    """The `kv_cache_gib` an arm's overrides set (first deployment that sets one), else None."""
    for over in overrides.values():
        value = over.get("kv_cache_gib") if isinstance(over, Mapping) else over.kv_cache_gib
        if value is not None:
            return float(value)
    return None


def _override(result: ScenarioResult, arm: str, key: str) -> Any:
    spec = next(a for a in result.scenario.arms if a.name == arm)
    for over in spec.overrides.values():
        value = getattr(over, key)
        if value is not None:
            return value
    return None


def _target_classes(result: ScenarioResult) -> list[str]:
    """The classes of the target roots (deadline classes, `metrics.task.root_class`)."""
    roles = result.trace_set.role_of
    return sorted(
        {root_class(r) for r in result.trace_set.trace.roots if roles[r.root_id] == "target"}
    )


def _p(
    result: ScenarioResult, runs: list[ArmResult], q: float, cls: str | None = None
) -> list[float | None]:
    """Per block: the `q`-th percentile of the measured roots' latency (of class `cls`)."""
    return [bf.percentile(bf.latencies(bf.measured_outcomes(result, r.run), cls), q) for r in runs]


def _paired_delta(result: ScenarioResult, dag: ArmResult, bar: ArmResult, cls: str) -> float | None:
    """Mean over the measured roots of `cls` completed in both runs of Barrier − DAG latency."""

    def done(res: ArmResult) -> dict[str, float]:
        return {
            r.root_id: r.latency_s
            for r in bf.measured_outcomes(result, res.run)
            if r.workload_class == cls and r.latency_s is not None
        }

    d, b = done(dag), done(bar)
    deltas = [b[k] - v for k, v in d.items() if k in b]
    return float(np.mean(deltas)) if deltas else None


# -- the four suites ---------------------------------------------------------------------------


def barrier_rows(results: Mapping[str, ScenarioResult]) -> list[Row]:
    """Barrier vs DAG root latency per scenario and workload class (expected: Barrier ≥ DAG).

    Every scenario must have arms named `dag` and `barrier`. Per block: P50 / P95 of each arm
    and the mean paired delta (Barrier − DAG latency of the same root); rows give the median and
    range across blocks.

    Examples:
        >>> barrier_rows({})
        []
    """
    rows: list[Row] = []
    for name, result in results.items():
        by_arm = result.by_arm()
        dag, bar = by_arm["dag"], by_arm["barrier"]
        for cls in _target_classes(result):
            row: Row = {"scenario": name, "class": cls, "blocks": len(dag)}
            row["num_roots"] = int(
                np.median(
                    [len(bf.latencies(bf.measured_outcomes(result, r.run), cls)) for r in dag]
                )
            )
            dag_p50 = bf.put(row, "dag_p50_s", _p(result, dag, 50, cls))
            bar_p50 = bf.put(row, "barrier_p50_s", _p(result, bar, 50, cls))
            bf.put(row, "dag_p95_s", _p(result, dag, 95, cls))
            bf.put(row, "barrier_p95_s", _p(result, bar, 95, cls))
            deltas = [_paired_delta(result, d, b, cls) for d, b in zip(dag, bar, strict=True)]
            bf.put(row, "mean_paired_delta_s", deltas)
            row |= {
                "p50_change_pct": _pct_change(dag_p50, bar_p50),
                "expected": "barrier >= dag",
                "measured": direction(dag_p50, bar_p50),
                "holds": bar_p50 is not None and dag_p50 is not None and bar_p50 >= dag_p50,
            }
            rows.append(row)
    return rows


def kv_budget_rows(results: Mapping[str, ScenarioResult]) -> list[Row]:
    """Per KV budget: prefill factor and target root P95 (expected: both fall as KV grows).

    Rows are sorted by KV budget; `*_vs_smaller` is the direction of the median from the
    previous (smaller) budget. Arms must set `kv_cache_gib` by override.

    Examples:
        >>> kv_budget_rows({})
        []
    """
    rows: list[Row] = []
    for name, result in results.items():
        arms = [(kv_gib_of(a.overrides), a.name) for a in result.scenario.arms]
        by_arm = result.by_arm()
        prev: Row | None = None
        for kv, arm in sorted(arms, key=lambda t: (t[0] is None, t[0] or 0.0)):
            runs = by_arm[arm]
            row: Row = {"scenario": name, "arm": arm, "kv_cache_gib": kv, "blocks": len(runs)}
            bf.put(row, "prefill_factor", [bf.run_prefill_factor(r.run) for r in runs])
            bf.put(row, "num_preemptions", [bf.num_preemptions(r.run) for r in runs])
            bf.put(row, "peak_running_seqs", [bf.peak_running_seqs(r.run) for r in runs])
            bf.put(row, "root_p95_s", _p(result, runs, 95))
            row["expected"] = "smaller KV -> higher prefill factor and P95"
            if prev is not None:
                row["factor_vs_smaller"] = direction(prev["prefill_factor"], row["prefill_factor"])
                row["p95_vs_smaller"] = direction(prev["root_p95_s"], row["root_p95_s"])
                row["holds"] = row["prefill_factor"] <= prev["prefill_factor"] + 1e-12
            rows.append(row)
            prev = row
    return rows


def rate_rows(results: Mapping[str, ScenarioResult]) -> list[Row]:
    """DAG vs Barrier attainment, goodput and λ* per (rate, KV budget) (expected: DAG ≥ Barrier).

    Arms are named `<rule>-kv<GiB>` (`dag-kv16`, `barrier-kv16`, ...); rows are one per
    (scenario, KV budget), sorted by arrival rate. `dag_lambda_star_per_s` /
    `barrier_lambda_star_per_s` are that KV budget's λ* over every scenario's rate
    (`bench.replay.block_figures.sweep_lambda_star`, α = `LAMBDA_ALPHA`, minimum across blocks);
    their `_range` is λ* of each block's own sweep.

    Examples:
        >>> rate_rows({})
        []
    """
    ordered = sorted(results.items(), key=lambda kv: _rate(kv[1]))
    figures: dict[tuple[str, str, str], list[bf.DeadlineFigures | None]] = {}
    budgets: dict[str, list[str]] = {}
    for name, result in ordered:
        budgets[name] = sorted(
            {a.name.split("-kv", 1)[1] for a in result.scenario.arms if "-kv" in a.name}, key=float
        )
        by_arm = result.by_arm()
        for kv in budgets[name]:
            for rule in ("dag", "barrier"):
                figures[name, kv, rule] = [
                    bf.run_deadline_figures(result, r.run) for r in by_arm[f"{rule}-kv{kv}"]
                ]
    stars = {
        (kv, rule): bf.sweep_lambda_star(
            {_rate(res): figures[n, kv, rule] for n, res in ordered if kv in budgets[n]},
            LAMBDA_ALPHA,
        )
        for kv in {k for ks in budgets.values() for k in ks}
        for rule in ("dag", "barrier")
    }
    rows: list[Row] = []
    for name, result in ordered:
        for kv in budgets[name]:
            row: Row = {"scenario": name, "rate_per_s": _rate(result), "kv_cache_gib": float(kv)}
            row["blocks"] = len(figures[name, kv, "dag"])
            med: dict[str, float | None] = {}
            for rule in ("dag", "barrier"):
                figs = figures[name, kv, rule]
                med[f"{rule}_a"] = bf.put(row, f"{rule}_attainment", [_att(f) for f in figs])
                med[f"{rule}_g"] = bf.put(row, f"{rule}_goodput_per_s", [_good(f) for f in figs])
            dag_a, bar_a, dag_g, bar_g = (
                med[k] for k in ("dag_a", "barrier_a", "dag_g", "barrier_g")
            )
            row["attainment_gap"] = _gap(dag_a, bar_a)
            row["goodput_gap_per_s"] = _gap(dag_g, bar_g)
            for rule in ("dag", "barrier"):
                star, per_block = stars[kv, rule]
                row[f"{rule}_lambda_star_per_s"] = star
                row[f"{rule}_lambda_star_per_s_range"] = bf.range_text(per_block)
            row |= {
                "expected": "dag >= barrier, gap larger at higher rate / smaller KV",
                "measured": direction(bar_a, dag_a),
                "holds": _ge(dag_a, bar_a) and _ge(dag_g, bar_g),
            }
            rows.append(row)
    return rows


def request_limit_rows(results: Mapping[str, ScenarioResult]) -> list[Row]:
    """Per request limit: output TPS vs timely-task rate (expected: TPS up, timely may fall).

    Arms set `max_num_seqs` by override; rows sorted by it, `*_vs_smaller` is the direction of
    the median from the previous (smaller) limit.

    Examples:
        >>> request_limit_rows({})
        []
    """
    rows: list[Row] = []
    for name, result in results.items():
        by_arm = result.by_arm()
        arms = sorted(
            ((_override(result, a.name, "max_num_seqs"), a.name) for a in result.scenario.arms),
            key=lambda t: (t[0] is None, t[0] or 0),
        )
        prev: Row | None = None
        for limit, arm in arms:
            runs = by_arm[arm]
            figs = [bf.run_deadline_figures(result, r.run) for r in runs]
            row: Row = {"scenario": name, "arm": arm, "max_num_seqs": limit, "blocks": len(runs)}
            bf.put(row, "peak_running_seqs", [bf.peak_running_seqs(r.run) for r in runs])
            bf.put(row, "output_tps", [bf.output_tps(result, r.run) for r in runs])
            bf.put(row, "timely_tasks_per_s", [_timely(f) for f in figs])
            bf.put(row, "attainment", [_att(f) for f in figs])
            bf.put(row, "root_p95_s", _p(result, runs, 95))
            row["expected"] = "larger limit -> output TPS up, timely-task rate may fall"
            if prev is not None:
                row["tps_vs_smaller"] = direction(prev["output_tps"], row["output_tps"])
                row["timely_vs_smaller"] = direction(
                    prev["timely_tasks_per_s"], row["timely_tasks_per_s"]
                )
            rows.append(row)
            prev = row
    return rows


def _att(f: bf.DeadlineFigures | None) -> float | None:
    return f.attainment if f is not None else None


def _good(f: bf.DeadlineFigures | None) -> float | None:
    return f.goodput_per_s if f is not None else None


def _timely(f: bf.DeadlineFigures | None) -> float | None:
    return f.timely_rate_per_s if f is not None else None


def _gap(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def _ge(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and a >= b


def _rate(result: ScenarioResult) -> float:
    return float(getattr(result.scenario.arrivals, "rate_per_s", 0.0))


def _pct_change(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before == 0:
        return None
    return 100.0 * (after - before) / before
