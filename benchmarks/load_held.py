"""Load held (issue 19 point 4): many roots through Prefect, a 100,000-op replay.

Two experiments, each run through the real commands so what is measured is what a user runs:

`roots`: `maserve run WORKFLOW --users N` — N roots released at once through
`MAServeTaskRunner` on the simulator against a Prefect server (the managed local server, on its
SQLite database or, with `--postgres`, on a PostgreSQL server this script starts; the ledger on
the same server then). The command itself checks Prefect's history against the ledger op for
op (exit 3 otherwise); this script then counts task runs in Prefect's API and ops in the ledger
and prints both, with the command's wall time and peak memory (the CLI process; the Prefect
server's own memory is printed from /proc while it still runs).

`replay`: a Mooncake-format trace tiled to at least `--ops` requests (each copy of the shared
synthetic trace shifted past the previous one's last arrival, hash ids kept), imported with
`maserve trace import-mooncake`, then replayed with `maserve replay` on the simulator (8 H100
replicas, DAG release, length-locked) without Prefect; prints the conformance audit (release
lateness p50 / p99 / max on the driver's clock, incomplete / failed / early ops), the bundle
sizes and the wall time and peak memory of import and replay.

    python benchmarks/load_held.py roots --users 1000 [--postgres]
    python benchmarks/load_held.py replay --ops 100000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACE = ROOT.parent / "shared" / "data" / "traces" / "mooncake_synthetic_trace.jsonl"
MAX_MODEL_LEN = 1_048_576  # the shared trace's longest prompts exceed Qwen3-8B's window


def _maserve() -> str:
    return str(Path(sys.executable).with_name("maserve"))


def _timed(cmd: list[str], env: dict[str, str], log: Path) -> tuple[int, float, float]:
    """Run `cmd`; return (exit code, wall s, peak RSS MiB of the children so far)."""
    t0 = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return proc.returncode, wall, peak


def _du_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def _prefect_task_runs(api_url: str, flow_run_ids: list[str]) -> int:
    import httpx

    total = 0
    with httpx.Client(base_url=api_url, timeout=60) as client:
        for fr in flow_run_ids:
            r = client.post("/task_runs/count", json={"flow_runs": {"id": {"any_": [fr]}}})
            r.raise_for_status()
            total += int(r.json())
    return total


def roots(args: argparse.Namespace) -> int:
    from maserve_prefect.trace.cas import MemoryStore
    from maserve_prefect.trace.ledger import Ledger

    work = Path(tempfile.mkdtemp(prefix="maserve-load-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_")}
    env.update(MASERVE_HOME=str(work / "home"), PREFECT_HOME=str(work / "prefect-client"))
    ledger_url = f"sqlite:///{work / 'ledger.db'}"
    server = None
    pg_root = Path(tempfile.mkdtemp(prefix="maserve-pg-"))
    try:
        if args.postgres:
            from maserve_prefect.postgres_server import LocalPostgres

            server = LocalPostgres.start(pg_root)
            ledger_url = server.create_database("ledger")
            server.create_database("prefect")
            env["PREFECT_API_DATABASE_CONNECTION_URL"] = server.url("prefect", driver="asyncpg")
        cmd = [_maserve(), "run", args.workflow, "--users", str(args.users), "--ledger", ledger_url]
        cmd += ["--out", str(work / "bundle"), "--wait", str(args.wait)]
        code, wall, peak = _timed(cmd, env, work / "run.log")
        state = json.loads((work / "home" / "prefect" / "server.json").read_text())
        server_rss = _rss_mib(int(state["pid"]))
        with Ledger(ledger_url, MemoryStore()) as ledger:
            (info,) = ledger.list_runs()
            ops = len(ledger.load_trace(info.trace_id).ops)
            flow_runs = sorted(
                {
                    link.flow_run_id
                    for link in ledger.prefect_links(info.trace_id)
                    if link.flow_run_id
                }
            )
        task_runs = _prefect_task_runs(state["url"], flow_runs)
        print(
            f"maserve run {args.workflow} --users {args.users} "
            f"({'PostgreSQL' if args.postgres else 'SQLite'} Prefect server and ledger)"
        )
        print(
            f"  exit code {code}; wall {wall:.1f} s; CLI peak RSS {peak:.0f} MiB; "
            f"Prefect server RSS at the end {server_rss:.0f} MiB"
        )
        print(
            f"  ledger ops {ops}; Prefect task runs of its {len(flow_runs)} flow runs {task_runs}; "
            f"equal: {ops == task_runs}"
        )
        if code != 0:
            print((work / "run.log").read_text()[-3000:])
        return 0 if code == 0 and ops == task_runs else 1
    finally:
        subprocess.run([_maserve(), "server", "stop"], env=env, capture_output=True, check=False)
        if server is not None:
            server.stop()
        shutil.rmtree(pg_root, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def tile_trace(src: Path, dest: Path, min_ops: int) -> int:
    """Copies of `src` one after another (timestamps shifted past the last arrival + 1 s)."""
    rows = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    span_ms = max(r["timestamp"] for r in rows) + 1000
    n = 0
    with dest.open("w") as out:
        copy = 0
        while n < min_ops:
            for r in rows:
                out.write(json.dumps({**r, "timestamp": r["timestamp"] + copy * span_ms}) + "\n")
                n += 1
            copy += 1
    return n


def replay(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="maserve-replay-load-"))
    env = dict(os.environ, MASERVE_HOME=str(work / "home"))
    try:
        n = tile_trace(SHARED_TRACE, work / "trace.jsonl", args.ops)
        code, imp_wall, imp_peak = _timed(
            [_maserve(), "trace", "import-mooncake", str(work / "trace.jsonl"), "--out", str(work / "bundle")],
            env, work / "import.log")  # fmt: skip
        if code != 0:
            print((work / "import.log").read_text()[-3000:])
            return 1
        devices = [f"H100:{i}" for i in range(args.replicas)]
        (work / "pool.yaml").write_text(
            f"devices: [{', '.join(devices)}]\n"
            f"deployments:\n  - {{name: main, model: Qwen3-8B, max_model_len: {MAX_MODEL_LEN}}}\n"
            "placements:\n"
            + "".join(f'  - {{deployment: main, device: "{d}"}}\n' for d in devices)
            + "default: main\n"
        )
        (work / "scenario.yaml").write_text(
            "name: load-replay\n"
            f"cohorts: [{{name: mc, role: target, bundle: {work / 'bundle'}}}]\n"
            "arrivals: {kind: trace}\nlock: length\nblocks: 1\n"
            "arms: [{name: dag, release: dag, pool: pool.yaml}]\n"
        )
        code, wall, peak = _timed(
            [_maserve(), "replay", str(work / "scenario.yaml"), "--no-prefect", "--out", str(work / "out")],
            env, work / "replay.log")  # fmt: skip
        log = (work / "replay.log").read_text()
        audit = [line for line in log.splitlines() if "│ dag │ dag" in line]
        print(
            f"{n} requests ({n} single-op roots), {args.replicas} simulated H100 replicas, DAG, length-locked"
        )
        print(
            f"  import: wall {imp_wall:.1f} s, peak RSS {imp_peak:.0f} MiB, bundle {_du_mib(work / 'bundle'):.1f} MiB"
        )
        print(
            f"  replay: exit code {code}, wall {wall:.1f} s, peak RSS {peak:.0f} MiB, "
            f"replay bundle {_du_mib(work / 'out'):.1f} MiB"
        )
        print(
            "  conformance audit (arm | rule | ops | incomplete | failed | token mismatch | early | "
            "lateness p50 / p99 / max ms | replay/native | verdict):"
        )
        for line in audit:
            print("   ", " ".join(line.split()))
        if code != 0:
            print(log[-3000:])
        return code
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("roots", help="N concurrent roots through Prefect and the ledger")
    r.add_argument("--users", type=int, default=1000)
    r.add_argument("--workflow", default="fork_join")
    r.add_argument(
        "--postgres", action="store_true", help="Prefect server and ledger on PostgreSQL"
    )
    r.add_argument(
        "--wait", type=float, default=1800.0, help="seconds to wait for Prefect's history"
    )
    r.add_argument("--keep", action="store_true")
    p = sub.add_parser("replay", help="a fixed-work replay of at least --ops ops")
    p.add_argument("--ops", type=int, default=100_000)
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--keep", action="store_true")
    args = ap.parse_args(argv)
    return roots(args) if args.what == "roots" else replay(args)


if __name__ == "__main__":
    sys.exit(main())
