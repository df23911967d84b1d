"""Running a scenario: deadlines locked first, then paired blocks of arms, one Prefect flow per arm.

One idea: a comparison is fair only if everything but the arm is fixed before the arms run. So
`run_scenario` (1) builds the trace set once, (2) computes and *locks* the per-class deadlines —
explicit seconds, or `factor ×` a latency quantile from an independent low-load reference replay
(DAG rule, one root at a time: closed loop with one user and no think time, on the first arm's
pool) — and writes them into the result before any arm runs, then (3) runs `blocks` paired
blocks: in each block every arm replays the same arrivals (the block's seed is the scenario seed
+ block index), arm order alternates (forward in even blocks, reversed in odd ones), and every arm
starts from drained state (a fresh kernel and a fresh warm pool). Each arm run is one Prefect flow
run (`maserve-replay-arm`) that drives the dispatcher — never a Prefect task per op; with
`prefect=False` the same function runs without Prefect.

The per-arm summary is deliberately minimal (root latency percentiles of the measured roots,
deadline attainment, early releases); task-level metrics are computed by `maserve_prefect.metrics`
from each arm's replay trace and step records. Across blocks an arm is summarized by the median
and range (min, max) of each figure.

Examples:
    >>> median_range([3.0, 1.0, 2.0])
    (2.0, 1.0, 3.0)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from maserve_prefect.engine.target import parse_engine
from maserve_prefect.errors import ConfigError
from maserve_prefect.replay.arrivals import ClosedLoopArrivals, ThinkTime, with_seed
from maserve_prefect.replay.driver import ReplayRun, replay_trace
from maserve_prefect.replay.scenario import Arm, Scenario, arrival_process
from maserve_prefect.replay.traceset import TraceSet, build_trace_set
from maserve_prefect.runtime.poolfile import PoolFile, default_pool_file, load_pool_file
from maserve_prefect.trace.cas import BlobStore
from maserve_prefect.trace.model import RootRecord, Trace

QUANTILES = (50, 95, 99)


@dataclass(slots=True)
class ArmSummary:
    """One arm in one block: the figures the CLI prints."""

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


@dataclass(slots=True)
class ArmResult:
    """An arm run: its summary and the full replay (trace, pool, step records)."""

    summary: ArmSummary
    run: ReplayRun
    flow_run_id: str | None = None


@dataclass(slots=True)
class ScenarioResult:
    """What a scenario produced: locked deadlines, every arm run, and cross-block summaries."""

    scenario: Scenario
    trace_set: TraceSet
    deadlines_s: dict[str, float]
    reference_latency_s: dict[str, list[float]]
    results: list[ArmResult] = field(default_factory=list)

    def by_arm(self) -> dict[str, list[ArmResult]]:
        """Results grouped by arm name, in scenario arm order, blocks in order."""
        out: dict[str, list[ArmResult]] = {a.name: [] for a in self.scenario.arms}
        for r in sorted(self.results, key=lambda r: r.summary.block):
            out[r.summary.arm].append(r)
        return out

    def across_blocks(self) -> dict[str, dict[str, tuple[float, float, float] | None]]:
        """Per arm: median and range of each summary figure across blocks."""
        figures = ("latency_p50_s", "latency_p95_s", "latency_p99_s", "attainment")
        out: dict[str, dict[str, tuple[float, float, float] | None]] = {}
        for arm, results in self.by_arm().items():
            out[arm] = {}
            for f in figures:
                vals = [getattr(r.summary, f) for r in results]
                out[arm][f] = median_range(vals) if vals and None not in vals else None
        return out


def median_range(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of `values`."""
    a = np.asarray(values, dtype=float)
    return float(np.median(a)), float(a.min()), float(a.max())


def root_class(root: RootRecord) -> str:
    """The deadline class of a root: its workload class, else its workflow, else "default"."""
    return root.workload_class or root.workflow or "default"


def arm_pool_file(scenario: Scenario, arm: Arm) -> PoolFile:
    """The arm's pool file with its per-deployment overrides applied.

    Raises:
        ConfigError: an override names a deployment the pool does not have.
    """
    pf = load_pool_file(scenario.path(arm.pool)) if arm.pool is not None else default_pool_file()
    if not arm.overrides:
        return pf
    names = pf.names()
    for dep in arm.overrides:
        if dep not in names:
            raise ConfigError(
                f"scenario {scenario.name}: arms.{arm.name}.overrides names deployment {dep!r}; "
                f"the pool has {', '.join(names)}"
            )
    deps = tuple(
        d.model_copy(update=arm.overrides[d.name].model_dump(exclude_none=True))
        if d.name in arm.overrides
        else d
        for d in pf.deployments
    )
    return pf.model_copy(update={"deployments": deps})


def _quantiles(lat: list[float]) -> list[float | None]:
    if not lat:
        return [None] * len(QUANTILES)
    return [float(v) for v in np.percentile(np.asarray(lat), QUANTILES)]


def summarize_arm(
    run: ReplayRun,
    ts: TraceSet,
    scenario: Scenario,
    deadlines: Mapping[str, float],
    *,
    arm: str,
    block: int,
) -> ArmSummary:
    """The arm's summary over the measured roots (window × target cohorts)."""
    roots = {r.root_id: r for r in ts.trace.roots}
    measured = [
        r for r in ts.targets() if scenario.window.holds(run.root_arrival_s[r] - run.start_s)
    ]
    lat = [run.root_latency_s[r] for r in measured]
    p50, p95, p99 = _quantiles(lat)
    attainment = None
    if deadlines and measured:
        met = [
            run.root_latency_s[r] <= deadlines[root_class(roots[r])]
            for r in measured
            if root_class(roots[r]) in deadlines
        ]
        attainment = sum(met) / len(met) if met else None
    return ArmSummary(
        arm=arm,
        block=block,
        rule=run.rule.value,
        non_causal=run.non_causal,
        num_roots=len(run.root_latency_s),
        num_measured=len(measured),
        latency_p50_s=p50,
        latency_p95_s=p95,
        latency_p99_s=p99,
        attainment=attainment,
        num_early_releases=run.num_early_releases,
        num_failed_ops=run.num_failed_ops,
        makespan_s=run.end_s - run.start_s,
    )


def lock_deadlines(
    scenario: Scenario, ts: TraceSet
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Explicit deadlines plus reference-derived ones for the other classes (see module doc)."""
    deadlines = dict(scenario.deadlines.classes)
    ref = scenario.deadlines.reference
    if ref is None:
        return deadlines, {}
    run = replay_trace(
        ts.trace,
        ts.store,
        rule="dag",
        arrivals=ClosedLoopArrivals(1, ThinkTime("constant", 0.0)),
        pool_file=arm_pool_file(scenario, scenario.arms[0]),
        lock=scenario.lock,
        slots=ts.slots,
        name="reference",
        engine=scenario.engine,
    )
    by_class: dict[str, list[float]] = {}
    for root in ts.trace.roots:
        by_class.setdefault(root_class(root), []).append(run.root_latency_s[root.root_id])
    for cls, lat in sorted(by_class.items()):
        deadlines.setdefault(cls, ref.factor * float(np.quantile(lat, ref.quantile)))
    return deadlines, by_class


# -- one Prefect flow per arm run -------------------------------------------------------------

_JOBS: dict[str, Callable[[], ArmResult]] = {}
_KEYS = itertools.count()


def _arm_flow() -> Any:
    from prefect import flow

    @flow(
        name="maserve-replay-arm", persist_result=False, log_prints=False, validate_parameters=False
    )
    def replay_arm(job: str, scenario: str, arm: str, block: int) -> dict[str, Any]:
        """Run one arm of a scenario (the whole replay drives the dispatcher in this flow)."""
        from prefect.runtime import flow_run

        result = _JOBS[job]()
        result.flow_run_id = str(flow_run.id)
        s = result.summary
        return {
            "arm": s.arm,
            "block": s.block,
            "p95_s": s.latency_p95_s,
            "early": s.num_early_releases,
        }

    return replay_arm


def run_arm(
    scenario: Scenario, ts: TraceSet, arm: Arm, block: int, deadlines: Mapping[str, float]
) -> ArmResult:
    """Replay one arm of one block without Prefect."""
    process = arrival_process(scenario.arrivals)
    seed = getattr(process, "seed", 0)
    run = replay_trace(
        ts.trace,
        ts.store,
        rule=arm.release,
        arrivals=with_seed(process, seed + block),
        barrier=[b.to_release() for b in arm.barrier],
        pool_file=arm_pool_file(scenario, arm),
        plan=arm.plan,
        lock=scenario.lock,
        slots=ts.slots,
        name=arm.name,
        notes={"scenario": scenario.name, "block": block},
        engine=scenario.engine,
    )
    return ArmResult(summarize_arm(run, ts, scenario, deadlines, arm=arm.name, block=block), run)


def run_scenario(
    scenario: Scenario,
    *,
    prefect: bool = True,
    loaded: Mapping[str, tuple[Trace, BlobStore]] | None = None,
    on_arm: Callable[[ArmResult], None] | None = None,
) -> ScenarioResult:
    """Run every arm of every block (see the module docstring).

    Args:
        scenario: the parsed scenario.
        prefect: run each arm as a `maserve-replay-arm` flow run (needs a Prefect API).
        loaded: cohort name → (trace, store) already in memory (skips loading those cohorts).
        on_arm: called after each arm run (progress).

    Raises:
        ConfigError: a malformed `engine` (not `sim` or `openai:URL`).
        UnsupportedError: the engine cannot honour the scenario's input contract.

    Examples:
        >>> from maserve_prefect.replay.scenario import parse_scenario
        >>> s = parse_scenario({"name": "x", "engine": "tgi", "cohorts": [
        ...     {"name": "t", "bundle": "b"}], "arms": [{"name": "dag"}]})
        >>> run_scenario(s)
        Traceback (most recent call last):
        ...
        maserve_prefect.errors.ConfigError: --engine 'tgi': expected 'sim' or 'openai:URL' (e.g. openai:http://127.0.0.1:8000)
    """
    parse_engine(scenario.engine)
    ts = build_trace_set(scenario, loaded)
    deadlines, reference = lock_deadlines(scenario, ts)
    result = ScenarioResult(scenario, ts, deadlines, reference)
    flow_fn = _arm_flow() if prefect else None
    for block in range(scenario.blocks):
        arms = scenario.arms if block % 2 == 0 else tuple(reversed(scenario.arms))
        for arm in arms:
            if flow_fn is None:
                res = run_arm(scenario, ts, arm, block, deadlines)
            else:
                res = _run_in_flow(flow_fn, scenario, ts, arm, block, deadlines)
            result.results.append(res)
            if on_arm is not None:
                on_arm(res)
    return result


def _run_in_flow(
    flow_fn: Any,
    scenario: Scenario,
    ts: TraceSet,
    arm: Arm,
    block: int,
    deadlines: Mapping[str, float],
) -> ArmResult:
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    job = f"replay-{next(_KEYS)}"
    box: list[ArmResult] = []

    def work() -> ArmResult:
        box.append(run_arm(scenario, ts, arm, block, deadlines))
        return box[0]

    _JOBS[job] = work
    try:
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            flow_fn.with_options(flow_run_name=f"{scenario.name}-{arm.name}-b{block}")(
                job, scenario.name, arm.name, block
            )
    finally:
        _JOBS.pop(job, None)
    return box[0]
