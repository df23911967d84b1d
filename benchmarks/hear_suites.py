"""Run the HEAR suites and print their tables: `python benchmarks/hear_suites.py --scale demo`.

Writes `<out>/hear_<suite>_<scale>.json` and `.md` (and the recorded workloads as JSONL).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from maserve_prefect.bench.hear.mooncake_suite import run_mooncake
from maserve_prefect.bench.hear.role_modes import run_role_modes
from maserve_prefect.bench.hear.scbench_suite import run_scbench

SUITES = {"scbench": run_scbench, "mooncake": run_mooncake, "role_modes": run_role_modes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scale", choices=("demo", "full"), default="demo")
    ap.add_argument("--suite", choices=(*SUITES, "all"), default="all")
    ap.add_argument("--out", type=Path, default=Path("out/hear_suites"))
    args = ap.parse_args()
    names = list(SUITES) if args.suite == "all" else [args.suite]
    for name in names:
        t0 = time.perf_counter()
        report = SUITES[name](scale=args.scale, out_dir=args.out)
        print(report.text)
        print(f"\n({name} {args.scale}: {time.perf_counter() - t0:.1f} s wall; "
              f"wrote {', '.join(str(p) for p in report.files)})\n")  # fmt: skip


if __name__ == "__main__":
    main()
