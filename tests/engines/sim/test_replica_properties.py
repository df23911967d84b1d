"""Property tests on random workloads: invariants after every step, fast-forward equivalence,
determinism."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_factories import LinearCost, make_replica

from maserve_prefect.engines.sim.loop import LogEntry
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.engines.sim.step.scheduler import Policy
from maserve_prefect.errors import SimulationError
from maserve_prefect.protocol.outcomes import Ticket
from maserve_prefect.protocol.requests import Request


@dataclass(frozen=True)
class Workload:
    requests: tuple[tuple[float, Request], ...]
    num_blocks: int
    config: dict[str, object]


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    bs = draw(st.sampled_from([4, 16]))
    n = draw(st.integers(1, 10))
    reqs = []
    for i in range(n):
        # arrivals on a grid offset from the cost model's step grid, so no exact ties
        t = draw(st.integers(0, 300)) * 1e-3 + 1.37e-5
        prompt = draw(st.integers(1, 70))
        out = draw(st.integers(1, 40))
        group = draw(st.integers(0, 2))
        num_hashes = draw(st.integers(0, prompt // 8))
        hashes = tuple(range(group * 100, group * 100 + num_hashes))
        reqs.append((t, Request(
            f"q{i}", "", num_prompt_tokens=prompt, max_tokens=out, priority=draw(st.integers(0, 3)),
            prefix_block_hashes=hashes, prefix_block_size=8 if hashes else 0,
        )))  # fmt: skip
    config = {
        "block_size": bs,
        "max_num_seqs": draw(st.integers(1, 8)),
        "max_num_batched_tokens": draw(st.integers(8, 96)),
        "long_prefill_token_threshold": draw(st.sampled_from([0, 8])),
        "policy": draw(st.sampled_from(list(Policy))),
        "enable_prefix_caching": draw(st.booleans()),
    }
    return Workload(tuple(reqs), draw(st.integers(3, 40)), config)


COST = LinearCost(per_token_s=0.001, per_context_s=3e-6, overhead_s=0.004)


def simulate(w: Workload, fast_forward: bool) -> tuple[SimReplica, list[LogEntry], list[Ticket]]:
    log: list[LogEntry] = []
    k, rep = make_replica(
        w.num_blocks, cost=COST, log=log, check=True, fast_forward=fast_forward, **w.config
    )
    tickets: list[Ticket] = []
    for t, r in w.requests:
        k.call_at(t, lambda r=r: tickets.append(rep.submit(r)))
    k.run()
    return rep, log, tickets


def fingerprint(tickets: list[Ticket]) -> list[tuple[object, ...]]:
    return [
        (t.request_id, t.acceptance, None if t.outcome is None else (
            t.outcome.num_output_tokens, t.outcome.num_cached_tokens, t.outcome.num_preemptions))
        for t in tickets
    ]  # fmt: skip


SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(workloads())
def test_invariants_hold_after_every_step_and_everything_accepted_finishes(w: Workload) -> None:
    rep, _, tickets = simulate(w, fast_forward=True)  # check=True: full invariant check per step
    for t in tickets:
        if t.accepted:
            assert t.outcome is not None
            r = dict((r.request_id, r) for _, r in w.requests)[t.request_id]
            assert t.outcome.num_output_tokens == r.max_tokens
            assert t.outcome.arrival_s <= t.outcome.first_token_s <= t.outcome.finish_s
    assert rep.kv.num_free_blocks == rep.kv.num_blocks and rep.is_idle
    usage = rep.timeline.values["vllm:kv_cache_usage_perc"]
    assert all(0.0 <= u <= 1.0 for u in usage)
    for rec in rep.records:
        assert rec.num_scheduled_tokens <= w.config["max_num_batched_tokens"]  # budget never < 0
        assert rec.end_s > rec.start_s


@SETTINGS
@given(workloads())
def test_fast_forward_gives_the_same_results_as_stepping(w: Workload) -> None:
    fast, fast_log, fast_t = simulate(w, fast_forward=True)
    slow, slow_log, slow_t = simulate(w, fast_forward=False)
    assert fingerprint(fast_t) == fingerprint(slow_t)
    assert [e[1:] for e in fast_log] == [e[1:] for e in slow_log]
    assert [e[0] for e in fast_log] == pytest.approx([e[0] for e in slow_log], rel=1e-9, abs=1e-12)
    assert fast.state().counters == slow.state().counters
    assert list(fast.kv.free_queue) == list(slow.kv.free_queue)  # same eviction order
    assert fast.kv.cached == slow.kv.cached
    assert sum(r.num_steps for r in fast.records) == len(slow.records)


def test_fast_forward_collapses_decode_runs() -> None:
    k, rep = make_replica(64, cost=COST)
    rep.submit(Request("a", "", num_prompt_tokens=20, max_tokens=200))
    rep.submit(Request("b", "", num_prompt_tokens=30, max_tokens=150))
    k.run()
    # prefill, a run to b's completion, then a run to a's completion
    assert [r.num_steps for r in rep.records] == [1, 149, 50]


def test_same_inputs_twice_give_identical_records() -> None:
    w = Workload(
        tuple(
            (0.002 * i, Request(f"q{i}", "", num_prompt_tokens=10 + 7 * i, max_tokens=5 + 3 * i,
                                prefix_block_hashes=(1, 2)[: i % 3], prefix_block_size=8))
            for i in range(8)
        ),
        num_blocks=12,
        config={"block_size": 4, "max_num_batched_tokens": 32},
    )  # fmt: skip
    a, log_a, _ = simulate(w, True)
    b, log_b, _ = simulate(w, True)
    assert log_a == log_b and a.records == b.records
    assert a.timeline.to_rows() == b.timeline.to_rows()
    assert any(r.preempted for r in a.records)  # the case exercises preemption


def test_timeline_rows_use_prometheus_names() -> None:
    k, rep = make_replica(16)
    rep.submit(Request("a", "", num_prompt_tokens=20, max_tokens=3))
    k.run()
    rows = rep.timeline.to_rows()
    names = {r["name"] for r in rows}
    assert "vllm:kv_cache_usage_perc" in names and "vllm:prefix_cache_hits_total" in names
    assert len(rows) == 6 * len(rep.records)
    assert rep.timeline.time_weighted_mean("vllm:num_requests_running") == 1.0


def test_a_broken_invariant_is_reported() -> None:
    k, rep = make_replica(16)
    rep.submit(Request("a", "", num_prompt_tokens=20, max_tokens=3))
    k.run(until=0.001)
    rep.kv.ref_cnt[0] += 1
    with pytest.raises(SimulationError, match="ref counts"):
        k.run()


@st.composite
def pool_workloads(draw: st.DrawFn) -> tuple[Workload, list[int]]:
    """A workload and, per request, which of three replicas it goes to."""
    w = draw(workloads())
    return w, [draw(st.integers(0, 2)) for _ in w.requests]


def simulate_pool(
    w: Workload, targets: list[int], fast_forward: bool
) -> tuple[list[SimReplica], list[LogEntry], list[Ticket], list[tuple[float, float, float]]]:
    """Three replicas on one kernel; arrivals interleaved across them; mid-run `state()` probes."""
    log: list[LogEntry] = []
    k, first = make_replica(w.num_blocks, cost=COST, log=log, fast_forward=fast_forward, **w.config)
    reps = [first] + [
        make_replica(
            w.num_blocks, cost=COST, kernel=k, log=log, fast_forward=fast_forward, **w.config
        )[1]
        for _ in range(2)
    ]
    tickets: list[Ticket] = []
    probes: list[tuple[float, float, float]] = []
    for (t, r), i in zip(w.requests, targets, strict=True):
        k.call_at(t, lambda r=r, i=i: tickets.append(reps[i].submit(r)))
    for t in (0.0123, 0.0571, 0.1337, 0.2459):  # what a KV-aware router would read mid-run
        k.call_at(t, lambda: probes.extend(
            (k.now(), s.kv_usage, s.counters["num_steps"]) for s in (r.state() for r in reps)))  # fmt: skip
    k.run()
    return reps, log, tickets, probes


@SETTINGS
@given(pool_workloads())
def test_fast_forward_matches_stepping_in_a_pool_with_interleaved_arrivals(
    wt: tuple[Workload, list[int]],
) -> None:
    w, targets = wt
    fast, fast_log, fast_t, fast_p = simulate_pool(w, targets, fast_forward=True)
    slow, slow_log, slow_t, slow_p = simulate_pool(w, targets, fast_forward=False)
    assert fingerprint(fast_t) == fingerprint(slow_t)
    assert [e[1:] for e in fast_log] == [e[1:] for e in slow_log]
    assert [e[0] for e in fast_log] == pytest.approx([e[0] for e in slow_log], rel=1e-9, abs=1e-12)
    assert fast_p == slow_p  # mid-run KV usage and step counts as stepping shows them
    for f, s in zip(fast, slow, strict=True):
        assert f.state().counters == s.state().counters
        assert list(f.kv.free_queue) == list(s.kv.free_queue)
        assert f.kv.cached == s.kv.cached
        assert sum(r.num_steps for r in f.records) == len(s.records)
        starts = [r.start_s for r in s.records]  # every run starts and ends on a step boundary
        for rec in f.records:
            i = bisect.bisect_left(starts, rec.start_s - 1e-9)
            assert starts[i] == pytest.approx(rec.start_s, abs=1e-9)
            j = i + rec.num_steps - 1
            assert s.records[j].end_s == pytest.approx(rec.end_s, abs=1e-9)


def test_a_decode_run_ignores_other_replicas_and_is_cut_by_an_arrival() -> None:
    k, a = make_replica(64, cost=COST)
    b = make_replica(64, cost=COST, kernel=k)[1]
    a.submit(Request("long", "", num_prompt_tokens=20, max_tokens=200))
    for i in range(5):  # b's steps are kernel events all through a's run
        k.call_at(0.05 * i, lambda i=i: b.submit(Request(f"b{i}", "", num_prompt_tokens=8,
                                                         max_tokens=30)))  # fmt: skip
    k.call_at(0.5, lambda: a.submit(Request("late", "", num_prompt_tokens=4, max_tokens=2)))
    k.run()
    assert [r.num_steps for r in a.records][:2] != [1, 1]
    first_run = a.records[1]
    assert first_run.num_steps > 1 and first_run.start_s < 0.5 <= first_run.end_s
    assert a.records[2].start_s == first_run.end_s  # the late arrival's step starts at the cut
    assert any(rec.num_steps == 1 for rec in a.records[2:])
