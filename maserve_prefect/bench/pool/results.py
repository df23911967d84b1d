"""What a pool suite run recorded: per (arrival pattern, arm, run) numbers, bounds, workload.

One idea: the run (`bench.pool.suite`) only records plain numbers here (the Oracle's too, or
why it did not run); every table is a pure
function of them (`bench.pool.tables`), so the tables are deterministic for a suite file and
scale, and the record carries no reference back to the code that reads it.

Examples:
    >>> ArmRun("burst", "joint", 0, {"makespan_s": 3.0}, {"r0": 2.0}, 0).summary["makespan_s"]
    3.0
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from maserve_prefect.bench.pool.suite_file import PoolSuite
from maserve_prefect.pool.oracle import OracleResult
from maserve_prefect.pool.results import PoolRunResult

Row = dict[str, Any]


@dataclass(slots=True)
class ArmRun:
    """The numbers one arm run produced (what the tables need, not the whole result)."""

    pattern: str
    arm: str
    run: int
    summary: dict[str, float]
    latency_s: dict[str, float]
    num_reacquiring_ops: int
    by_scenario: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per workflow: GPU-seconds per completed session by part (`pool.gpu_attribution`)."""

    @classmethod
    def of(cls, pattern: str, arm: str, run: int, res: PoolRunResult) -> ArmRun:
        return cls(
            pattern,
            arm,
            run,
            res.summary(),
            dict(res.root_latency_s),
            sum(o.reacquire_s > 0 for o in res.ops),
            {wf: dict(parts) for wf, parts in res.gpu_s_by_scenario.items()},
        )


@dataclass(slots=True)
class OracleRun:
    """The Oracle's numbers for one (arrival pattern, run): its best schedule's summary, where
    the schedule came from and the search's effort."""

    summary: dict[str, float]
    source: str
    num_evaluated: int
    num_improvements: int

    @classmethod
    def of(cls, found: OracleResult) -> OracleRun:
        return cls(
            found.result.summary(), found.source, found.num_evaluated, found.num_improvements
        )


@dataclass(slots=True)
class PoolSuiteResult:
    """A suite run: per-run numbers, lower bounds, workload facts, predictor scores."""

    suite: PoolSuite
    scale: str
    runs: list[ArmRun] = field(default_factory=list)
    lower_bounds: dict[tuple[str, int], float] = field(default_factory=dict)
    oracles: dict[tuple[str, int], OracleRun] = field(default_factory=dict)
    oracle_skipped: dict[tuple[str, int], str] = field(default_factory=dict)  # why not run
    paths: dict[int, dict[str, str]] = field(default_factory=dict)  # run -> root -> path
    workload: list[Row] = field(default_factory=list)
    predictors: list[Row] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The JSON fields beside the tables: the scale, the goals, every run's numbers, the
        lower bounds and the wall seconds of each phase."""
        return {
            "scale_config": self.suite.scale(self.scale).model_dump(mode="json"),
            "goals": self.suite.goals.model_dump(),
            "per_run": [
                {"pattern": r.pattern, "arm": r.arm, "run": r.run, **r.summary} for r in self.runs
            ],
            "lower_bound_s": {f"{p}/run{r}": v for (p, r), v in self.lower_bounds.items()},
            "oracle": {
                f"{p}/run{r}": {"source": o.source, "evaluated": o.num_evaluated, **o.summary}
                for (p, r), o in self.oracles.items()
            },
            "oracle_skipped": {f"{p}/run{r}": v for (p, r), v in self.oracle_skipped.items()},
            "wall_seconds": self.seconds,
        }
