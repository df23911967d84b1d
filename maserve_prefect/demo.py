"""`make demo`: the main job on the embedded simulator, end to end, with task-level tables.

1. Semantic Trace: import the shared Mooncake FAST'25 trace and print its graph statistics.
2. Simulator: replay it request by request on simulated H100s serving Qwen3-8B (TTFT / TPOT /
   end-to-end percentiles, prefix hits, preemptions, KV usage).
3. Native runs through Prefect: every collaboration template and every reference workflow,
   realized on the simulator in lockstep virtual time, recorded into the ledger, with root
   latency, graph depth / antichain width and tokens per workflow.
4. Fixed-work replay of the four-call workflow under DAG, Barrier and Flat release rules, with
   root latency and the completion-path ledger.

Outputs land under `out/demo/` (trace bundles) and the ledger under `$MASERVE_HOME`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
OUT = Path("out") / "demo"


def _pct(values: list[float], q: float) -> str:
    return f"{np.percentile(values, q):.2f}" if values else "-"


def mooncake_section(console: Console) -> None:
    from maserve_prefect.clock.kernel import Kernel
    from maserve_prefect.engines.sim.pool.device import Deployment
    from maserve_prefect.engines.sim.pool.sim_pool import SimPool
    from maserve_prefect.metrics.graph import trace_graph_summary
    from maserve_prefect.replay.requests import replay_requests
    from maserve_prefect.trace.mooncake import import_mooncake

    path = SHARED / "traces" / "mooncake_synthetic_trace.jsonl"
    if not path.exists():
        console.print(f"[yellow]shared Mooncake trace not found at {path}; skipping[/]")
        return
    t0 = time.perf_counter()
    imported = import_mooncake(path)
    summary = trace_graph_summary(imported.trace)
    console.rule("[bold]1. Semantic Trace: Mooncake FAST'25 import")
    console.print(
        f"{imported.num_accepted} roots imported, {len(imported.rejected)} rejected rows; "
        f"graph depth max {summary.depth.max:g}, antichain width max "
        f"{summary.antichain_width.max:g} (single-call roots) ({time.perf_counter() - t0:.2f}s)"
    )
    console.rule("[bold]2. Simulator: request-level replay on 4x H100, Qwen3-8B")
    kernel = Kernel()
    devices = [f"H100:{i}" for i in range(4)]
    pool = SimPool(kernel, devices)
    dep = Deployment("qwen3-8b", "Qwen3-8B")
    for d in devices:
        pool.load(dep, d)
    kernel.run()
    t0 = time.perf_counter()
    result = replay_requests(imported.trace, pool, "qwen3-8b")
    wall = time.perf_counter() - t0
    table = Table("metric", "p50", "p90", "p99")
    for name, s in (("TTFT s", result.ttft()), ("TPOT s", result.tpot()), ("E2E s", result.e2e())):
        table.add_row(name, f"{s.p50:.3f}", f"{s.p90:.3f}", f"{s.p99:.3f}")
    console.print(table)
    refused = result.status_counts().get("rejected", 0)
    if refused:
        console.print(
            f"{refused} requests longer than Qwen3-8B's {dep.spec.max_position_embeddings}-token "
            "context refused, as a vLLM server refuses them"
        )
    span = kernel.now()
    console.print(
        f"prefix hit rate {result.prefix_hit_rate:.1%}, preemptions {result.num_preemptions}, "
        f"KV usage mean {result.kv_usage_mean:.1%} max {result.kv_usage_max:.1%}; "
        f"{span:.0f} simulated s in {wall:.1f} wall s ({span / wall:.0f}x)"
    )


def native_section(console: Console, users: int) -> None:
    from maserve_prefect.metrics.graph import root_graph_stats
    from maserve_prefect.taskrunner.native import list_workflows, run_native
    from maserve_prefect.trace.bundle import export_bundle

    console.rule(f"[bold]3. Native runs through Prefect ({users} roots each, simulator)")
    table = Table(
        "workflow", "binding", "roots ok", "ops", "model", "tool", "depth", "antichain",
        "latency p50 s", "p90 s", "in tok", "out tok", "wall s",
    )  # fmt: skip
    total_ops = 0
    t_all = time.perf_counter()
    for name in list_workflows():
        t0 = time.perf_counter()
        run = run_native(name, users=users, seed=0)
        wall = time.perf_counter() - t0
        ops = run.trace.ops
        total_ops += len(ops)
        lat = [r.finish_s - r.arrival_s for r in run.roots if r.error is None]
        stats = [root_graph_stats(run.trace, r.root_id) for r in run.trace.roots]
        model_ops = [o for o in ops if o.kind.value == "model"]
        table.add_row(
            name,
            run.trace.manifest.binding_ids[0],
            f"{len(lat)}/{len(run.roots)}",
            str(len(ops)),
            str(len(model_ops)),
            str(sum(o.kind.value == "tool" for o in ops)),
            str(max((s.depth for s in stats), default=0)),
            str(max((s.antichain_width for s in stats), default=0)),
            _pct(lat, 50),
            _pct(lat, 90),
            str(sum(o.num_input_tokens for o in model_ops)),
            str(sum(o.num_output_tokens for o in model_ops)),
            f"{wall:.1f}",
        )
        export_bundle(run.trace, run.harness.store, OUT / name, overwrite=True)
    console.print(table)
    console.print(
        f"{total_ops} Prefect task runs in {time.perf_counter() - t_all:.0f}s; bundles in {OUT}/. "
        "Latency is virtual (simulated) time; answers on the simulator are synthetic text."
    )


def replay_section(console: Console, users: int) -> None:
    from maserve_prefect.metrics.path import path_ledger, path_shares
    from maserve_prefect.metrics.task import root_latencies
    from maserve_prefect.replay.driver import replay_trace
    from maserve_prefect.taskrunner.native import run_native
    from maserve_prefect.trace.barrier import StageBarrier

    console.rule("[bold]4. Fixed-work replay: four-call workflow, DAG vs Barrier vs Flat")
    native = run_native("four_call_full", users=users, seed=0)
    barrier = [StageBarrier(before="analyst_a", after="analyst_b")]
    table = Table(
        "arm", "causal", "early releases", "latency p50 s", "p95 s",
        "gap %", "pre-submit %", "backend wait %", "residence %",
    )  # fmt: skip
    for arm, rule, extra in (
        ("DAG", "dag", []),
        ("Barrier (analysts serialized)", "barrier", barrier),
        ("Flat (reference)", "flat", []),
    ):
        run = replay_trace(native.trace, native.harness.store, rule=rule, barrier=extra, name=arm)
        lat = [r.latency_s for r in root_latencies(run.trace) if r.latency_s is not None]
        shares = path_shares(path_ledger(run.trace)) if rule != "flat" else {}
        table.add_row(
            arm,
            "no" if run.non_causal else "yes",
            str(run.num_early_releases),
            _pct(lat, 50),
            _pct(lat, 95),
            *(f"{100 * shares[k]:.0f}" if shares else "-" for k in (
                "boundary_gap_s", "pre_submission_s", "backend_wait_s", "scheduled_residence_s"
            )),
        )  # fmt: skip
    console.print(table)
    console.print(
        "Same recorded work in every arm (token-locked inputs, length-locked outputs); only "
        "release times change. Path shares: where each root's latency went along its critical path."
    )


def main() -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    console = Console(width=max(140, Console().width))
    mooncake_section(console)
    from maserve_prefect.prefect_server import connected, ensure_server

    with console.status("starting the local Prefect server (first time: ~15 s)"):
        info = ensure_server()
    console.print(f"Prefect API: {info.url}")
    with connected(info):
        users = int(os.environ.get("MASERVE_DEMO_USERS", "3"))
        native_section(console, users=users)
        replay_section(console, users=8)
    where = f"in its UI at {info.ui_url}" if info.ui_url else f"through its API at {info.url}"
    console.print(
        f"The local Prefect server keeps running for the next command; browse the runs {where}, "
        "stop it with `.venv/bin/maserve server stop`."
    )


if __name__ == "__main__":
    main()
