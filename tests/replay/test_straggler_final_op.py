"""Replay ends a root at its final op; stragglers of a k-of-n join still run and are recorded.

Each root is a 2-of-3 fork-join: workers w0, w1 and a slow straggler w2 start at the root's
arrival; the judge j waits for w0 and w1 only and produces the answer (`final_op_id`). With tool
ops of fixed durations (w0 1 s, w1 2 s, w2 8 s, j 1.5 s) the answer exists at 3.5 s and the
straggler ends at 8 s. A model-op variant runs through the simulator and the dispatcher.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from maserve_prefect.clock import WallClock
from maserve_prefect.errors import TraceValidationError
from maserve_prefect.metrics.path import path_ledger
from maserve_prefect.metrics.task import RootStatus, root_latencies
from maserve_prefect.protocol.engine import Replica
from maserve_prefect.replay.driver import replay_trace
from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    GenerationSettings,
    Manifest,
    OpKind,
    OpRecord,
    RootRecord,
    Trace,
)
from maserve_prefect.workloads.arrivals import ClosedLoopArrivals, ThinkTime

DURATIONS = {"w0": 1.0, "w1": 2.0, "w2": 8.0, "j": 1.5}


def make_k_of_n_trace(
    num_roots: int = 1, *, final: bool = True, model: bool = False, final_op: str = "j"
) -> Trace:
    """`num_roots` 2-of-3 fork-join roots (see the module docstring)."""
    roots, ops = [], []
    for i in range(num_roots):
        r = f"r{i}"
        roots.append(
            RootRecord(root_id=r, workflow="kofn", final_op_id=f"{r}/{final_op}" if final else None)
        )
        for name, dur in DURATIONS.items():
            deps = (
                tuple(Dep(op_id=f"{r}/{w}", kind=EdgeKind.DATA) for w in ("w0", "w1"))
                if name == "j"
                else ()
            )
            if model:
                # Output length stands in for duration: the straggler decodes 8x longer.
                op = OpRecord(
                    op_id=f"{r}/{name}", root_id=r, kind=OpKind.MODEL, deps=deps,
                    generation=GenerationSettings(deployment="main"),
                    num_input_tokens=256, num_output_tokens=int(64 * dur),
                )  # fmt: skip
            else:
                op = OpRecord(
                    op_id=f"{r}/{name}", root_id=r, kind=OpKind.TOOL, deps=deps,
                    tool_name="t", tool_duration_s=dur,
                )  # fmt: skip
            ops.append(op)
    return Trace(manifest=Manifest(trace_id="kofn"), roots=roots, ops=ops)


def test_root_done_at_the_final_op_while_the_straggler_still_runs() -> None:
    run = replay_trace(make_k_of_n_trace(), None, lock="length")
    assert run.root_latency_s == {"r0": 3.5}
    realized = run.trace.op_index()
    assert realized["r0/w2"].times.completed_s == run.start_s + 8.0  # still ran, still recorded
    assert run.end_s == run.start_s + 8.0
    assert run.num_incomplete_ops == 0 and run.num_early_releases == 0
    # The replay trace carries the final op, so the metrics agree with the driver.
    (lat,) = root_latencies(run.trace)
    assert lat.terminal_op_id == "r0/j" and lat.latency_s == pytest.approx(3.5)
    (path,) = path_ledger(run.trace)
    assert path.total_s == pytest.approx(3.5, abs=1e-9)
    assert [s.op_id for s in path.segments] == ["r0/w1", "r0/j"]


def test_without_a_final_op_the_root_waits_for_every_op() -> None:
    run = replay_trace(make_k_of_n_trace(final=False), None, lock="length")
    assert run.root_latency_s == {"r0": 8.0}


def test_closed_loop_user_moves_on_when_the_answer_exists() -> None:
    users = ClosedLoopArrivals(users=1, think_time=ThinkTime("constant", 0.0))
    run = replay_trace(make_k_of_n_trace(2), None, lock="length", arrivals=users)
    # The second root starts at the first one's answer (3.5 s), not at its straggler (8 s).
    assert run.root_arrival_s["r1"] - run.root_arrival_s["r0"] == pytest.approx(3.5)
    assert run.root_latency_s == {"r0": 3.5, "r1": 3.5}
    assert run.end_s - run.start_s == pytest.approx(3.5 + 8.0)


def test_model_stragglers_on_the_simulator_are_deterministic() -> None:
    trace = make_k_of_n_trace(2, model=True)
    runs = [replay_trace(trace, None, lock="length") for _ in range(2)]
    a, b = runs
    assert a.root_latency_s == b.root_latency_s
    assert [op.to_json_line() for op in a.trace.ops] == [op.to_json_line() for op in b.trace.ops]
    realized = a.trace.op_index()
    for root in ("r0", "r1"):
        judge = realized[f"{root}/j"].times.completed_s
        straggler = realized[f"{root}/w2"].times.completed_s
        assert judge is not None and straggler is not None and straggler > judge
        assert a.root_latency_s[root] == pytest.approx(judge - a.root_arrival_s[root])
    lats = {r.root_id: r.latency_s for r in root_latencies(a.trace)}
    assert lats == pytest.approx(a.root_latency_s)
    for path in path_ledger(a.trace):
        assert path.total_s == pytest.approx(path.latency_s, abs=1e-9)


def test_wall_replay_waits_for_stragglers_before_it_ends() -> None:
    def factory(
        clock: WallClock, deployments: Sequence[str]
    ) -> tuple[Sequence[Replica], Callable[[], None]]:
        clock.scale = 0.02  # 1 trace second = 20 ms; tool ops need no replica
        return [], lambda: None

    run = replay_trace(make_k_of_n_trace(), None, lock="length", replicas_factory=factory)
    assert run.num_incomplete_ops == 0
    realized = run.trace.op_index()
    done_s = run.root_arrival_s["r0"] + run.root_latency_s["r0"]
    judge, w2 = realized["r0/j"].times.completed_s, realized["r0/w2"].times.completed_s
    # Ordering only (wall time): done right after the judge, the straggler well after.
    assert judge is not None and w2 is not None
    assert judge <= done_s < w2


def test_a_final_op_outside_the_root_is_refused() -> None:
    trace = make_k_of_n_trace(final_op="missing")
    with pytest.raises(TraceValidationError, match="final op 'r0/missing'"):
        replay_trace(trace, None, lock="length")


def test_root_status_in_the_replay_trace_is_completed() -> None:
    run = replay_trace(make_k_of_n_trace(3), None, lock="length")
    assert {r.status for r in root_latencies(run.trace)} == {RootStatus.COMPLETED}
