"""Running a benchmark suite: one `maserve-suite` Prefect flow run over its scenarios.

One idea: a suite run is a thin loop over `replay.arms.run_scenario` — each arm is already its
own `maserve-replay-arm` flow run (here nested under the suite's flow run) — that adds what a
benchmark needs around it: a progress artifact (`maserve-suite-<name>-progress`, advanced after
each arm run), the conformance audit and the task- and engine-level metric tables of every arm
run (`replay.report.report_scenario`, the same tables `maserve replay` prints), the
optional findings analysis, and the result tables published as Prefect artifacts
(`metrics.report.publish_artifacts`). The same flow is what `maserve bench
serve` deploys, so a scheduled run and `maserve bench run` do exactly the same work. With
`prefect=False` the loop runs without Prefect (no artifacts).

The native trace given to the audit's replay/native ratio is the scenario's trace set itself
when its manifest says it was recorded natively (the usual case: native cohorts or bundles of
native runs; see `report_scenario`).

Examples:
    >>> total_arm_runs([])
    0
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from maserve_prefect.bench.suite import Suite, check_scale, load_suite
from maserve_prefect.metrics.report import Progress
from maserve_prefect.replay.arms import ArmResult, ScenarioResult, run_scenario
from maserve_prefect.replay.conformance import ConformanceReport
from maserve_prefect.replay.report import report_scenario
from maserve_prefect.replay.scenario import Scenario

Row = dict[str, Any]
ProgressFn = Callable[[int, int, str], None]
"""Called after each arm run with (arm runs done, arm runs in total, "scenario/arm/b<block>")."""


@dataclass(slots=True)
class SuiteResult:
    """A suite run: every scenario's result, the audits, and the findings rows.

    Attributes:
        suite: the parsed suite; `scale`: the scale it ran at.
        results: scenario name → its `ScenarioResult`, in suite order.
        conformance: scenario name → one `ConformanceReport` per arm run (result order).
        metrics: scenario name → its metric tables (`replay.report.metric_tables`).
        findings: rows of the suite's `analysis` function (empty without one).
        flow_run_id: the `maserve-suite` flow run (None without Prefect).
    """

    suite: Suite
    scale: str
    results: dict[str, ScenarioResult] = field(default_factory=dict)
    conformance: dict[str, list[ConformanceReport]] = field(default_factory=dict)
    metrics: dict[str, dict[str, list[Row]]] = field(default_factory=dict)
    findings: list[Row] = field(default_factory=list)
    flow_run_id: str | None = None

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

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready summary (no traces): suite, scale, deadlines and every table."""
        return {
            "suite": self.suite.name,
            "scale": self.scale,
            "flow_run_id": self.flow_run_id,
            "deadlines_s": {n: r.deadlines_s for n, r in self.results.items()},
            "passed": self.passed,
            "work_ok": self.work_ok,
        } | self.tables()

    @property
    def passed(self) -> bool:
        """True when every arm run passed its conformance audit."""
        return all(rep.passed for reps in self.conformance.values() for rep in reps)

    @property
    def work_ok(self) -> bool:
        """True when every arm run passed the audit's work checks (`ConformanceReport.work_ok`:
        all that `passed` asks except the wall-clock lateness goal)."""
        return all(rep.work_ok for reps in self.conformance.values() for rep in reps)


def total_arm_runs(scenarios: Sequence[Scenario]) -> int:
    """Arm runs a suite makes: blocks × arms, summed over its scenarios."""
    return sum(s.blocks * len(s.arms) for s in scenarios)


def execute_suite(
    suite: Suite, scale: str = "demo", *, prefect: bool = True, progress: ProgressFn | None = None
) -> SuiteResult:
    """Run every scenario of a parsed suite in the current context (no flow of its own).

    Raises:
        ConfigError: a bad scale, scenario or analysis.
    """
    check_scale(scale)
    scenarios = suite.load_scenarios(scale)
    analysis = suite.analysis_fn()  # fail on a bad analysis path before any work
    total, done = total_arm_runs(scenarios), 0
    bar = Progress(f"suite {suite.name} ({scale})", key=f"maserve-suite-{suite.name}-progress")
    out = SuiteResult(suite, scale)
    for sc in scenarios:

        def on_arm(r: ArmResult, sc: Scenario = sc) -> None:
            nonlocal done
            done += 1
            bar.update(100.0 * done / total)
            if progress is not None:
                progress(done, total, f"{sc.name}/{r.summary.arm}/b{r.summary.block}")

        rep = report_scenario(run_scenario(sc, prefect=prefect, on_arm=on_arm))
        out.results[sc.name] = rep.result
        out.conformance[sc.name] = rep.conformance
        out.metrics[sc.name] = rep.metric_tables
    if analysis is not None:
        out.findings = list(analysis(out.results))
    return out


# -- in-process hand-off from the `maserve-suite` flow (`bench.flow`) to `run_suite` ----------

CAPTURE: dict[str, SuiteResult] = {}
"""Capture key → the full result, deposited by the flow for an in-process caller."""
PROGRESS: dict[str, ProgressFn] = {}
"""Capture key → the caller's progress callback."""
_KEYS = itertools.count()


def run_suite(
    path: str | Path,
    scale: str = "demo",
    *,
    prefect: bool = True,
    progress: ProgressFn | None = None,
) -> SuiteResult:
    """Run a suite file now: one `maserve-suite` flow run (needs a Prefect API), or none.

    Args:
        path: the suite YAML file.
        scale: `demo` (CI-sized) or `full`.
        prefect: run as a Prefect flow run with artifacts; False runs the same loop bare.
        progress: called after each arm run (see `ProgressFn`).

    Raises:
        ConfigError: a bad suite, scale, scenario or analysis (file and field named).

    Examples:
        >>> run_suite("/nonexistent.yaml", prefect=False)
        Traceback (most recent call last):
        ...
        maserve_prefect.errors.ConfigError: suite /nonexistent.yaml: cannot read it: [Errno 2] No such file or directory: '/nonexistent.yaml'
    """
    suite = load_suite(path)  # parse errors surface before a flow run is created
    check_scale(scale)
    if not prefect:
        return execute_suite(suite, scale, prefect=False, progress=progress)
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from maserve_prefect.bench.flow import maserve_suite

    key = f"suite-{next(_KEYS)}"
    if progress is not None:
        PROGRESS[key] = progress
    try:
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            maserve_suite.with_options(flow_run_name=f"{suite.name}-{scale}")(
                str(Path(path).resolve()), scale, key
            )
        return CAPTURE.pop(key)
    finally:
        PROGRESS.pop(key, None)
        CAPTURE.pop(key, None)
