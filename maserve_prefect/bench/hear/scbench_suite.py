"""The SCBench-style HEAR experiment: FCFS, Cache-Aware, +Guard-40, +Guard-60 on one workload.

One idea: the workload is generated *once* (`workloads.generate_scbench`, closed loop, shared
long contexts), its content hash recorded, and every arm replays exactly that `SessionSet` on a
fresh simulated pool (RTX PRO 6000, Qwen3-8B, a 96 GiB host KV tier); only the admission-queue
order changes. The full-scale workload follows SCBench's stated shape (one context per session,
its tasks' context lengths capped at the model window, ~5.2 queries per session; the YAML says
which parameters are SCBench's and which are ours), and the header prints the KV room (GPU and
host tier) beside the workload's distinct prompt tokens: ordering can only change reuse when
the working set does not fit. The harness caps its requests in flight per replica
(`max_in_flight`, an agent framework's concurrency limit) so a queue forms — without a queue
there is nothing to order.

Table (paper layout): per arm TTFT p50 / p95 / max, batch completion (makespan) and reuse, then
the headline ratios of Cache-Aware+Guard-40 against FCFS beside the paper's goals (>= 1.61x
batch speedup, >= 2.23x lower p50 TTFT, p95 not worse), and the control-plane overhead rows.
The suite file is `experiment: scbench` of `kind: hear` (`bench.hear.suite_file.ScbenchSuite`).

Examples:
    >>> from maserve_prefect.bench.hear.suite_file import ScbenchWorkload
    >>> len(scbench_workload(ScbenchWorkload(seed=0, num_sessions=3, num_contexts=1)))
    3
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from maserve_prefect.bench.hear.arms import ArmRun, make_pool, parse_arm, run_arm
from maserve_prefect.bench.hear.suite_file import ScbenchSuite, ScbenchWorkload
from maserve_prefect.bench.hear.tables import arm_row, capacity_line, overhead_rows
from maserve_prefect.bench.report import ProgressFn, Report, Table
from maserve_prefect.errors import ConfigError
from maserve_prefect.workloads.scbench import generate_scbench
from maserve_prefect.workloads.sessions import SessionSet

__all__ = ["distinct_prompt_tokens", "headline_rows", "run_scbench", "scbench_workload"]

HEADLINE = "cache_aware+guard40"
PAPER = {
    "batch_speedup": ">= 1.61x",
    "p50_ttft_reduction": ">= 2.23x",
    "p95_ttft_ratio": "<= 1.00 (not worse)",
}
COLUMNS = ("policy", "ttft_p50_s", "ttft_p95_s", "ttft_max_s", "makespan_s", "makespan_incl_cp_s",
           "reuse", "reuse_host", "host_load_s", "max_queue_s", "num_completed", "recheck_demoted",
           "control_plane_share", "paper")  # fmt: skip
"""The arm table's shown columns (the JSON keeps every column; the workload hash is in the
header: every arm has the same one)."""


def scbench_workload(w: ScbenchWorkload) -> SessionSet:
    """The suite's recorded workload (the scaled suite's `workload`)."""
    return generate_scbench(w.num_sessions, w.seed, **w.params())


def distinct_prompt_tokens(sset: SessionSet) -> int:
    """Tokens of the distinct prompt blocks over all turns (shared prefixes counted once)."""
    seen: set[int] = set()
    total = 0
    for s in sset:
        for t in s.turns:
            for i, h in enumerate(t.prefix_block_hashes):
                if h not in seen:
                    seen.add(h)
                    total += min(t.block_size, t.num_prompt_tokens - i * t.block_size)
    return total


def headline_rows(runs: dict[str, ArmRun], headline: str = HEADLINE) -> list[dict[str, Any]]:
    """Headline ratios of `headline` against FCFS, with the paper's goals.

    Raises:
        ConfigError: the arms lack `fcfs` or `headline`.
    """
    if "fcfs" not in runs or headline not in runs:
        raise ConfigError(f"the headline needs arms 'fcfs' and {headline!r}; have {list(runs)}")
    base, best = runs["fcfs"].result, runs[headline].result
    speedup = base.makespan_s / best.makespan_s
    p50 = base.ttft_percentile(50) / best.ttft_percentile(50)
    p95 = best.ttft_percentile(95) / base.ttft_percentile(95)
    return [
        {"metric": "batch_speedup", "measured": speedup, "met": speedup >= 1.61,
         "paper": PAPER["batch_speedup"]},
        {"metric": "p50_ttft_reduction", "measured": p50, "met": p50 >= 2.23,
         "paper": PAPER["p50_ttft_reduction"]},
        {"metric": "p95_ttft_ratio", "measured": p95, "met": p95 <= 1.0 + 1e-9,
         "paper": PAPER["p95_ttft_ratio"]},
    ]  # fmt: skip


def run_scbench(
    suite: ScbenchSuite,
    scale: str = "demo",
    out_dir: Path | None = None,
    progress: ProgressFn | None = None,
) -> Report:
    """Run every arm of the SCBench suite at `scale` (progress: after each arm).

    With `out_dir`, the recorded workload is written there as JSONL.

    Raises:
        ConfigError: a bad scale or arm.
    """
    cfg = suite.scaled(scale)
    sset = scbench_workload(cfg.workload)
    digest = sset.content_hash()
    files = []
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        files.append(sset.save(Path(out_dir) / f"hear_scbench_{scale}_workload.jsonl"))
    pool = cfg.pool
    num_devices = pool.num_devices or 1
    runs: dict[str, ArmRun] = {}
    for i, (name, spec) in enumerate(cfg.arms.items()):
        replicas = make_pool(pool.gpu, pool.model, num_devices, float(pool.host_kv_gib),
                             dict(pool.scheduler))  # fmt: skip
        runs[name] = run_arm(sset, parse_arm(name, spec), replicas,
                             max_in_flight=cfg.max_in_flight, expect_hash=digest)  # fmt: skip
        if progress is not None:
            progress(i + 1, len(cfg.arms), name)
    rows = []
    for name, run in runs.items():
        row = arm_row(run)
        row["paper"] = (
            f"speedup {PAPER['batch_speedup']}, p50 {PAPER['p50_ttft_reduction']} lower"
            if name == HEADLINE
            else ("baseline" if name == "fcfs" else "n/a")
        )
        rows.append(row)
    head = headline_rows(runs) if "fcfs" in runs and HEADLINE in runs else []
    over = overhead_rows(list(runs.values()))
    header = [
        f"HEAR SCBench ({scale}): {len(sset)} sessions, {sset.num_turns} turns, "
        f"workload {digest[:12]}, {num_devices} x {pool.gpu} {pool.model}, "
        f"host KV {pool.host_kv_gib} GiB, max_in_flight {cfg.max_in_flight}",
        capacity_line(next(iter(runs.values())), distinct_prompt_tokens(sset)),
    ]
    meta = [{"scale": scale, "workload_sha256": digest, "num_sessions": len(sset),
             "num_turns": sset.num_turns}]  # fmt: skip
    tables = {
        "arms": Table(rows, "Policy arms", COLUMNS),
        "headline": Table(head, "Cache-Aware+Guard-40 vs FCFS"),
        "overhead": Table(over, "Control-plane overhead (host CPU)"),
        "meta": Table(meta, "Workload"),
    }
    assert all(math.isfinite(r["makespan_s"]) for r in rows)
    return Report(tables, header=header, files=files)
