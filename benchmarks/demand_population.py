"""The paper's demand population realized natively on the simulator, beside the paper's figures.

Realizes (1) App. G.5's fixed population — 62 Loop roots over the three target bindings, one
Spawn, one Fork–Join — and (2) each of the seven structures under every shipped binding, on the
paper's 910C serving setup (`pool_910c_qwen3_8b.yaml`: 8,192 model length), and prints per
population: calls per root, input and output tokens per call (mean, P50, P90) and the largest
input + output of a call, beside the paper's stated figures with ratios
(`maserve_prefect.bench.replay.demand_population`).

    PYTHONPATH=. python benchmarks/demand_population.py                 # G.5 (64 roots) + 7 × 6
    PYTHONPATH=. python benchmarks/demand_population.py --users 2 --g5-users 21
    PYTHONPATH=. python benchmarks/demand_population.py --g5-only

Native runs record on the managed local Prefect server (`prefect_server.recording_api`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from maserve_prefect.bindings import list_bindings

from maserve_prefect.bench.replay import demand_population as dp
from maserve_prefect.engines.poolfile import PoolFile, load_pool_file
from maserve_prefect.prefect_server import recording_api
from maserve_prefect.taskrunner.native import run_native
from maserve_prefect.trace.model import OpKind

POOL = Path(__file__).resolve().parents[1] / "deployments/suites/scenarios/pool_910c_qwen3_8b.yaml"


def realize(cohort: dp.Cohort, pool: PoolFile, seed: int) -> list[list[dp.Call]]:
    """Each realized root's model calls as (input, output) tokens, in op order."""
    run = run_native(cohort.workflow, cohort.binding, users=cohort.users, seed=seed, pool=pool)
    errors = [r.error for r in run.roots if r.error]
    if errors:
        raise SystemExit(
            f"{cohort.workflow}/{cohort.binding}: {len(errors)} roots failed: {errors[0]}"
        )
    by_root: dict[str, list[dp.Call]] = {r.root_id: [] for r in run.trace.roots}
    for op in run.trace.ops:
        if op.kind is OpKind.MODEL:
            by_root.setdefault(op.root_id, []).append((op.num_input_tokens, op.num_output_tokens))
    return list(by_root.values())


def _print(table: list[list[str]]) -> None:
    head = ["population", "figure", "ours", "paper", "ours/paper"]
    widths = [max(len(r[i]) for r in [head, *table]) for i in range(len(head))]
    for r in [head, *table]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=2, help="roots per structure × binding")
    ap.add_argument("--g5-users", type=int, default=21, help="Loop roots per G.5 binding")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pool", type=Path, default=POOL)
    ap.add_argument("--g5-only", action="store_true")
    args = ap.parse_args(argv)
    pool = load_pool_file(args.pool)
    t0 = time.monotonic()
    table: list[list[str]] = []
    with recording_api():
        g5 = {c: realize(c, pool, args.seed) for c in dp.g5_cohorts(args.g5_users)}
        table += dp.rows("G.5 population (64 roots)", dp.weighted_stats(g5), dp.g5_paper())
        if not args.g5_only:
            for wf in dp.STRUCTURES:
                roots = [
                    r
                    for b in list_bindings()
                    for r in realize(dp.Cohort(wf, b, args.users, args.users), pool, args.seed)
                ]
                table += dp.rows(wf, dp.call_stats(roots), dp.structure_paper(wf))
    print(f"pool {args.pool.name}; seed {args.seed}; wall {time.monotonic() - t0:.0f} s")
    _print(table)


if __name__ == "__main__":
    main(sys.argv[1:])
