"""Session replay on a simulated pool: closed-loop timing, ordering hook, determinism, reuse."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from sim_factories import loaded_sim_pool

from maserve_prefect.engines.sim.pool.sim_pool import SimPool
from maserve_prefect.errors import ConfigError, SimulationError
from maserve_prefect.protocol.controls import Force, Priority
from maserve_prefect.protocol.views import WaitingRequest
from maserve_prefect.replay.session_results import TurnResult
from maserve_prefect.replay.sessions import QueuedTurn, replay_sessions
from maserve_prefect.workloads.scbench import generate_scbench
from maserve_prefect.workloads.sessions import Session, SessionSet, Turn

DEP = "q"


def make_pool(num_devices: int = 1) -> SimPool:
    return loaded_sim_pool(num_devices, "Qwen3-0.6B", DEP)


def make_scbench(n: int = 6, seed: int = 5) -> SessionSet:
    return generate_scbench(
        n, seed, context_tokens=(1024, 2048), num_contexts=2, mean_turns=3, min_turns=2,
        max_turns=4, think_mean_s=2.0, arrival_rate_per_s=2.0,
    )  # fmt: skip


def simultaneous(n: int) -> SessionSet:
    """n single-turn sessions arriving together (a contended admission queue)."""
    return SessionSet(
        tuple(Session(f"s{i}", (Turn(0, 300, 20, arrival_s=0.0),)) for i in range(n)), "open"
    )


def reverse_fcfs(waiting: Sequence[QueuedTurn], now_s: float) -> list[str]:
    return [
        q.request_id
        for q in sorted(waiting, key=lambda q: (q.arrival_s, q.request_id), reverse=True)
    ]


def test_closed_loop_respects_think_times() -> None:
    sset = make_scbench()
    res = replay_sessions(sset, make_pool(), deployment=DEP)
    assert res.status_counts() == {"completed": sset.num_turns}
    by_id = {(t.session_id, t.turn_index): t for t in res.turns}
    checked = 0
    for s in sset:
        for prev, cur in zip(s.turns, s.turns[1:], strict=False):
            done = by_id[(s.session_id, prev.turn_index)]
            nxt = by_id[(s.session_id, cur.turn_index)]
            assert cur.think_s is not None
            assert nxt.arrival_s == pytest.approx(done.finish_s + cur.think_s, abs=1e-9)
            assert nxt.arrival_s >= done.finish_s
            checked += 1
    assert checked == sset.num_turns - len(sset)
    firsts = sorted(by_id[(s.session_id, 0)].arrival_s for s in sset)
    assert firsts[0] == res.start_s and firsts[-1] > firsts[0]


def test_open_loop_uses_recorded_arrivals() -> None:
    turns = (Turn(0, 300, 4, arrival_s=10.0), Turn(1, 400, 4, arrival_s=10.5))
    sset = SessionSet((Session("a", turns), Session("b", (Turn(0, 200, 4, arrival_s=12.0),))))
    pool = make_pool()
    start = pool.clock.now()
    res = replay_sessions(sset, pool, deployment=DEP)
    arrivals = {t.request_id: t.arrival_s - start for t in res.turns}
    assert arrivals == pytest.approx({"a/t0": 0.0, "a/t1": 0.5, "b/t0": 2.0})


def test_reversed_order_changes_first_tokens_under_contention() -> None:
    sset = simultaneous(4)
    fcfs = replay_sessions(sset, make_pool(), deployment=DEP, max_in_flight=1)
    rev = replay_sessions(sset, make_pool(), deployment=DEP, max_in_flight=1, order=reverse_fcfs)
    assert fcfs.first_token_order() == ["s0/t0", "s1/t0", "s2/t0", "s3/t0"]
    assert rev.first_token_order() == ["s3/t0", "s2/t0", "s1/t0", "s0/t0"]
    assert rev.submit_order == rev.first_token_order()
    waits = {t.request_id: t.queue_s for t in rev.turns}
    assert waits["s3/t0"] == 0.0 and waits["s0/t0"] > waits["s1/t0"] > 0


def test_without_contention_order_does_not_matter() -> None:
    sset = simultaneous(4)
    a = replay_sessions(sset, make_pool(), deployment=DEP)
    b = replay_sessions(sset, make_pool(), deployment=DEP, order=reverse_fcfs)
    assert all(t.queue_s == 0.0 for t in a.turns)
    assert [t.first_token_s for t in a.turns] == [t.first_token_s for t in b.turns]


def test_identical_results_twice() -> None:
    sset = make_scbench(n=8)
    a = replay_sessions(sset, make_pool(2), deployment=DEP, max_in_flight=3)
    b = replay_sessions(sset, make_pool(2), deployment=DEP, max_in_flight=3)
    assert a.turns == b.turns and a.sessions == b.sessions and a.submit_order == b.submit_order
    assert a.makespan_s == b.makespan_s and a.content_hash == sset.content_hash()
    assert {t.replica for t in a.turns} == {"q@H100:0", "q@H100:1"}


def test_sticky_sessions_stay_on_one_replica() -> None:
    res = replay_sessions(make_scbench(n=8), make_pool(2), deployment=DEP)
    homes: dict[str, set[str]] = {}
    for t in res.turns:
        homes.setdefault(t.session_id, set()).add(t.replica)
    assert all(len(v) == 1 for v in homes.values())


def test_multi_turn_sessions_reuse_their_prefix() -> None:
    sset = make_scbench()
    res = replay_sessions(sset, make_pool(), deployment=DEP)
    assert res.reuse > 0.5
    prompts = {(s.session_id, t.turn_index): t for s in sset for t in s.turns}
    for t in res.turns:
        if t.turn_index == 0:
            continue
        prev = prompts[(t.session_id, t.turn_index - 1)]
        assert t.num_cached_tokens >= (prev.num_prompt_tokens // 16) * 16  # its history
    agg = res.session_time()
    assert agg.count == len(sset) and res.throughput_rps > 0 and res.output_tokens_per_s > 0
    assert res.ttft_percentile(50) <= res.ttft_percentile(95)
    for srow in res.sessions:  # the HEAR paper's session: total response waiting
        mine = [t for t in res.completed() if t.session_id == srow.session_id]
        assert srow.waiting_s == sum(t.finish_s - t.arrival_s for t in mine) > 0
    assert 0.5 < res.followup_reuse <= 1.0 and res.followup_reuse > res.reuse


def test_on_complete_sees_every_turn_in_session_order() -> None:
    seen: list[tuple[str, int, str]] = []

    def hook(s: Session, t: Turn, r: TurnResult) -> None:
        assert r.session_id == s.session_id and r.turn_index == t.turn_index
        seen.append((s.session_id, t.turn_index, r.status))

    sset = make_scbench()
    replay_sessions(sset, make_pool(), deployment=DEP, on_complete=hook)
    assert len(seen) == sset.num_turns
    for s in sset:
        assert [i for sid, i, _ in seen if sid == s.session_id] == list(range(len(s.turns)))


def test_rejected_closed_loop_turn_ends_its_session() -> None:
    big = Turn(1, 10_000_000, 4, think_s=0.0)  # cannot fit any KV cache: rejected
    sset = SessionSet(
        (Session("a", (Turn(0, 100, 4, arrival_s=0.0), big, Turn(2, 10_000_100, 4, think_s=0.0))),),
        "closed",
    )
    res = replay_sessions(sset, make_pool(), deployment=DEP)
    assert [t.status for t in res.turns] == ["completed", "rejected"]
    assert res.num_skipped == 1 and res.sessions[0].num_skipped == 1


def test_waiting_requests_convert_to_hear_views() -> None:
    q = QueuedTurn("a/t0", "a", 0, 1.0, 40, 4, (1, 2, 3), 16)
    assert q.to_waiting() == WaitingRequest("a/t0", 1.0, 40, (1, 2, 3))


def test_bad_hooks_are_reported() -> None:
    sset = simultaneous(2)
    with pytest.raises(SimulationError, match="stuck"):
        replay_sessions(sset, make_pool(), deployment=DEP, order=lambda w, now: [])
    with pytest.raises(ConfigError, match="not waiting"):
        replay_sessions(sset, make_pool(), deployment=DEP, order=lambda w, now: ["nope"])
    with pytest.raises(ConfigError, match="no READY replica"):
        replay_sessions(sset, make_pool(), deployment="other")


def test_without_a_cap_every_turn_goes_to_the_engine_as_it_arrives() -> None:
    pool = make_pool()
    (rep,) = pool.replicas()
    n = rep.config.max_num_seqs + 8  # more than the engine runs at once
    seen: list[tuple[str, str]] = []
    res = replay_sessions(
        simultaneous(n), pool, deployment=DEP,
        controls=lambda q: (Priority(-1) if q.session_id == f"s{n - 1}" else Priority(0),),
        on_submit=lambda q, replica: seen.append((q.request_id, replica)),
    )  # fmt: skip
    assert res.status_counts() == {"completed": n}
    assert all(t.submit_s == t.arrival_s for t in res.turns)  # no harness queue
    assert len(seen) == n and {r for _, r in seen} == {rep.name}
    assert max(t.queue_s for t in res.turns) == 0.0


def test_controls_reach_the_engine_with_the_submission() -> None:
    # an FCFS engine cannot honour a required priority: that turn alone is refused, by the
    # engine (UNSUPPORTED), with its reason; the others run
    required = (Priority(-1, force=Force.REQUIREMENT),)
    res = replay_sessions(
        simultaneous(3), make_pool(), deployment=DEP,
        controls=lambda q: required if q.session_id == "s2" else (),
    )  # fmt: skip
    by_id = {t.request_id: t for t in res.turns}
    assert by_id["s2/t0"].status == "rejected" and "unsupported" in by_id["s2/t0"].reason
    assert by_id["s0/t0"].status == by_id["s1/t0"].status == "completed"
