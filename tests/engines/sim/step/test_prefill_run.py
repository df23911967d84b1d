"""Chunked-prefill fast-forward: merged full-budget chunk runs give exactly what stepping gives
(outcomes, event log with exact times, counters, KV cache state, every timeline sample, mid-run
state), including arrivals that cut a run and the one-by-one allocation path."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_factories import LinearCost, make_replica

from maserve_prefect.engines.sim.kv.manager import KVCacheManager
from maserve_prefect.engines.sim.loop import LogEntry
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.engines.sim.step.records import StepKind
from maserve_prefect.engines.sim.step.scheduler import Policy
from maserve_prefect.protocol.outcomes import Ticket
from maserve_prefect.protocol.requests import Request

COST = LinearCost(per_token_s=0.001, per_context_s=3e-6, overhead_s=0.004)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Case:
    requests: tuple[tuple[float, int, Request], ...]  # (time, replica, request)
    num_blocks: int
    config: dict[str, object]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """Long prompts against a small budget (many full-budget chunks), shared prefixes, arrivals
    spread over three replicas so they land inside prefill runs."""
    bs = draw(st.sampled_from([4, 8]))
    reqs = []
    for i in range(draw(st.integers(1, 8))):
        t = draw(st.integers(0, 400)) * 1e-3 + 1.37e-5
        prompt = draw(st.integers(1, 240))
        group = draw(st.integers(0, 2))
        num_hashes = draw(st.integers(0, prompt // 8))
        hashes = tuple(range(group * 100, group * 100 + num_hashes))
        request = Request(
            f"q{i}", "", num_prompt_tokens=prompt, max_tokens=draw(st.integers(1, 12)),
            priority=draw(st.integers(0, 3)), prefix_block_hashes=hashes,
            prefix_block_size=8 if hashes else 0,
        )  # fmt: skip
        reqs.append((t, draw(st.integers(0, 2)), request))
    config = {
        "block_size": bs,
        "max_num_seqs": draw(st.integers(1, 4)),
        "max_num_batched_tokens": draw(st.integers(2, 40)),
        "long_prefill_token_threshold": draw(st.sampled_from([0, 8, 64])),
        "policy": draw(st.sampled_from(list(Policy))),
        "enable_prefix_caching": draw(st.booleans()),
    }
    return Case(tuple(reqs), draw(st.integers(8, 90)), config)


def simulate(
    case: Case, merge: bool
) -> tuple[list[SimReplica], list[LogEntry], list[Ticket], list[tuple[float, float, float]]]:
    log: list[LogEntry] = []
    kw = dict(case.config, fast_forward_prefill=merge)
    k, first = make_replica(case.num_blocks, cost=COST, log=log, **kw)
    reps = [first] + [
        make_replica(case.num_blocks, cost=COST, kernel=k, log=log, **kw)[1] for _ in range(2)
    ]
    tickets: list[Ticket] = []
    probes: list[tuple[float, float, float]] = []
    for t, i, r in case.requests:
        k.call_at(t, lambda r=r, i=i: tickets.append(reps[i].submit(r)))
    for t in (0.0123, 0.0571, 0.1337, 0.2459, 0.3001):
        k.call_at(t, lambda: probes.extend(
            (k.now(), s.kv_usage, s.counters["num_steps"]) for s in (r.state() for r in reps)))  # fmt: skip
    k.run()
    return reps, log, tickets, probes


def outcomes(tickets: list[Ticket]) -> list[object]:
    return [(t.request_id, t.acceptance, t.outcome) for t in tickets]


def _per_instant(log: list[LogEntry]) -> list[LogEntry]:
    """The log with same-instant entries grouped by request (stable: a request's order kept)."""
    return sorted(log, key=lambda e: (e[0], e[2]))


def assert_same_as_stepping(case: Case) -> list[SimReplica]:
    fast, fast_log, fast_t, fast_p = simulate(case, merge=True)
    slow, slow_log, slow_t, slow_p = simulate(case, merge=False)
    assert outcomes(fast_t) == outcomes(slow_t)  # exact times included
    # Replicas share one kernel and log: events of *different* replicas at the same instant
    # interleave by kernel event order, which a merged run changes; each request's own events,
    # and everything at distinct instants, must match exactly.
    assert _per_instant(fast_log) == _per_instant(slow_log)
    assert fast_p == slow_p
    for f, s in zip(fast, slow, strict=True):
        assert f.state().counters == s.state().counters
        assert f.kv.free_queue == s.kv.free_queue
        assert f.kv.cached == s.kv.cached
        assert f.timeline.t_s == s.timeline.t_s and f.timeline.values == s.timeline.values
        assert sum(r.num_steps for r in f.records) == sum(r.num_steps for r in s.records)
        assert sum(r.num_scheduled_tokens * r.num_steps for r in f.records) == sum(
            r.num_scheduled_tokens * r.num_steps for r in s.records
        )
    return fast


@SETTINGS
@given(cases())
def test_merged_prefill_runs_match_stepping_exactly(case: Case) -> None:
    assert_same_as_stepping(case)


@SETTINGS
@given(cases())
def test_one_by_one_allocation_path_matches_stepping(case: Case) -> None:
    # as if some upcoming hash were cached: every run replays its allocations step by step
    with pytest.MonkeyPatch.context() as m:
        m.setattr(KVCacheManager, "any_cached", lambda self, hashes: True)
        assert_same_as_stepping(case)


def long_prompt_case(arrival_s: float | None) -> Case:
    reqs = [(0.0, 0, Request("long", "", num_prompt_tokens=100, max_tokens=3))]
    if arrival_s is not None:
        reqs.append((arrival_s, 0, Request("late", "", num_prompt_tokens=5, max_tokens=2)))
    return Case(tuple(reqs), 64, {"block_size": 4, "max_num_batched_tokens": 16})


def test_a_long_prompt_prefills_in_one_record() -> None:
    reps = assert_same_as_stepping(long_prompt_case(None))
    recs = reps[0].records
    # 100 tokens in chunks of 16: six full chunks (one run), the last 4 with the first token,
    # then two decode steps as one run
    assert [(r.kind, r.num_steps, r.num_scheduled_tokens) for r in recs] == [
        (StepKind.PREFILL, 6, 16),
        (StepKind.PREFILL, 1, 4),
        (StepKind.DECODE, 2, 1),
    ]
    assert recs[0].scheduled[0].num_new_tokens == 96
    assert len(reps[0].timeline) == 6 + 1 + 1  # one sample per prefill step


def test_an_arrival_cuts_a_prefill_run_at_a_step_boundary() -> None:
    whole = simulate(long_prompt_case(None), merge=True)[0][0].records[0]
    t = whole.start_s + 0.4 * whole.duration_s
    reps = assert_same_as_stepping(long_prompt_case(t))
    recs = reps[0].records
    assert 1 <= recs[0].num_steps < 6 and recs[0].start_s < t <= recs[0].end_s
    assert recs[1].start_s == recs[0].end_s
    assert recs[1].num_steps > 1  # the long prompt's next chunks run merged again
