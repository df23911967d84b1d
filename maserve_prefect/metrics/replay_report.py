"""The report of a replay scenario: task- and engine-level metric tables, plots and artifacts.

The one idea: a scenario's arms are compared on their *measured* roots — target-cohort roots
whose arrival offset lies in the scenario's window (`replay.arm_summary.measured_roots`, the roots
`ArmSummary` counts) — so every figure here is computed from each arm run's replay trace (and, on the simulator, its
per-step records) by the library functions of `maserve_prefect.metrics`, once per arm run
(`arm_metrics`), and then only rendered: `metric_tables` gives report rows (one table per
metric, one row per arm and block, or per arm, block and class/stage/replica), `write_plots` the
four PNGs, `publish_replay` the Prefect table and markdown artifacts. The CLI (`maserve
replay`), the suite runner (`bench.runner`) and the UI therefore show the same numbers.

Tables (`metric_tables` keys):

- **completion path**: measured completed roots, mean root latency and the mean share of root
  latency per completion-path segment (`metrics.path.path_ledger`, `path_shares`).
- **stage time**: per stage name, stage instances of measured roots, finished ones, mean and
  max stage time (`metrics.task.stage_times`).
- **attempts**: per root status, measured roots and the work they consumed over every attempt
  (`metrics.task.attempts`).
- **slo**: per class, deadline, measured roots, roots that met it and attainment
  (`metrics.slo.attainment`; a failed or unfinished root is a miss). Only classes with a locked
  deadline count, as in `ArmSummary.attainment`.
- **goodput**: arrival-window task goodput of the measured roots that arrived
  (`metrics.slo.task_goodput`) over the scenario's window `[start_s, end_s)` when it has an end,
  else the library's default window (first to last measured arrival); None when that window
  has no length (a burst).
  Per accelerator: divided by the devices the simulated pool's replicas held
  (`metrics.engine.goodput_per_accelerator`); None on a real engine.
- simulator only (per-step records): **engine** (per arm run, all replicas: KV memory-time,
  time-weighted arithmetic intensity and decode batch over every step record, processed/source
  prefill factor, preemptions), **replicas** (`metrics.engine.replica_metrics`), **co-batching**
  (per target class, the share of its scheduled time co-batched with each class) and
  **preemptions** (per victim class). Engine figures cover the whole run (background roots
  included): the engine serves them all.

Examples:
    >>> SEGMENT_SHARES["backend_wait_s"]
    'backend_wait'
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from maserve_prefect.metrics.engine import (
    PrefillFactor,
    ReplicaMetrics,
    co_batching,
    decode_batch,
    goodput_per_accelerator,
    kv_capacity_bytes,
    kv_occupancy,
    preemptions_by_class,
    prefill_factor,
    replica_metrics,
    request_classes,
    step_intensity,
    time_weighted_intensity,
)
from maserve_prefect.metrics.path import SEGMENTS, RootPath, path_ledger, path_shares
from maserve_prefect.metrics.report import (
    Row,
    plot_kv_occupancy,
    plot_latency_cdf,
    plot_path_bars,
    plot_root_gantt,
    publish_artifacts,
)
from maserve_prefect.metrics.slo import (
    ClassAttainment,
    arrival_window,
    attainment,
    task_goodput,
)
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
from maserve_prefect.replay.conformance import ConformanceReport, audit
from maserve_prefect.trace.model import Trace

SEGMENT_SHARES = {s: s.removesuffix("_s") for s in SEGMENTS}
"""Completion-path segment → its share column in the completion-path table."""
GIB = 2**30
PLOT_FILES = ("latency_cdf.png", "path_bars.png", "kv_occupancy.png", "root_gantt.png")


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
    num_accelerators: int | None
    replicas: list[ReplicaMetrics] = field(default_factory=list)
    intensity: float | None = None
    decode_batch: float | None = None
    prefill: PrefillFactor | None = None
    co_batching: dict[str, dict[str, float]] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)

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
) -> tuple[float | None, float | None]:
    if not lats or not deadlines:
        return None, None
    w = result.scenario.window
    if w.end_s is not None:
        window = (arm.run.start_s + w.start_s, arm.run.start_s + w.end_s)
    else:
        window = arrival_window(lats)
    span = window[1] - window[0]
    if span <= 0:
        return None, None
    return span, task_goodput(lats, deadlines, window=window)


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
    span, goodput = _goodput(result, arm, offered, deadlines)
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
        num_accelerators=None,
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
    out.intensity = time_weighted_intensity(
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


# -- tables ------------------------------------------------------------------------------------


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def _path_row(m: ArmMetrics) -> Row:
    shares = path_shares(m.paths)
    return {
        "arm": m.arm,
        "block": m.block,
        "roots": len(m.paths),
        "mean_latency_s": _mean([p.latency_s for p in m.paths]),
    } | {SEGMENT_SHARES[k]: v if m.paths else None for k, v in shares.items()}


def _stage_rows(m: ArmMetrics) -> list[Row]:
    by_name: dict[str, list[StageTime]] = {}
    for st in m.stages:
        by_name.setdefault(st.name, []).append(st)
    rows = []
    for name, sts in by_name.items():
        done = [d for st in sts if (d := st.duration_s) is not None]
        rows.append(
            {
                "arm": m.arm,
                "block": m.block,
                "stage": name,
                "stages": len(sts),
                "finished": len(done),
                "mean_s": _mean(done),
                "max_s": max(done) if done else None,
            }
        )
    return rows


def _attempt_rows(m: ArmMetrics) -> list[Row]:
    return [
        {
            "arm": m.arm,
            "block": m.block,
            "status": a.status.value,
            "roots": a.num_roots,
            "op_attempts": a.num_op_attempts,
            "prefill_tokens": a.num_prefill_tokens,
            "output_tokens": a.num_output_tokens,
        }
        for a in m.attempts.values()
    ]


def _slo_rows(m: ArmMetrics) -> list[Row]:
    return [
        {
            "arm": m.arm,
            "block": m.block,
            "class": a.workload_class,
            "deadline_s": a.deadline_s,
            "roots": a.num_roots,
            "met": a.num_met,
            "attainment": a.attainment,
        }
        for a in m.slo.values()
    ]


def _goodput_row(m: ArmMetrics) -> Row:
    per_acc = (
        goodput_per_accelerator(m.goodput_per_s, m.num_accelerators)
        if m.goodput_per_s is not None and m.num_accelerators
        else None
    )
    return {
        "arm": m.arm,
        "block": m.block,
        "window_s": m.goodput_window_s,
        "goodput_per_s": m.goodput_per_s,
        "accelerators": m.num_accelerators,
        "goodput_per_accel_s": per_acc,
    }


def _engine_row(m: ArmMetrics) -> Row:
    pf = m.prefill
    kv = m.kv_memory_time_byte_s
    return {
        "arm": m.arm,
        "block": m.block,
        "kv_gib_s": None if kv is None else kv / GIB,
        "intensity": m.intensity,
        "decode_batch": m.decode_batch,
        "prefill_factor": None if pf is None or not pf.source_tokens else pf.factor,
        "prefill_processed": None if pf is None else pf.processed_tokens,
        "prefill_source": None if pf is None else pf.source_tokens,
        "preemptions": sum(m.preemptions.values()),
    }


def _replica_rows(m: ArmMetrics) -> list[Row]:
    return [
        {
            "arm": m.arm,
            "block": m.block,
            "replica": r.replica,
            "steps": r.num_steps,
            "busy_s": r.busy_s,
            "kv_gib_s": r.kv_memory_time_byte_s / GIB,
            "intensity": r.intensity,
            "decode_batch": r.decode_batch,
            "preemptions": r.num_preemptions,
        }
        for r in m.replicas
    ]


def _co_batching_rows(m: ArmMetrics) -> list[Row]:
    return [
        {"arm": m.arm, "block": m.block, "class": t, "with": w, "share": v}
        for t, shares in m.co_batching.items()
        for w, v in shares.items()
    ]  # fmt: skip


def _preemption_rows(m: ArmMetrics) -> list[Row]:
    return [
        {"arm": m.arm, "block": m.block, "class": c, "preemptions": n}
        for c, n in m.preemptions.items()
    ]


def metric_tables(metrics: Iterable[ArmMetrics]) -> dict[str, list[Row]]:
    """Report name → rows over every arm run (see the module docstring).

    The engine tables are present only when some run has per-step records (the simulator).

    Examples:
        >>> sorted(metric_tables([]))
        ['attempts', 'completion path', 'goodput', 'slo', 'stage time']
    """
    ms = list(metrics)
    tables: dict[str, list[Row]] = {
        "completion path": [_path_row(m) for m in ms],
        "stage time": [row for m in ms for row in _stage_rows(m)],
        "attempts": [row for m in ms for row in _attempt_rows(m)],
        "slo": [row for m in ms for row in _slo_rows(m)],
        "goodput": [_goodput_row(m) for m in ms],
    }
    with_engine = [m for m in ms if m.replicas]
    if with_engine:
        tables |= {
            "engine": [_engine_row(m) for m in with_engine],
            "replicas": [row for m in with_engine for row in _replica_rows(m)],
            "co-batching": [row for m in with_engine for row in _co_batching_rows(m)],
            "preemptions": [row for m in with_engine for row in _preemption_rows(m)],
        }
    return tables


@dataclass(slots=True)
class ScenarioReport:
    """A scenario result with its metrics, the conformance audit of every arm run (result
    order) and the metric tables (`metric_tables`)."""

    result: ScenarioResult
    metrics: list[ArmMetrics]
    conformance: list[ConformanceReport]
    metric_tables: dict[str, list[Row]]

    def arm_rows(self) -> list[Row]:
        """One row per arm and block: the arm summary (`replay.arm_summary.ArmSummary`)."""
        return [asdict(r.summary) for rs in self.result.by_arm().values() for r in rs]

    def conformance_rows(self) -> list[Row]:
        """One row per arm run: its block and the audit (`ConformanceReport.row`)."""
        return [
            {"block": r.summary.block} | a.row()
            for r, a in zip(self.result.results, self.conformance, strict=True)
        ]

    def tables(self) -> dict[str, list[Row]]:
        """Every report table: `arms`, `conformance`, then the metric tables."""
        return {"arms": self.arm_rows(), "conformance": self.conformance_rows()} | (
            self.metric_tables
        )


def report_scenario(result: ScenarioResult) -> ScenarioReport:
    """Metrics and conformance audit of every arm run, and the metric tables.

    The audit's replay/native ratio uses the trace set itself when its manifest says it was
    recorded natively.

    Raises:
        TraceValidationError: an arm run's replay trace is inconsistent.
    """
    ts = result.trace_set
    native = ts.trace if ts.trace.manifest.source == "native" else None
    metrics = scenario_metrics(result)
    audits = [audit(r.run, native) for r in result.results]
    return ScenarioReport(result, metrics, audits, metric_tables(metrics))


# -- plots -------------------------------------------------------------------------------------


def _gantt_root(metrics: Sequence[ArmMetrics]) -> tuple[ArmMetrics, str] | None:
    for m in metrics:
        for lat in m.latencies:
            if lat.status is RootStatus.COMPLETED:
                return m, lat.root_id
    return None


def write_plots(result: ScenarioResult, metrics: Sequence[ArmMetrics], folder: Path) -> list[Path]:
    """The four PNGs in `folder` (`PLOT_FILES`); returns the paths written.

    Latency CDF and completion-path bars pool each arm's blocks; KV occupancy shows block 0
    of every arm, each replica that ran a step, on time since the run started (simulator only:
    skipped on a real engine); the Gantt shows the first completed measured root of the first
    arm's first block.
    """
    by_arm: dict[str, list[ArmMetrics]] = {}
    for m in metrics:
        by_arm.setdefault(m.arm, []).append(m)
    written = [
        plot_latency_cdf(
            {
                arm: [lat.latency_s for m in ms for lat in m.latencies if lat.latency_s is not None]
                for arm, ms in by_arm.items()
            },
            folder / PLOT_FILES[0],
        ),
        plot_path_bars(
            {arm: [p for m in ms for p in m.paths] for arm, ms in by_arm.items()},
            folder / PLOT_FILES[1],
        ),
    ]
    series = {}
    for r in result.results:
        if r.summary.block != 0 or r.run.pool is None:
            continue
        for p in r.run.pool.pool_replicas():
            if p.engine.records:
                t, used = kv_occupancy(p.engine.timeline, kv_capacity_bytes(p))
                series[f"{r.summary.arm}: {p.name}"] = (t - r.run.start_s, used)
    if series:
        written.append(plot_kv_occupancy(series, folder / PLOT_FILES[2]))
    pick = _gantt_root(metrics)
    if pick is not None:
        m, root_id = pick
        run = next(
            r.run for r in result.results if (r.summary.arm, r.summary.block) == (m.arm, m.block)
        )
        written.append(
            plot_root_gantt(
                run.trace, root_id, folder / PLOT_FILES[3], title=f"{m.arm} b{m.block}: {root_id}"
            )
        )
    return written


# -- Prefect artifacts -------------------------------------------------------------------------


def publish_replay(report: ScenarioReport) -> list[Any]:
    """Publish every table of `report` as a Prefect table artifact, plus one markdown report.

    Keys are `maserve-replay-<scenario>-<table>`; outside a flow or task run nothing happens.
    """
    result = report.result
    sc = result.scenario
    locked = ", ".join(f"{k} {v:.3g} s" for k, v in sorted(result.deadlines_s.items()))
    header = f"## replay {sc.name}\n\n{len(result.trace_set.slots)} roots per arm, "
    header += f"{sc.blocks} block(s); deadlines: {locked or 'none'}"
    return publish_artifacts(report.tables(), header, prefix=f"maserve-replay-{sc.name}")
