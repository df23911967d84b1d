"""The metrics of a replay scenario's arm runs: every figure computed once per arm run.

One idea: a scenario's arms are compared on their *measured* roots — target-cohort roots whose
arrival offset lies in the scenario's window (`replay.arm_summary.measured_roots`, the roots
`ArmSummary` counts) — so `arm_metrics` computes every figure from an arm run's replay trace (and,
on the simulator, its per-step records) by the library functions of `maserve_prefect.metrics`,
once per arm run, and `replay.report` only renders them (its module docstring says what
each table covers).

Request level, over the model calls of the measured roots: TTFT, TPOT / ITL and e2e latency
(`metrics.request`), and on a real server its own histograms over the run (`ArmResult.server`).
Task level, over the measured roots: root latencies and completion paths (`metrics.task`,
`metrics.path`), stage times, attempts, SLO attainment of the classes with a locked deadline, the
arrival-window goodput over the declared `T` and the drain-inclusive timely rate over
`max(T, T_cohort)` (`metrics.slo`; `T` from `replay.window`). Engine level (simulator only; the whole run,
background roots included): per-replica metrics, KV memory-time, arithmetic intensity, decode
batch, prefill factor, co-batching and preemptions (`metrics.engine`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from maserve_prefect.metrics.engine import (
    PrefillFactor,
    ReplicaMetrics,
    co_batching,
    decode_batch,
    preemptions_by_class,
    prefill_factor,
    replica_metrics,
    request_classes,
    run_intensity,
    step_intensity,
)
from maserve_prefect.metrics.path import RootPath, path_ledger
from maserve_prefect.metrics.request import LatencyStats, request_latencies
from maserve_prefect.metrics.slo import ClassAttainment, attainment, task_goodput, timely_rate
from maserve_prefect.metrics.task import (
    AttemptSummary,
    RootLatency,
    RootStatus,
    StageTime,
    attempts,
    root_latencies,
    stage_times,
)
from maserve_prefect.replay.arm_summary import measured_roots
from maserve_prefect.replay.arms import ArmResult, ScenarioResult
from maserve_prefect.replay.window import declared_window
from maserve_prefect.trace.model import Trace

if TYPE_CHECKING:
    from maserve_prefect.engines.openai.server_latency import ServerWindow

__all__ = ["ArmMetrics", "arm_metrics", "scenario_metrics"]


@dataclass(slots=True)
class ArmMetrics:
    """Every metric of one arm run (see the module docstring for what each covers).

    On a real engine, which has neither a simulated pool nor per-step records,
    `num_accelerators` and the engine fields (`replicas` to `preemptions`) stay empty.
    """

    arm: str
    block: int
    measured: list[str]
    latencies: list[RootLatency]
    paths: list[RootPath]
    stages: list[StageTime]
    attempts: dict[RootStatus, AttemptSummary]
    slo: dict[str, ClassAttainment]
    goodput_window_s: float | None
    goodput_per_s: float | None
    timely_rate_per_s: float | None
    num_accelerators: int | None
    replicas: list[ReplicaMetrics] = field(default_factory=list)
    intensity: float | None = None
    decode_batch: float | None = None
    prefill: PrefillFactor | None = None
    co_batching: dict[str, dict[str, float]] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)
    requests: dict[str, LatencyStats | None] = field(default_factory=dict)
    server: ServerWindow | None = None

    @property
    def kv_memory_time_byte_s(self) -> float | None:
        """KV memory-time summed over replicas (None without per-step records)."""
        if not self.replicas:
            return None
        return sum(r.kv_memory_time_byte_s for r in self.replicas)


def _sub_trace(trace: Trace, roots: set[str]) -> Trace:
    return trace.model_copy(
        update={
            "roots": [r for r in trace.roots if r.root_id in roots],
            "stages": [s for s in trace.stages if s.root_id in roots],
            "ops": [o for o in trace.ops if o.root_id in roots],
        }
    )


def _goodput(
    result: ScenarioResult, arm: ArmResult, lats: list[RootLatency], deadlines: dict[str, float]
) -> tuple[float | None, float | None, float | None]:
    """(T, arrival-window goodput, drain-inclusive timely rate); Nones without a declared T."""
    if not lats or not deadlines:
        return None, None, None
    run = arm.run
    window = declared_window(result.scenario, len(result.trace_set.slots), run.start_s)
    if window is None:
        return None, None, None
    goodput = task_goodput(lats, deadlines, window=window)
    rate = timely_rate(lats, deadlines, window=window, last_completion_s=run.end_s)
    return window[1] - window[0], goodput, rate


def arm_metrics(result: ScenarioResult, arm: ArmResult) -> ArmMetrics:
    """Compute every metric of one arm run of `result` (see the module docstring).

    Raises:
        TraceValidationError: the replay trace is inconsistent (e.g. a missing dependency).
    """
    run, s = arm.run, arm.summary
    measured = [m.root_id for m in measured_roots(run, result.trace_set, result.scenario)]
    keep = set(measured)
    lats = [r for r in root_latencies(run.trace) if r.root_id in keep]
    deadlines = result.deadlines_s
    timed = [r for r in lats if r.workload_class in deadlines]
    offered = [r for r in timed if r.root_id in run.root_arrival_s]
    span, goodput, timely = _goodput(result, arm, offered, deadlines)
    out = ArmMetrics(
        arm=s.arm,
        block=s.block,
        measured=measured,
        latencies=lats,
        paths=[p for p in path_ledger(run.trace) if p.root_id in keep],
        stages=[st for st in stage_times(run.trace) if st.root_id in keep],
        attempts=attempts(_sub_trace(run.trace, keep)),
        slo=attainment(timed, deadlines) if deadlines else {},
        goodput_window_s=span,
        goodput_per_s=goodput,
        timely_rate_per_s=timely,
        num_accelerators=None,
        requests=request_latencies(run.trace, keep),
        server=arm.server,
    )
    if run.pool is None:
        return out
    replicas = list(run.pool.pool_replicas())
    out.num_accelerators = len({d.name for p in replicas for d in p.devices}) or None
    records = run.step_records()
    if not records:
        return out
    classes = request_classes(run.trace)
    out.replicas = replica_metrics(replicas, end_s=run.end_s)
    out.intensity = run_intensity(
        [step_intensity(r, p.deployment.spec) for p in replicas for r in p.engine.records]
    )
    out.decode_batch = decode_batch(records)
    out.prefill = prefill_factor(records, run.trace)
    scheduled = {classes.get(t.request_id) for r in records for t in r.scheduled}
    out.co_batching = {
        c: co_batching(records, classes, c) for c in sorted(x for x in scheduled if x is not None)
    }
    out.preemptions = preemptions_by_class(records, classes)
    return out


def scenario_metrics(result: ScenarioResult) -> list[ArmMetrics]:
    """`arm_metrics` of every arm run, in arm order (scenario order), blocks in order."""
    return [arm_metrics(result, r) for rs in result.by_arm().values() for r in rs]
