"""Four processes record ops of their own runs into one ledger at once — a SQLite file (WAL,
busy timeout) and a real PostgreSQL server: every append that returned is there and whole.

Runs `benchmarks/ledger_writers.py`'s `run_writers` small; the benchmark prints ops/s."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "ledger_writers.py"
WRITERS = 4
OPS = 40


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ledger_writers", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_four_concurrent_writers_lose_nothing(durable_ledger_url: str, tmp_path: Path) -> None:
    bench = _bench()
    result = bench.run_writers(
        durable_ledger_url, tmp_path / "cas", writers=WRITERS, n_ops=OPS, backend="x"
    )
    assert result.appended == WRITERS * OPS
    assert result.lost == 0
    assert result.found_ops == WRITERS * OPS
    assert result.found_edges == WRITERS * (OPS - 1)  # one data edge per op after the first
    assert result.found_refs == WRITERS * OPS * 2  # its prompt and its output
