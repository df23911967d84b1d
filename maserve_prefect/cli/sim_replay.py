"""`maserve sim replay TRACE`: replay an imported trace on a simulated pool and print latencies.

One idea: load N replicas of one deployment on N identical devices, wait until they are ready,
then submit every model op at its recorded time (`replay/requests.py`, Arrival rule) on the
replica its route picks (`--route least-outstanding | prefix | session`, `dispatch.routes`)
and report TTFT / TPOT / end-to-end percentiles, prefix hit rate, preemptions and KV usage —
and, beside the measured reuse, the trace's infinite-cache reuse bound (`replay.reuse_bound`:
what one server with an unbounded cache would reuse; no route can beat it).
TRACE is a bundle folder (or its `trace.jsonl`) or a Mooncake `.jsonl` file, imported on the fly.
Errors print one red line and exit 1.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from maserve_prefect.cli.checks import check_out_dir
from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.dispatch.routes import DEFAULT_LOAD_BOUND, ROUTES
from maserve_prefect.engines.sim.pool.sim_pool import Deployment, SimPool
from maserve_prefect.errors import ConfigError, MaserveError
from maserve_prefect.protocol.outcomes import Acceptance
from maserve_prefect.replay.requests import ReplayProgress, ReplayResult, replay_requests
from maserve_prefect.trace.model import Trace


def load_trace(path: Path) -> Trace:
    """A bundle folder / `trace.jsonl` via `import_bundle`, any other `.jsonl` as Mooncake."""
    from maserve_prefect.trace.bundle import TRACE_FILE, import_bundle
    from maserve_prefect.trace.mooncake import import_mooncake

    if path.is_dir() or path.name == TRACE_FILE:
        return import_bundle(path).trace
    if path.suffix == ".jsonl":
        return import_mooncake(path).trace
    raise ConfigError(f"{path}: not a bundle folder or a Mooncake .jsonl file")


def replay(
    trace: Annotated[Path, typer.Argument(help="Bundle folder or Mooncake .jsonl file.")],
    gpu: Annotated[str, typer.Option("--gpu", help="Catalog GPU name, e.g. H100.")] = "H100",
    model: Annotated[str, typer.Option("--model", help="Catalog model name.")] = "Qwen3-8B",
    replicas: Annotated[int, typer.Option("--replicas", min=1, help="Replicas (1 per GPU).")] = 1,
    max_num_seqs: Annotated[
        int | None, typer.Option("--max-num-seqs", min=1, help="vLLM max_num_seqs.")
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None, typer.Option("--max-num-batched-tokens", min=1, help="Token budget per step.")
    ] = None,
    route: Annotated[
        str,
        typer.Option(
            "--route",
            help=f"Where each request goes: {' | '.join(ROUTES)} (longest cached prefix within "
            "the load bound; sticky by session).",
        ),
    ] = "least-outstanding",
    load_bound: Annotated[
        int,
        typer.Option(
            "--load-bound",
            min=0,
            help="prefix / session routes: the most outstanding requests the chosen replica may "
            "have beyond the least-loaded one's.",
        ),
    ] = DEFAULT_LOAD_BOUND,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write requests / device time / timelines here.")
    ] = None,
) -> None:
    """Replay TRACE on REPLICAS simulated GPUs (one replica each) and print latency percentiles."""
    console = Console(width=120)
    try:
        if out is not None:
            check_out_dir(out, "--out")
        result, pool = _run(
            trace, gpu, model, replicas, max_num_seqs, max_num_batched_tokens, route, load_bound
        )
    except MaserveError as exc:
        from maserve_prefect.cli.run_cmd import fail

        fail(str(exc))
    _print(console, result, f"{model} on {replicas} x {gpu}, route {route}")
    if out is not None:
        write_outputs(out, result, pool)
        console.print(f"wrote {out}")


def _run(
    path: Path,
    gpu: str,
    model: str,
    replicas: int,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    route: str = "least-outstanding",
    load_bound: int = DEFAULT_LOAD_BOUND,
) -> tuple[ReplayResult, SimPool]:
    if route not in ROUTES:
        raise ConfigError(f"unknown route {route!r}; routes: {', '.join(ROUTES)}")
    trace = load_trace(path)
    overrides = tuple(
        (k, v)
        for k, v in (
            ("max_num_seqs", max_num_seqs),
            ("max_num_batched_tokens", max_num_batched_tokens),
        )
        if v is not None
    )
    dep = Deployment("replay", model, scheduler=overrides)
    kernel = Kernel()
    pool = SimPool(kernel, [f"{gpu}:{i}" for i in range(replicas)])
    for device in pool.devices():
        ticket = pool.load(dep, device)
        if ticket.acceptance is not Acceptance.ACCEPTED:
            raise ConfigError(f"cannot load {model} on {device}: {ticket.reason}")
    kernel.run()
    progress = Progress(
        TextColumn("replaying"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} requests"),
        TextColumn("sim {task.fields[sim]:.0f} s"),
        transient=True,
    )
    with progress:
        task = progress.add_task("replay", total=None, sim=0.0)

        def advance(p: ReplayProgress) -> None:
            progress.update(task, completed=p.num_done, total=p.num_total, sim=p.elapsed_s)

        result = replay_requests(
            trace, pool, dep.name, route=route, load_bound=load_bound, progress=advance
        )
    return result, pool


def _print(console: Console, res: ReplayResult, title: str) -> None:
    table = Table(title=f"{title}: {len(res.requests)} requests over {res.span_s:.1f} s simulated")
    table.add_column("metric")
    for col in ("count", "mean", "p50", "p90", "p99", "max"):
        table.add_column(col, justify="right")
    for label, s in (("TTFT (s)", res.ttft()), ("TPOT (s)", res.tpot()), ("E2E (s)", res.e2e())):
        table.add_row(
            label, str(s.count), *(f"{v:.4f}" for v in (s.mean, s.p50, s.p90, s.p99, s.max))
        )
    console.print(table)
    console.print(
        f"status {res.status_counts()}  prefix hit rate {100 * res.prefix_hit_rate:.1f}%  "
        f"preemptions {res.num_preemptions}  KV usage mean {100 * res.kv_usage_mean:.1f}% "
        f"max {100 * res.kv_usage_max:.1f}%"
    )
    console.print(
        f"prompt tokens reused {100 * res.prompt_reuse:.1f}% of "
        f"{100 * res.bound.fraction:.1f}% an infinite cache on one server would reuse "
        f"(the trace's bound)"
    )
    for note in res.notes:
        console.print(f"[yellow]note: {note}[/yellow]")


def write_outputs(out: Path, res: ReplayResult, pool: SimPool) -> None:
    """`requests.csv`, `device_time.csv`, `timelines.csv` (long format), `memory.json`,
    `lifecycle.json` and `summary.json` under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [asdict(r) for r in res.requests]
    _csv(out / "requests.csv", rows)
    _csv(out / "device_time.csv", [r.to_dict() for r in pool.device_time(res.start_s, res.end_s)])
    _csv(out / "timelines.csv", [row for tl in pool.timelines().values() for row in tl.to_rows()])
    memory = {d: pool.memory_timeline(d) for d in pool.devices()}
    (out / "memory.json").write_text(json.dumps(memory, indent=1))
    lifecycle = [
        {
            "action": r.action.value,
            "replica": r.replica,
            "start_s": r.start_s,
            "end_s": r.end_s,
            "phases": [[p.name, p.start_s, p.end_s] for p in r.phases],
            "memory_before_bytes": r.memory_before_bytes,
            "memory_after_bytes": r.memory_after_bytes,
        }
        for r in pool.lifecycle_log
    ]
    (out / "lifecycle.json").write_text(json.dumps(lifecycle, indent=1))
    summary = {
        "ttft": res.ttft().to_dict(),
        "tpot": res.tpot().to_dict(),
        "e2e": res.e2e().to_dict(),
        "route": res.route,
        "prefix_hit_rate": res.prefix_hit_rate,
        "prompt_reuse": res.prompt_reuse,
        "reuse_bound": res.bound.fraction,
        "num_preemptions": res.num_preemptions,
        "kv_usage_mean": res.kv_usage_mean,
        "kv_usage_max": res.kv_usage_max,
        "status": res.status_counts(),
        "notes": res.notes,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


def _csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    with path.open("w", newline="") as fh:
        if not rows:
            return
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
