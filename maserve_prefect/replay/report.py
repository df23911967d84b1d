"""The report of a replay scenario: task- and engine-level metric tables, plots and artifacts.

The one idea: every figure is computed once per arm run, on the scenario's *measured* roots, by
`replay.metrics` (`arm_metrics`), and here only rendered: `metric_tables` gives report
rows (one table per metric, one row per arm and block, or per arm, block and class/stage/replica),
`write_plots` the four PNGs, `publish_replay` the Prefect table and markdown artifacts. The CLI
(`maserve replay`), the suite runner (`bench.runner`) and the UI therefore show the same numbers.

Tables (`metric_tables` keys):

- **request latency**: per arm run and figure, the model calls of the measured roots as a load
  generator reports them (`metrics.request`: TTFT, TPOT / ITL, e2e; requests, mean, p50 / p90 /
  p99 in ms, source `client`); on a vLLM server also the server's own histograms over the run
  (source `server /metrics`: TTFT, ITL, e2e, bucket-interpolated percentiles) and the client's
  TTFT overhead (source `client - server`: the difference of the two TTFT means).
- **completion path**: measured completed roots, mean root latency and the mean share of root
  latency per completion-path segment (`metrics.path.path_ledger`, `path_shares`).
- **stage time**: per stage name, stage instances of measured roots, finished ones, mean and
  max stage time (`metrics.task.stage_times`).
- **attempts**: per root status, measured roots and the work they consumed over every attempt
  (`metrics.task.attempts`).
- **slo**: per class, deadline, measured roots, roots that met it and attainment
  (`metrics.slo.attainment`; a failed or unfinished root is a miss). Only classes with a locked
  deadline count, as in `ArmSummary.attainment`.
- **goodput**: arrival-window task goodput of the measured roots (`metrics.slo.task_goodput`:
  roots that met their deadline, drain completions included, per second of the declared `T`,
  `replay.window`), and the drain-inclusive timely rate over `max(T, T_cohort)`
  (`metrics.slo.timely_rate`); None when the scenario declares no `T` (a burst, explicit or
  closed-loop arrivals without `window.end_s`).
  Per accelerator: divided by the devices the simulated pool's replicas held
  (`metrics.engine.goodput_per_accelerator`); None on a real engine.
- simulator only (per-step records): **engine** (per arm run, all replicas: KV memory-time,
  run arithmetic intensity ΣF / ΣD (`metrics.engine.run_intensity`), time-weighted decode
  batch over every step record, processed/source prefill factor, preemptions), **replicas** (`metrics.engine.replica_metrics`), **co-batching**
  (per target class, the share of its scheduled time co-batched with each class) and
  **preemptions** (per victim class). Engine figures cover the whole run (background roots
  included): the engine serves them all.

Examples:
    >>> SEGMENT_SHARES["backend_wait_s"]
    'backend_wait'
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from maserve_prefect.metrics.engine import goodput_per_accelerator, kv_capacity_bytes, kv_occupancy
from maserve_prefect.metrics.path import SEGMENTS, path_shares
from maserve_prefect.metrics.report import (
    Row,
    plot_kv_occupancy,
    plot_latency_cdf,
    plot_path_bars,
    plot_root_gantt,
    publish_artifacts,
)
from maserve_prefect.metrics.task import RootStatus, StageTime
from maserve_prefect.replay.arms import ScenarioResult
from maserve_prefect.replay.conformance import ConformanceReport, audit
from maserve_prefect.replay.metrics import ArmMetrics, scenario_metrics

SEGMENT_SHARES = {s: s.removesuffix("_s") for s in SEGMENTS}
"""Completion-path segment → its share column in the completion-path table."""
GIB = 2**30
PLOT_FILES = ("latency_cdf.png", "path_bars.png", "kv_occupancy.png", "root_gantt.png")


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
        "timely_rate_per_s": m.timely_rate_per_s,
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


def _request_rows(m: ArmMetrics) -> list[Row]:
    base = {"arm": m.arm, "block": m.block}
    rows: list[Row] = []
    for key, st in m.requests.items():
        figs = (None,) * 5 if st is None else (st.n, st.mean_ms, st.p50_ms, st.p90_ms, st.p99_ms)
        rows.append(
            base | {"source": "client", "metric": key} | dict(zip(_REQ_COLS, figs, strict=True))
        )
    if m.server is None:
        return rows
    srv = m.server.row()
    for key in ("ttft", "itl", "e2e"):
        rows.append(
            base
            | {"source": "server /metrics", "metric": key, "requests": srv["requests"]}
            | {c: srv[f"{key}_{c}"] for c in _REQ_COLS[1:]}
        )
    client = m.requests.get("ttft")
    if client is not None and srv["ttft_mean_ms"] is not None:
        over = client.mean_ms - srv["ttft_mean_ms"]
        rows.append(
            base
            | {"source": "client - server", "metric": "ttft", "requests": None}
            | dict.fromkeys(_REQ_COLS[1:])
            | {"mean_ms": over}
        )
    return rows


_REQ_COLS = ("requests", "mean_ms", "p50_ms", "p90_ms", "p99_ms")


def metric_tables(metrics: Iterable[ArmMetrics]) -> dict[str, list[Row]]:
    """Report name → rows over every arm run (see the module docstring).

    The engine tables are present only when some run has per-step records (the simulator).

    Examples:
        >>> sorted(metric_tables([]))
        ['attempts', 'completion path', 'goodput', 'request latency', 'slo', 'stage time']
    """
    ms = list(metrics)
    tables: dict[str, list[Row]] = {
        "request latency": [row for m in ms for row in _request_rows(m)],
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
