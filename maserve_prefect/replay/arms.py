"""Running a scenario: deadlines locked first, then paired blocks of arms, one Prefect flow per arm.

One idea: a comparison is fair only if everything but the arm is fixed before the arms run. So
`run_scenario` (1) builds the trace set once, (2) computes and *locks* the per-class deadlines —
explicit seconds, or `factor ×` a latency quantile from an independent low-load reference replay
(DAG rule, one root at a time: closed loop with one user and no think time, on the scenario's
reference pool *as written*, without any arm's overrides, so the deadlines do not depend on arm
order; `Reference.pool`) — and writes them into the result before any arm runs, then (3) runs
`blocks` paired blocks: in each block every arm replays the same arrivals (the block's seed is the
scenario seed + block index), arm order alternates (forward in even blocks, reversed in odd ones),
and every arm starts from drained state. An arm's slot order is its placement's
(`Scenario.placement_of`; the fixed-slot placements rotate with the block,
`replay.traceset.place_fixed_slots`). Each arm run is one Prefect flow run
(`maserve-replay-arm`) that drives the dispatcher — never a Prefect task per op; with
`prefect=False` the same function runs without Prefect.

Drained state: on the simulator every arm gets a fresh kernel and a fresh warm pool. A real
engine is one shared server, so before each arm (and before the reference replay) the server is
drained (`engines.openai.wall.drain_server`: wait until it runs and queues nothing, then reset its
prefix cache); what that achieved is recorded with the arm (`ArmSummary.initial_state`, e.g.
"idle; prefix cache not reset: unsupported by the server"). The server's capabilities are
probed once (`probe_engine`: three tiny completions), before the first drain, and every arm's
engine reuses what was found, so no probe reaches the server during a measured arm; its latency
histograms are scraped after each drain and after each arm (`ArmResult.server`). Real-engine
replays run under the scenario's wall-clock limit (`Scenario.wall_timeout_s`): a stuck op ends
the arm, never hangs it.

Each arm run is summarized over its measured roots (`replay.arm_summary`: latency percentiles,
deadline attainment, roots by status); across blocks an arm is summarized by the median and range
(min, max) of each figure.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from maserve_prefect.engines.poolfile import PoolFile, default_pool_file, load_pool_file
from maserve_prefect.engines.target import parse_engine, parse_single_engine
from maserve_prefect.errors import ConfigError, EngineError, IllegalReleaseError
from maserve_prefect.metrics.task import RootStatus, root_class
from maserve_prefect.replay.arm_summary import (
    SIM_INITIAL_STATE,
    ArmSummary,
    median_range,
    summarize_arm,
)
from maserve_prefect.replay.coordination import coordination_stage_of
from maserve_prefect.replay.driver import ReplayRun, replay_trace
from maserve_prefect.replay.scenario import Arm, Scenario, arrival_process
from maserve_prefect.replay.traceset import TraceSet, build_trace_set
from maserve_prefect.trace.barrier import BarrierEdge, apply_barrier, barrier_edges
from maserve_prefect.trace.cas import BlobStore
from maserve_prefect.trace.model import Trace
from maserve_prefect.workloads.arrivals import ClosedLoopArrivals, ThinkTime, with_seed

if TYPE_CHECKING:
    from maserve_prefect.engines.openai.discovery import ServerInfo
    from maserve_prefect.engines.openai.server_latency import Histogram, ServerWindow
    from maserve_prefect.engines.openai.wall import DrainReport

__all__ = [
    "ArmResult",
    "LockedDeadlines",
    "ScenarioResult",
    "arm_barrier",
    "arm_order",
    "arm_pool_file",
    "drain_engine",
    "lock_deadlines",
    "prepare_scenario",
    "probe_engine",
    "root_class",
    "run_arm",
    "run_arm_unit",
    "run_scenario",
]


@dataclass(slots=True)
class ArmResult:
    """An arm run: its summary, the full replay (trace, pool, step records) and, on a real
    engine, how draining the server went before it and the server's own latency histograms over
    the run (`engines.openai.server_latency`: scraped after the drain and after the run; None
    when the server shows none)."""

    summary: ArmSummary
    run: ReplayRun
    flow_run_id: str | None = None
    drain: DrainReport | None = None
    server: ServerWindow | None = None


class LockedDeadlines(NamedTuple):
    """What `lock_deadlines` fixed before the arms: deadlines, the reference latencies per class
    and the state the reference replay started from (None without a reference replay)."""

    deadlines_s: dict[str, float]
    reference_latency_s: dict[str, list[float]]
    reference_state: str | None


@dataclass(slots=True)
class ScenarioResult:
    """What a scenario produced: locked deadlines, every arm run, and cross-block summaries
    (`server_info`: what the one probe of a real server found; None on the simulator)."""

    scenario: Scenario
    trace_set: TraceSet
    deadlines_s: dict[str, float]
    reference_latency_s: dict[str, list[float]]
    results: list[ArmResult] = field(default_factory=list)
    reference_state: str | None = None
    server_info: ServerInfo | None = None

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


def _pool_file(scenario: Scenario, pool: Path | None) -> PoolFile:
    return load_pool_file(scenario.path(pool)) if pool is not None else default_pool_file()


def arm_pool_file(scenario: Scenario, arm: Arm) -> PoolFile:
    """The arm's pool file with its per-deployment overrides applied.

    Raises:
        ConfigError: an override names a deployment the pool does not have.
    """
    pf = _pool_file(scenario, arm.pool)
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


def drain_engine(scenario: Scenario) -> DrainReport | None:
    """Drain the scenario's real server before a run (None on the simulator; module docstring)."""
    target = parse_engine(scenario.engine)
    if target.is_sim:
        return None
    from maserve_prefect.engines.openai.wall import DRAIN_TIMEOUT_S, drain_server

    # Bounded by the arm's wall-clock limit (`--timeout`), as every wait of an arm is.
    limit = scenario.wall_timeout_s()
    return drain_server(
        target.base_url,
        timeout_s=min(DRAIN_TIMEOUT_S, limit or DRAIN_TIMEOUT_S),
        **target.client_auth(),
    )


def probe_engine(scenario: Scenario) -> ServerInfo | None:
    """Discover the scenario's real server once — its models and the capability probes (three
    tiny completions, `engines.openai.discovery`) — before any drain, so that no probe reaches
    the server during a measured arm (None on the simulator).

    Raises:
        EngineError: the server cannot be reached.
        ConfigError: an unknown model, or several served and the engine names none.
    """
    target = parse_engine(scenario.engine)
    if target.is_sim:
        return None
    from maserve_prefect.engines.openai.discovery import discover

    # The probe runs before the arms, outside their wall-clock limit: an arm's timeout (which
    # may be tiny, to cut an arm short) bounds the arm's replay, never this discovery.
    return discover(
        target.base_url, model=target.model, timeout_s=PROBE_TIMEOUT_S, **target.client_auth()
    )


PROBE_TIMEOUT_S = 30.0
"""The time budget of the one discovery before a scenario's drains (`probe_engine`)."""


def _server_histograms(scenario: Scenario) -> dict[str, Histogram] | None:
    """The real server's latency histograms now (None on the simulator or without them)."""
    target = parse_engine(scenario.engine)
    if target.is_sim:
        return None
    from maserve_prefect.engines.openai.server_latency import scrape_histograms

    return scrape_histograms(target.base_url, **target.client_auth())


def _wall_factory(scenario: Scenario, info: ServerInfo | None) -> Any:
    """The replay's replica factory on the probed server (None: the driver's default, which
    discovers the server itself)."""
    if info is None:
        return None
    from maserve_prefect.engines.openai.wall import openai_replicas_factory

    return openai_replicas_factory(parse_engine(scenario.engine), server_info=info)


def lock_deadlines(
    scenario: Scenario, ts: TraceSet, server_info: ServerInfo | None = None
) -> LockedDeadlines:
    """Explicit deadlines plus reference-derived ones for the other classes (see module doc).

    The reference replays on `Scenario.reference_pool()` without any arm's overrides.

    Raises:
        EngineError: a root of the reference replay failed or did not finish within the
            scenario's wall-clock limit (deadlines from the roots that did would be biased).
    """
    deadlines = dict(scenario.deadlines.classes)
    ref = scenario.deadlines.reference
    if ref is None:
        return LockedDeadlines(deadlines, {}, None)
    drain = drain_engine(scenario)
    run = replay_trace(
        ts.trace,
        ts.store,
        replicas_factory=_wall_factory(scenario, server_info),
        rule="dag",
        arrivals=ClosedLoopArrivals(1, ThinkTime("constant", 0.0)),
        pool_file=_pool_file(scenario, scenario.reference_pool()),
        lock=scenario.lock,
        slots=ts.slots,
        name="reference",
        engine=scenario.engine,
        timeout_s=scenario.wall_timeout_s(),
    )
    status = run.root_status()
    short = [r for r in ts.slots if status[r] is not RootStatus.COMPLETED]
    if short:
        raise EngineError(
            f"scenario {scenario.name}: the deadline reference replay on {scenario.engine} did "
            f"not complete {len(short)} of {len(ts.slots)} roots (first: {', '.join(short[:3])}; "
            f"{run.num_failed_ops} failed ops, {run.num_incomplete_ops} incomplete ops, limit "
            f"{scenario.wall_timeout_s()} s); check the server or raise `timeout_s`"
        )
    by_class: dict[str, list[float]] = {}
    for root in ts.trace.roots:
        by_class.setdefault(root_class(root), []).append(run.root_latency_s[root.root_id])
    for cls, lat in sorted(by_class.items()):
        deadlines.setdefault(cls, ref.factor * float(np.quantile(lat, ref.quantile)))
    state = SIM_INITIAL_STATE if drain is None else drain.describe()
    return LockedDeadlines(deadlines, by_class, state)


# -- one Prefect flow per arm run -------------------------------------------------------------

_JOBS: dict[str, Callable[[], ArmResult]] = {}
_KEYS = itertools.count()


@functools.cache
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
        from maserve_prefect.metrics.report import publish_table

        publish_table(  # the arm's own figures on its flow run's Artifacts tab
            [dataclasses.asdict(s)],
            key=f"maserve-replay-{scenario}-{arm}-b{block}",
            description=f"arm {arm}, block {block}",
        )
        return {
            "arm": s.arm,
            "block": s.block,
            "p95_s": s.latency_p95_s,
            "early": s.num_early_releases,
        }

    return replay_arm


def arm_barrier(scenario: Scenario, ts: TraceSet, arm: Arm) -> list[BarrierEdge]:
    """The op edges `arm`'s barrier adds to the trace set, each with its note and stage (none
    for an arm without a barrier), checked as the replay applies them.

    Stage barriers and per-root edges (`each_root: true`) expand against the trace set here, so
    one per-root edge covers however many roots the scale gives the cohort. Every edge must be
    legal (`trace.barrier`): independent ops of one stage (`replay.coordination`), no shared-state
    version conflict, no cycle.

    Raises:
        IllegalReleaseError: an op no root realized, an unknown op, a stage that matches no root,
            an edge across roots, between dependent ops, across stages or reordering state ops,
            or a cycle; the one-line message names the scenario file, the arm and both ops.
    """
    if not arm.barrier:
        return []
    try:
        stage_of = coordination_stage_of(ts.trace)
        edges = barrier_edges(ts.trace, [b.to_release() for b in arm.barrier], stage_of)
        apply_barrier(ts.trace, edges, stage_of)  # refuses cycles
    except IllegalReleaseError as exc:
        raise IllegalReleaseError(f"scenario {scenario.source}: arm {arm.name!r}: {exc}") from None
    return edges


def check_deadline_classes(scenario: Scenario, ts: TraceSet) -> None:
    """Refuse a deadline for a class no root of the trace set has (a typo would otherwise
    leave the class without a deadline and its attainment unmeasured).

    Raises:
        ConfigError: naming the scenario file, the unknown classes and the known ones.
    """
    known = {root_class(r) for r in ts.trace.roots}
    unknown = sorted(set(scenario.deadlines.classes) - known)
    if unknown:
        raise ConfigError(
            f"scenario {scenario.source}: deadlines.classes names {', '.join(unknown)}, which no "
            f"root of the trace set has; its classes are {', '.join(sorted(known)) or '(none)'}"
        )


def run_arm(
    scenario: Scenario,
    ts: TraceSet,
    arm: Arm,
    block: int,
    deadlines: Mapping[str, float],
    server_info: ServerInfo | None = None,
) -> ArmResult:
    """Replay one arm of one block without Prefect (a real server is probed, unless
    `server_info` holds what a probe found, and then drained; no probe runs during the arm)."""
    process = arrival_process(scenario.arrivals, num_targets=len(ts.targets()))
    seed = getattr(process, "seed", 0)
    info = server_info if server_info is not None else probe_engine(scenario)
    drain = drain_engine(scenario)
    before = _server_histograms(scenario)
    run = replay_trace(
        ts.trace,
        ts.store,
        replicas_factory=_wall_factory(scenario, info),
        rule=arm.release,
        arrivals=with_seed(process, seed + block),
        barrier=arm_barrier(scenario, ts, arm),
        pool_file=arm_pool_file(scenario, arm),
        plan=arm.plan,
        lock=scenario.lock,
        slots=ts.slots_for(scenario.placement_of(arm), block),
        name=arm.name,
        notes={"scenario": scenario.name, "block": block},
        engine=scenario.engine,
        timeout_s=scenario.wall_timeout_s(),
    )
    server = None
    if before is not None:
        from maserve_prefect.engines.openai.server_latency import ServerWindow

        server = ServerWindow.between(before, _server_histograms(scenario))
    state = SIM_INITIAL_STATE if drain is None else drain.describe()
    summary = summarize_arm(
        run, ts, scenario, deadlines, arm=arm.name, block=block, initial_state=state
    )
    return ArmResult(summary, run, drain=drain, server=server)


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
        EngineError: the real server is unreachable, or the deadline reference replay did not
            complete every root.
        IllegalReleaseError: an arm's barrier does not fit the trace set (`arm_barrier`),
            raised before anything replays.

    Examples:
        >>> from maserve_prefect.replay.scenario import parse_scenario
        >>> s = parse_scenario({"name": "x", "engine": "tgi", "cohorts": [
        ...     {"name": "t", "bundle": "b"}], "arms": [{"name": "dag"}]})
        >>> run_scenario(s)
        Traceback (most recent call last):
        ...
        maserve_prefect.errors.ConfigError: --engine 'tgi': expected 'sim' or 'openai:URL' (e.g. openai:http://127.0.0.1:8000)
    """
    result = prepare_scenario(scenario, loaded)
    for block, arm in arm_order(scenario):
        res = run_arm_unit(
            scenario, result.trace_set, arm, block, result.deadlines_s, prefect,
            result.server_info,
        )  # fmt: skip
        result.results.append(res)
        if on_arm is not None:
            on_arm(res)
    return result


def prepare_scenario(
    scenario: Scenario, loaded: Mapping[str, tuple[Trace, BlobStore]] | None = None
) -> ScenarioResult:
    """What every arm run of `scenario` shares, its arm runs still to come: the trace set, the
    checks (engine, deadline classes, every arm's barrier) and the locked deadlines (their
    reference replay). Raises as `run_scenario` does."""
    parse_single_engine(scenario.engine, "a replay scenario")
    ts = build_trace_set(scenario, loaded)
    check_deadline_classes(scenario, ts)
    for arm in scenario.arms:
        arm_barrier(scenario, ts, arm)  # a bad barrier is refused before anything replays
    info = probe_engine(scenario)  # once, before every drain: never during an arm
    deadlines, reference, reference_state = lock_deadlines(scenario, ts, info)
    return ScenarioResult(
        scenario, ts, deadlines, reference, reference_state=reference_state, server_info=info
    )


def arm_order(scenario: Scenario) -> list[tuple[int, Arm]]:
    """(block, arm) of every arm run, in the order results are kept: block by block, the arms in
    scenario order on even blocks and reversed on odd ones."""
    out = []
    for block in range(scenario.blocks):
        arms = scenario.arms if block % 2 == 0 else tuple(reversed(scenario.arms))
        out += [(block, arm) for arm in arms]
    return out


def run_arm_unit(
    scenario: Scenario,
    ts: TraceSet,
    arm: Arm,
    block: int,
    deadlines: Mapping[str, float],
    prefect: bool = True,
    server_info: ServerInfo | None = None,
) -> ArmResult:
    """One arm run of one block: bare (`run_arm`) or as its `maserve-replay-arm` flow run (a
    subflow of the flow or task run that calls it); `server_info`: the probed real server."""
    if not prefect:
        return run_arm(scenario, ts, arm, block, deadlines, server_info)
    return _run_in_flow(_arm_flow(), scenario, ts, arm, block, deadlines, server_info)


def _run_in_flow(
    flow_fn: Any,
    scenario: Scenario,
    ts: TraceSet,
    arm: Arm,
    block: int,
    deadlines: Mapping[str, float],
    server_info: ServerInfo | None = None,
) -> ArmResult:
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    job = f"replay-{next(_KEYS)}"
    box: list[ArmResult] = []

    def work() -> ArmResult:
        box.append(run_arm(scenario, ts, arm, block, deadlines, server_info))
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
