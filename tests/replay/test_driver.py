"""The replay driver on real native DAG traces: fixed work, legal release changes, determinism."""

from __future__ import annotations

import pytest
from replay_factories import make_trace

from maserve_prefect.errors import ConfigError, IllegalReleaseError, UnsupportedError
from maserve_prefect.protocol.capabilities import Capabilities
from maserve_prefect.replay.driver import replay_trace
from maserve_prefect.replay.work import InputLock, check_capabilities
from maserve_prefect.trace.barrier import StageBarrier
from maserve_prefect.trace.cas import BlobStore
from maserve_prefect.trace.model import OpKind, Trace
from maserve_prefect.trace.validate import validate_trace

Loaded = tuple[Trace, BlobStore]


def _work(trace: Trace) -> dict[str, tuple[object, ...]]:
    """What an op does, everything but times and engine-realized cache hits."""
    return {
        op.op_id: (op.kind, op.input_refs, op.output_ref, op.num_input_tokens,
                   op.num_output_tokens, op.generation, op.tool_duration_s)
        for op in trace.ops
    }  # fmt: skip


def test_token_locked_dag_replay_reproduces_the_native_run(four_call: Loaded) -> None:
    trace, store = four_call
    run = replay_trace(trace, store, rule="dag", lock="token")
    native = trace.op_index()
    assert _work(run.trace) == _work(trace)
    for op in run.trace.ops:
        # Same arrivals (all at once), same requests, same dispatcher: same prefix hits and times.
        assert op.num_cached_tokens == native[op.op_id].num_cached_tokens
        assert op.times.completed_s == pytest.approx(native[op.op_id].times.completed_s, abs=1e-9)
    assert run.num_early_releases == 0 and not run.non_causal
    validate_trace(run.trace, store)


def test_barrier_changes_only_release_times(four_call: Loaded) -> None:
    trace, store = four_call
    dag = replay_trace(trace, store, rule="dag")
    bar = replay_trace(
        trace, store, rule="barrier", barrier=[StageBarrier("analyst_a", "analyst_b")]
    )
    assert bar.num_early_releases == 0
    assert _work(bar.trace) == _work(dag.trace)
    ops = bar.trace.op_index()
    for root in trace.roots:
        a = ops[f"{root.root_id}/analyst_a.analyst_a/0"]
        b = ops[f"{root.root_id}/analyst_b.analyst_b/0"]
        assert b.times.ready_s == a.times.completed_s  # released exactly when the barrier opened
        assert dag.trace.op_index()[b.op_id].times.ready_s < b.times.ready_s
        # a coordination edge of the four-call's analyst fork (two Γ-parallel single stages)
        (edge,) = [d for d in b.deps if d.is_coordination]
        assert (edge.op_id, edge.stage) == (
            a.op_id,
            f"{root.root_id}/parallel(analyst_a,analyst_b)",
        )
    assert bar.trace.manifest.notes["replay"]["release_rule"] == "barrier"


def test_illegal_barrier_is_refused_naming_both_ops(four_call: Loaded) -> None:
    trace, store = four_call
    # synthesis consumes analyst_a's artifact: dependent ops
    with pytest.raises(
        IllegalReleaseError,
        match=r"synthesis.synthesizer/0 -> r\d+/analyst_a.analyst_a/0: the ops are not independent",
    ):
        replay_trace(trace, store, rule="barrier", barrier=[StageBarrier("synthesis", "analyst_a")])


def test_barrier_edges_need_the_barrier_rule(four_call: Loaded) -> None:
    trace, store = four_call
    with pytest.raises(ConfigError, match="release: barrier"):
        replay_trace(trace, store, rule="dag", barrier=[StageBarrier("analyst_a", "analyst_b")])


def test_replaying_twice_gives_identical_traces(four_call: Loaded) -> None:
    trace, store = four_call
    first = replay_trace(trace, store, rule="dag")
    second = replay_trace(trace, store, rule="dag")
    assert first.trace == second.trace
    assert first.root_latency_s == second.root_latency_s
    assert first.step_rows() == second.step_rows()


@pytest.mark.parametrize("rule", ["flat", "arrival"])
def test_reference_arms_are_flagged_non_causal(four_call: Loaded, rule: str) -> None:
    trace, store = four_call
    run = replay_trace(trace, store, rule=rule)
    assert run.non_causal and run.trace.manifest.notes["replay"]["non_causal"] is True
    assert _work(run.trace) == _work(trace)


def test_flat_releases_dependent_ops_early(four_call: Loaded) -> None:
    trace, store = four_call
    run = replay_trace(trace, store, rule="flat")
    # synthesis and verification of each root are released before their inputs exist
    assert run.num_early_releases == 2 * len(trace.roots)


def test_tool_ops_take_their_recorded_duration(code_repair: Loaded) -> None:
    trace, store = code_repair
    run = replay_trace(trace, store, rule="dag")
    tools = [op for op in run.trace.ops if op.kind is OpKind.TOOL]
    assert tools
    for op in tools:
        assert op.times.completed_s - op.times.ready_s == pytest.approx(op.tool_duration_s)
    assert run.num_early_releases == 0 and run.num_failed_ops == 0


def test_tool_ops_return_their_recorded_result(code_repair: Loaded) -> None:
    trace, store = code_repair
    run = replay_trace(trace, store, rule="dag")
    recorded = trace.op_index()
    tools = [op for op in run.trace.op_index().values() if op.kind is OpKind.TOOL]
    assert tools
    for op in tools:
        want = recorded[op.op_id]
        assert want.output_ref is not None
        assert (op.output_ref, op.status) == (want.output_ref, want.status), op.op_id
        store.get(op.output_ref)  # the recorded result is still in the replay's store
    validate_trace(run.trace, store)


def _with(trace: Trace, **updates: dict[str, object]) -> Trace:
    """`trace` with `updates[op_id]` applied to those ops (op ids use "__" for "/")."""
    by_id = {k.replace("__", "/"): v for k, v in updates.items()}
    return trace.model_copy(update={"ops": [
        op.model_copy(update=by_id[op.op_id]) if op.op_id in by_id else op for op in trace.ops
    ]})  # fmt: skip


@pytest.mark.parametrize("rule", ["dag", "flat"])
def test_external_delay_holds_the_release(rule: str) -> None:
    trace = _with(make_trace(1, model_tokens=(64, 8)),
                  r0__a={"external_delay_s": 0.25}, r0__m={"external_delay_s": 0.5})  # fmt: skip
    run = replay_trace(trace, None, rule=rule, lock="length")
    ops = run.trace.op_index()
    arrival = run.root_arrival_s["r0"]
    assert ops["r0/a"].times.ready_s == arrival + 0.25
    assert ops["r0/b"].times.ready_s == arrival
    # DAG: after its data predecessor plus the delay; Flat: after the root's arrival plus it
    after = ops["r0/a"].times.completed_s if rule == "dag" else arrival
    assert ops["r0/m"].times.ready_s == after + 0.5
    assert ops["r0/m"].times.completed_s > ops["r0/m"].times.ready_s


def test_arrival_rule_releases_at_the_recorded_submission_offset() -> None:
    from maserve_prefect.trace.model import OpTimes
    from maserve_prefect.workloads.arrivals import ExplicitArrivals

    trace = _with(make_trace(1, model_tokens=(64, 8)),
                  r0__a={"times": OpTimes(ready_s=0.1, submitted_s=0.3)},
                  r0__b={"times": OpTimes(ready_s=0.2)},  # no submission time: ready time
                  r0__m={"times": OpTimes(ready_s=0.4, submitted_s=0.5)})  # fmt: skip
    # recorded: root r0 arrived at 0 s; replayed: it arrives at 4 s
    run = replay_trace(trace, None, rule="arrival", lock="length",
                       arrivals=ExplicitArrivals((4.0,)))  # fmt: skip
    ops = run.trace.op_index()
    arrival = run.root_arrival_s["r0"]
    assert arrival - run.start_s == pytest.approx(4.0) and run.non_causal
    ready = [ops[f"r0/{o}"].times.ready_s for o in ("a", "b", "m")]
    assert ready == [arrival + 0.3, arrival + 0.2, arrival + 0.5]
    # the model op is released before its data predecessor (a: 1 s tool) completed: non-causal
    assert run.num_early_releases == 1


@pytest.mark.usefixtures("toy_fork")
def test_barrier_replay_notes_which_barrier_added_each_edge() -> None:
    run = replay_trace(make_trace(2), None, rule="barrier", lock="length",
                       barrier=[StageBarrier("s1", "s2")])  # fmt: skip
    edges = run.trace.manifest.notes["replay"]["barrier_edges"]
    assert edges == [["r0/a", "r0/b", "stage s1 -> s2"], ["r1/a", "r1/b", "stage s1 -> s2"]]
    ops = run.trace.op_index()
    assert ops["r0/b"].times.ready_s == ops["r0/a"].times.completed_s


def test_token_lock_refuses_another_tokenizer(four_call: Loaded) -> None:
    trace, store = four_call
    op = next(op for op in trace.ops if op.kind is OpKind.MODEL)
    bad = trace.model_copy(update={"ops": [
        o.model_copy(update={"num_input_tokens": o.num_input_tokens + 1}) if o is op else o
        for o in trace.ops
    ]})  # fmt: skip
    with pytest.raises(ConfigError, match=f"op '{op.op_id}'.*lock: length"):
        replay_trace(bad, store, rule="dag")
    assert replay_trace(bad, store, rule="dag", lock="length").num_failed_ops == 0


def test_token_lock_needs_recorded_messages() -> None:
    with pytest.raises(ConfigError, match="lock: length"):
        replay_trace(make_trace(1, model_tokens=(50, 4)), None, lock="token")


class _NoTokenIds:
    name = "r0"

    def capabilities(self) -> Capabilities:
        return Capabilities((), accepts_token_ids=False, length_lock=True,
                            priority_scheduling=False, prefix_caching=False, kv_events=False,
                            sleep_levels=(), modes=())  # fmt: skip


def test_engine_without_token_ids_is_unsupported_for_token_lock() -> None:
    rep = _NoTokenIds()
    with pytest.raises(UnsupportedError, match="token-locked replay is unsupported"):
        check_capabilities([rep], InputLock.TOKEN)  # type: ignore[list-item]
    check_capabilities([rep], InputLock.LENGTH)  # type: ignore[list-item]


def test_length_locked_model_ops_keep_lengths_and_wait_for_data() -> None:
    run = replay_trace(make_trace(2, model_tokens=(64, 8)), None, lock="length")
    ops = run.trace.op_index()
    for r in ("r0", "r1"):
        m, a = ops[f"{r}/m"], ops[f"{r}/a"]
        assert (m.num_input_tokens, m.num_output_tokens) == (64, 8)
        assert m.times.ready_s == a.times.completed_s
        assert m.times.first_token_s is not None and m.times.submitted_s is not None
    assert {row["request_id"] for row in run.step_rows()} == {"r0/m", "r1/m"}
