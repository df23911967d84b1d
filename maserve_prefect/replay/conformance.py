"""The conformance audit of a replay run: did it keep the work fixed and release on time?

One idea: a replay is evidence only if it replayed the *same work* under its rule, so the audit
is a report (not a timed test) of four checks on one `ReplayRun`:

1. **Work**: every op completed, and every op's realized input and output token counts equal the
   replayed trace's (mismatches are listed by op id). An op *did not complete* when it has no
   completion time in the replay (`incomplete`: a wall-clock replay that hit its timeout) or
   when the replay failed it (`failed`: the engine rejected or failed the request) although the
   recorded run had not — a recorded failure that the replay reproduces is the same work. Those
   ops are listed by id and are not compared for token counts (a run that did no work must
   never pass because nothing was there to mismatch). Ops whose recorded count is unknown are
   not compared.
2. **Causality**: zero early releases (`ReplayRun.num_early_releases`, read from realized times).
   Required for causal arms (DAG, Barrier); Flat and Arrival are non-causal *references* and are
   flagged, not failed.
3. **Release lateness** on the driver's *wall clock*: on the simulator the driver runs in virtual
   time, where releases are exact by construction, so what can be late is the harness itself —
   the wall time from the driver processing an op's last release predecessor's completion (or
   its root's arrival, or its delay timer) to handing the op to the dispatcher
   (`ReplayRun.release_wall_ns`). Reported as p50 / p99 / max in ms against `LATENESS_GOAL_MS`.
   On a real engine the run *is* on the wall clock, so lateness is measured end to end: from the
   moment the engine client saw an op's last release predecessor complete (plus the op's
   external delay) to the op's release (`ReplayRun.release_lag_s`) — it includes the hop from
   the engine client to the driver.
4. **Schedule lag** on a real engine: per op released on the trace's schedule (a root's first
   ops: root arrivals from the scenario's arrival process), the time its request was actually
   sent (the engine client's send stamp, `Attempt.start_s`) minus its due time
   (`ReplayRun.schedule_lag_s`) — what a load generator calls arrival lateness. Reported as
   p50 / p99 / max in ms against the same goal; a run whose arrivals ran late does not pass.
5. **Replay / native root latency**: when the native trace the replay came from is given, the
   per-root ratio of replay to native latency and its median (roots matched by id, or by id
   without the cohort prefix `"<cohort>/"` that multi-cohort trace sets add).

`passed` is True when every op completed, the work matches, causal arms have no early releases and
lateness p99 and schedule lag p99 meet the goal; the ratio is informational (a replay under a different rule *should*
differ).

Examples:
    >>> from maserve_prefect.replay.driver import replay_trace
    >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, RootRecord, Trace
    >>> t = Trace(manifest=Manifest(trace_id="t"), roots=[RootRecord(root_id="r")],
    ...           ops=[OpRecord(op_id="r/a", root_id="r", kind=OpKind.TOOL, tool_duration_s=1.0)])
    >>> rep = audit(replay_trace(t, None, lock="length"))
    >>> rep.num_ops_checked, rep.token_mismatches, rep.early_releases_ok, rep.num_released
    (1, [], True, 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich.table import Table

from maserve_prefect.metrics.task import RootStatus, root_latencies
from maserve_prefect.replay.driver import ReplayRun
from maserve_prefect.trace.model import OpStatus, Trace

LATENESS_GOAL_MS = 1.0
MAX_IDS_IN_ROW = 10
"""Op ids a table row or verdict lists before it says how many more there are."""


@dataclass(slots=True)
class TokenMismatch:
    """An op whose realized token counts differ from the replayed trace's."""

    op_id: str
    field: str
    expected: int
    realized: int | None


@dataclass(slots=True)
class ConformanceReport:
    """The audit of one replay run (see the module docstring).

    Attributes:
        arm / rule / non_causal: which run this is; non-causal arms are reference arms.
        num_ops_checked: completed ops with a recorded input or output count that were compared.
        token_mismatches: ops whose realized counts differ (empty when the work was kept).
        incomplete_ops: ids of ops that never completed (the run ended first), sorted.
        failed_ops: ids of ops the replay failed though the recorded run did not, sorted.
        num_early_releases: ops released before a required predecessor completed.
        num_released: ops with a wall-clock release measurement.
        lateness_p50_ms / lateness_p99_ms / lateness_max_ms: driver reaction cost (None if
            nothing was released).
        root_ratio: root id → replay latency / native latency (when a native trace is given).
        root_ratio_median: median of `root_ratio` (None without a native trace or matches).
        basis: what lateness measures — "driver reaction" (simulator runs) or "engine
            completion -> release" (wall-clock runs on a real engine).
        num_scheduled / schedule_p50_ms / schedule_p99_ms / schedule_max_ms: ops released on
            the trace's schedule and their send − due time (None off a real engine).
    """

    arm: str
    rule: str
    non_causal: bool
    num_ops_checked: int
    token_mismatches: list[TokenMismatch]
    num_early_releases: int
    num_released: int
    lateness_p50_ms: float | None
    lateness_p99_ms: float | None
    lateness_max_ms: float | None
    goal_ms: float = LATENESS_GOAL_MS
    root_ratio: dict[str, float] = field(default_factory=dict)
    root_ratio_median: float | None = None
    basis: str = "driver reaction"
    incomplete_ops: list[str] = field(default_factory=list)
    failed_ops: list[str] = field(default_factory=list)
    num_scheduled: int = 0
    schedule_p50_ms: float | None = None
    schedule_p99_ms: float | None = None
    schedule_max_ms: float | None = None

    @property
    def completed_ok(self) -> bool:
        """True when every op completed (none incomplete, none newly failed)."""
        return not self.incomplete_ops and not self.failed_ops

    @property
    def early_releases_ok(self) -> bool:
        """True when a causal arm released nothing early (non-causal arms are exempt)."""
        return self.non_causal or self.num_early_releases == 0

    @property
    def lateness_ok(self) -> bool:
        """True when lateness p99 meets the goal (or nothing was released)."""
        return self.lateness_p99_ms is None or self.lateness_p99_ms <= self.goal_ms

    @property
    def schedule_ok(self) -> bool:
        """True when the schedule lag p99 meets the goal (or nothing ran on a schedule)."""
        return self.schedule_p99_ms is None or self.schedule_p99_ms <= self.goal_ms

    @property
    def work_ok(self) -> bool:
        """Every op completed, work kept, no early release on a causal arm: the checks that do
        not depend on how busy the machine was (lateness is a wall-clock figure)."""
        return self.completed_ok and not self.token_mismatches and self.early_releases_ok

    @property
    def passed(self) -> bool:
        """`work_ok`, lateness and schedule lag in goal."""
        return self.work_ok and self.lateness_ok and self.schedule_ok

    def row(self) -> dict[str, Any]:
        """A flat row for tables, JSON and Prefect artifacts."""
        return {
            "arm": self.arm,
            "rule": self.rule,
            "non_causal": self.non_causal,
            "ops_checked": self.num_ops_checked,
            "incomplete_ops": len(self.incomplete_ops),
            "incomplete_op_ids": _ids(self.incomplete_ops),
            "failed_ops": len(self.failed_ops),
            "failed_op_ids": _ids(self.failed_ops),
            "token_mismatches": len(self.token_mismatches),
            "early_releases": self.num_early_releases,
            "released": self.num_released,
            "lateness_p50_ms": self.lateness_p50_ms,
            "lateness_p99_ms": self.lateness_p99_ms,
            "lateness_max_ms": self.lateness_max_ms,
            "goal_ms": self.goal_ms,
            "lateness_basis": self.basis,
            "scheduled": self.num_scheduled,
            "schedule_lag_p50_ms": self.schedule_p50_ms,
            "schedule_lag_p99_ms": self.schedule_p99_ms,
            "schedule_lag_max_ms": self.schedule_max_ms,
            "replay_native_ratio": self.root_ratio_median,
            "work_ok": self.work_ok,
            "passed": self.passed,
        }


def _ids(op_ids: list[str], limit: int = MAX_IDS_IN_ROW) -> str:
    """The first `limit` ids, comma-separated, and how many more."""
    more = len(op_ids) - limit
    return ", ".join(op_ids[:limit]) + (f" +{more} more" if more > 0 else "")


def unfinished_ops(replayed: Trace, source: Trace) -> tuple[list[str], list[str]]:
    """(incomplete, failed) op ids of a replay, sorted (see the module docstring).

    Examples:
        >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, OpTimes
        >>> src = Trace(manifest=Manifest(trace_id="t"), ops=[
        ...     OpRecord(op_id=i, root_id="r", kind=OpKind.TOOL) for i in ("a", "b", "c")])
        >>> rep = src.model_copy(update={"ops": [
        ...     OpRecord(op_id="a", root_id="r", kind=OpKind.TOOL, times=OpTimes(completed_s=1.0)),
        ...     OpRecord(op_id="b", root_id="r", kind=OpKind.TOOL, status=OpStatus.FAILED,
        ...              times=OpTimes(completed_s=1.0)),
        ...     OpRecord(op_id="c", root_id="r", kind=OpKind.TOOL, status=OpStatus.INCOMPLETE)]})
        >>> unfinished_ops(rep, src)
        (['c'], ['b'])
    """
    recorded = source.op_index()
    incomplete, failed = [], []
    for op_id, op in replayed.op_index().items():
        if op.status is OpStatus.FAILED:
            was = recorded.get(op_id)
            if was is None or was.status is not OpStatus.FAILED:
                failed.append(op_id)
        elif op.times.completed_s is None:
            incomplete.append(op_id)
    return sorted(incomplete), sorted(failed)


def token_mismatches(
    replayed: Trace, source: Trace, skip: frozenset[str] = frozenset()
) -> tuple[int, list[TokenMismatch]]:
    """(ops compared, mismatches) of realized vs recorded input/output token counts.

    Ops in `skip` (those that did not complete) are not compared.
    """
    realized = replayed.op_index()
    checked, bad = 0, []
    for op in source.ops:
        if op.op_id in skip:
            continue
        got = realized.get(op.op_id)
        compared = False
        for name in ("num_input_tokens", "num_output_tokens"):
            want = getattr(op, name)
            if want is None:
                continue
            compared = True
            have = None if got is None else getattr(got, name)
            if have != want:
                bad.append(TokenMismatch(op.op_id, name, want, have))
        checked += compared
    return checked, bad


def lateness_ms(wall_ns: dict[str, tuple[int, int]]) -> list[float]:
    """Per released op, submit − trigger on the wall clock, in milliseconds."""
    return [(sub - trig) / 1e6 for trig, sub in wall_ns.values()]


def wall_lateness_ms(run: ReplayRun) -> list[float]:
    """Per released op of a wall-clock run: release − (predecessor done + external delay), ms.

    Ops of non-causal rules are released on their own schedule and are measured from the
    driver's trigger instead (`lateness_ms`).
    """
    if not run.rule.is_causal:
        return lateness_ms(run.release_wall_ns)
    ops = run.source.op_index()
    return [
        max(released - done - ops[op_id].external_delay_s, 0.0) * 1e3
        for op_id, (done, released) in run.release_lag_s.items()
    ]


def schedule_lag_ms(run: ReplayRun) -> list[float]:
    """Per op released on the trace's schedule, sent − due in ms (empty off a real engine)."""
    return [(went - due) * 1e3 for due, went in run.schedule_lag_s.values()]


def _p50_p99_max(values: list[float]) -> tuple[float | None, float | None, float | None]:
    if not values:
        return None, None, None
    arr = np.asarray(values)
    p50, p99 = (float(v) for v in np.percentile(arr, (50, 99)))
    return p50, p99, float(arr.max())


def root_ratios(replayed: Trace, native: Trace) -> dict[str, float]:
    """Replay / native latency per completed root present in both traces (see module doc)."""
    native_lat = {
        r.root_id: r.latency_s
        for r in root_latencies(native)
        if r.status is RootStatus.COMPLETED and r.latency_s
    }
    out: dict[str, float] = {}
    for r in root_latencies(replayed):
        if r.status is not RootStatus.COMPLETED or r.latency_s is None:
            continue
        key = r.root_id if r.root_id in native_lat else r.root_id.partition("/")[2]
        if key in native_lat:
            out[r.root_id] = r.latency_s / native_lat[key]
    return out


def audit(run: ReplayRun, native_trace: Trace | None = None) -> ConformanceReport:
    """Audit one replay run; add the replay/native root-latency ratio when `native_trace` is given.

    Examples:
        >>> from maserve_prefect.replay.driver import replay_trace
        >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, RootRecord, Trace
        >>> t = Trace(manifest=Manifest(trace_id="t"), roots=[RootRecord(root_id="r")],
        ...           ops=[OpRecord(op_id="r/a", root_id="r", kind=OpKind.TOOL,
        ...                         tool_duration_s=1.0)])
        >>> audit(replay_trace(t, None, rule="flat", lock="length")).non_causal
        True
    """
    incomplete, failed = unfinished_ops(run.trace, run.source)
    checked, bad = token_mismatches(run.trace, run.source, frozenset(incomplete + failed))
    wall = run.pool is None and bool(run.release_lag_s)
    late = wall_lateness_ms(run) if wall else lateness_ms(run.release_wall_ns)
    p50, p99, mx = _p50_p99_max(late)
    sched = schedule_lag_ms(run)
    s50, s99, smax = _p50_p99_max(sched)
    ratios = root_ratios(run.trace, native_trace) if native_trace is not None else {}
    return ConformanceReport(
        arm=str(run.notes.get("replay", {}).get("arm", run.trace.manifest.trace_id)),
        rule=run.rule.value,
        non_causal=run.non_causal,
        num_ops_checked=checked,
        token_mismatches=bad,
        num_early_releases=run.num_early_releases,
        num_released=len(late),
        lateness_p50_ms=p50,
        lateness_p99_ms=p99,
        lateness_max_ms=mx,
        root_ratio=ratios,
        root_ratio_median=float(np.median(list(ratios.values()))) if ratios else None,
        basis="engine completion -> release" if wall else "driver reaction",
        incomplete_ops=incomplete,
        failed_ops=failed,
        num_scheduled=len(sched),
        schedule_p50_ms=s50,
        schedule_p99_ms=s99,
        schedule_max_ms=smax,
    )


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def render(reports: list[ConformanceReport], *, title: str = "conformance audit") -> Table:
    """A rich table, one row per audited run; non-causal arms are marked as references. The
    schedule-lag column (`sched p99 ms`: request sent − due) is shown when some run was on a
    real engine's wall clock.

    Examples:
        >>> render([]).row_count
        0
    """
    sched = any(r.schedule_p99_ms is not None for r in reports)
    what = "lateness and schedule lag" if sched else "lateness on the driver's wall clock"
    table = Table(title=f"{title} ({what}, goal p99 <= {LATENESS_GOAL_MS:g} ms)")
    cols = ["arm", "rule", "ops", "incomplete", "failed", "token mismatch", "early", "p50 ms",
            "p99 ms", "max ms", "replay/native", "verdict"]  # fmt: skip
    if sched:
        cols.insert(cols.index("replay/native"), "sched p99 ms")
    for col in cols:
        table.add_column(col, justify="left" if col in ("arm", "rule", "verdict") else "right")
    for r in reports:
        rule = f"{r.rule} (non-causal reference)" if r.non_causal else r.rule
        verdict = "ok" if r.passed else "FAIL: " + failure_reason(r)
        ratio = "-" if r.root_ratio_median is None else f"{r.root_ratio_median:.2f}"
        cells = [
            r.arm, rule, str(r.num_ops_checked), str(len(r.incomplete_ops)),
            str(len(r.failed_ops)), str(len(r.token_mismatches)),
            str(r.num_early_releases), _ms(r.lateness_p50_ms), _ms(r.lateness_p99_ms),
            _ms(r.lateness_max_ms), ratio, verdict,
        ]  # fmt: skip
        if sched:
            cells.insert(cols.index("sched p99 ms"), _ms(r.schedule_p99_ms))
        table.add_row(*cells)
    return table


def failure_reason(r: ConformanceReport) -> str:
    """Why `r` did not pass, in a few words ("" when it passed)."""
    reasons = []
    if r.incomplete_ops:
        reasons.append(f"{len(r.incomplete_ops)} ops incomplete ({_ids(r.incomplete_ops, 3)})")
    if r.failed_ops:
        reasons.append(f"{len(r.failed_ops)} ops failed ({_ids(r.failed_ops, 3)})")
    if r.token_mismatches:
        first = r.token_mismatches[0]
        reasons.append(f"work changed ({first.op_id} {first.field})")
    if not r.early_releases_ok:
        reasons.append("early releases")
    if not r.lateness_ok:
        reasons.append("late releases")
    if not r.schedule_ok:
        reasons.append(
            f"late arrivals (schedule lag p99 {r.schedule_p99_ms:.3f} ms > {r.goal_ms:g} ms)"
        )
    return ", ".join(reasons)
