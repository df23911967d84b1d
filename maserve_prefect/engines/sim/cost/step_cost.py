"""The step-cost seam between the simulator's scheduler and its step-time model.

The scheduler hands the model what one engine step computes — for each scheduled request, how
many new tokens it computes and how many tokens already sit in its KV cache — and gets back the
step's duration split into linear layers / attention / lm_head / fixed overhead.

One idea makes the simulator fast: on a step where every scheduled request decodes exactly one
token, the step time is affine in the total context read, `base_s + per_context_token_s * ctx`
(linear layers, lm_head and overhead depend only on the number of sequences; decode attention
reads KV bytes proportional to context). `decode_affine(n)` returns those coefficients, and a
model must agree exactly with `step_cost` on such steps, so that runs of pure decode steps can be
fast-forwarded in closed form with the same result as stepping one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol


class ScheduledChunk(NamedTuple):
    """One request's share of a step: `num_new_tokens` computed over `num_context_tokens` prior.

    A named tuple, not a dataclass: the simulator builds one per scheduled request per step, and
    a tuple is the cheapest immutable record to build."""

    num_new_tokens: int
    num_context_tokens: int


@dataclass(frozen=True, slots=True)
class StepCost:
    """Duration of one step split by operator group (seconds)."""

    linear_s: float
    attention_s: float
    lm_head_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return self.linear_s + self.attention_s + self.lm_head_s + self.overhead_s


@dataclass(frozen=True, slots=True)
class DecodeAffine:
    """Exact cost of an all-decode step of `num_seqs` sequences reading `ctx` context tokens:
    linear_s + lm_head_s + overhead_s + attention_per_context_token_s * ctx."""

    num_seqs: int
    linear_s: float
    lm_head_s: float
    overhead_s: float
    attention_per_context_token_s: float

    @property
    def base_s(self) -> float:
        return self.linear_s + self.lm_head_s + self.overhead_s

    def step_s(self, total_context_tokens: int) -> float:
        return self.base_s + self.attention_per_context_token_s * total_context_tokens


class StepCostModel(Protocol):
    """What the simulator needs from a step-time model."""

    def step_cost(self, chunks: Sequence[ScheduledChunk]) -> StepCost:
        """Cost of one step that computes `chunks` (one per scheduled request)."""
        ...

    def decode_affine(self, num_seqs: int) -> DecodeAffine:
        """Affine coefficients of an all-decode step of `num_seqs` sequences."""
        ...
