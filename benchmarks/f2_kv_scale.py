"""Finding 2 with KV budgets scaled to the simulated cohort's state: a calibration on the baseline arm.

SUPERSEDED (2026-12-02): with the bindings' lengths fitted to App. G.5 (main 219a4bf) KV binds at the
paper's own 16 / 32 / 40 GiB (finding_kv_budget at full scale: peak KV 16.0 / 32.0 / 39.9 GiB,
638-680 preemptions per block at 32 GiB), so the suite runs the paper's budgets unscaled; this
script documents the calibration made on the earlier, shorter workload and is no longer reported.

Why: on the simulator the MIX7 cohort's peak KV state is 10.6–12.5 GiB (finding_kv_budget at full
scale), under even the paper's smallest budget, so 16 / 32 / 40 GiB never bind and the paper's
pressure cannot appear. The paper's baseline row — the 32 GiB arm, the paper's serving setup as
written, the only budget with a published absolute level (Table F.3: prefill factor 1.76–1.84
at 31.99 GiB) — fixes one unstated quantity: how the paper's budget relates to the cohort's state.
This script chooses a scale `s` on that baseline arm ONLY (block 0; the grid is printed), freezes
it, and then runs the paper's three arms at `s × 16 / 32 / 40 GiB` on every block. The 16 and
40 GiB arms are never looked at while choosing `s`.

    PYTHONPATH=. python benchmarks/f2_kv_scale.py            # full scale: 3 blocks × 64 roots
    PYTHONPATH=. python benchmarks/f2_kv_scale.py --scale demo

Prints one line per sweep point and per (block, arm), then the paper rows (`finding_f2`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from maserve_prefect.bench.replay import finding_f2
from maserve_prefect.bench.replay.suite_file import ReplaySuite
from maserve_prefect.bench.suite import load_suite
from maserve_prefect.replay.arms import ScenarioResult, run_arm
from maserve_prefect.replay.scenario import Arm, DeploymentOverride
from maserve_prefect.replay.traceset import build_trace_set

SUITE = Path(__file__).resolve().parents[1] / "deployments" / "suites" / "finding_kv_budget.yaml"
BASELINE_GIB = 32.0
TARGET_FACTOR = 1.80  # midpoint of the paper's 1.76–1.84 (Table F.3)
GRID_GIB = (4.0, 5.0, 6.0, 7.0, 8.0, 10.0)  # candidate baseline budgets (× 32 GiB = s)


def _arm(name: str, gib: float) -> Arm:
    return Arm(
        name=name,
        pool=Path("pool_910c_qwen3_8b.yaml"),
        overrides={"main": DeploymentOverride(kv_cache_gib=round(gib, 3))},
    )


def main(scale: str = "full") -> None:
    suite = load_suite(SUITE)
    assert isinstance(suite, ReplaySuite)
    sweeps = [s for s in suite.load_scenarios(scale) if len(s.arms) == 3]
    t0 = time.monotonic()
    sets = [build_trace_set(s) for s in sweeps]
    print(f"native captures: {len(sets)} blocks, {time.monotonic() - t0:.0f} s", flush=True)

    def figures(block: int, gib: float) -> finding_f2.BlockFigures:
        sc, ts = sweeps[block], sets[block]
        run = run_arm(sc, ts, _arm(f"kv{gib:g}", gib), 0, {})
        return finding_f2.block_figures(ScenarioResult(sc, ts, {}, {}), run)

    best: tuple[float, float] | None = None
    for gib in GRID_GIB:  # the baseline arm of block 0 only
        f = figures(0, gib)
        print(
            f"sweep baseline {gib:g} GiB (s = {gib / BASELINE_GIB:.4f}): factor "
            f"{f.prefill_factor:.3f}, {f.preemptions} preemptions, P95 {f.root_p95_s:.1f} s",
            flush=True,
        )
        miss = abs(f.prefill_factor - TARGET_FACTOR)
        if best is None or miss < best[1]:
            best = (gib, miss)
    assert best is not None
    s = best[0] / BASELINE_GIB
    print(f"frozen: s = {s:.4f} (baseline {best[0]:g} GiB)", flush=True)
    blocks = []
    for b in range(len(sweeps)):
        figs = {}
        for paper_gib in (16.0, 32.0, 40.0):
            figs[paper_gib] = f = figures(b, s * paper_gib)
            print(
                f"block {b} paper {paper_gib:g} GiB -> {s * paper_gib:.3f} GiB: factor "
                f"{f.prefill_factor:.3f}, {f.preemptions} preemptions, P95 {f.root_p95_s:.1f} s, "
                f"peak KV {f.peak_context_gib:.2f} GiB",
                flush=True,
            )
        blocks.append(figs)
    setup = f"sim MIX7 64 roots, burst, budgets scaled by s = {s:.4f}, {len(blocks)} blocks"
    for row in finding_f2.figure_rows(blocks, [], sweep_setup=setup)[:5]:
        print(
            f"{row['figure']}: paper {row['paper']:.4g}, ours {row['measured']} "
            f"[{row['measured_range']}] -> {row['verdict']}"
        )
    print(f"wall {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main(sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--scale" else "full")
