"""SCBench-style closed-loop sessions: multi-turn conversations over a few shared long contexts.

One idea: a prompt is a *token stream of named segments* — a shared context document, then the
session's earlier queries and answers, then the new query — and each `block_size`-token block's
hash is chained over the block's content and its parent block's hash. Two prompts therefore share
exactly the leading blocks whose tokens (and every token before them) are identical: sessions over
the same document share its full blocks; turn t of a session extends turn t-1's prompt (its full
blocks are a prefix of turn t's), and a block that straddles a segment boundary is shared only
where the same segments meet. The last, partial block is hashed too (marked as partial), so the
hashes cover the prompt the Mooncake way; it matches only an identical partial block.

SCBench (Li et al., "SCBench: A KV Cache-Centric Analysis of Long-Context Methods", ICLR 2025)
evaluates long-context methods over *shared contexts* in two modes: multi-turn (one session asks
several follow-up queries over its context; the conversation history stays in the prompt) and
multi-request (several requests share one context). This generator reproduces that shape for
serving experiments: `include_history=True` is the multi-turn mode; `include_history=False` makes
each turn context + new query only (multi-request). Contexts are shared across sessions in both.

Parameters (`ScbenchConfig`), with where the defaults come from:

- `mean_turns=5`: SCBench reports 931 multi-turn sessions with 4,853 queries (≈5.2 queries per
  session). Turns per session are `min_turns + Poisson(mean_turns - min_turns)`, clipped to
  `[min_turns, max_turns]`.
- Context lengths, two sources (`context_source`):
  - `"uniform"` (default): each context's length is uniform in `context_tokens=(8192, 32768)` —
    scaled down to fit an 8B model's native 32k window next to a session's history;
  - `"scbench"`: SCBench's own lengths. Each context draws one of SCBench's 12 tasks with
    weight proportional to the task's number of sessions (`SCBENCH_TASKS`) and takes that
    task's average context length, capped at `max_context_tokens` (SCBench itself truncates a
    context to the model's window). SCBench's contexts are long — ~22k (many-shot ICL) to
    ~200k tokens (English QA / multiple choice), one Chinese QA task far beyond that — so most
    contexts sit at the cap of a 128k-window model.
- `num_contexts=4`: contexts sessions pick from, uniformly or by Zipf weights
  `1/rank**context_zipf_s` when `context_zipf_s > 0`. `num_contexts=None` gives every session
  its own context, SCBench's layout: in SCBench a context is shared by the turns (multi-turn
  mode) or requests (multi-request mode) of one session, not across sessions.
- `query_tokens=(32, 256)`, `answer_tokens=(16, 256)`: SCBench queries are short questions and
  most of its tasks answer briefly (retrieval, QA, choice); uniform integer ranges.
- `arrival_rate_per_s`: Poisson session arrivals (SCBench itself runs offline; this is ours).
- `think_mean_s`, `think_std_s`: the pause between a turn's completion and the next turn —
  normal N(mean, std) clipped at 0 when `think_std_s` is given (the HEAR paper's Appendix A.2:
  N(5, 1) s), else exponential with that mean.
- `block_size=16`: vLLM's default KV block size, so a simulated prefix cache reuses exactly the
  tokens vLLM would (a coarser block would lose up to a block of reuse per turn boundary).

Sampling uses one `numpy.random.Generator(seed)` in a fixed order (context lengths — or context
tasks —, session gaps, context choice unless one per session, turn counts, then per-turn query
lengths, answer lengths, think times), so a seed fixes the whole set; segment identities are
derived from the seed by BLAKE2b, never from Python's salted `hash`.

Examples:
    >>> sset = generate_scbench(3, seed=1, context_tokens=(64, 64), num_contexts=1,
    ...                         query_tokens=(8, 8), answer_tokens=(8, 8), mean_turns=2,
    ...                         max_turns=2, min_turns=2)
    >>> [len(s.turns) for s in sset], sset.mode
    ([2, 2, 2], 'closed')
    >>> a, b = sset.sessions[0], sset.sessions[1]
    >>> a.turns[0].prefix_block_hashes[:4] == b.turns[0].prefix_block_hashes[:4]  # shared doc
    True
    >>> a.turns[1].prefix_block_hashes[:4] == a.turns[0].prefix_block_hashes[:4]  # history
    True
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from maserve_prefect.errors import ConfigError
from maserve_prefect.workloads.sessions import Session, SessionSet, Turn

__all__ = ["SCBENCH_TASKS", "ScbenchConfig", "ScbenchTask", "generate_scbench"]

_MASK63 = (1 << 63) - 1
_MASK64 = (1 << 64) - 1
_DOC, _QUERY, _ANSWER, _PARTIAL = 1, 2, 3, 4
_SOURCES = ("uniform", "scbench")


@dataclass(frozen=True, slots=True)
class ScbenchTask:
    """One SCBench task: its multi-turn sessions and average context length (tokens)."""

    name: str
    num_sessions: int
    mean_context_tokens: int


# SCBench's task table (Li et al., 2024, arXiv 2412.10319): sessions per task and average context
# length, rounded to thousands of tokens. The sessions add up to the paper's 931; the lengths
# agree in magnitude with the dataset card's bytes per example (e.g. Retr.KV ~200 kB of random
# JSON, many-shot ICL ~88 kB of text).
SCBENCH_TASKS: tuple[ScbenchTask, ...] = (
    ScbenchTask("retr_kv", 100, 125_000),
    ScbenchTask("retr_prefix_suffix", 100, 112_000),
    ScbenchTask("retr_multihop", 90, 124_000),
    ScbenchTask("code_repoqa", 88, 65_000),
    ScbenchTask("en_qa", 69, 198_000),
    ScbenchTask("zh_qa", 35, 1_500_000),
    ScbenchTask("en_multichoice", 58, 188_000),
    ScbenchTask("icl_manyshot", 54, 22_000),
    ScbenchTask("math_find", 100, 120_000),
    ScbenchTask("en_sum", 79, 104_000),
    ScbenchTask("mix_sum_niah", 70, 105_000),
    ScbenchTask("mix_repoqa_kv", 88, 68_000),
)


@dataclass(frozen=True, slots=True)
class ScbenchConfig:
    """Parameters of `generate_scbench` (defaults and sources: the module docstring).

    Raises:
        ConfigError: a rate or mean that is not positive, or an empty / inverted range.
    """

    arrival_rate_per_s: float = 0.2
    num_contexts: int | None = 4
    context_tokens: tuple[int, int] = (8192, 32768)
    context_source: str = "uniform"
    max_context_tokens: int | None = None
    context_zipf_s: float = 0.0
    mean_turns: float = 5.0
    min_turns: int = 1
    max_turns: int = 10
    think_mean_s: float = 5.0
    think_std_s: float | None = None
    query_tokens: tuple[int, int] = (32, 256)
    answer_tokens: tuple[int, int] = (16, 256)
    include_history: bool = True
    block_size: int = 16

    def __post_init__(self) -> None:
        if not self.arrival_rate_per_s > 0:
            raise ConfigError(
                f"scbench: arrival_rate_per_s must be > 0, got {self.arrival_rate_per_s}"
            )
        if self.num_contexts is not None and self.num_contexts < 1:
            raise ConfigError(
                f"scbench: num_contexts must be >= 1 (or None: one per session), got "
                f"{self.num_contexts}"
            )
        if self.context_source not in _SOURCES:
            raise ConfigError(
                f"scbench: context_source must be one of {_SOURCES}, got {self.context_source!r}"
            )
        if self.max_context_tokens is not None and self.max_context_tokens < 1:
            raise ConfigError(
                f"scbench: max_context_tokens must be >= 1, got {self.max_context_tokens}"
            )
        if self.context_zipf_s < 0:
            raise ConfigError(f"scbench: context_zipf_s must be >= 0, got {self.context_zipf_s}")
        if not 1 <= self.min_turns <= self.max_turns:
            raise ConfigError(
                f"scbench: need 1 <= min_turns <= max_turns, got {self.min_turns}, {self.max_turns}"
            )
        if not self.min_turns <= self.mean_turns <= self.max_turns:
            raise ConfigError(
                f"scbench: mean_turns {self.mean_turns} must lie in [min_turns, max_turns]"
            )
        if self.think_mean_s < 0:
            raise ConfigError(f"scbench: think_mean_s must be >= 0, got {self.think_mean_s}")
        if self.think_std_s is not None and self.think_std_s < 0:
            raise ConfigError(f"scbench: think_std_s must be >= 0, got {self.think_std_s}")
        if self.block_size < 1:
            raise ConfigError(f"scbench: block_size must be >= 1, got {self.block_size}")
        for name in ("context_tokens", "query_tokens", "answer_tokens"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ConfigError(f"scbench: {name} must be a range 1 <= lo <= hi, got {(lo, hi)}")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _hash(*parts: int) -> int:
    """A 63-bit BLAKE2b digest of unsigned ints (stable across processes and platforms)."""
    data = b"".join((p & _MASK64).to_bytes(8, "little") for p in parts)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") & _MASK63


class _BlockChain:
    """A token stream of segments `(key, length)` cut into hashed, chained blocks."""

    __slots__ = ("block_size", "fill", "full", "pieces")

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.full: list[int] = []
        self.pieces: list[int] = []  # (key, start, end) triples of the open block, flattened
        self.fill = 0

    def copy(self) -> _BlockChain:
        out = _BlockChain(self.block_size)
        out.full, out.pieces, out.fill = list(self.full), list(self.pieces), self.fill
        return out

    @property
    def num_tokens(self) -> int:
        return len(self.full) * self.block_size + self.fill

    def extend(self, key: int, length: int) -> None:
        off = 0
        while off < length:
            take = min(length - off, self.block_size - self.fill)
            self.pieces += (key, off, off + take)
            self.fill += take
            off += take
            if self.fill == self.block_size:
                self.full.append(_hash(self.full[-1] if self.full else 0, *self.pieces))
                self.pieces, self.fill = [], 0

    def hashes(self) -> tuple[int, ...]:
        """Every full block's hash, then the partial block's (if any)."""
        if not self.fill:
            return tuple(self.full)
        parent = self.full[-1] if self.full else 0
        return (*self.full, _hash(parent, _PARTIAL, *self.pieces))


def _context_lengths(
    cfg: ScbenchConfig, num_ctx: int, rng: np.random.Generator
) -> tuple[list[str], np.ndarray]:
    """Each context's SCBench task ([] for uniform lengths) and length (module docstring)."""
    if cfg.context_source == "uniform":
        lengths = rng.integers(cfg.context_tokens[0], cfg.context_tokens[1] + 1, num_ctx)
        if cfg.max_context_tokens is not None:
            lengths = np.minimum(lengths, cfg.max_context_tokens)
        return [], lengths
    w = np.array([t.num_sessions for t in SCBENCH_TASKS], dtype=float)
    picks = rng.choice(len(SCBENCH_TASKS), num_ctx, p=w / w.sum())
    cap = cfg.max_context_tokens if cfg.max_context_tokens is not None else 1 << 62
    tasks = [SCBENCH_TASKS[int(i)] for i in picks]
    return [t.name for t in tasks], np.array([min(t.mean_context_tokens, cap) for t in tasks])


def generate_scbench(
    num_sessions: int, seed: int, config: ScbenchConfig | None = None, **overrides: Any
) -> SessionSet:
    """Generate closed-loop SCBench-style sessions.

    Args:
        num_sessions: how many sessions (ids `scb-00000`, ... in arrival order).
        seed: the seed of the one numpy Generator (and of the segment identities).
        config: parameters; `overrides` replace single fields (`arrival_rate_per_s=1.0`).

    Returns:
        A closed-loop `SessionSet`; its `meta` records the generator, seed and parameters.

    Raises:
        ConfigError: `num_sessions < 1`, an unknown override, or a bad parameter.
    """
    if num_sessions < 1:
        raise ConfigError(f"scbench: num_sessions must be >= 1, got {num_sessions}")
    base = config if config is not None else ScbenchConfig()
    try:
        cfg = dataclasses.replace(base, **overrides)
    except TypeError as exc:
        known = ", ".join(f.name for f in dataclasses.fields(ScbenchConfig))
        raise ConfigError(f"scbench: {exc}; parameters are {known}") from None
    rng = np.random.default_rng(seed)
    n = num_sessions
    num_ctx = n if cfg.num_contexts is None else cfg.num_contexts
    ctx_task, ctx_len = _context_lengths(cfg, num_ctx, rng)
    gaps = rng.exponential(1.0 / cfg.arrival_rate_per_s, n)
    arrivals = np.cumsum(gaps) - gaps[0]  # the first session starts at 0
    if cfg.num_contexts is None:
        ctx_of = np.arange(n)  # SCBench: every session over its own context
    else:
        weights = 1.0 / np.arange(1, num_ctx + 1) ** cfg.context_zipf_s
        ctx_of = rng.choice(num_ctx, n, p=weights / weights.sum())
    extra = rng.poisson(cfg.mean_turns - cfg.min_turns, n)
    num_turns = np.clip(cfg.min_turns + extra, cfg.min_turns, cfg.max_turns)
    total = int(num_turns.sum())
    q_len = rng.integers(cfg.query_tokens[0], cfg.query_tokens[1] + 1, total)
    a_len = rng.integers(cfg.answer_tokens[0], cfg.answer_tokens[1] + 1, total)
    if cfg.think_std_s is not None:  # normal, the HEAR paper's N(5, 1) s; never negative
        think = np.maximum(rng.normal(cfg.think_mean_s, cfg.think_std_s, total), 0.0)
    elif cfg.think_mean_s > 0:
        think = rng.exponential(cfg.think_mean_s, total)
    else:
        think = np.zeros(total)

    seed_key = _hash(seed)
    docs: list[_BlockChain] = []
    for d in range(num_ctx):
        chain = _BlockChain(cfg.block_size)
        chain.extend(_hash(seed_key, _DOC, d), int(ctx_len[d]))
        docs.append(chain)

    sessions: list[Session] = []
    k = 0  # index into the per-turn draws
    for i in range(n):
        doc = docs[int(ctx_of[i])]
        history = doc.copy()
        turns: list[Turn] = []
        for t in range(int(num_turns[i])):
            chain = history.copy() if cfg.include_history else doc.copy()
            chain.extend(_hash(seed_key, _QUERY, i, t), int(q_len[k]))
            turns.append(
                Turn(
                    t,
                    num_prompt_tokens=chain.num_tokens,
                    num_output_tokens=int(a_len[k]),
                    prefix_block_hashes=chain.hashes(),
                    block_size=cfg.block_size,
                    arrival_s=round(float(arrivals[i]), 6) if t == 0 else None,
                    think_s=round(float(think[k]), 6) if t > 0 else None,
                    source=f"context {int(ctx_of[i])}"
                    + (f" ({ctx_task[int(ctx_of[i])]})" if ctx_task else ""),
                )
            )
            if cfg.include_history:
                chain.extend(_hash(seed_key, _ANSWER, i, t), int(a_len[k]))
                history = chain
            k += 1
        sessions.append(Session(f"scb-{i:05d}", tuple(turns)))
    meta = {
        "generator": "scbench",
        "seed": seed,
        "num_sessions": n,
        "config": cfg.to_dict(),
        "context_tokens": [int(x) for x in ctx_len],
    }
    if ctx_task:
        meta["context_tasks"] = list(ctx_task)
    return SessionSet(tuple(sessions), "closed", meta)
