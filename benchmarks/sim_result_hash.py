"""Result hash of a full Mooncake replay: proves a simulator speed change left results unchanged.

Usage:
    python benchmarks/sim_result_hash.py [--trace PATH] [--replicas 8] [--copies 1] [--no-ff]
        [--prompt-scale K]

Replays the trace as `benchmarks/sim_speed.py` does (Qwen3-8B, one replica per H100) and prints
one SHA-256 over what a speed change must not move: per request (in op order) the replica, status,
prompt / output / cached tokens, preemptions, and TTFT, TPOT and E2E as exact float reprs; then
the prefix-cache query / hit tokens, preemptions, model steps, and the mean and max KV usage.
Step-record counts are printed but not hashed (merging steps into one record is the point of
fast-forward). `--timeline` also hashes every replica's sampled series (stricter: KV usage at
every step end). `--prompt-scale K` hashes the replay of `sim_speed.py`'s synthetic trace with
K-times longer prompts (e.g. K = 4 on 16 replicas: hundreds of preemptions, so re-admissions'
prefix lookups are covered too).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_speed import DEFAULT_TRACE, copies, run, scale_prompts

from maserve_prefect.engines.sim.pool.sim_pool import SimPool
from maserve_prefect.replay.requests import ReplayResult
from maserve_prefect.trace.mooncake import import_mooncake


def result_lines(res: ReplayResult) -> list[str]:
    """The replay's observable results, one line each, in a fixed order."""
    lines = [
        f"{r.op_id}|{r.replica}|{r.status}|{r.num_prompt_tokens}|{r.num_output_tokens}|"
        f"{r.num_cached_tokens}|{r.num_preemptions}|{r.ttft_s!r}|{r.tpot_s!r}|{r.e2e_s!r}"
        for r in sorted(res.requests, key=lambda r: r.op_id)
    ]
    lines.append(
        f"prefix {res.prefix_queries_tokens} {res.prefix_hits_tokens} pre {res.num_preemptions} "
        f"steps {res.num_model_steps} kv {res.kv_usage_mean!r} {res.kv_usage_max!r}"
    )
    return lines


def timeline_lines(pool: SimPool) -> list[str]:
    """Every replica's sampled engine series (time and values as exact reprs)."""
    lines: list[str] = []
    for eng in pool.replicas():
        tl = eng.timeline
        cols = [tl.t_s, *tl.values.values()]
        lines.extend(f"{eng.name}|" + "|".join(repr(c[i]) for c in cols) for i in range(len(tl)))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--copies", type=int, default=1)
    ap.add_argument("--no-ff", action="store_true", help="fast-forward off")
    ap.add_argument("--timeline", action="store_true", help="also hash every sampled series")
    ap.add_argument("--prompt-scale", type=int, default=1, help="K-times longer prompts (K >= 1)")
    args = ap.parse_args()
    if args.prompt_scale < 1:
        ap.error(f"--prompt-scale must be an integer >= 1, got {args.prompt_scale}")
    base = scale_prompts(import_mooncake(args.trace).trace, args.prompt_scale)
    trace = copies(base, args.copies) if args.copies > 1 else base
    pools: list[SimPool] = []
    res, wall, cpu = run(trace, args.replicas, fast_forward=not args.no_ff, pools=pools)
    lines = result_lines(res)
    if args.timeline:
        lines += timeline_lines(pools[0])
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    print(
        f"requests {len(res.requests)}  step records {res.num_step_records}  "
        f"model steps {res.num_model_steps}  preemptions {res.num_preemptions}  "
        f"cpu {cpu:.2f}s  wall {wall:.2f}s"
    )
    print(f"result sha256 {digest}")


if __name__ == "__main__":
    main()
