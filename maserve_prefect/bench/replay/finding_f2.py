"""Finding 2, KV pressure and task tails (MAServeBench §6.4, Fig. 9, App. F.1, Tables F.3 / F.4).

One idea: the paper's two measurements of state pressure, each read per paired block and then
reported as the median and range across blocks (`bench.replay.paper.paper_row`):

- **Fixed-work KV-budget replay** (Fig. 9 b, c; App. F.1): the MIX7 cohort's 64 roots replayed at
  16 / 32 / 40 GiB with identical arrivals, payloads, lengths and dependencies. Per block, the
  40 / 16 GiB ratio of the processed / source prefill factor (`metrics.engine.prefill_factor`)
  and of the root P95 become a change in percent (the paper: ratios 0.470–0.491 and 0.822–0.825,
  medians −51.97 % and −17.49 %), and the preemption count must fall from 16 to 40 GiB in every
  paired block.
- **Native state pressure at the base pool** (Fig. 9 a; Table F.3): the mixed cohort at 31.99 GiB
  records 431–471 preemptions per block (1,372 over three) and a prefill factor of 1.76–1.84;
  Loop-only blocks record zero preemptions and a factor of one.

Root P95 is the paper's estimator for this study (App. F.1): the sorted latency at zero-based
index ⌈0.95 (n − 1)⌉ (`paper_p95`; index 60 for 64 roots), over every root of the trace set that
completed.

Which scenario is which (`fn(results)` gets scenario name → result):

- a *KV sweep* is a scenario whose arms set at least two distinct `kv_cache_gib`; block `b` of
  every sweep scenario is one paired block (a suite may also give one scenario per block: the
  blocks are then the scenarios' blocks in suite order);
- the *native mixed* row reads the sweep's arm at `NATIVE_GIB` (32 GiB: the paper's 31.99 GiB
  allocated pool, rounded as `pool_910c_qwen3_8b.yaml` rounds it);
- a *Loop-only* scenario is one whose cohorts are all `LOOP_WORKFLOW` roots.

Examples:
    >>> paper_p95([float(i) for i in range(64)])
    60.0
    >>> paper_p95([]) is None
    True
    >>> change_pct(0.5, 1.0), change_pct(1.0, 0.0)
    (-50.0, None)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

from maserve_prefect.bench.replay import block_figures as bf
from maserve_prefect.bench.replay.block_figures import Row
from maserve_prefect.bench.replay.findings import kv_gib_of
from maserve_prefect.bench.replay.paper import PaperFigure, paper_row
from maserve_prefect.engines.catalog.models import get_model
from maserve_prefect.replay.arms import ArmResult, ScenarioResult
from maserve_prefect.replay.driver import ReplayRun

NATIVE_GIB = 32.0
"""The KV budget of the native-pressure rows: the paper's 31.99 GiB pool as the pool file rounds it."""

LOW_GIB, HIGH_GIB = 16.0, 40.0
"""The budgets the paper's changes compare (16 → 40 GiB)."""

MODEL = "qwen3-8b"
"""The paper's model (Qwen3-8B: 144 KiB of KV per token), for `peak_context_gib`."""

LOOP_WORKFLOW = "refinement_loop"
"""The paper's Loop structure (the Loop-only control of Table F.3)."""

_SETUP = (
    "Qwen3-8B/910C, MIX7 (10 Spawn + 9 × six classes = 64 roots), limit 128, prefix caching off, "
    "8,192 model length and batched tokens"
)

FACTOR_CHANGE = PaperFigure(
    "F2 KV pressure",
    "processed/source prefill factor change 16→40 GiB (%)",
    -51.97,
    f"{_SETUP}; fixed-work replay at 16/32/40 GiB, 3 paired blocks",
    "§6.4 Fig. 9(b); App. F.1",
)
P95_CHANGE = PaperFigure(
    "F2 KV pressure",
    "root P95 change 16→40 GiB (%)",
    -17.49,
    f"{_SETUP}; fixed-work replay at 16/32/40 GiB, 3 paired blocks; P95 = index ⌈.95(n−1)⌉",
    "§6.4 Fig. 9(c); App. F.1",
)
FEWER_PREEMPTIONS = PaperFigure(
    "F2 KV pressure",
    "blocks with fewer preemptions at 40 than at 16 GiB (1 = yes)",
    1.0,
    f"{_SETUP}; fixed-work replay, every paired block",
    "§6.4; App. F.1, Table F.4",
    kind="value",
)
NATIVE_PREEMPTIONS = PaperFigure(
    "F2 KV pressure",
    "mixed-cohort preemptions per block at 31.99 GiB",
    1372 / 3,
    f"{_SETUP}; native, 31.99 GiB; 431–471 per block, 1,372 over 3 blocks (paper value: mean)",
    "§6.4 Fig. 9(a); App. F, Table F.3",
    kind="value",
)
NATIVE_FACTOR = PaperFigure(
    "F2 KV pressure",
    "mixed-cohort processed/source prefill factor at 31.99 GiB (×)",
    1.80,
    f"{_SETUP}; native, 31.99 GiB; 1.76–1.84 across 3 blocks (paper value: midpoint)",
    "§6.4; App. F, Table F.3",
    kind="ratio",
)
LOOP_PREEMPTIONS = PaperFigure(
    "F2 KV pressure",
    "Loop-only preemptions per block at 31.99 GiB",
    0.0,
    "Qwen3-8B/910C, 64 Loop roots, limit 128, prefix caching off; native, 31.99 GiB",
    "§6.4; App. F, Table F.3",
    kind="value",
)
LOOP_FACTOR = PaperFigure(
    "F2 KV pressure",
    "Loop-only processed/source prefill factor at 31.99 GiB (×)",
    1.0,
    "Qwen3-8B/910C, 64 Loop roots, limit 128, prefix caching off; native, 31.99 GiB",
    "§6.4; App. F, Table F.3",
    kind="value",
)

FIGURES: tuple[PaperFigure, ...] = (
    FACTOR_CHANGE,
    P95_CHANGE,
    FEWER_PREEMPTIONS,
    NATIVE_PREEMPTIONS,
    NATIVE_FACTOR,
    LOOP_PREEMPTIONS,
    LOOP_FACTOR,
)
"""Every paper figure this finding reproduces, in table order."""


def paper_p95(latencies: Sequence[float]) -> float | None:
    """The paper's root P95 for this study: the sorted latency at index ⌈0.95 (n − 1)⌉."""
    if not latencies:
        return None
    ordered = sorted(latencies)
    return ordered[math.ceil(0.95 * (len(ordered) - 1))]


def change_pct(after: float | None, before: float | None) -> float | None:
    """100 (after / before − 1); None when either is missing or `before` is 0."""
    if after is None or before is None or before == 0:
        return None
    return 100.0 * (after / before - 1.0)


@dataclass(frozen=True, slots=True)
class BlockFigures:
    """One arm in one block: what the finding reads of it."""

    prefill_factor: float
    preemptions: int
    root_p95_s: float | None
    completed: int
    roots: int
    peak_running: int
    peak_context_gib: float = float("nan")


def block_figures(result: ScenarioResult, run: ArmResult) -> BlockFigures:
    """The figures of one arm run (every root of the trace set; `paper_p95` of the completed)."""
    outcomes = bf.measured_outcomes(result, run.run)
    lats = bf.latencies(outcomes)
    return BlockFigures(
        prefill_factor=bf.run_prefill_factor(run.run),
        preemptions=bf.num_preemptions(run.run),
        root_p95_s=paper_p95(lats),
        completed=len(lats),
        roots=len(outcomes),
        peak_running=bf.peak_running_seqs(run.run),
        peak_context_gib=peak_context_gib(run.run),
    )


def peak_context_gib(run: ReplayRun, model: str = MODEL) -> float:
    """The largest KV state one engine step of `run` held for its scheduled requests: the sum of
    their contexts (computed + new tokens) × `model`'s KV bytes per token, in GiB. Requests
    preempted or waiting hold none, so at a budget that binds this stays just under it; well
    under the budget, the cohort's state never pressed on it."""
    per_token = get_model(model).kv_bytes_per_token
    tokens = max(
        (
            sum(t.num_computed_before + t.num_new_tokens for t in r.scheduled)
            for r in run.step_records()
        ),
        default=0,
    )
    return tokens * per_token / 2**30


def _sweep_arms(result: ScenarioResult) -> dict[float, str]:
    """KV budget → arm name, for a scenario whose arms set ≥ 2 distinct budgets (else {})."""
    arms = {kv_gib_of(a.overrides): a.name for a in result.scenario.arms}
    budgets = {kv: name for kv, name in arms.items() if kv is not None}
    return budgets if len(budgets) >= 2 else {}


def _is_loop_only(result: ScenarioResult) -> bool:
    return all(
        c.native is not None and c.native.workflow == LOOP_WORKFLOW for c in result.scenario.cohorts
    )


def sweep_blocks(results: Mapping[str, ScenarioResult]) -> list[dict[float, BlockFigures]]:
    """Every paired block of every KV-sweep scenario (suite order, then block order): budget →
    that arm's figures in that block."""
    blocks: list[dict[float, BlockFigures]] = []
    for result in results.values():
        arms = _sweep_arms(result)
        if not arms:
            continue
        by_arm = result.by_arm()
        for b in range(result.scenario.blocks):
            blocks.append({kv: block_figures(result, by_arm[name][b]) for kv, name in arms.items()})
    return blocks


def loop_blocks(results: Mapping[str, ScenarioResult]) -> list[BlockFigures]:
    """Every block of the Loop-only scenarios' arm at `NATIVE_GIB` (or their only arm)."""
    out: list[BlockFigures] = []
    for result in results.values():
        if _sweep_arms(result) or not _is_loop_only(result):
            continue
        arms = result.scenario.arms
        arm = next((a for a in arms if kv_gib_of(a.overrides) == NATIVE_GIB), arms[0])
        out += [block_figures(result, r) for r in result.by_arm()[arm.name]]
    return out


def _our_setup(results: Mapping[str, ScenarioResult], which: str) -> str:
    """Our setup in a line: the first matching scenario's pool, roots and arrivals, and the
    blocks of every matching scenario together (a suite may give one scenario per block)."""
    matching = [
        r
        for r in results.values()
        if bool(_sweep_arms(r)) == (which == "sweep") and (which != "loop" or _is_loop_only(r))
    ]
    if not matching:
        return "not run"
    first, s = matching[0], matching[0].scenario
    pool = s.arms[0].pool.name if s.arms[0].pool else "default pool"
    roots = "/".join(str(n) for n in sorted({len(r.trace_set.slots) for r in matching}))
    budgets = "/".join(f"{kv:g}" for kv in sorted(_sweep_arms(first))) or "the pool's"
    blocks = sum(r.scenario.blocks for r in matching)
    return (
        f"sim, {pool}, {roots} roots, {s.arrivals.kind} arrivals, {s.lock}-locked replay at "
        f"{budgets} GiB, {blocks} block(s)"
    )


def kv_pressure_rows(results: Mapping[str, ScenarioResult]) -> list[Row]:
    """The suite's `analysis:` hook: `figure_rows` of the sweep and Loop-only blocks.

    Examples:
        >>> [r["verdict"] for r in kv_pressure_rows({})][:2]
        ['no value', 'no value']
    """
    return figure_rows(
        sweep_blocks(results),
        loop_blocks(results),
        sweep_setup=_our_setup(results, "sweep"),
        loop_setup=_our_setup(results, "loop"),
    )


def figure_rows(
    blocks: Sequence[Mapping[float, BlockFigures]],
    loops: Sequence[BlockFigures],
    *,
    sweep_setup: str = "",
    loop_setup: str = "",
) -> list[Row]:
    """The finding's paper rows (`FIGURES` order), then one detail row per (block, budget) of the
    sweep (the last of a block says whether factor and P95 fall monotonically with the budget)
    and per Loop-only block. A block without a 16 or 40 GiB arm has no value for the changes.

    Examples:
        >>> f = lambda pf, n, p95: BlockFigures(pf, n, p95, 64, 64, 128)
        >>> rows = figure_rows([{16.0: f(2.0, 400, 100.0), 40.0: f(1.0, 10, 80.0)}], [])
        >>> [(round(r["measured"], 6), r["verdict"]) for r in rows[:3]]
        [(-50.0, 'reproduced'), (-20.0, 'reproduced'), (1.0, 'reproduced')]
    """
    factor: list[float | None] = []
    p95: list[float | None] = []
    fewer: list[float | None] = []
    native_pre: list[float | None] = []
    native_factor: list[float | None] = []
    for b in blocks:
        lo, hi, mid = b.get(LOW_GIB), b.get(HIGH_GIB), b.get(NATIVE_GIB)
        factor.append(change_pct(hi.prefill_factor, lo.prefill_factor) if lo and hi else None)
        p95.append(change_pct(hi.root_p95_s, lo.root_p95_s) if lo and hi else None)
        fewer.append(float(hi.preemptions < lo.preemptions) if lo and hi else None)
        native_pre.append(float(mid.preemptions) if mid else None)
        native_factor.append(mid.prefill_factor if mid else None)
    native_setup = f"{sweep_setup}; its {NATIVE_GIB:g} GiB arm"
    rows = [
        paper_row(FACTOR_CHANGE, sweep_setup, factor),
        paper_row(P95_CHANGE, sweep_setup, p95),
        paper_row(FEWER_PREEMPTIONS, sweep_setup, fewer),
        paper_row(NATIVE_PREEMPTIONS, native_setup, native_pre),
        paper_row(NATIVE_FACTOR, native_setup, native_factor),
        paper_row(LOOP_PREEMPTIONS, loop_setup, [float(x.preemptions) for x in loops]),
        paper_row(LOOP_FACTOR, loop_setup, [x.prefill_factor for x in loops]),
    ]
    for i, b in enumerate(blocks):
        for kv in sorted(b):
            rows.append(_detail(f"sweep block {i}", kv, b[kv]))
        rows[-1]["monotone_in_budget"] = monotone(b)
    for i, x in enumerate(loops):
        rows.append(_detail(f"loop-only block {i}", NATIVE_GIB, x))
    return rows


def _detail(what: str, kv: float, f: BlockFigures) -> Row:
    """A detail row: its figures as columns, and in words under `our_setup` (the table's
    columns are the paper rows')."""
    p95 = "none" if f.root_p95_s is None else f"{f.root_p95_s:.1f} s"
    return {
        "finding": "F2 detail",
        "figure": f"{what} at {kv:g} GiB",
        "our_setup": (
            f"factor {f.prefill_factor:.3f}, {f.preemptions} preemptions, P95 {p95}, "
            f"{f.completed}/{f.roots} roots, peak {f.peak_running} seqs, "
            f"peak KV {f.peak_context_gib:.1f} GiB"
        ),
        "kv_cache_gib": kv,
        "prefill_factor": f.prefill_factor,
        "preemptions": f.preemptions,
        "root_p95_s": f.root_p95_s,
        "completed_roots": f"{f.completed}/{f.roots}",
        "peak_running_seqs": f.peak_running,
        "peak_context_gib": f.peak_context_gib,
    }


def monotone(b: Mapping[float, BlockFigures]) -> bool:
    """Whether the prefill factor and root P95 both fall (non-strictly) as the budget grows
    (the paper: "both quantities decrease monotonically from 16 through 32 to 40 GiB")."""
    ordered = [b[kv] for kv in sorted(b)]
    pairs = list(pairwise(ordered))
    return all(
        y.prefill_factor <= x.prefill_factor
        and x.root_p95_s is not None
        and y.root_p95_s is not None
        and y.root_p95_s <= x.root_p95_s
        for x, y in pairs
    )
