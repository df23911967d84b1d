"""Exact event logs on tiny cases, computed by hand with `LinearCost` defaults:
a step costs 1 ms per scheduled token + 10 ms overhead."""

from __future__ import annotations

import pytest
from sim_factories import assert_log, make_replica, req, submit_at

from maserve_prefect.engines.sim.loop import LogEntry
from maserve_prefect.engines.sim.step.records import StepKind
from maserve_prefect.engines.sim.step.scheduler import Policy
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import Lifecycle


def test_two_requests() -> None:
    log: list[LogEntry] = []
    k, rep = make_replica(64, log=log)
    ta = rep.submit(req("a", 32, 3))
    tb = rep.submit(req("b", 16, 2))
    k.run()
    # step 0: prefill 32+16 = 48 tok -> 0.058; step 1: 2 decodes -> 0.070 (b done);
    # step 2: a alone -> 0.081
    assert_log(log, [
        (0.0, "arrive", "a", 0), (0.0, "arrive", "b", 0),
        (0.0, "schedule", "a", 0), (0.0, "schedule", "b", 0),
        (0.058, "first_token", "a", 1), (0.058, "first_token", "b", 1),
        (0.070, "finish", "b", 2), (0.081, "finish", "a", 3),
    ])  # fmt: skip
    assert ta.outcome is not None and tb.outcome is not None
    assert (ta.outcome.first_token_s, ta.outcome.finish_s) == pytest.approx((0.058, 0.081))
    assert [r.kind for r in rep.records] == [StepKind.PREFILL, StepKind.DECODE, StepKind.DECODE]
    assert [r.num_scheduled_tokens for r in rep.records] == [48, 2, 1]
    assert rep.records[0].linear_s == pytest.approx(0.048)


def test_preemption_under_a_tiny_kv_budget() -> None:
    log: list[LogEntry] = []
    k, rep = make_replica(4, log=log, block_size=4)
    rep.submit(req("a", 6, 5))
    tb = rep.submit(req("b", 6, 5))
    k.run()
    # 4 blocks of 4 tokens. step 0: both prefill 6 tok (2 blocks each) -> 0.022.
    # decodes at 0.022 and 0.034 fit (8 tokens = 2 blocks each) -> 0.046.
    # at 0.046 a needs a 3rd block: victim = last running (b), freed tail first; a decodes
    # -> 0.057, -> 0.068 (a done). b's tail block was reused by a; its first block still hits
    # (4 tokens), so b recomputes 9 - 4 = 5 tokens -> 0.083, then decodes -> 0.094.
    assert_log(log, [
        (0.0, "arrive", "a", 0), (0.0, "arrive", "b", 0),
        (0.0, "schedule", "a", 0), (0.0, "schedule", "b", 0),
        (0.022, "first_token", "a", 1), (0.022, "first_token", "b", 1),
        (0.046, "preempt", "b", 1),
        (0.068, "finish", "a", 5), (0.068, "schedule", "b", 4),
        (0.094, "finish", "b", 5),
    ])  # fmt: skip
    out = tb.outcome
    assert out is not None and (out.num_preemptions, out.num_cached_tokens) == (1, 0)
    assert [r.preempted for r in rep.records if r.preempted] == [("b",)]
    counters = rep.state().counters
    # admitted lookups: a 6, b 6, b 9 after preemption (4 hit)
    assert counters["vllm:prefix_cache_queries_total"] == 21
    assert counters["vllm:prefix_cache_hits_total"] == 4
    assert counters["vllm:num_preemptions_total"] == 1


def test_prefix_hit() -> None:
    log: list[LogEntry] = []
    k, rep = make_replica(16, log=log, block_size=4)
    rep.submit(Request("a", "", prompt_token_ids=tuple(range(10)), max_tokens=2))
    b = Request("b", "", prompt_token_ids=(*range(8), 100, 101, 102), max_tokens=2)
    submit_at(k, rep, 1.0, b)
    k.run()
    # a: 10 tok -> 0.020, decode -> 0.031. b shares a's two full blocks (8 tok):
    # 3 new tokens -> 1.013, decode -> 1.024.
    assert_log(log, [
        (0.0, "arrive", "a", 0), (0.0, "schedule", "a", 0),
        (0.020, "first_token", "a", 1), (0.031, "finish", "a", 2),
        (1.0, "arrive", "b", 0), (1.0, "schedule", "b", 8),
        (1.013, "first_token", "b", 1), (1.024, "finish", "b", 2),
    ])  # fmt: skip


def test_priority_order() -> None:
    def run(policy: Policy) -> list[LogEntry]:
        log: list[LogEntry] = []
        k, rep = make_replica(64, log=log, policy=policy, max_num_seqs=1)
        rep.submit(req("a", 10, 2, priority=5))
        for i, (rid, prio) in enumerate([("b", 3), ("c", 1), ("d", 1)]):
            submit_at(k, rep, 0.001 * (i + 1), req(rid, 10, 2, priority=prio))
        k.run()
        return [e for e in log if e[1] == "schedule"]

    # one seat; each request takes 0.020 (prefill) + 0.011 (decode) = 0.031
    assert_log(run(Policy.PRIORITY), [
        (0.0, "schedule", "a", 0), (0.031, "schedule", "c", 0),
        (0.062, "schedule", "d", 0), (0.093, "schedule", "b", 0),
    ])  # fmt: skip
    assert [e[2] for e in run(Policy.FCFS)] == ["a", "b", "c", "d"]


@pytest.mark.parametrize(("policy", "victim"), [(Policy.PRIORITY, "lo"), (Policy.FCFS, "hi")])
def test_preemption_victim_by_policy(policy: Policy, victim: str) -> None:
    log: list[LogEntry] = []
    k, rep = make_replica(4, log=log, block_size=4, policy=policy)
    rep.submit(req("lo", 6, 5, priority=9))
    submit_at(k, rep, 0.001, req("hi", 6, 5, priority=0))  # admitted second: last in running
    k.run()
    # lo is first to need a third block; FCFS evicts the last admitted (hi), priority evicts the
    # worst priority (lo, which then preempts itself)
    assert [e[2] for e in log if e[1] == "preempt"] == [victim]
    assert {e[2] for e in log if e[1] == "finish"} == {"lo", "hi"}


def test_head_of_line_blocking() -> None:
    log: list[LogEntry] = []
    k, rep = make_replica(6, log=log, block_size=4)
    rep.submit(req("a", 12, 4))
    rep.submit(req("b", 16, 1))  # needs 4 blocks; only 3 free while a runs
    tc = rep.submit(req("c", 4, 1))  # would fit, but waits behind b
    k.run()
    # a: 12 tok -> 0.022, three decodes -> 0.055. Then b (16) and c (4) together: 20 tok -> 0.085
    assert_log(log, [
        (0.0, "arrive", "a", 0), (0.0, "arrive", "b", 0), (0.0, "arrive", "c", 0),
        (0.0, "schedule", "a", 0), (0.022, "first_token", "a", 1), (0.055, "finish", "a", 4),
        (0.055, "schedule", "b", 0), (0.055, "schedule", "c", 0),
        (0.085, "first_token", "b", 1), (0.085, "first_token", "c", 1),
        (0.085, "finish", "b", 1), (0.085, "finish", "c", 1),
    ])  # fmt: skip
    assert tc.outcome is not None and tc.outcome.first_scheduled_s == pytest.approx(0.055)
    # a's three decodes run fast-forwarded while b stays blocked on KV
    assert [r.num_steps for r in rep.records] == [1, 3, 1]


def test_chunked_prefill_under_the_token_budget_and_long_prefill_threshold() -> None:
    k, rep = make_replica(64, max_num_batched_tokens=16, long_prefill_token_threshold=6)
    rep.submit(req("a", 20, 1))
    rep.submit(req("b", 4, 1))
    k.run()
    chunks = [
        [(s.request_id, s.num_computed_before, s.num_new_tokens) for s in r.scheduled]
        for r in rep.records
    ]
    # a is capped at 6 tokens a step; b takes 4 of the remaining budget in step 0
    assert chunks == [
        [("a", 0, 6), ("b", 0, 4)],
        [("a", 6, 6)],
        [("a", 12, 6)],
        [("a", 18, 2)],
    ]
    assert all(r.num_scheduled_tokens <= 16 for r in rep.records)


def test_max_num_seqs_limits_the_running_set() -> None:
    k, rep = make_replica(64, max_num_seqs=2)
    for rid in "abc":
        rep.submit(req(rid, 4, 3))
    k.run()
    assert max(len(r.scheduled) for r in rep.records) == 2
    assert rep.timeline.values["vllm:num_requests_waiting"][0] == 1


def test_pause_holds_steps_and_resume_continues() -> None:
    k, rep = make_replica(64)
    t = rep.submit(req("a", 4, 2))
    rep.pause()
    k.run()
    assert (
        t.outcome is None
        and rep.state().lifecycle is Lifecycle.PAUSED
        and rep.state().num_waiting == 1
    )
    idle: list[float] = []
    rep.on_idle(lambda: idle.append(k.now()))
    rep.resume()
    k.run()
    assert t.outcome is not None and idle == [t.outcome.finish_s]
