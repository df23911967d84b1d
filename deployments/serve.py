"""Serve every scheduled suite in `deployments/suites/` (the same as `maserve bench serve`).

Run from anywhere: `python deployments/serve.py [demo|full]`. The code lives in
`maserve_prefect.bench.serve`; this file is only the repository's entry point.
"""

from __future__ import annotations

import sys
from pathlib import Path

from maserve_prefect import prefect_server
from maserve_prefect.bench.serve import serve_suites

if __name__ == "__main__":
    scale = sys.argv[1] if len(sys.argv) > 1 else "demo"
    with prefect_server.connected(prefect_server.ensure_server()):
        serve_suites(Path(__file__).resolve().parent / "suites", scale)
