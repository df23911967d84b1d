"""Seed paper §6.5 and App. G: temporal mixing, background composition, separate vs mixed cohorts.

One idea: each of these findings holds the target roots' work fixed and changes only what runs
beside them — the mapping of one background to fixed global slots (App. G.1), the background's
composition (G.2 near-matched, G.4 unmatched), or the cohort a class runs in (G.3) — so every
figure is a paired per-block comparison of the target roots, computed from the replay traces and
the simulator's step records, and reported beside the paper's value (`paper.paper_row`).

The co-batching share and the pure-decode batch are `metrics.cobatch`'s, on the simulator's
step records.

Suites and their rows:

- `finding_temporal_mixing.yaml` (`temporal_mixing_rows`): arms `interleaved` (A) and
  `clustered` (B): co-batching share with all three classes under A and B, target mean root
  latency change A vs B (overall and per binding), pure-decode batch under A and B.
- `finding_background.yaml` (`background_rows`): scenarios `mix-bg-same`, `mix-bg-near`,
  `mix-bg-het`: near-matched vs same-class target mean latency change and background token
  changes; heterogeneous vs same-class background tokens and target mean latency ratios.
- `finding_cohorts.yaml` (`cohort_rows`): `cohort-sep-<workflow>` vs `cohort-mixed`: mean root
  latency ratio mixed / separate for Loop and Sequence, and the share of the change that is
  waiting before first scheduling on the completion path (`metrics.path`): readiness-to-
  submission plus backend wait, since our request limit queues requests in the engine
  (`WAIT_NOTE`); `class_ratios` keeps the readiness-to-submission-only share too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from maserve_prefect.bench.replay import block_figures as bf
from maserve_prefect.bench.replay.block_figures import Row
from maserve_prefect.bench.replay.paper import PaperFigure, paper_row
from maserve_prefect.errors import ConfigError
from maserve_prefect.metrics.cobatch import (
    TARGET,
    model_tokens,
    pure_decode_batch,
    request_groups,
    target_cobatching,
)
from maserve_prefect.metrics.path import path_ledger
from maserve_prefect.replay.arms import ArmResult, ScenarioResult
from maserve_prefect.replay.traceset import TraceSet
from maserve_prefect.trace.model import OpKind

COBATCH_WINDOW_S = (2.0, 110.0)
"""Fig. 10a's window, seconds after the replay's start: the common background arrival span."""

BINDINGS = {"t_gsm8k": "GSM8K", "t_pubmedqa": "PubMedQA", "t_science": "Science"}
"""Target cohorts of the mix scenarios → the paper's binding names."""

LOOP, SEQUENCE = "refinement_loop", "research_review_writing"

WAIT_NOTE = (
    "; ours counts readiness-to-submission + backend wait: our request limit is the engine's "
    "(max_num_seqs), so requests past it wait in the engine queue, not before submission"
)
"""Why the cohort attribution row adds backend wait (the paper's limit holds requests before
submission; ours queues them in the engine)."""

_G1 = "Qwen3-8B/910C, 9 Loop targets + 19 Loop/18 Spawn/18 Fork–Join, 3 paired blocks"
_G2 = "Qwen3-8B/910C, 9 Loop targets + 55 background roots, 3 paired blocks"
_G3 = "Qwen3.5-9B/RTX PRO 5000, 64 users separate vs 64 mixed, 3 blocks"

TEMPORAL = {
    "all_a": PaperFigure(
        "§6.5 temporal mixing",
        "target time co-batched with all 3 classes, A interleaved (%)",
        96.3,
        _G1,
        "§6.5, Fig. 10a",
        kind="share",
    ),
    "all_b": PaperFigure(
        "§6.5 temporal mixing",
        "target time co-batched with all 3 classes, B clustered (%)",
        31.5,
        _G1,
        "§6.5, Fig. 10a",
        kind="share",
    ),
    "root": PaperFigure(
        "§6.5 temporal mixing",
        "target mean root latency, A vs B (%)",
        0.743,
        _G1,
        "§6.5, Fig. 10c",
    ),
    "t_gsm8k": PaperFigure(
        "§6.5 temporal mixing", "GSM8K target root latency, A vs B (%)", 2.17, _G1, "Fig. 10c"
    ),
    "t_pubmedqa": PaperFigure(
        "§6.5 temporal mixing", "PubMedQA target root latency, A vs B (%)", 2.14, _G1, "Fig. 10c"
    ),
    "t_science": PaperFigure(
        "§6.5 temporal mixing", "Science target root latency, A vs B (%)", -3.75, _G1, "Fig. 10c"
    ),
    "batch_a": PaperFigure(
        "§6.5 temporal mixing",
        "pure-decode batch over target lifetime, A",
        79.8,
        _G1,
        "App. G.1",
        kind="value",
    ),
    "batch_b": PaperFigure(
        "§6.5 temporal mixing",
        "pure-decode batch over target lifetime, B",
        72.9,
        _G1,
        "App. G.1",
        kind="value",
    ),
}
"""The paper's temporal-mixing figures (A = interleaved, B = clustered)."""

BACKGROUND = {
    "near_root": PaperFigure(
        "§6.5 near-matched background",
        "target mean root latency, near-matched vs Loop-only (%; paper 3.9–5.0 across blocks)",
        4.45,
        _G2 + "; 2 of 55 Loop roots → 1 Spawn + 1 Fork–Join",
        "§6.5, Fig. 11; App. G.2",
    ),
    "near_in": PaperFigure(
        "§6.5 near-matched background",
        "background input tokens, near-matched vs Loop-only (%)",
        4.5,
        _G2,
        "§6.5; Table G.3",
    ),
    "near_out": PaperFigure(
        "§6.5 near-matched background",
        "background output tokens, near-matched vs Loop-only (%)",
        4.8,
        _G2,
        "§6.5; Table G.3",
    ),
    "het_tokens": PaperFigure(
        "App. G.4 unmatched background",
        "background input+output tokens, heterogeneous / same-class (×)",
        4.92,
        _G2 + "; heterogeneous vs same-class",
        "App. G.4, Fig. G.5",
        kind="ratio",
    ),
    "het_root": PaperFigure(
        "App. G.4 unmatched background",
        "target mean root latency, heterogeneous / same-class (×)",
        1.77,
        _G2 + "; heterogeneous vs same-class",
        "App. G.4, Fig. G.5",
        kind="ratio",
    ),
}
"""The paper's background-composition figures."""

COHORTS = {
    "loop_ratio": PaperFigure(
        "App. G.3 separate vs mixed",
        "Loop mean root latency, mixed / separate (×)",
        1.83,
        _G3,
        "App. G.3, Fig. G.2b",
        kind="ratio",
    ),
    "seq_ratio": PaperFigure(
        "App. G.3 separate vs mixed",
        "Sequence mean root latency, mixed / separate (×)",
        0.53,
        _G3,
        "App. G.3, Fig. G.2b",
        kind="ratio",
    ),
    "loop_pre": PaperFigure(
        "App. G.3 separate vs mixed",
        "share of Loop's latency change in readiness-to-submission (%)",
        91.5,
        _G3,
        "App. G.3, Fig. G.2c",
        kind="share",
    ),
    "seq_pre": PaperFigure(
        "App. G.3 separate vs mixed",
        "share of Sequence's latency change in readiness-to-submission (%)",
        92.3,
        _G3,
        "App. G.3, Fig. G.2c",
        kind="share",
    ),
}
"""The paper's separate-vs-mixed figures."""


# -- per-run figures -------------------------------------------------------------------------------


def _runs(result: ScenarioResult, arm: str) -> list[ArmResult]:
    runs = result.by_arm().get(arm)
    if not runs:
        raise ConfigError(
            f"scenario {result.scenario.name}: the analysis needs an arm named {arm!r}; it has "
            f"{', '.join(result.by_arm())}"
        )
    return runs


def _scenario(results: Mapping[str, ScenarioResult], name: str) -> ScenarioResult:
    if name not in results:
        raise ConfigError(
            f"the analysis needs scenario {name!r}; the suite ran {', '.join(results) or 'none'}"
        )
    return results[name]


def mean_latency(
    result: ScenarioResult, arm: ArmResult, cohort: str | None = None, cls: str | None = None
) -> float | None:
    """Mean latency of the measured roots that completed (of one cohort / class when given);
    None when one of them did not complete (a mean over the finished ones would hide it)."""
    outcomes = [
        o
        for o in bf.measured_outcomes(result, arm.run)
        if (cohort is None or result.trace_set.cohort_of.get(o.root_id) == cohort)
        and (cls is None or o.workload_class == cls)
    ]
    lats = [o.latency_s for o in outcomes]
    if not lats or any(v is None for v in lats):
        return None
    return float(np.mean([v for v in lats if v is not None]))


def _change_pct(new: float | None, old: float | None) -> float | None:
    return None if new is None or old is None or old <= 0 else 100.0 * (new / old - 1.0)


def _ratio(new: float | None, old: float | None) -> float | None:
    return None if new is None or old is None or old <= 0 else new / old


def cobatching_of(result: ScenarioResult, arm: ArmResult) -> dict[str, float]:
    """Fig. 10a's shares for one arm run, window `COBATCH_WINDOW_S` after its start."""
    run = arm.run
    groups = request_groups(run.trace, result.trace_set.role_of)
    lo, hi = COBATCH_WINDOW_S
    return target_cobatching(
        run.step_records(), groups, window=(run.start_s + lo, run.start_s + hi)
    )


def target_lifetime(result: ScenarioResult, arm: ArmResult) -> tuple[float, float] | None:
    """(first target arrival, last target completion) of one arm run on its clock."""
    outcomes = bf.measured_outcomes(result, arm.run)
    done = [o.completed_s for o in outcomes if o.completed_s is not None]
    if not outcomes or not done:
        return None
    return min(o.arrival_s for o in outcomes), max(done)


def decode_batch_of(result: ScenarioResult, arm: ArmResult) -> float | None:
    """Pure-decode batch over the targets' lifetime for one arm run."""
    life = target_lifetime(result, arm)
    return None if life is None else pure_decode_batch(arm.run.step_records(), window=life)


# -- analyses ---------------------------------------------------------------------------------------


def _our_setup(result: ScenarioResult, extra: str = "") -> str:
    sc = result.scenario
    pool = sc.arms[0].pool.name if sc.arms[0].pool is not None else "default pool"
    n = len(result.trace_set.slots)
    tgt = len(result.trace_set.targets())
    return f"sim {pool}, {tgt} targets of {n} roots, {sc.blocks} blocks{extra}"


def temporal_mixing_rows(results: Mapping[str, ScenarioResult]) -> list[Row]:
    """Paper rows of `finding_temporal_mixing.yaml` (module docstring)."""
    res = _scenario(results, "mix-temporal")
    a_runs, b_runs = _runs(res, "interleaved"), _runs(res, "clustered")
    pairs = list(zip(a_runs, b_runs, strict=True))
    co_a = [cobatching_of(res, a) for a, _ in pairs]
    co_b = [cobatching_of(res, b) for _, b in pairs]
    setup = _our_setup(res)
    rows = [
        paper_row(TEMPORAL["all_a"], setup, [_pct(c.get("all")) for c in co_a]),
        paper_row(TEMPORAL["all_b"], setup, [_pct(c.get("all")) for c in co_b]),
        paper_row(
            TEMPORAL["root"],
            setup,
            [_change_pct(mean_latency(res, a), mean_latency(res, b)) for a, b in pairs],
        ),
    ]
    for cohort in BINDINGS:
        if cohort not in {c.name for c in res.scenario.cohorts}:
            continue
        rows.append(
            paper_row(
                TEMPORAL[cohort],
                setup,
                [
                    _change_pct(mean_latency(res, a, cohort), mean_latency(res, b, cohort))
                    for a, b in pairs
                ],
            )
        )
    rows.append(paper_row(TEMPORAL["batch_a"], setup, [decode_batch_of(res, a) for a, _ in pairs]))
    rows.append(paper_row(TEMPORAL["batch_b"], setup, [decode_batch_of(res, b) for _, b in pairs]))
    return rows


def _pct(x: float | None) -> float | None:
    return None if x is None else 100.0 * x


def _background_tokens(ts: TraceSet) -> tuple[int, int]:
    bg = {r for r, role in ts.role_of.items() if role != TARGET}
    return model_tokens(ts.trace, bg)


def _target_work(ts: TraceSet) -> list[tuple[str, int, int]]:
    return sorted(
        (o.op_id, o.num_input_tokens, o.num_output_tokens)
        for o in ts.trace.ops
        if ts.role_of.get(o.root_id) == TARGET and o.kind is OpKind.MODEL
    )


def background_rows(results: Mapping[str, ScenarioResult]) -> list[Row]:
    """Paper rows of `finding_background.yaml` (module docstring). `our_setup` says whether the
    targets' recorded work was identical in the three scenarios."""
    same = _scenario(results, "mix-bg-same")
    near = _scenario(results, "mix-bg-near")
    het = _scenario(results, "mix-bg-het")
    work = _target_work(same.trace_set)
    fixed = all(_target_work(r.trace_set) == work for r in (near, het))
    note = f"; targets' work {'identical' if fixed else 'DIFFERS'} across backgrounds"
    s_runs, n_runs, h_runs = (_runs(r, "replay") for r in (same, near, het))
    blocks = min(len(s_runs), len(n_runs), len(h_runs))
    s_in, s_out = _background_tokens(same.trace_set)
    n_in, n_out = _background_tokens(near.trace_set)
    h_in, h_out = _background_tokens(het.trace_set)
    lat_s = [mean_latency(same, r) for r in s_runs[:blocks]]
    lat_n = [mean_latency(near, r) for r in n_runs[:blocks]]
    lat_h = [mean_latency(het, r) for r in h_runs[:blocks]]
    return [
        paper_row(
            BACKGROUND["near_root"],
            _our_setup(near, note),
            [_change_pct(n, s) for n, s in zip(lat_n, lat_s, strict=True)],
        ),
        paper_row(BACKGROUND["near_in"], _our_setup(near), [_change_pct(n_in, s_in)] * blocks),
        paper_row(BACKGROUND["near_out"], _our_setup(near), [_change_pct(n_out, s_out)] * blocks),
        paper_row(
            BACKGROUND["het_tokens"],
            _our_setup(het, "; 19 Loop/18 Spawn/18 Fork–Join vs 55 Loop"),
            [_ratio(h_in + h_out, s_in + s_out)] * blocks,
        ),
        paper_row(
            BACKGROUND["het_root"],
            _our_setup(het, note),
            [_ratio(h, s) for h, s in zip(lat_h, lat_s, strict=True)],
        ),
    ]


def _class_paths(
    result: ScenarioResult, arm: ArmResult, cls: str
) -> tuple[float, float, float] | None:
    """(mean root latency, mean readiness-to-submission, mean backend wait) on the completion
    paths of the measured roots of class `cls`; None when one of them did not complete."""
    outcomes = [o for o in bf.measured_outcomes(result, arm.run) if o.workload_class == cls]
    if not outcomes or any(o.latency_s is None for o in outcomes):
        return None
    keep = {o.root_id for o in outcomes}
    paths = [p for p in path_ledger(arm.run.trace) if p.root_id in keep]
    if len(paths) != len(keep):
        return None
    lat = float(np.mean([o.latency_s for o in outcomes if o.latency_s is not None]))
    pre = float(np.mean([p.pre_submission_s for p in paths]))
    return lat, pre, float(np.mean([p.backend_wait_s for p in paths]))


CohortFigures = tuple[float, float, float, float, float, float]
"""One block of one class: separate and mixed mean root latency, readiness-to-submission and
backend wait (s), in that order: (lat_s, lat_m, pre_s, pre_m, wait_s, wait_m)."""


def cohort_figures(results: Mapping[str, ScenarioResult], cls: str) -> list[CohortFigures | None]:
    """Per block, `CohortFigures` of class `cls` (None for a block where one is missing)."""
    sep = _scenario(results, f"cohort-sep-{cls}")
    mixed = _scenario(results, "cohort-mixed")
    s_runs, m_runs = _runs(sep, "separate"), _runs(mixed, "mixed")
    out: list[CohortFigures | None] = []
    for s, m in zip(s_runs, m_runs, strict=False):
        a, b = _class_paths(sep, s, cls), _class_paths(mixed, m, cls)
        out.append(None if a is None or b is None else (a[0], b[0], a[1], b[1], a[2], b[2]))
    return out


def pre_submission_share(
    figs: Sequence[CohortFigures | None], *, with_backend_wait: bool = False
) -> float | None:
    """100 × mean Δ readiness-to-submission / mean Δ root latency over the blocks (App. G.3:
    a ratio of mean changes, not a mean of ratios); with `with_backend_wait` the numerator adds
    the backend wait (all waiting before first scheduling). None without a change.

    Examples:
        >>> f = [(10.0, 20.0, 1.0, 10.0, 0.0, 0.0), (10.0, 14.0, 1.0, 5.0, 0.0, 1.0)]
        >>> pre_submission_share(f), pre_submission_share(f, with_backend_wait=True)
        (92.85714285714286, 100.0)
    """
    if not figs or any(f is None for f in figs):
        return None
    done = [f for f in figs if f is not None]
    d_lat = float(np.mean([f[1] - f[0] for f in done]))
    d_pre = float(np.mean([f[3] - f[2] for f in done]))
    if with_backend_wait:
        d_pre += float(np.mean([f[5] - f[4] for f in done]))
    return None if d_lat == 0 else 100.0 * d_pre / d_lat


def cohort_rows(results: Mapping[str, ScenarioResult]) -> list[Row]:
    """Paper rows of `finding_cohorts.yaml` (module docstring)."""
    rows = []
    mixed = _scenario(results, "cohort-mixed")
    setup = _our_setup(mixed, "; separate: 64 roots of one class")
    for cls, ratio_key, pre_key in (
        (LOOP, "loop_ratio", "loop_pre"),
        (SEQUENCE, "seq_ratio", "seq_pre"),
    ):
        figs = cohort_figures(results, cls)
        ratios = [None if f is None else _ratio(f[1], f[0]) for f in figs]
        rows.append(paper_row(COHORTS[ratio_key], setup, ratios))
        share = pre_submission_share(figs, with_backend_wait=True)
        rows.append(paper_row(COHORTS[pre_key], setup + WAIT_NOTE, [share]))
    return rows


def class_ratios(results: Mapping[str, ScenarioResult]) -> dict[str, Any]:
    """Every class's mixed / separate mean latency ratio and pre-submission share (detail)."""
    out: dict[str, Any] = {}
    for name in results:
        if not name.startswith("cohort-sep-"):
            continue
        cls = name.removeprefix("cohort-sep-")
        figs = cohort_figures(results, cls)
        out[cls] = {
            "ratio": [None if f is None else _ratio(f[1], f[0]) for f in figs],
            "pre_share_pct": pre_submission_share(figs),
            "pre_and_wait_share_pct": pre_submission_share(figs, with_backend_wait=True),
            "figures": figs,
        }
    return out
