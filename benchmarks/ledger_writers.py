"""Concurrent ledger writers: P processes record ops of their own runs into one ledger at once.

Each writer process opens the ledger, begins its own run and appends `--ops` model ops, each
with a data dependency on the previous one and two payloads, one transaction per append (as the
task runner records). All writers start at the same wall-clock instant. The parent then reopens
the ledger and checks that every append that returned is there and whole (ops, edges, payload
references, unique `(trace_id, op_id, attempt)`), and prints ops/s per backend: a SQLite file
(WAL, busy timeout) and a PostgreSQL server this script starts itself (`postgres_server`), or
one you name with `--postgres-url`. The ratio line compares the two in the same run.

    python benchmarks/ledger_writers.py --writers 4 --ops 500
    python benchmarks/ledger_writers.py --postgres-url postgresql+psycopg://me@db/maserve

`tests/trace/test_concurrent_writers.py` runs `run_writers` small on both backends.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func
from sqlmodel import Session, col, select

from maserve_prefect.trace.cas import ContentStore, sha256_hex
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import Dep, EdgeKind, Manifest, OpKind, OpRecord, RootRecord
from maserve_prefect.trace.tables import EdgeRow, OpRow, PayloadRefRow

START_DELAY_S = 10.0
"""Seconds between spawning the writers and their common start: enough to import the package."""
CHILD_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class WritersResult:
    """What one backend did: appends that returned, ops found, the busiest writer's time."""

    backend: str
    writers: int
    appended: int
    found_ops: int
    found_edges: int
    found_refs: int
    seconds: float

    @property
    def ops_per_s(self) -> float:
        return self.appended / self.seconds if self.seconds > 0 else float("nan")

    @property
    def lost(self) -> int:
        return self.appended - self.found_ops


def write_run(
    url: str, cas_dir: str, trace_id: str, n_ops: int, start_at: float
) -> tuple[int, float]:
    """One writer: its own run of `n_ops` chained ops; returns (appends returned, seconds)."""
    ledger = Ledger(url, ContentStore(Path(cas_dir)))
    ledger.begin_run(Manifest(trace_id=trace_id))
    ledger.add_root(trace_id, RootRecord(root_id="r"))
    prompt = f"prompt of {trace_id}".encode()
    time.sleep(max(0.0, start_at - time.time()))
    t0 = time.perf_counter()
    done = 0
    for k in range(1, n_ops + 1):
        out = f"{trace_id} output {k}".encode()
        deps = (Dep(op_id=f"r/{k - 1}", kind=EdgeKind.DATA),) if k > 1 else ()
        op = OpRecord(
            op_id=f"r/{k}",
            root_id="r",
            kind=OpKind.MODEL,
            deps=deps,
            input_refs=(sha256_hex(prompt),),
            output_ref=sha256_hex(out),
            num_input_tokens=100,
            num_output_tokens=k,
        )
        ledger.append_op(trace_id, op, payloads={sha256_hex(out): out, sha256_hex(prompt): prompt})
        done += 1
    seconds = time.perf_counter() - t0
    ledger.finish_run(trace_id)
    ledger.close()
    return done, seconds


def run_writers(
    url: str, cas_dir: Path, *, writers: int, n_ops: int, backend: str
) -> WritersResult:
    """Run `writers` processes at once against `url`; check and count what the ledger holds."""
    start_at = time.time() + START_DELAY_S
    tag = uuid.uuid4().hex[:8]
    jobs = [(url, str(cas_dir), f"w{i}-{tag}", n_ops, start_at) for i in range(writers)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", *map(str, job)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for job in jobs
    ]
    results: list[tuple[int, float]] = []
    for proc in procs:
        out, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
        if proc.returncode != 0:
            raise RuntimeError(f"writer exited with code {proc.returncode}: {err.strip()[-2000:]}")
        done, seconds = out.split()
        results.append((int(done), float(seconds)))
    ledger = Ledger(url, ContentStore(cas_dir))
    ids = [j[2] for j in jobs]
    with Session(ledger.engine) as s:
        counts = [
            s.exec(
                select(func.count()).select_from(table).where(col(table.trace_id).in_(ids))
            ).one()
            for table in (OpRow, EdgeRow, PayloadRefRow)
        ]
    ops, edges, refs = counts
    for trace_id in (j[2] for j in jobs):  # every run loads whole and in order
        trace = ledger.load_trace(trace_id)
        assert [o.op_id for o in trace.ops] == [f"r/{k}" for k in range(1, n_ops + 1)], trace_id
    ledger.close()
    return WritersResult(
        backend=backend,
        writers=writers,
        appended=sum(n for n, _ in results),
        found_ops=int(ops),
        found_edges=int(edges),
        found_refs=int(refs),
        seconds=max(t for _, t in results),
    )


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        url, cas_dir, trace_id, n_ops, start_at = sys.argv[2:7]
        done, seconds = write_run(url, cas_dir, trace_id, int(n_ops), float(start_at))
        print(done, seconds)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--ops", type=int, default=500, help="ops per writer")
    ap.add_argument("--postgres-url", help="use this server instead of starting one")
    args = ap.parse_args(argv)

    from maserve_prefect.postgres_server import LocalPostgres

    work = Path(tempfile.mkdtemp(prefix="maserve-writers-"))
    pg_root = Path(tempfile.mkdtemp(prefix="maserve-pg-"))
    server = None
    try:
        rows = []
        sqlite_url = f"sqlite:///{work / 'ledger.db'}"
        rows.append(
            run_writers(
                sqlite_url,
                work / "cas",
                writers=args.writers,
                n_ops=args.ops,
                backend="sqlite (WAL)",
            )
        )
        if args.postgres_url:
            pg_url = args.postgres_url
        else:
            server = LocalPostgres.start(pg_root)
            pg_url = server.create_database("writers")
        rows.append(
            run_writers(
                pg_url, work / "cas", writers=args.writers, n_ops=args.ops, backend="postgresql"
            )
        )
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(pg_root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.writers} writers x {args.ops} ops, one transaction per append")
    print(
        f"{'backend':<14} {'appended':>9} {'found':>7} {'lost':>5} {'edges':>7} {'refs':>7} {'s':>8} {'ops/s':>8}"
    )
    for r in rows:
        print(
            f"{r.backend:<14} {r.appended:>9} {r.found_ops:>7} {r.lost:>5} {r.found_edges:>7} "
            f"{r.found_refs:>7} {r.seconds:>8.2f} {r.ops_per_s:>8.1f}"
        )
    print(f"ratio postgresql / sqlite ops/s: {rows[1].ops_per_s / rows[0].ops_per_s:.2f}x")
    return 0 if all(r.lost == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
