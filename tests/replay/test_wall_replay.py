"""Wall-clock replay: the same driver on a WallClock, with replicas built on that clock.

Simulated replicas paced on the wall clock stand in for a server here (the real vLLM runs in the
integration tests): the work must stay fixed, no op may be released early, and every released op
must carry its release lag so the conformance audit can report lateness on the wall clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from replay_factories import make_trace

from maserve_prefect.clock import WallClock
from maserve_prefect.engine.protocol import Replica
from maserve_prefect.engine.sim.replica import SimReplica
from maserve_prefect.engine.sim.step_time import make_step_model
from maserve_prefect.replay.driver import replay_trace
from maserve_prefect.trace.model import OpKind, OpStatus


def _paced_sim(
    clock: WallClock, deployments: Sequence[str]
) -> tuple[Sequence[Replica], Callable[[], None]]:
    model = make_step_model("Qwen3-0.6B", "H100")
    reps = [SimReplica(clock, model, 2000, name=f"wall-{d}", deployment=d) for d in deployments]
    return reps, lambda: None


def _scaled(scale: float) -> Callable[[WallClock, Sequence[str]], object]:
    def factory(clock: WallClock, deployments: Sequence[str]) -> object:
        clock.scale = scale  # the run's clock: 1 simulated second takes `scale` wall seconds
        return _paced_sim(clock, deployments)

    return factory


def test_wall_replay_keeps_the_work_and_never_releases_early() -> None:
    trace = make_trace(3, model_tokens=(64, 8))
    run = replay_trace(trace, None, rule="dag", lock="length", replicas_factory=_paced_sim)
    assert run.pool is None and run.step_rows() == []
    assert run.num_early_releases == 0 and run.num_incomplete_ops == 0
    src = trace.op_index()
    for op in run.trace.ops:
        assert op.status is OpStatus.COMPLETED
        if op.kind is OpKind.MODEL:
            assert op.num_output_tokens == src[op.op_id].num_output_tokens
            assert op.num_input_tokens == src[op.op_id].num_input_tokens
    assert set(run.root_latency_s) == {r.root_id for r in trace.roots}
    # Every op has a release lag; a release never precedes its predecessor's completion.
    assert set(run.release_lag_s) == set(src)
    for done_s, released_s in run.release_lag_s.values():
        assert released_s >= done_s


def test_wall_replay_reports_incomplete_ops_at_the_timeout() -> None:
    trace = make_trace(2, model_tokens=(64, 8))
    # 1 simulated second takes 100 wall seconds: nothing can finish within the 0.2 s limit.
    run = replay_trace(
        trace, None, rule="dag", lock="length", replicas_factory=_scaled(100.0), timeout_s=0.2
    )
    assert run.num_incomplete_ops > 0
    assert len(run.root_latency_s) < len(trace.roots)


def test_audit_of_a_wall_run_measures_from_engine_completion() -> None:
    from maserve_prefect.replay.conformance import audit, wall_lateness_ms

    trace = make_trace(2, model_tokens=(64, 8))
    run = replay_trace(trace, None, rule="dag", lock="length", replicas_factory=_paced_sim)
    rep = audit(run)
    assert rep.basis == "engine completion -> release"
    assert rep.num_released == len(run.release_lag_s) == len(trace.ops)
    assert not rep.token_mismatches and rep.num_early_releases == 0
    late = wall_lateness_ms(run)
    assert all(v >= 0.0 for v in late) and rep.lateness_max_ms == max(late)
