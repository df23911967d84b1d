"""Probe pool-suite arms decision by decision: lifecycle counts, residencies, waits, workflows.

The suite (`maserve bench run deployments/suites/pool_hetero.yaml`) reports outcomes; this script
shows why arms differ. It runs one (arrival pattern, run) of a scale for the named arms on the
suite's own recorded work, cost tables and replica sizing, and prints per arm:

- makespan, p95, loads / prefetches / unloads, fused chains, and the first lifecycle decision
  where the arm departs from the first arm listed;
- with `--residencies`: every load (model, device, load window, calls served, last completion);
- with `--waits`: re-acquire and load waits summed over calls, per-workflow mean / max session
  latency, and per-model mean wait and service time.

`--devices` replaces the scale's pool (e.g. `A100-40GB:0,V100-32GB:0,V100-32GB:1`). Recorded
traces must be cached under `$MASERVE_HOME/pool_traces/` (a suite run caches them) or a Prefect
API must be reachable.

    python benchmarks/pool_probe.py --scale full --pattern burst \\
        --arms joint,joint-no-fusion,joint-scalar-gbdt --residencies --waits
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path

from maserve_prefect.bench.pool.suite import cost_tables
from maserve_prefect.bench.pool.traces import record_traces
from maserve_prefect.bench.suite import load_suite
from maserve_prefect.errors import ConfigError
from maserve_prefect.pool.costs import cost_model_source
from maserve_prefect.pool.executor import run_pool
from maserve_prefect.pool.recorded import ARRIVAL_SEED, build_root_dags, recorded_roots
from maserve_prefect.pool.results import PoolRunResult

SUITE = Path(__file__).resolve().parents[1] / "deployments" / "suites" / "pool_hetero.yaml"


def short(name: str) -> str:
    return name.removeprefix("Qwen3-")


def summary(arm: str, r: PoolRunResult, first: list[tuple[str, str, str]] | None) -> str:
    loads = [e for e in r.lifecycle if e.action == "load"]
    seq = [(e.action, short(e.deployment), e.device) for e in r.lifecycle]
    chains = Counter(o.chain for o in r.ops if o.chain)
    fused = [c for c in chains.values() if c > 1]
    diverge = "-"
    if first is not None:
        for i, (x, y) in enumerate(zip(first, seq, strict=False)):
            if x != y:
                diverge = f"#{i}: {' '.join(x)} -> {' '.join(y)}"
                break
    return (
        f"{arm:20s} makespan {r.makespan_s:7.1f}  p95 {r.p95_latency_s:7.1f}  "
        f"loads {len(loads):3d}  prefetch {sum(e.prefetch for e in loads):3d}  "
        f"unloads {sum(e.action == 'unload' for e in r.lifecycle):3d}  "
        f"fused chains {len(fused):4d} ({sum(fused)} calls)  first difference {diverge}"
    )


def residencies(r: PoolRunResult) -> list[str]:
    out = []
    for e in (e for e in r.lifecycle if e.action == "load"):
        ops = [o for o in r.ops if o.replica == e.replica]
        head = f"    {short(e.deployment):5s} {e.device:13s} load {e.start_s:6.1f}-{e.end_s:6.1f}"
        if not ops:
            out.append(f"{head}  unused{'  (prefetch)' if e.prefetch else ''}")
            continue
        out.append(
            f"{head}  calls {len(ops):4d}  first {min(o.submitted_s for o in ops):6.1f}  "
            f"last {max(o.completed_s for o in ops):6.1f}{'  (prefetch)' if e.prefetch else ''}"
        )
    return out


def waits(r: PoolRunResult, workflow_of: dict[str, str]) -> list[str]:
    reacq = [o.reacquire_s for o in r.ops if o.reacquire_s > 0]
    out = [
        f"    re-acquire: {len(reacq)} calls, {sum(reacq):.1f} s; load waits "
        f"{sum(o.wait_load_s for o in r.ops):.1f} s; other waits "
        f"{sum(o.wait_other_s for o in r.ops):.1f} s"
    ]
    by_wf: dict[str, list[float]] = {}
    for root, lat in r.root_latency_s.items():
        by_wf.setdefault(workflow_of.get(root, "?"), []).append(lat)
    for wf, lats in sorted(by_wf.items()):
        out.append(
            f"    {wf:22s} sessions {len(lats):3d}  mean {statistics.mean(lats):6.1f}  "
            f"max {max(lats):6.1f}"
        )
    per: dict[str, list[float]] = {}
    for o in r.ops:
        acc = per.setdefault(short(o.deployment), [0.0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += o.submitted_s - o.ready_s
        acc[2] += o.completed_s - o.submitted_s
    for m, (n, w, sv) in sorted(per.items()):
        out.append(f"    {m:5s} calls {int(n):4d}  mean wait {w / n:6.1f}  service {sv / n:6.1f}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", type=Path, default=SUITE)
    ap.add_argument("--scale", default="full")
    ap.add_argument("--pattern", default="burst", help="an arrival pattern of the suite")
    ap.add_argument("--run", type=int, default=0, help="arrival seed index (0 = seed 42)")
    ap.add_argument("--arms", default="joint,joint-no-fusion,joint-no-prefetch,joint-formula,"
                    "joint-scalar-gbdt")  # fmt: skip
    ap.add_argument("--devices", default="", help="comma-separated devices replacing the pool")
    ap.add_argument("--residencies", action="store_true")
    ap.add_argument("--waits", action="store_true")
    args = ap.parse_args(argv)
    try:
        suite = load_suite(args.suite)
        sc = suite.scale(args.scale)
        arms = [a.strip() for a in args.arms.split(",") if a.strip()]
        unknown = [a for a in arms if a not in suite.arms]
        if unknown or args.pattern not in suite.arrivals:
            raise ConfigError(
                f"unknown arm(s) {unknown} or pattern {args.pattern!r}; the suite has arms "
                f"{sorted(suite.arms)} and patterns {sorted(suite.arrivals)}"
            )
        spec = suite.training_spec(sc)
        rows = cost_model_source().training_rows(spec)
        roots = recorded_roots(record_traces(suite.workflows, sc.sessions_per_workflow,
                                             ARRIVAL_SEED))  # fmt: skip
        costs = cost_tables(suite, arms, roots, rows, sc, spec.num_trees)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    devices = [d for d in args.devices.split(",") if d] or sc.device_names()
    workflows = build_root_dags(roots, suite.arrivals[args.pattern].pattern(), args.run)
    workflow_of = {r.root_id: r.workflow for r in roots}
    sizing = suite.sizing(sc)
    print(f"{args.scale} / {args.pattern} / run {args.run} on {len(devices)} devices")
    first: list[tuple[str, str, str]] | None = None
    for arm in arms:
        a = suite.arms[arm]
        r = run_pool(workflows, devices, a.plan, costs=costs[a.predictor],
                     options=a.options(sizing))  # fmt: skip
        print(summary(arm, r, first))
        if first is None:
            first = [(e.action, short(e.deployment), e.device) for e in r.lifecycle]
        if args.residencies:
            print("\n".join(residencies(r)))
        if args.waits:
            print("\n".join(waits(r, workflow_of)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
