"""The demand population the paper states, realized natively: calls per root and tokens per call.

The simulator's native work comes from each binding's content model (`bindings.content`); issue
16 fits its lengths to the paper's *stated workload statistics* (never to a finding's result).
This module holds those statistics (`PAPER_*`), the populations that realize them (`G5_COHORTS`:
App. G.5's fixed 64-root population; `STRUCTURES`: the seven structures of §6.1 / App. D.2),
and the pure summaries (`call_stats`, `weighted_stats`, `rows`) that put ours beside the
paper's with ratios. Realizing is `realize` (native runs on the simulator; effects at the edge).

Stated figures used:

- **App. G.5** (Qwen3-8B / 910C, request limit 128, 8,192 model length): 9 Loop targets + 53
  Loop, 1 Spawn, 1 Fork–Join background; three blocks of 134 calls with input/output totals
  92,409/352,227, 92,050/351,748 and 92,389/350,113 tokens → 688.7 input and 2,622.1 output
  tokens per call (three-block mean), 2.09 calls per root.
- **App. D.2, Fig. D.4**: model-call medians per root range from 2 (Loop) to 16 (the composed
  research–review–writing Sequence).
- **Serving limits**: max model length 8,192 on the 910C (App. G.2, G.5): a call's output is
  capped at 8,192 − its input (`tasks.model`).

Examples:
    >>> s = call_stats([[(100, 1000), (300, 2000)], [(500, 3000)]])
    >>> s.calls_per_root_mean, s.input_mean, s.output_p50
    (1.5, 300.0, 2000.0)
    >>> round(PAPER_G5_INPUT_PER_CALL, 1), round(PAPER_G5_OUTPUT_PER_CALL, 1)
    (688.7, 2622.1)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from maserve_prefect.errors import ConfigError

G5_BLOCKS: tuple[tuple[int, int, int], ...] = (
    (134, 92_409, 352_227),
    (134, 92_050, 351_748),
    (134, 92_389, 350_113),
)
"""App. G.5: (calls, input tokens, output tokens) of each of the three blocks (64 roots each)."""
G5_ROOTS = 64
PAPER_G5_INPUT_PER_CALL = sum(b[1] for b in G5_BLOCKS) / sum(b[0] for b in G5_BLOCKS)
PAPER_G5_OUTPUT_PER_CALL = sum(b[2] for b in G5_BLOCKS) / sum(b[0] for b in G5_BLOCKS)
PAPER_G5_CALLS_PER_ROOT = G5_BLOCKS[0][0] / G5_ROOTS
PAPER_MAX_MODEL_LEN = 8192
"""Max model length on the 910C (App. G.2 / G.5; `pool_910c_qwen3_8b.yaml`)."""

PAPER_CALL_MEDIANS: Mapping[str, float] = {
    "refinement_loop": 2.0,
    "research_review_writing": 16.0,
}
"""App. D.2, Fig. D.4: model calls per root, median (stated for Loop and the Sequence only)."""

STRUCTURES: tuple[str, ...] = (
    "spawn",
    "fork_join",
    "refinement_loop",
    "debate",
    "spawn_fork_join_refinement",
    "fork_join_debate_refinement",
    "research_review_writing",
)
"""The seven structures of §6.1 (workflow names of `flows/specs/index.yaml`)."""

G5_LOOP_BINDINGS: tuple[str, ...] = ("math", "research", "science_qa")
"""The G.5 targets' bindings in ours: GSM8K → math, PubMedQA → research, SCIENCE → science_qa
(the same mapping as `mix_bg_*.yaml`)."""


@dataclass(frozen=True, slots=True)
class Cohort:
    """One native realization: `users` roots of `workflow` under `binding`, and the number of
    roots of the population it stands for (`weight_roots`; the population's composition)."""

    workflow: str
    binding: str
    users: int
    weight_roots: float


def g5_cohorts(users_per_loop_binding: int = 21) -> tuple[Cohort, ...]:
    """App. G.5's population: 62 Loop roots (9 targets + 53 background) over the three target
    bindings, one Spawn, one Fork–Join. `users_per_loop_binding` realizes fewer Loop roots (a
    cheap test) while each realized cohort still stands for its share of the 64 roots.

    Examples:
        >>> [(c.workflow, c.weight_roots) for c in g5_cohorts(2)][-2:]
        [('spawn', 1.0), ('fork_join', 1.0)]
        >>> round(sum(c.weight_roots for c in g5_cohorts()), 6)
        64.0
    """
    if users_per_loop_binding < 1:
        raise ConfigError(f"users_per_loop_binding must be >= 1, got {users_per_loop_binding}")
    share = 62 / len(G5_LOOP_BINDINGS)
    loops = tuple(
        Cohort("refinement_loop", b, users_per_loop_binding, share) for b in G5_LOOP_BINDINGS
    )
    # the paper does not name the Spawn / Fork-Join backgrounds' bindings: the first target's
    return (*loops, Cohort("spawn", "math", 1, 1.0), Cohort("fork_join", "math", 1, 1.0))


Call = tuple[int, int]
"""(input tokens, output tokens) of one model call."""


@dataclass(frozen=True, slots=True)
class CallStats:
    """Per-root call counts and per-call token figures of a set of roots."""

    roots: int
    calls: int
    calls_per_root_mean: float
    calls_per_root_p50: float
    input_mean: float
    input_p50: float
    input_p90: float
    output_mean: float
    output_p50: float
    output_p90: float
    max_context: int
    """The largest input + output of any call (must not exceed the model length)."""


def call_stats(
    roots: Sequence[Sequence[Call]], weights: Sequence[float] | None = None
) -> CallStats:
    """Summaries over `roots` (each a list of its calls); `weights` weight each root (default
    1): per-call figures weight each call by its root's weight, so a cohort realized with fewer
    roots than it stands for keeps its share."""
    if not roots:
        raise ConfigError("call_stats needs at least one root")
    w = np.ones(len(roots)) if weights is None else np.asarray(weights, float)
    counts = np.array([len(r) for r in roots], float)
    calls = [c for r in roots for c in r]
    if not calls:
        raise ConfigError("call_stats: the roots made no model calls")
    cw = np.repeat(w, counts.astype(int))
    ins = np.array([c[0] for c in calls], float)
    outs = np.array([c[1] for c in calls], float)
    return CallStats(
        roots=len(roots),
        calls=len(calls),
        calls_per_root_mean=float(np.average(counts, weights=w)),
        calls_per_root_p50=_wq(counts, w, 0.5),
        input_mean=float(np.average(ins, weights=cw)),
        input_p50=_wq(ins, cw, 0.5),
        input_p90=_wq(ins, cw, 0.9),
        output_mean=float(np.average(outs, weights=cw)),
        output_p50=_wq(outs, cw, 0.5),
        output_p90=_wq(outs, cw, 0.9),
        max_context=int(max(i + o for i, o in calls)),
    )


def _wq(x: np.ndarray, w: np.ndarray, q: float) -> float:
    """Weighted quantile: the smallest value whose cumulative weight share reaches `q`."""
    order = np.argsort(x, kind="stable")
    cum = np.cumsum(w[order]) / w.sum()
    return float(x[order][int(np.searchsorted(cum, q - 1e-12))])


def weighted_stats(realized: Mapping[Cohort, Sequence[Sequence[Call]]]) -> CallStats:
    """One population's figures from its realized cohorts, each root weighted so the cohort
    stands for `weight_roots` roots."""
    roots: list[Sequence[Call]] = []
    weights: list[float] = []
    for cohort, rs in realized.items():
        roots += list(rs)
        weights += [cohort.weight_roots / len(rs)] * len(rs)
    return call_stats(roots, weights)


def _ratio(ours: float, paper: float | None) -> str:
    return f"{ours / paper:.2f}x" if paper else "-"


def rows(name: str, s: CallStats, paper: Mapping[str, float | None]) -> list[list[str]]:
    """Table rows for one population: figure, ours, the paper's stated value, ratio.
    `paper` keys: calls_per_root_mean, calls_per_root_p50, input_mean, output_mean."""
    out = []
    for key, label in (
        ("calls_per_root_mean", "calls per root, mean"),
        ("calls_per_root_p50", "calls per root, P50"),
        ("input_mean", "input tokens per call, mean"),
        ("input_p50", "input tokens per call, P50"),
        ("input_p90", "input tokens per call, P90"),
        ("output_mean", "output tokens per call, mean"),
        ("output_p50", "output tokens per call, P50"),
        ("output_p90", "output tokens per call, P90"),
        ("max_context", "max input+output of a call"),
    ):
        ours = float(getattr(s, key))
        p = paper.get(key)
        out.append(
            [name, label, f"{ours:,.1f}", "-" if p is None else f"{p:,.1f}", _ratio(ours, p)]
        )
    return out


def g5_paper() -> dict[str, float | None]:
    """The paper's stated G.5 figures (`rows` keys)."""
    return {
        "calls_per_root_mean": PAPER_G5_CALLS_PER_ROOT,
        "input_mean": PAPER_G5_INPUT_PER_CALL,
        "output_mean": PAPER_G5_OUTPUT_PER_CALL,
        "max_context": float(PAPER_MAX_MODEL_LEN),
    }


def structure_paper(workflow: str) -> dict[str, float | None]:
    """The paper's stated figures for one structure (Fig. D.4's call medians only)."""
    return {
        "calls_per_root_p50": PAPER_CALL_MEDIANS.get(workflow),
        "max_context": float(PAPER_MAX_MODEL_LEN),
    }
