"""Arm summaries of runs that did not finish: unfinished roots are counted, never a KeyError, and
a root with a failed op never meets its deadline."""

from __future__ import annotations

from replay_factories import Factory, make_trace, paced_sim, scaled, wrapped

from maserve_prefect.metrics.task import RootStatus
from maserve_prefect.replay.arm_summary import ArmSummary, measured_roots, summarize_arm
from maserve_prefect.replay.driver import replay_trace
from maserve_prefect.replay.scenario import Scenario, parse_scenario
from maserve_prefect.replay.traceset import TraceSet, build_trace_set
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.workloads.arrivals import ArrivalProcess, ClosedLoopArrivals, ThinkTime


def _setup(num_roots: int, **extra: object) -> tuple[Scenario, TraceSet]:
    s = parse_scenario(
        {"name": "toy", "cohorts": [{"name": "tgt", "bundle": "unused"}], "lock": "length",
         "arms": [{"name": "dag"}]} | extra
    )  # fmt: skip
    loaded = {"tgt": (make_trace(num_roots, model_tokens=(64, 8)), MemoryStore())}
    return s, build_trace_set(s, loaded)


def _summary(
    s: Scenario,
    ts: TraceSet,
    factory: Factory,
    *,
    arrivals: ArrivalProcess | None = None,
    timeout_s: float | None = None,
) -> ArmSummary:
    run = replay_trace(ts.trace, ts.store, lock="length", slots=ts.slots, arrivals=arrivals,
                       replicas_factory=factory, timeout_s=timeout_s)  # fmt: skip
    return summarize_arm(run, ts, s, {"toy": 1e6}, arm="dag", block=0)


def test_a_timed_out_arm_counts_its_roots_as_incomplete() -> None:
    s, ts = _setup(3)
    summary = _summary(s, ts, scaled(100.0), timeout_s=0.2)
    assert (summary.num_measured, summary.num_completed, summary.num_incomplete_roots) == (3, 0, 3)
    assert summary.num_incomplete_ops == 9 and summary.attainment == 0.0
    assert summary.latency_p50_s is None and summary.latency_p99_s is None


def test_roots_that_never_arrived_are_measured_unless_the_window_excludes_them() -> None:
    one_user = ClosedLoopArrivals(1, ThinkTime("constant", 0.0))  # root 2 waits for root 1
    s, ts = _setup(3)
    summary = _summary(s, ts, scaled(100.0), arrivals=one_user, timeout_s=0.2)
    assert (summary.num_measured, summary.num_incomplete_roots) == (3, 3)
    # the run's clock is slowed 100x: it ran 0.2 wall s = 0.002 s. The window ends before
    # that, so roots that had not arrived by then cannot be in it.
    s, ts = _setup(3, window={"start_s": 0.0, "end_s": 0.001})
    summary = _summary(s, ts, scaled(100.0), arrivals=one_user, timeout_s=0.2)
    assert (summary.num_measured, summary.num_incomplete_roots) == (1, 1)


def test_a_root_with_a_failed_op_never_meets_its_deadline() -> None:
    s, ts = _setup(3)
    summary = _summary(s, ts, wrapped(["r1/m"]))
    assert (summary.num_completed, summary.num_failed_roots, summary.num_incomplete_roots) == (
        2, 1, 0)  # fmt: skip
    assert summary.num_failed_ops == 1
    assert summary.attainment == 2 / 3  # the deadline is huge; the failed root still misses it


def test_a_finished_arm_measures_every_root_as_completed() -> None:
    s, ts = _setup(2)
    run = replay_trace(ts.trace, ts.store, lock="length", slots=ts.slots,
                       replicas_factory=paced_sim)  # fmt: skip
    roots = measured_roots(run, ts, s)
    assert [(m.root_id, m.status) for m in roots] == [
        ("r0", RootStatus.COMPLETED), ("r1", RootStatus.COMPLETED)]  # fmt: skip
    assert [m.latency_s for m in roots] == [run.root_latency_s["r0"], run.root_latency_s["r1"]]
    summary = summarize_arm(run, ts, s, {}, arm="dag", block=0)
    assert summary.attainment is None and summary.num_completed == 2
