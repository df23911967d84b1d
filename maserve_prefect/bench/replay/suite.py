"""Running a replay suite: every arm of every scenario, its audit, its metric tables, findings.

One idea: a replay suite run is a thin loop over `replay.arms.run_scenario` — each arm is
already its own `maserve-replay-arm` flow run (nested under the suite's `maserve-suite` flow run
when there is one; see `bench.flow`) — that adds what a benchmark needs around it: progress after
each arm run, the conformance audit and the task- and engine-level metric tables of every arm
run (`replay.report.report_scenario`, the same tables `maserve replay` prints) and the optional
findings analysis. `ReplaySuiteResult.report()` lays them out as every suite kind does
(`bench.report.Report`).

Native cohorts are realized once per suite run: scenarios whose cohorts name the same native
recipe (workflow, binding, users, seed) replay the same recorded trace (`native_cohorts`), so a
finding that holds its targets fixed across scenarios (App. G.2's backgrounds) replays identical
target work by construction, and each recipe costs one native run.

The native trace given to the audit's replay/native ratio is the scenario's trace set itself
when its manifest says it was recorded natively (the usual case: native cohorts or bundles of
native runs; see `report_scenario`).

Examples:
    >>> total_arm_runs([])
    0
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from maserve_prefect.bench.fanout import Fanout, run_units
from maserve_prefect.bench.replay.suite_file import ReplaySuite
from maserve_prefect.bench.report import ProgressFn, Report, Row, Table
from maserve_prefect.bench.units import Unit
from maserve_prefect.errors import ConfigError
from maserve_prefect.replay.arms import (
    ScenarioResult,
    arm_order,
    prepare_scenario,
    run_arm_unit,
)
from maserve_prefect.replay.conformance import ConformanceReport
from maserve_prefect.replay.report import report_scenario
from maserve_prefect.replay.scenario import NativeRecipe, Scenario
from maserve_prefect.replay.traceset import load_cohort, realization_pool
from maserve_prefect.trace.cas import BlobStore
from maserve_prefect.trace.model import Trace

Loaded = tuple[Trace, BlobStore]


@dataclass(slots=True)
class ReplaySuiteResult:
    """A replay suite run: every scenario's result, the audits, and the findings rows.

    Attributes:
        suite: the parsed suite; `scale`: the scale it ran at.
        results: scenario name → its `ScenarioResult`, in suite order.
        conformance: scenario name → one `ConformanceReport` per arm run (result order).
        metrics: scenario name → its metric tables (`replay.report.metric_tables`).
        findings: rows of the suite's `analysis` function (empty without one).
    """

    suite: ReplaySuite
    scale: str
    results: dict[str, ScenarioResult] = field(default_factory=dict)
    conformance: dict[str, list[ConformanceReport]] = field(default_factory=dict)
    metrics: dict[str, dict[str, list[Row]]] = field(default_factory=dict)
    findings: list[Row] = field(default_factory=list)

    def arm_rows(self) -> list[Row]:
        """One row per scenario, arm and block: root-latency percentiles, attainment, early."""
        rows = []
        for name, res in self.results.items():
            for results in res.by_arm().values():
                for r in results:
                    rows.append({"scenario": name} | asdict(r.summary))
        return rows

    def conformance_rows(self) -> list[Row]:
        """One row per scenario and arm run: the audit (see `ConformanceReport.row`)."""
        rows = []
        for name, reports in self.conformance.items():
            res = self.results[name]
            for r, rep in zip(res.results, reports, strict=True):
                rows.append({"scenario": name, "block": r.summary.block} | rep.row())
        return rows

    def metric_rows(self) -> dict[str, list[Row]]:
        """Metric table name → rows of every scenario, each row led by its scenario."""
        out: dict[str, list[Row]] = {}
        for name, tables in self.metrics.items():
            for table, rows in tables.items():
                out.setdefault(table, []).extend({"scenario": name} | r for r in rows)
        return out

    def tables(self) -> dict[str, list[Row]]:
        """Report name → rows: arms, conformance, the metric tables (completion path, stage
        time, attempts, slo, goodput and, on the simulator, engine, replicas, co-batching,
        preemptions), and findings when the suite has an analysis."""
        out = {"arms": self.arm_rows(), "conformance": self.conformance_rows()}
        out |= self.metric_rows()
        if self.findings:
            out["findings"] = self.findings
        return out

    @property
    def passed(self) -> bool:
        """True when every arm run passed its conformance audit."""
        return all(rep.passed for reps in self.conformance.values() for rep in reps)

    @property
    def work_ok(self) -> bool:
        """True when every arm run passed the audit's work checks (`ConformanceReport.work_ok`:
        all that `passed` asks except the wall-clock lateness goal)."""
        return all(rep.work_ok for reps in self.conformance.values() for rep in reps)

    def summary(self) -> dict[str, Any]:
        """The JSON fields beside the tables: deadlines per scenario and the audit verdicts."""
        return {
            "deadlines_s": {n: r.deadlines_s for n, r in self.results.items()},
            "passed": self.passed,
            "work_ok": self.work_ok,
        }

    def report(self) -> Report:
        """The tables as every suite kind shows them; the metric tables are detail."""
        metric = set(self.metric_rows())
        tables = {name: Table(rows, detail=name in metric) for name, rows in self.tables().items()}
        return Report(tables, self.summary(), passed=self.passed)


def total_arm_runs(scenarios: Sequence[Scenario]) -> int:
    """Arm runs a suite makes: blocks × arms, summed over its scenarios."""
    return sum(s.blocks * len(s.arms) for s in scenarios)


NativeKey = tuple[NativeRecipe, Path | None]
"""A native realization's identity: its recipe and the pool it is realized on."""


def native_cohorts(sc: Scenario, cache: dict[NativeKey, Loaded]) -> dict[str, Loaded]:
    """Cohort name → (trace, store) of `sc`'s native cohorts, each recipe realized once per
    pool (`traceset.realization_pool`) per `cache` (bundle cohorts are left to the scenario)."""
    out: dict[str, Loaded] = {}
    for cohort in sc.cohorts:
        if cohort.native is None:
            continue
        key = (cohort.native, realization_pool(sc, cohort))
        if key not in cache:
            cache[key] = load_cohort(sc, cohort)
        out[cohort.name] = cache[key]
    return out


def run_replay_suite(
    suite: ReplaySuite,
    scale: str = "demo",
    *,
    prefect: bool = True,
    progress: ProgressFn | None = None,
    fanout: Fanout | None = None,
) -> ReplaySuiteResult:
    """Run every scenario of a replay suite in the current context (no flow of its own).

    Each scenario is prepared here (trace set, checks, the deadlines' reference replay; native
    cohorts realized once per suite), then every arm run of every scenario is one unit
    (`bench.fanout`), run here in order or on Dask, and the results are kept in scenario and
    arm-run order, as the sequential loop keeps them.

    Args:
        suite: the parsed suite.
        scale: `demo` or `full`.
        prefect: run each arm as a `maserve-replay-arm` flow run (False: bare).
        progress: called after each arm run, labelled `scenario/arm/b<block>`.
        fanout: where the arm runs go (None: here, in order).

    Raises:
        ConfigError: a bad scale, scenario or analysis, or Dask workers for a scenario that
            replays on a real server (its arm runs share the server).
    """
    suite.check_scale(scale)
    scenarios = suite.load_scenarios(scale)
    analysis = suite.analysis_fn()  # fail on a bad analysis path before any work
    if fanout is not None and fanout.distributed:
        check_side_by_side(scenarios)
    out = ReplaySuiteResult(suite, scale)
    natives: dict[NativeKey, Loaded] = {}
    prepared = [prepare_scenario(sc, native_cohorts(sc, natives)) for sc in scenarios]
    units = [
        Unit(f"{p.scenario.name}/{arm.name}/b{block}", run_arm_unit,
             (p.scenario, p.trace_set, arm, block, p.deadlines_s, prefect, p.server_info))
        for p in prepared
        for block, arm in arm_order(p.scenario)
    ]  # fmt: skip
    results, _ = run_units(units, fanout, progress)
    it = iter(results)
    for p in prepared:
        p.results = [next(it) for _ in arm_order(p.scenario)]
        rep = report_scenario(p)
        out.results[p.scenario.name] = rep.result
        out.conformance[p.scenario.name] = rep.conformance
        out.metrics[p.scenario.name] = rep.metric_tables
    if analysis is not None:
        out.findings = list(analysis(out.results))
    return out


def check_side_by_side(scenarios: Sequence[Scenario]) -> None:
    """Refuse Dask workers for a suite with a scenario on a real server: its arm runs would
    share that server at once, and each drains it first (`replay.arms.drain_engine`).

    Raises:
        ConfigError: naming the scenario and its engine.
    """
    for sc in scenarios:
        if sc.engine != "sim":
            raise ConfigError(
                f"scenario {sc.source}: engine {sc.engine} is a real server its arm runs share; "
                "run this suite with --workers 1 (no --dask-address)"
            )
