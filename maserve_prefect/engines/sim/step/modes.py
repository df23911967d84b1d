"""Execution modes the simulator models: `dense`, `kv_budget` and `sparse_attention`.

One idea: a mode changes only two quantities the simulator already prices — how many KV blocks
a request holds, and how many context tokens each of its decode steps reads (decode attention
time is proportional to that, `engines/sim/cost/step_cost.py`). Prefill is unchanged in every mode. These
are *modeled* behaviours for what-if studies, not measurements of any implementation; calibrate
them (e.g. `hear.mode_calibration`) before trusting absolute numbers.

- `dense` (and `default`, or any mode name not below): full KV kept, full KV read.
- `kv_budget` — KV eviction in the style of H2O (Zhang et al., NeurIPS 2023: keep "heavy
  hitter" tokens plus the most recent ones under a fixed KV budget) and SnapKV (Li et al., 2024:
  after prefill, compress each head's prompt KV to a fixed budget selected by an observation
  window at the prompt's end). Meant for sub-agent roles whose outputs tolerate lossy context.
  Model: once its prompt is computed, a request keeps `min(prompt, budget)` prompt tokens plus a
  window of its most recent `recent_window` output tokens, so it holds
  `ceil((min(prompt, budget) + min(max_tokens, recent_window)) / block_size)` blocks for the rest
  of its life (its other blocks are freed at once; hashed ones stay in the prefix cache, as freed
  blocks do) and a decode step reads `min(prompt, budget) + min(outputs so far, recent_window)`
  context tokens. A preempted request recomputes its full prompt and is compressed again.
- `sparse_attention` — dynamic sparse attention in the style of OmniKV (ICLR 2025: the full KV
  is kept, and most layers attend only to the context tokens a few "filter" layers select).
  Meant for main roles that need their whole context. Model: all blocks kept; a decode step reads
  `ceil(attention_fraction * context)` tokens.

Defaults live in one place, `DEFAULT_MODE_PARAMS`: a 1,024-token prompt budget with a 32-token
recent window (a budget and a window size in the range SnapKV evaluates; H2O's experiments keep
a similar small fraction of a long prompt), and an attention fraction of 0.25 for sparse
attention (an assumed round figure: OmniKV's share of selected tokens depends on the task and
its settings). Non-dense modes cost simulator speed, not accuracy: while a request in such a mode
is in flight, the replica steps decode one step at a time (no decode fast-forward, whose closed
form assumes every context token is read).

Examples:
    >>> p = DEFAULT_MODE_PARAMS
    >>> kv_keep_tokens(4000, 200, p), kv_keep_tokens(300, 10, p)
    (1056, 310)
    >>> decode_context(ModeKind.KV_BUDGET, 4100, 4000, p), decode_context(ModeKind.SPARSE, 4100, 4000, p)
    (1056, 1025)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from maserve_prefect.engines.sim.cost.step_cost import ScheduledChunk
from maserve_prefect.engines.sim.request import SimRequest
from maserve_prefect.errors import ConfigError

DENSE = "dense"
KV_BUDGET = "kv_budget"
SPARSE_ATTENTION = "sparse_attention"
MODELED_MODES = (DENSE, KV_BUDGET, SPARSE_ATTENTION)
DEFAULT_MODES = ("default", *MODELED_MODES)  # a replica's modes; "default" runs dense


class ModeKind(IntEnum):
    DENSE = 0
    KV_BUDGET = 1
    SPARSE = 2


def mode_kind(mode: str) -> ModeKind:
    """What a mode name runs as (any name but the two modeled ones is dense)."""
    if mode == KV_BUDGET:
        return ModeKind.KV_BUDGET
    if mode == SPARSE_ATTENTION:
        return ModeKind.SPARSE
    return ModeKind.DENSE


@dataclass(frozen=True, slots=True)
class ModeParams:
    """Parameters of the modeled modes (module docstring says where they come from).

    Attributes:
        kv_budget_tokens: prompt tokens a `kv_budget` request keeps after prefill.
        recent_window_tokens: most recent output tokens it keeps besides.
        attention_fraction: share of the context a `sparse_attention` decode step reads.
    """

    kv_budget_tokens: int = 1024
    recent_window_tokens: int = 32
    attention_fraction: float = 0.25

    def __post_init__(self) -> None:
        if self.kv_budget_tokens < 1 or self.recent_window_tokens < 0:
            raise ConfigError(
                "ModeParams: need kv_budget_tokens >= 1 and recent_window_tokens >= 0, got "
                f"{self.kv_budget_tokens}, {self.recent_window_tokens}"
            )
        if not 0.0 < self.attention_fraction <= 1.0:
            raise ConfigError(
                f"ModeParams: attention_fraction must be in (0, 1], got {self.attention_fraction}"
            )


DEFAULT_MODE_PARAMS = ModeParams()


def kv_keep_tokens(num_prompt_tokens: int, max_tokens: int, params: ModeParams) -> int:
    """KV tokens a `kv_budget` request holds after prefill (prompt budget + output window)."""
    window = min(max_tokens, params.recent_window_tokens)
    return min(num_prompt_tokens, params.kv_budget_tokens) + window


def decode_context(
    kind: ModeKind, num_context_tokens: int, num_prompt_tokens: int, params: ModeParams
) -> int:
    """Context tokens one decode step of a request in mode `kind` reads."""
    if kind is ModeKind.KV_BUDGET:
        outputs = max(num_context_tokens - num_prompt_tokens, 0)
        return min(num_prompt_tokens, params.kv_budget_tokens) + min(
            outputs, params.recent_window_tokens
        )
    if kind is ModeKind.SPARSE:
        return math.ceil(params.attention_fraction * num_context_tokens)
    return num_context_tokens


class ModeBook:
    """The non-dense requests in flight on one replica and what their modes change.

    Args:
        params: the modes' parameters.
    """

    __slots__ = ("_kinds", "params")

    def __init__(self, params: ModeParams = DEFAULT_MODE_PARAMS) -> None:
        self.params = params
        self._kinds: dict[int, ModeKind] = {}  # request seq -> kind (non-dense only)

    @property
    def in_flight(self) -> dict[int, ModeKind]:
        """The non-dense requests in flight, by seq (empty: every request runs dense). The
        live dict, so a hot loop can test it without a call; do not change it."""
        return self._kinds

    def admit(self, req: SimRequest) -> None:
        """A request was accepted in `req.realized_mode`."""
        kind = mode_kind(req.realized_mode)
        if kind is not ModeKind.DENSE:
            self._kinds[req.seq] = kind

    def done(self, req: SimRequest) -> None:
        """A request finished or was aborted."""
        self._kinds.pop(req.seq, None)

    def kind(self, req: SimRequest) -> ModeKind:
        return self._kinds.get(req.seq, ModeKind.DENSE)

    def chunks(self, items: Sequence[tuple[SimRequest, int, int]]) -> list[ScheduledChunk]:
        """One step's chunks `(request, new tokens, computed before)` as the cost model sees
        them: a decode chunk of a non-dense request reads its mode's context."""
        out: list[ScheduledChunk] = []
        params = self.params
        for req, num_new, ctx in items:
            kind = self._kinds.get(req.seq)
            if kind is not None and num_new == 1 and req.num_output_tokens >= 1:
                ctx = decode_context(kind, ctx, req.num_prompt_tokens, params)
            out.append(ScheduledChunk(num_new, ctx))
        return out

    def to_compress(self, reqs: Sequence[SimRequest]) -> list[tuple[SimRequest, int]]:
        """`kv_budget` requests among `reqs` whose prompt is computed, with the KV tokens each
        keeps (the caller compresses those not compressed yet)."""
        out: list[tuple[SimRequest, int]] = []
        for req in reqs:
            if self._kinds.get(req.seq) is ModeKind.KV_BUDGET and req.num_output_tokens >= 1:
                keep = kv_keep_tokens(req.num_prompt_tokens, req.max_tokens, self.params)
                out.append((req, keep))
        return out
