"""The replay driver: release a trace's ops under a release rule through the one dispatcher.

One idea: replay keeps the work fixed and moves only release times. `replay_trace` runs one
replay: on a fresh simulated pool in virtual time, or in wall time on a real engine (one asyncio
loop runs the driver and the engine). When each op is released, when a root is done and which
cross-root edges are relaxed is the event logic of `replay.release_driver.ReleaseDriver`. Flat
and Arrival are non-causal reference arms and the result says so.

Roots start at their arrival slots (`workloads.arrivals`); a closed-loop user's next root starts when
the previous root is done, and a wall-clock replay waits for every op, stragglers included.

The result is a replay `Trace`: the same op ids, inputs, deps and lengths, with the realized
times (ready / submitted / first scheduled / first token / completed) and cached tokens of this
run, plus the `SimPool` whose step records the metrics join through the request id (= op id).
`count_early_releases` audits the realized times independently of the release logic.

Examples:
    >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, RootRecord, Trace
    >>> t = Trace(manifest=Manifest(trace_id="t"), roots=[RootRecord(root_id="r")],
    ...           ops=[OpRecord(op_id="r/t", root_id="r", kind=OpKind.TOOL, tool_duration_s=2.0)])
    >>> run = replay_trace(t, None, lock="length")
    >>> run.root_latency_s["r"], run.num_early_releases
    (2.0, 0)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from maserve_prefect.clock import WallClock
from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.poolfile import PoolFile, build_sim_pool, default_pool_file
from maserve_prefect.engines.sim.pool.sim_pool import SimPool
from maserve_prefect.engines.target import EngineTarget, parse_single_engine
from maserve_prefect.errors import ConfigError, DiscoveryTimeoutError, SimulationError
from maserve_prefect.metrics.task import RootStatus, root_latencies
from maserve_prefect.protocol.engine import Replica
from maserve_prefect.replay.audit import count_early_releases, realized_trace
from maserve_prefect.replay.coordination import coordination_stage_of
from maserve_prefect.replay.release_driver import ReleaseDriver
from maserve_prefect.replay.work import InputLock, check_capabilities, deployment_of
from maserve_prefect.trace.barrier import Barrier, apply_barrier, barrier_edges
from maserve_prefect.trace.cas import BlobStore
from maserve_prefect.trace.model import OpKind, OpStatus, Trace
from maserve_prefect.trace.release import ReleaseRule
from maserve_prefect.workloads.arrivals import (
    ArrivalProcess,
    BurstArrivals,
    ClosedLoopArrivals,
    open_loop_offsets,
)

WALL_SWITCH_INTERVAL_S = 1e-4
"""The interpreter's thread switch interval during a wall-clock replay (default is 5 ms)."""

ReplicaFactory = Callable[
    [WallClock, Sequence[str]], tuple[Sequence[Replica], Callable[[], Awaitable[None] | None]]
]
"""Builds a real engine's replicas on a run's wall clock for the given deployment names; returns
them and a function that closes them (a coroutine function for engines attached to the loop)."""


@dataclass(slots=True)
class ReplayRun:
    """One replay of a trace set under one rule on one pool.

    Attributes:
        trace: the replay trace (realized times; manifest source "replay").
        source: the trace that was replayed (with barrier edges applied for Barrier).
        pool: the simulated pool (step records, timelines, device time).
        rule: the release rule; `non_causal` is True for Flat / Arrival.
        start_s / end_s: replay start (pool warm) and the last completion.
        root_arrival_s / root_latency_s: per root, arrival and done − arrival (done: its final
            op completed, else its last op; see `replay.release_driver`).
        num_early_releases: ops released before a required predecessor completed (audit).
        num_failed_ops: model ops the engine rejected or failed.
        release_wall_ns: per released op, (trigger, submit) on the driver's wall clock
            (`time.perf_counter_ns`): trigger = the driver processed the op's last release
            predecessor's completion (its root's arrival for a first op, its release timer when
            it waits a delay); submit = handed to the dispatcher (model op) or started (other).
            Their difference is the driver's reaction cost (`replay.conformance`).
        release_lag_s: per released op, (when its last release predecessor completed as the
            engine observed it, when the op was released), on the run's clock: on a real engine
            the release lateness includes the hop from the engine's completion to the driver.
        num_incomplete_ops: ops that never completed (a real-engine replay that timed out).
        schedule_lag_s: per op released on the trace's schedule (a root's first ops), (due
            time, when it went out: its request's send on a real engine), on the run's clock:
            the arrival lateness of wall runs (`replay.conformance`).
        pool: the simulated pool, or None on a real engine.
    """

    trace: Trace
    source: Trace
    pool: SimPool | None
    rule: ReleaseRule
    non_causal: bool
    start_s: float
    end_s: float
    root_arrival_s: dict[str, float]
    root_latency_s: dict[str, float]
    num_early_releases: int
    num_failed_ops: int
    notes: dict[str, Any] = field(default_factory=dict)
    release_wall_ns: dict[str, tuple[int, int]] = field(default_factory=dict)
    release_lag_s: dict[str, tuple[float, float]] = field(default_factory=dict)
    num_incomplete_ops: int = 0
    schedule_lag_s: dict[str, tuple[float, float]] = field(default_factory=dict)

    def root_status(self) -> dict[str, RootStatus]:
        """Root id → its status in this replay (`metrics.task`: failed if an answer op failed,
        completed if every answer op completed, else incomplete). A root without ops is
        completed once it arrived."""
        has_ops = {op.root_id for op in self.trace.ops}
        out: dict[str, RootStatus] = {}
        for r in root_latencies(self.trace):
            empty_done = r.root_id not in has_ops and r.root_id in self.root_latency_s
            out[r.root_id] = RootStatus.COMPLETED if empty_done else r.status
        return out

    def step_rows(self) -> list[dict[str, object]]:
        """The pool's step records, one row per (step, scheduled request); join on request_id.

        Real engines expose no per-step records: empty there.
        """
        return self.pool.step_rows() if self.pool is not None else []

    def step_records(self) -> list[Any]:
        """Every replica's per-step records (`engines.sim.step.records`); empty on a real engine."""
        if self.pool is None:
            return []
        return [r for p in self.pool.pool_replicas() for r in p.engine.records]


def slot_order(trace: Trace) -> list[str]:
    """Roots in recorded arrival order (ties by id): the default slot order."""
    return [r.root_id for r in sorted(trace.roots, key=lambda r: (r.arrival_s, r.root_id))]


def replay_trace(
    trace: Trace,
    store: BlobStore | None,
    *,
    rule: ReleaseRule | str = ReleaseRule.DAG,
    arrivals: ArrivalProcess | None = None,
    barrier: Sequence[Barrier] = (),
    pool_file: PoolFile | None = None,
    plan: str = "fcfs",
    lock: InputLock | str = InputLock.TOKEN,
    slots: Sequence[str] | None = None,
    name: str = "replay",
    notes: Mapping[str, Any] | None = None,
    engine: str | EngineTarget = "sim",
    replicas_factory: ReplicaFactory | None = None,
    timeout_s: float | None = None,
) -> ReplayRun:
    """Replay `trace` under `rule` on a fresh simulated pool, or in wall time on a real engine.

    Args:
        trace: the recorded trace set (one or more roots).
        store: the CAS holding the recorded prompts (needed for token lock).
        rule: dag, barrier, flat or arrival.
        arrivals: root arrival process (default: every root at once).
        barrier: edges / stage barriers added for the Barrier rule (refused for other rules).
        pool_file: the pool (default: the shipped default pool).
        plan: the dispatcher plan name.
        lock: model-input contract, "token" or "length" (`replay.work`).
        slots: root ids in arrival-slot order (default: recorded arrival order).
        name: the arm name, written into the replay trace's id and notes.
        notes: more manifest notes (scenario name, block, ...). Under Barrier the replay notes
            also list the edges the barrier added as `barrier_edges`: `[src, dst, note]` each,
            the note naming the barrier (e.g. "stage analyst_a -> analyst_b").
        engine: "sim" (virtual time, deterministic) or a real engine (`openai:URL`), replayed
            in wall time; ops that fail there (server gone) are counted, never raised.
        replicas_factory: builds the replicas on the run's wall clock (default for a real
            engine: one OpenAI-compatible replica per deployment, all on the target server);
            giving one replays in wall time whatever `engine` says (it then only labels the run).
        timeout_s: wall-clock limit of a real-engine replay; ops not done by then are reported
            as incomplete, roots not done have no latency (None: no limit; a scenario always
            passes one, `Scenario.wall_timeout_s`). The simulator ignores it: virtual time
            cannot hang, and ops that never complete there raise `SimulationError`.

    Raises:
        IllegalReleaseError: the barrier names unknown ops, crosses roots, orders dependent ops,
            crosses stages (`replay.coordination`), reorders state operations or makes a cycle.
        ConfigError: barrier edges under a non-Barrier rule, bad slots, or an op cannot be replayed.
        UnsupportedError: the engine cannot honour the input contract.
        SimulationError: ops never completed (the message names them).

    Examples:
        >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, RootRecord, Trace
        >>> t = Trace(manifest=Manifest(trace_id="t"), roots=[RootRecord(root_id="r")],
        ...           ops=[OpRecord(op_id="r/a", root_id="r", kind=OpKind.TOOL, tool_duration_s=1.0)])
        >>> replay_trace(t, None, rule="flat", lock="length").non_causal
        True
    """
    rule, lock = ReleaseRule(rule), InputLock(lock)
    if barrier and rule is not ReleaseRule.BARRIER:
        raise ConfigError(f"barrier edges given for the {rule} rule; use `release: barrier`")
    source = trace
    if rule is ReleaseRule.BARRIER:
        stage_of = coordination_stage_of(trace)
        added = barrier_edges(trace, barrier, stage_of)
        source = apply_barrier(trace, added, stage_of)
        # `Dep` has no note: the replay trace's notes say which barrier added each edge.
        edges = [[e.src_op, e.dst_op, e.note] for e in added]
        notes = {**(notes or {}), "barrier_edges": edges}
    order = list(slots) if slots is not None else slot_order(source)
    known = {r.root_id for r in source.roots}
    if sorted(order) != sorted(known):
        raise ConfigError(
            f"replay slots must list every root once; missing {sorted(known - set(order))[:5]}, "
            f"unknown {sorted(set(order) - known)[:5]}"
        )
    pool_file = pool_file or default_pool_file()
    target = parse_single_engine(engine, "a replay")
    if replicas_factory is not None or not target.is_sim:
        return _replay_wall(
            source, store, rule, order, arrivals, pool_file, plan, lock, name, notes, target,
            replicas_factory, timeout_s,
        )  # fmt: skip
    pool = build_sim_pool(pool_file, Kernel())
    check_capabilities(pool.replicas(), lock)
    drv = ReleaseDriver(source, store, rule, pool.clock, pool.replicas, pool_file, plan, lock)
    start = drv.clock.now()
    _schedule_roots(drv, order, arrivals, start)
    pool.clock.run()
    return _finish(drv, source, order, rule, lock, name, notes, pool, start)


def _schedule_roots(
    drv: ReleaseDriver, order: list[str], arrivals: ArrivalProcess | None, start: float
) -> None:
    process = arrivals or BurstArrivals(0.0)
    recorded = [drv.recorded_arrival.get(root, 0.0) for root in order]
    offsets = open_loop_offsets(process, recorded)
    if offsets is not None:
        for root_id, off in zip(order, offsets, strict=True):
            drv.schedule_root(root_id, start + off)
    else:
        assert isinstance(process, ClosedLoopArrivals)
        _closed_loop(drv, order, process, start)


def _finish(
    drv: ReleaseDriver,
    source: Trace,
    order: list[str],
    rule: ReleaseRule,
    lock: InputLock,
    name: str,
    notes: Mapping[str, Any] | None,
    pool: SimPool | None,
    start: float,
    engine: str = "sim",
) -> ReplayRun:
    stuck = sorted(op_id for op_id, r in drv.realized.items() if r.completed_s is None)
    if stuck and pool is not None:
        raise SimulationError(
            f"replay {name!r}: {len(stuck)} ops never completed (first: {', '.join(stuck[:5])}); "
            "a predecessor is missing from the trace set or the pool cannot serve a deployment"
        )
    replay = realized_trace(
        source,
        drv.realized,
        drv.arrival,
        rule=rule,
        name=name,
        lock=lock.value,
        notes=notes,
        engine=engine,
    )
    return ReplayRun(
        trace=replay,
        source=source,
        pool=pool,
        rule=rule,
        non_causal=not rule.is_causal,
        start_s=start,
        end_s=drv.clock.now(),
        root_arrival_s=dict(drv.arrival),
        root_latency_s={r: drv.finish[r] - drv.arrival[r] for r in order if r in drv.finish},
        num_early_releases=count_early_releases(replay, rule),
        num_failed_ops=sum(1 for r in drv.realized.values() if r.status is OpStatus.FAILED),
        notes=dict(replay.manifest.notes),
        release_wall_ns=dict(drv.wall_ns),
        release_lag_s=dict(drv.release_lag),
        num_incomplete_ops=len(stuck),
        schedule_lag_s=drv.schedule_lag() if pool is None else {},
    )


def _replay_wall(
    source: Trace,
    store: BlobStore | None,
    rule: ReleaseRule,
    order: list[str],
    arrivals: ArrivalProcess | None,
    pool_file: PoolFile,
    plan: str,
    lock: InputLock,
    name: str,
    notes: Mapping[str, Any] | None,
    target: EngineTarget,
    replicas_factory: ReplicaFactory | None,
    timeout_s: float | None,
) -> ReplayRun:
    """Replay on a real engine in wall time: one asyncio loop runs the driver and the engine."""
    factory = replicas_factory
    if factory is None:
        from maserve_prefect.engines.openai.wall import openai_replicas_factory

        bound = {} if timeout_s is None else {"discovery_timeout_s": timeout_s}
        factory = openai_replicas_factory(target, **bound)
    deployments = sorted(
        {pool_file.resolve(deployment_of(op)) for op in source.ops if op.kind is OpKind.MODEL}
    )

    async def drive() -> ReplayRun:
        clock = WallClock()
        try:
            replicas, close = factory(clock, deployments)
        except DiscoveryTimeoutError as exc:
            # discovery is the arm's first wait: an arm whose timeout ends during it ends like
            # any arm past its timeout — no root ran, every root is reported incomplete
            drv = ReleaseDriver(source, store, rule, clock, list, pool_file, plan, lock)
            timed_out = {**(notes or {}), "timed_out": str(exc)}
            return _finish(
                drv, source, order, rule, lock, name, timed_out, None, 0.0, engine=str(target)
            )
        try:
            for replica in replicas:  # an engine that opens connections: before the clock runs
                warmed = getattr(replica, "warmed", None)
                if warmed is not None:
                    await warmed()
            check_capabilities(replicas, lock)
            drv = ReleaseDriver(
                source, store, rule, clock, lambda: replicas, pool_file, plan, lock, wall=True
            )
            all_done = clock.create_future()

            def all_finished() -> None:
                if not all_done.done():
                    all_done.set_result(None)

            drv.on_all_done = all_finished
            _schedule_roots(drv, order, arrivals, clock.now())
            if not order:
                drv.on_all_done()
            try:
                await asyncio.wait_for(all_done, timeout_s)
            except TimeoutError:
                pass  # reported below as incomplete ops / roots
            return _finish(
                drv, source, order, rule, lock, name, notes, None, 0.0, engine=str(target)
            )
        finally:
            closing = close()
            if closing is not None:
                await closing

    # The engine client's thread and the driver share the GIL: at Python's default 5 ms switch
    # interval a completion could wait that long for the driver to see it. A wall-clock replay is
    # a measurement, so it hands the GIL over more often for its duration.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(min(switch, WALL_SWITCH_INTERVAL_S))
    # A full collection over everything the process holds (Prefect, pydantic, the trace set) can
    # stall the loop for tens of milliseconds — a late arrival, a late first-token stamp. What
    # exists before the run is frozen out of the collector for its duration.
    gc.collect()
    gc.freeze()
    try:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(drive())
        # Called from a thread that already runs a loop (an async Prefect flow): drive elsewhere.
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="maserve-replay") as ex:
            return ex.submit(asyncio.run, drive()).result()
    finally:
        gc.unfreeze()
        sys.setswitchinterval(switch)


def _closed_loop(
    drv: ReleaseDriver, order: list[str], process: ClosedLoopArrivals, start: float
) -> None:
    """Slot i belongs to user i % users; a user's next root starts after its last + think."""
    think = process.think_times(len(order))
    queues: dict[int, list[int]] = {}
    for i in range(len(order)):
        queues.setdefault(i % process.users, []).append(i)
    user_of = {order[i]: i % process.users for i in range(len(order))}
    for q in queues.values():
        drv.schedule_root(order[q.pop(0)], start)

    def next_of(root_id: str) -> None:
        q = queues[user_of[root_id]]
        if q:
            i = q.pop(0)
            drv.schedule_root(order[i], drv.clock.now() + think[i])

    drv.on_root_done = next_of
