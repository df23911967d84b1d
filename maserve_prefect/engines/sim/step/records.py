"""What a simulated replica did, step by step: `StepRecord`s and a `Timeline` of engine series.

A `StepRecord` covers one engine step, or — when steps were fast-forwarded — a run of
`num_steps` identical-shape decode steps or full-budget chunks of one prefill (then `scheduled`
gives each request's tokens over the whole run and `num_scheduled_tokens` is the per-step M). Requests are joined to the ops that issued
them through the request ids (and the request's `tags`).

The `Timeline` samples vLLM's Prometheus series at each record's end, stored column-wise (one list
per series, not one object per sample). Between samples a series holds its value, so
time-weighted statistics stay exact for the step-level series even across fast-forwarded runs
(KV usage inside a decode run is sampled at its end only; a prefill run samples every step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

SERIES = (
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_preemptions_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
)


class StepKind(Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"


@dataclass(frozen=True, slots=True)
class ScheduledTokens:
    """One request's share of a step: tokens already computed before it and new this step."""

    request_id: str
    num_computed_before: int
    num_new_tokens: int


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step (or a fast-forwarded run of `num_steps` decode steps)."""

    replica: str
    step_index: int
    start_s: float
    end_s: float
    num_steps: int
    kind: StepKind
    scheduled: tuple[ScheduledTokens, ...]
    num_scheduled_tokens: int
    linear_s: float
    attention_s: float
    lm_head_s: float
    overhead_s: float
    preempted: tuple[str, ...]

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def step_kind(scheduled: tuple[ScheduledTokens, ...], num_tokens_of: dict[str, int]) -> StepKind:
    """PREFILL if no request decodes, DECODE if all decode, MIXED otherwise.

    A request decodes when its chunk is the single last token (`num_tokens_of` gives each
    request's total token count before the step).
    """
    decodes = [
        s.num_new_tokens == 1 and s.num_computed_before + 1 == num_tokens_of[s.request_id]
        for s in scheduled
    ]
    if all(decodes):
        return StepKind.DECODE
    return StepKind.PREFILL if not any(decodes) else StepKind.MIXED


@dataclass(slots=True)
class Timeline:
    """Engine series sampled at step ends, column-wise."""

    replica: str
    t_s: list[float] = field(default_factory=list)
    values: dict[str, list[float]] = field(default_factory=lambda: {n: [] for n in SERIES})

    def sample(self, t_s: float, sample: tuple[float, ...]) -> None:
        """Append one sample; `sample` is ordered as `SERIES`."""
        self.t_s.append(t_s)
        kv, running, waiting, preemptions, queries, hits = sample
        v = self.values
        v[SERIES[0]].append(kv)
        v[SERIES[1]].append(running)
        v[SERIES[2]].append(waiting)
        v[SERIES[3]].append(preemptions)
        v[SERIES[4]].append(queries)
        v[SERIES[5]].append(hits)

    def __len__(self) -> int:
        return len(self.t_s)

    def to_rows(self) -> list[dict[str, float | str]]:
        """Long-format rows `{replica, t_s, name, value}` (one per series per sample)."""
        rows: list[dict[str, float | str]] = []
        for i, t in enumerate(self.t_s):
            for name in SERIES:
                rows.append(
                    {"replica": self.replica, "t_s": t, "name": name, "value": self.values[name][i]}
                )
        return rows

    def time_weighted_mean(self, name: str, end_s: float | None = None) -> float:
        """Mean of a series over time, each sample holding until the next (or `end_s`)."""
        ts, vs = self.t_s, self.values[name]
        if not ts:
            return 0.0
        end = ts[-1] if end_s is None else end_s
        total = sum(v * (t1 - t0) for v, t0, t1 in zip(vs, ts, [*ts[1:], end], strict=True))
        span = end - ts[0]
        return total / span if span > 0 else vs[-1]
