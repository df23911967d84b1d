"""Run the heterogeneous-GPU pool suite at a scale and print its tables.

Usage:
    python benchmarks/pool_suite.py [--suite deployments/suites/pool_hetero.yaml]
                                    [--scale demo|medium|full] [--out out/pool_suite]

Recording the native traces (once per workflow, session count and seed; cached under
`$MASERVE_HOME/pool_traces/`) runs Prefect flows, so the script connects to the configured
Prefect API or starts maserve's managed local server (`maserve_prefect.prefect_server`), as the
CLI does. Predictor fits, bucket tables and held-out scores are cached under
`$MASERVE_HOME/predictors/`. Prints every table (rich), the wall time of each phase, and writes
`<out>/<suite>-<scale>.json` and `.md`.

Scales (`deployments/suites/pool_hetero.yaml`): `demo` (CI: 12 sessions, 2 GPUs, 5 arms,
burst, one run), `medium` (the issue's 180 sessions on 8 x V100-32GB + 4 x A100-40GB, every arm
and arrival pattern, one run) and `full` (the same, five runs).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console

from maserve_prefect import prefect_server
from maserve_prefect.bench.pool.suite import run_pool_suite
from maserve_prefect.bench.pool.suite_file import load_pool_suite
from maserve_prefect.bench.pool.tables import render

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", type=Path, default=ROOT / "deployments/suites/pool_hetero.yaml")
    parser.add_argument("--scale", default="demo")
    parser.add_argument("--out", type=Path, default=Path("out/pool_suite"))
    args = parser.parse_args()
    console = Console(width=200)
    suite = load_pool_suite(args.suite)
    t0 = time.perf_counter()

    def progress(done: int, total: int, label: str) -> None:
        console.print(f"[{done}/{total}] {label}  ({time.perf_counter() - t0:.0f} s)")

    with prefect_server.connected(prefect_server.ensure_server()):
        res = run_pool_suite(suite, args.scale, progress=progress)
    render(res, console)
    js, md = res.write(args.out)
    phases = {k: v for k, v in res.seconds.items() if "/" not in k}
    arms = sum(v for k, v in res.seconds.items() if "/" in k)
    console.print(
        "wall seconds: "
        + ", ".join(f"{k} {v:.1f}" for k, v in phases.items())
        + f", pool runs {arms:.1f} ({len(res.runs)} runs)"
    )
    console.print(f"wrote {js} and {md}")


if __name__ == "__main__":
    main()
