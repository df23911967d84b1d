"""Session-replay results: per-turn times, per-session spans and the aggregates over a run."""

from __future__ import annotations

import math

from maserve_prefect.replay.session_results import (
    SessionReplayResult,
    SessionResult,
    TurnResult,
)


def make_turn(
    session_id: str,
    turn_index: int,
    status: str = "completed",
    *,
    arrival_s: float = 0.0,
    submit_s: float = 0.0,
    first_token_s: float | None = 1.0,
    finish_s: float = 2.0,
    num_prompt_tokens: int = 100,
    num_output_tokens: int = 10,
    num_cached_tokens: int = 0,
) -> TurnResult:
    return TurnResult(
        session_id, turn_index, f"{session_id}/t{turn_index}", "r0", status, "", arrival_s,
        submit_s, first_token_s, finish_s, num_prompt_tokens, num_output_tokens,
        num_cached_tokens, 0,
    )  # fmt: skip


def make_result() -> SessionReplayResult:
    """Session a: two completed turns; session b: one rejected turn, one turn skipped."""
    turns = [
        make_turn("a", 0, arrival_s=0.0, submit_s=1.0, first_token_s=3.0, finish_s=4.0,
                  num_cached_tokens=0),
        make_turn("a", 1, arrival_s=5.0, submit_s=5.0, first_token_s=6.0, finish_s=10.0,
                  num_cached_tokens=80),
        make_turn("b", 0, "rejected", arrival_s=2.0, submit_s=2.0, first_token_s=None,
                  finish_s=2.0, num_output_tokens=0),
    ]  # fmt: skip
    sessions = [SessionResult("a", 0.0, 10.0, 2, 2, 0), SessionResult("b", 2.0, 2.0, 2, 0, 1)]
    return SessionReplayResult("hash", "closed", 0.0, 10.0, turns, sessions, ["a/t0", "b/t0"])


def test_turn_times_split_queue_and_engine() -> None:
    t = make_turn("a", 0, arrival_s=1.0, submit_s=4.0, first_token_s=6.0, finish_s=9.0)
    assert (t.queue_s, t.ttft_s, t.engine_ttft_s, t.e2e_s) == (3.0, 5.0, 2.0, 8.0)
    rejected = make_turn("a", 1, "rejected", first_token_s=None)
    assert rejected.ttft_s is None and rejected.engine_ttft_s is None


def test_aggregates_count_completed_turns_only() -> None:
    res = make_result()
    assert res.status_counts() == {"completed": 2, "rejected": 1}
    assert [t.request_id for t in res.completed()] == ["a/t0", "a/t1"]
    assert res.num_skipped == 1
    assert res.makespan_s == 10.0
    assert res.throughput_rps == 2 / 10.0
    assert res.output_tokens_per_s == 20 / 10.0
    assert res.reuse == 80 / 200  # the rejected turn's prompt is not counted
    assert res.ttft_percentile(50) == 2.0  # (3.0, 1.0): the rejected turn has no TTFT
    assert (res.queue().count, res.queue().max) == (2, 1.0)
    assert (res.session_time().count, res.session_time().max) == (2, 10.0)
    assert res.first_token_order() == ["a/t0", "a/t1"]


def test_first_token_ties_go_by_request_id_and_empty_runs_are_zero() -> None:
    turns = [make_turn("b", 0, first_token_s=1.0), make_turn("a", 0, first_token_s=1.0)]
    res = SessionReplayResult("h", "open", 0.0, 0.0, turns, [])
    assert res.first_token_order() == ["a/t0", "b/t0"]
    assert res.throughput_rps == 0.0 and res.output_tokens_per_s == 0.0
    empty = SessionReplayResult("h", "open", 0.0, 0.0, [], [])
    assert empty.reuse == 0.0 and math.isnan(empty.ttft_percentile(95))


def test_the_hear_papers_session_throughput_and_reuse() -> None:
    """Session = total response waiting per conversation (arrival to finish over its completed
    turns); throughput in turns per minute; reuse over follow-up prompt tokens only."""
    res = make_result()
    turns = {t.request_id: t for t in res.turns}
    waiting_a = turns["a/t0"].e2e_s + turns["a/t1"].e2e_s  # (4 - 0) + (10 - 5)
    res = SessionReplayResult(
        res.content_hash, res.mode, res.start_s, res.end_s, res.turns,
        [SessionResult("a", 0.0, 10.0, 2, 2, 0, waiting_a), SessionResult("b", 2.0, 2.0, 2, 0, 1)],
    )  # fmt: skip
    assert waiting_a == 9.0
    assert (res.session_waiting().max, res.session_waiting().mean) == (9.0, 4.5)
    assert res.throughput_tpm == 60 * 2 / 10.0
    assert res.followup_reuse == 80 / 100  # a/t1 only: the first turn is left out
    assert res.reuse == 80 / 200
