"""What a session replay measured: per turn, per session, and the aggregates over a run.

One idea: every figure is derived from the per-turn records, and TTFT is measured from the
*harness arrival* (admission-queue wait included, which is what an ordering policy changes) —
`engine_ttft_s` leaves the queue out. Per turn: the harness arrival, engine submit, first token
and finish times, cached prompt tokens. Per session: first arrival to last finish, and the
total response-waiting time (the HEAR paper's "session": over its completed turns, arrival to
finish). Aggregates: makespan (first arrival to last finish), throughput (turns per second and
per minute), reuse over all prompt tokens and the paper's reuse over *follow-up* prompt tokens
(turns after a session's first). `replay.sessions.replay_sessions` produces them.

Examples:
    >>> t = TurnResult("s", 0, "s/t0", "r0", "completed", "", 1.0, 1.5, 2.0, 3.0, 100, 10, 64, 0)
    >>> t.queue_s, t.ttft_s, t.engine_ttft_s, t.e2e_s
    (0.5, 1.0, 0.5, 2.0)
    >>> res = SessionReplayResult("h", "open", 1.0, 3.0, [t], [])
    >>> res.makespan_s, res.reuse, res.throughput_rps, res.throughput_tpm
    (2.0, 0.64, 0.5, 30.0)
    >>> res.followup_reuse  # one first turn, no follow-up
    0.0
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from maserve_prefect.engines.sim.stats import Summary, summarize

__all__ = ["SessionReplayResult", "SessionResult", "TurnResult"]


@dataclass(frozen=True, slots=True)
class TurnResult:
    """What happened to one turn; times on the replay clock, None where it never happened."""

    session_id: str
    turn_index: int
    request_id: str
    replica: str
    status: str  # completed | rejected | failed
    reason: str
    arrival_s: float
    submit_s: float
    first_token_s: float | None
    finish_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    first_scheduled_s: float | None = None
    """When the engine first scheduled it (None: never, or an engine that does not say)."""

    @property
    def queue_s(self) -> float:
        """Time in the harness admission queue."""
        return self.submit_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        """First token minus harness arrival (queue wait included)."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def engine_ttft_s(self) -> float | None:
        """First token minus engine submission."""
        return None if self.first_token_s is None else self.first_token_s - self.submit_s

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class SessionResult:
    """One session: first arrival to last finish, turns done and skipped."""

    session_id: str
    start_s: float
    end_s: float
    num_turns: int
    num_completed: int
    num_skipped: int
    waiting_s: float = 0.0
    """Total response-waiting time: the sum of its completed turns' arrival-to-finish times."""

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(slots=True)
class SessionReplayResult:
    """Per-turn and per-session results and the aggregates.

    Attributes:
        content_hash: the replayed set's identity (`SessionSet.content_hash`).
        submit_order: request ids in the order they were submitted to the engine.
    """

    content_hash: str
    mode: str
    start_s: float
    end_s: float
    turns: list[TurnResult]
    sessions: list[SessionResult]
    submit_order: list[str] = field(default_factory=list)

    @property
    def makespan_s(self) -> float:
        """Batch completion time: first arrival to last finish."""
        return self.end_s - self.start_s

    def completed(self) -> list[TurnResult]:
        return [t for t in self.turns if t.status == "completed"]

    def status_counts(self) -> dict[str, int]:
        return dict(Counter(t.status for t in self.turns))

    @property
    def num_skipped(self) -> int:
        return sum(s.num_skipped for s in self.sessions)

    @property
    def throughput_rps(self) -> float:
        """Completed turns per second of makespan."""
        return len(self.completed()) / self.makespan_s if self.makespan_s > 0 else 0.0

    @property
    def throughput_tpm(self) -> float:
        """Completed turns per minute of makespan (the HEAR paper's throughput)."""
        return 60.0 * self.throughput_rps

    @property
    def followup_reuse(self) -> float:
        """Cached / prompt tokens over completed *follow-up* turns (every turn after a session's
        first): the HEAR paper's reuse, which leaves out the cold first turn."""
        done = [t for t in self.completed() if t.turn_index > 0]
        prompt = sum(t.num_prompt_tokens for t in done)
        return sum(t.num_cached_tokens for t in done) / prompt if prompt else 0.0

    def session_waiting(self) -> Summary:
        """Per session, the total response-waiting time (the HEAR paper's "session")."""
        return summarize([s.waiting_s for s in self.sessions])

    @property
    def output_tokens_per_s(self) -> float:
        done = self.completed()
        total = sum(t.num_output_tokens for t in done)
        return total / self.makespan_s if self.makespan_s > 0 else 0.0

    @property
    def reuse(self) -> float:
        """Cached prompt tokens / prompt tokens over completed turns."""
        done = self.completed()
        prompt = sum(t.num_prompt_tokens for t in done)
        return sum(t.num_cached_tokens for t in done) / prompt if prompt else 0.0

    def ttft(self) -> Summary:
        return summarize([t.ttft_s for t in self.turns if t.ttft_s is not None])

    def ttft_percentile(self, q: float) -> float:
        """The q-th percentile (0-100) of TTFT over turns that produced a first token."""
        values = [t.ttft_s for t in self.turns if t.ttft_s is not None]
        return float(np.percentile(values, q)) if values else float("nan")

    def queue(self) -> Summary:
        return summarize([t.queue_s for t in self.completed()])

    def session_time(self) -> Summary:
        return summarize([s.duration_s for s in self.sessions])

    def first_token_order(self) -> list[str]:
        """Request ids by first-token time (ties by request id)."""
        done = [t for t in self.turns if t.first_token_s is not None]
        done.sort(key=lambda t: (t.first_token_s, t.request_id))
        return [t.request_id for t in done]
