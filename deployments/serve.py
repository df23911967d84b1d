"""Serve every scheduled suite in `deployments/suites/` (the same as `maserve bench serve`).

Run from anywhere: `python deployments/serve.py [demo|full]` (default `demo`); Ctrl-C stops.
Every suite file with a `schedule` is served, whatever its kind (replay, pool, hear); the shipped
finding suites run daily on staggered crons (each suite file's `schedule`). The code lives in
`maserve_prefect.bench.serve`; this file is only the repository's entry point.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from maserve_prefect import prefect_server
from maserve_prefect.bench.serve import check_servable, serve_suites
from maserve_prefect.errors import MaserveError

SUITES = Path(__file__).resolve().parent / "suites"


def main(argv: Sequence[str]) -> int:
    """Serve the suites at the scale `argv[0]` (default demo); returns the exit code."""
    scale = argv[0] if argv else "demo"
    try:
        check_servable(SUITES, scale)  # a bad scale or suite fails before a server starts
        with prefect_server.connected(prefect_server.ensure_server()):
            served = serve_suites(SUITES, scale)
    except MaserveError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"stopped serving {', '.join(served)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
