"""Analysis of the four seed-finding suites: one function per suite, results → finding rows.

One idea: every figure here is read from the replays the suite ran — root latencies of the
measured roots (`ArmResult.run`), the locked deadlines (`ScenarioResult.deadlines_s`) and the
simulator's step records — and each row states the *direction* the issue expects next to what
was measured, so a table of rows is the finding. Nothing is fitted or hard-coded.

Load rule (one for all four suites, stated here once and in the README): Poisson arrivals at the
rungs of `LOAD_LADDER` × `MU_SAT_PER_S` (μ_sat: the four-call's saturated service rate on the
suites' pool). The low-load finding (Barrier vs DAG) runs at the lowest rung, the rate sweep at
every rung, and the findings about resource limits (KV budget, request limit) at the highest,
the only rung where those limits can bind. `tests/bench` checks every suite file against it.

Figures (over the measured roots: target cohorts whose arrival lies in the scenario window,
pooled over blocks):

- root latency P50 / P95 per arm (and per workload class for the barrier suite);
- **prefill factor** = processed / source prefill tokens (`metrics.engine.prefill_factor`);
- **attainment** = share of measured roots with latency ≤ their class's locked deadline;
- **goodput** = measured roots that met their deadline per second of their arrival span
  (first to last arrival; None when they all arrived at once);
- **output TPS** = output tokens of every completed model op / (last completion − start);
- **timely-task rate** = goodput (tasks finished within their deadline per second);
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

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from maserve_prefect.metrics.engine import prefill_factor
from maserve_prefect.replay.arms import ArmResult, ScenarioResult, root_class
from maserve_prefect.trace.model import OpKind, OpStatus

Row = dict[str, Any]

MU_SAT_PER_S = 1.488
"""μ_sat in roots/s: N / makespan of a 32-root `four_call_full` DAG burst on
`pool_h100_qwen3_8b.yaml` (32 / 21.50 s, the same at 16, 32 and 40 GiB)."""

LOAD_LADDER: tuple[float, ...] = (0.25, 1.0, 4.0, 16.0)
"""Arrival rates as multiples of μ_sat: a ratio-4 geometric ladder from under-load (¼ μ_sat)
through saturation to 16× overload, where a whole cohort arrives within seconds."""


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


def measured_latencies(
    result: ScenarioResult, runs: Iterable[ArmResult], cls: str | None = None
) -> list[float]:
    """Latencies of the measured roots (optionally of one class), pooled over `runs`."""
    roots = {r.root_id: r for r in result.trace_set.trace.roots}
    window = result.scenario.window
    out: list[float] = []
    for res in runs:
        run = res.run
        for rid in result.trace_set.targets():
            if not window.holds(run.root_arrival_s[rid] - run.start_s):
                continue
            if cls is not None and root_class(roots[rid]) != cls:
                continue
            out.append(run.root_latency_s[rid])
    return out


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values), q)) if values else None


def deadline_figures(result: ScenarioResult, runs: Sequence[ArmResult]) -> tuple[float, float]:
    """(attainment, goodput per s) of the measured roots against the locked deadlines.

    Goodput is per second of each block's arrival span, averaged over blocks (nan when the
    measured roots of a block all arrived at once).
    """
    roots = {r.root_id: r for r in result.trace_set.trace.roots}
    window = result.scenario.window
    met = total = 0
    rates: list[float] = []
    for res in runs:
        run = res.run
        arrivals, num_met = [], 0
        for rid in result.trace_set.targets():
            offset = run.root_arrival_s[rid] - run.start_s
            cls = root_class(roots[rid])
            if not window.holds(offset) or cls not in result.deadlines_s:
                continue
            arrivals.append(offset)
            num_met += run.root_latency_s[rid] <= result.deadlines_s[cls]
        met, total = met + num_met, total + len(arrivals)
        span = max(arrivals) - min(arrivals) if arrivals else 0.0
        rates.append(num_met / span if span > 0 else float("nan"))
    attain = met / total if total else float("nan")
    return attain, float(np.mean(rates)) if rates else float("nan")


def output_tps(runs: Sequence[ArmResult]) -> float:
    """Output tokens of completed model ops per second of replay, averaged over `runs`."""
    tps = []
    for res in runs:
        run = res.run
        tokens = sum(
            op.num_output_tokens or 0
            for op in run.trace.ops
            if op.kind is OpKind.MODEL and op.status is OpStatus.COMPLETED
        )
        span = run.end_s - run.start_s
        tps.append(tokens / span if span > 0 else float("nan"))
    return float(np.mean(tps))


def arm_prefill_factor(runs: Sequence[ArmResult]) -> float:
    """Processed / source prefill tokens over every completed request of `runs` (pooled)."""
    proc = src = 0
    for res in runs:
        records = res.run.step_records()
        pf = prefill_factor(records, res.run.trace)
        proc, src = proc + pf.processed_tokens, src + pf.source_tokens
    return proc / src if src else float("nan")


def _num_preemptions(runs: Sequence[ArmResult]) -> int:
    return sum(len(r.preempted) for res in runs for r in res.run.step_records())


def peak_running_seqs(runs: Sequence[ArmResult]) -> int:
    """The most requests any one engine step of `runs` scheduled (0 without step records)."""
    return max((len(r.scheduled) for res in runs for r in res.run.step_records()), default=0)


# -- the four suites ---------------------------------------------------------------------------


def barrier_rows(results: Mapping[str, ScenarioResult]) -> list[Row]:
    """Barrier vs DAG root latency per scenario and workload class (expected: Barrier ≥ DAG).

    Every scenario must have arms named `dag` and `barrier`.

    Examples:
        >>> barrier_rows({})
        []
    """
    rows: list[Row] = []
    for name, result in results.items():
        by_arm = result.by_arm()
        classes = sorted(
            {
                root_class(r)
                for r in result.trace_set.trace.roots
                if result.trace_set.role_of[r.root_id] == "target"
            }
        )
        for cls in classes:
            dag = measured_latencies(result, by_arm["dag"], cls)
            bar = measured_latencies(result, by_arm["barrier"], cls)
            dag_p50, bar_p50 = _pct(dag, 50), _pct(bar, 50)
            dag_p95, bar_p95 = _pct(dag, 95), _pct(bar, 95)
            mean_delta = float(np.mean(np.asarray(bar) - np.asarray(dag))) if dag else None
            rows.append(
                {
                    "scenario": name,
                    "class": cls,
                    "num_roots": len(dag),
                    "dag_p50_s": dag_p50,
                    "barrier_p50_s": bar_p50,
                    "dag_p95_s": dag_p95,
                    "barrier_p95_s": bar_p95,
                    "mean_paired_delta_s": mean_delta,
                    "p50_change_pct": _pct_change(dag_p50, bar_p50),
                    "expected": "barrier >= dag",
                    "measured": direction(dag_p50, bar_p50),
                    "holds": bar_p50 is not None and dag_p50 is not None and bar_p50 >= dag_p50,
                }
            )
    return rows


def kv_budget_rows(results: Mapping[str, ScenarioResult]) -> list[Row]:
    """Per KV budget: prefill factor and target root P95 (expected: both fall as KV grows).

    Rows are sorted by KV budget; `measured` is the direction from the previous (smaller)
    budget. Arms must set `kv_cache_gib` by override.

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
            lat = measured_latencies(result, by_arm[arm])
            row: Row = {
                "scenario": name,
                "arm": arm,
                "kv_cache_gib": kv,
                "prefill_factor": arm_prefill_factor(by_arm[arm]),
                "num_preemptions": _num_preemptions(by_arm[arm]),
                "peak_running_seqs": peak_running_seqs(by_arm[arm]),
                "root_p95_s": _pct(lat, 95),
                "expected": "smaller KV -> higher prefill factor and P95",
            }
            if prev is not None:
                row["factor_vs_smaller"] = direction(prev["prefill_factor"], row["prefill_factor"])
                row["p95_vs_smaller"] = direction(prev["root_p95_s"], row["root_p95_s"])
                row["holds"] = row["prefill_factor"] <= prev["prefill_factor"] + 1e-12
            rows.append(row)
            prev = row
    return rows


def rate_rows(results: Mapping[str, ScenarioResult]) -> list[Row]:
    """DAG vs Barrier attainment and goodput per (rate, KV budget) (expected: DAG ≥ Barrier).

    Arms are named `<rule>-kv<GiB>` (`dag-kv16`, `barrier-kv16`, ...); rows are one per
    (scenario, KV budget), sorted by arrival rate.

    Examples:
        >>> rate_rows({})
        []
    """
    rows: list[Row] = []
    for name, result in sorted(results.items(), key=lambda kv: _rate(kv[1])):
        by_arm = result.by_arm()
        budgets = sorted(
            {a.name.split("-kv", 1)[1] for a in result.scenario.arms if "-kv" in a.name}, key=float
        )
        for kv in budgets:
            dag_a, dag_g = deadline_figures(result, by_arm[f"dag-kv{kv}"])
            bar_a, bar_g = deadline_figures(result, by_arm[f"barrier-kv{kv}"])
            rows.append(
                {
                    "scenario": name,
                    "rate_per_s": _rate(result),
                    "kv_cache_gib": float(kv),
                    "dag_attainment": dag_a,
                    "barrier_attainment": bar_a,
                    "dag_goodput_per_s": dag_g,
                    "barrier_goodput_per_s": bar_g,
                    "attainment_gap": dag_a - bar_a,
                    "goodput_gap_per_s": dag_g - bar_g,
                    "expected": "dag >= barrier, gap larger at higher rate / smaller KV",
                    "measured": direction(bar_a, dag_a),
                    "holds": dag_a >= bar_a and dag_g >= bar_g,
                }
            )
    return rows


def request_limit_rows(results: Mapping[str, ScenarioResult]) -> list[Row]:
    """Per request limit: output TPS vs timely-task rate (expected: TPS up, timely may fall).

    Arms set `max_num_seqs` by override; rows sorted by it, `*_vs_smaller` is the direction
    from the previous (smaller) limit.

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
            attain, goodput = deadline_figures(result, by_arm[arm])
            row: Row = {
                "scenario": name,
                "arm": arm,
                "max_num_seqs": limit,
                "peak_running_seqs": peak_running_seqs(by_arm[arm]),
                "output_tps": output_tps(by_arm[arm]),
                "timely_tasks_per_s": goodput,
                "attainment": attain,
                "root_p95_s": _pct(measured_latencies(result, by_arm[arm]), 95),
                "expected": "larger limit -> output TPS up, timely-task rate may fall",
            }
            if prev is not None:
                row["tps_vs_smaller"] = direction(prev["output_tps"], row["output_tps"])
                row["timely_vs_smaller"] = direction(
                    prev["timely_tasks_per_s"], row["timely_tasks_per_s"]
                )
            rows.append(row)
            prev = row
    return rows


def _rate(result: ScenarioResult) -> float:
    return float(getattr(result.scenario.arrivals, "rate_per_s", 0.0))


def _pct_change(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before == 0:
        return None
    return 100.0 * (after - before) / before
