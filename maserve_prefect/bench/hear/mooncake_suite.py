"""The Mooncake HEAR experiment: five policies at 50 / 75 / 100 % load on one fixed pool.

One idea: sessions are inferred once from the shared Mooncake-format trace
(`workloads.mooncake_load_levels`: sessions starting in a 15-minute window, nested seeded 50 /
75 / 100 % subsets); each load level is one recorded `SessionSet` whose hash every arm checks.
The pool is fixed before any policy is compared and is the same for every arm and load. Its size
is a rule, not a number (`pool.sizing` in the YAML, `bench.hear.pool_sizing`): the smallest
number of RTX PRO 6000s (Qwen3-8B, 96 GiB host KV tier each) at which FCFS meets the stated TTFT
SLO at 50 % load, found by a sweep the suite runs and prints. A YAML may instead pin
`pool.num_devices` (the sweep is then skipped and the table says so). Arrivals are open loop
(the trace's timestamps); sessions stay on the replica of their first turn.

Table: per load and arm TTFT p50 / p95, session time, throughput and reuse (and the part of it
loaded from the host tier, with the PCIe seconds it cost), with a paper column ("n/a": the issue
gives no Mooncake figures), the pool-size sweep, and the control-plane overhead rows. The suite
file is `experiment: mooncake` of `kind: hear` (`bench.hear.suite_file.MooncakeSuite`).

Examples:
    >>> from maserve_prefect.bench.hear.suite_file import HearPool
    >>> mooncake_pool_size(HearPool(gpu="H100", model="Qwen3-8B", num_devices=2), None, {})
    (2, 'pinned by pool.num_devices', [])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from maserve_prefect.bench.hear.arms import ArmRun, make_pool, parse_arm, run_arm
from maserve_prefect.bench.hear.pool_sizing import SizingRule, SizingStep, size_pool
from maserve_prefect.bench.hear.suite_file import HearPool, MooncakeSuite
from maserve_prefect.bench.hear.tables import arm_row, overhead_rows
from maserve_prefect.bench.report import ProgressFn, Report, Table, columns_of
from maserve_prefect.errors import ConfigError
from maserve_prefect.metrics.report import markdown_table
from maserve_prefect.workloads.mooncake_sessions import mooncake_load_levels
from maserve_prefect.workloads.sessions import SessionSet

__all__ = ["mooncake_pool_size", "mooncake_workloads", "run_mooncake"]

COLUMNS = ("load", "policy", "ttft_p50_s", "ttft_p95_s", "session_p50_s", "session_mean_s",
           "throughput_rps", "makespan_s", "makespan_incl_cp_s", "reuse", "reuse_host",
           "host_load_s", "num_completed", "control_plane_share", "paper")  # fmt: skip
"""The arm table's shown columns (the JSON keeps every column; each load level's workload hash
is in the header)."""


def mooncake_workloads(suite: MooncakeSuite) -> dict[float, SessionSet]:
    """The recorded load levels (fraction -> sessions) of a scaled suite; the trace path is
    relative to the suite file."""
    w = suite.workload
    return mooncake_load_levels(
        suite.path(w.trace).resolve(),
        start_s=w.start_s,
        window_s=w.window_s,
        fractions=w.fractions,
        seed=w.seed,
    )


def mooncake_pool_size(
    pool: HearPool, max_in_flight: int | None, levels: dict[float, SessionSet]
) -> tuple[int, str, list[SizingStep]]:
    """The suite's device count, how it was chosen, and the sizing sweep (empty when pinned).

    Raises:
        ConfigError: neither `pool.num_devices` nor `pool.sizing`, a sizing load that is not
            one of the workload's fractions, or no size meets the SLO.
    """
    if pool.num_devices is not None:
        return pool.num_devices, "pinned by pool.num_devices", []
    if pool.sizing is None:
        raise ConfigError("the Mooncake suite's pool needs `sizing` (a rule) or `num_devices`")
    rule = SizingRule.from_config(pool.sizing.model_dump())
    sset = next((s for f, s in levels.items() if abs(f - rule.load) < 1e-9), None)
    if sset is None:
        raise ConfigError(
            f"pool.sizing.load {rule.load} is not a workload fraction {sorted(levels)}"
        )
    n, steps = size_pool(
        sset,
        rule,
        gpu=pool.gpu,
        model=pool.model,
        host_kv_gib=float(pool.host_kv_gib),
        scheduler=dict(pool.scheduler),
        max_in_flight=max_in_flight,
    )
    return n, rule.describe(), steps


def run_mooncake(
    suite: MooncakeSuite,
    scale: str = "demo",
    out_dir: Path | None = None,
    progress: ProgressFn | None = None,
) -> Report:
    """Run every arm at every load level of the Mooncake suite at `scale` (progress: after each
    (load level, arm)).

    With `out_dir`, each load level's workload is written there as JSONL, and the arm table so
    far as markdown after each level (a full run takes a while).

    Raises:
        ConfigError: a bad scale, trace or arm, or no pool size meets the sizing rule.
    """
    cfg = suite.scaled(scale)
    levels = mooncake_workloads(cfg)
    pool = cfg.pool
    num_devices, how, sweep = mooncake_pool_size(pool, cfg.max_in_flight, levels)
    rows: list[dict[str, Any]] = []
    runs: list[ArmRun] = []
    files: list[Path] = []
    total, done = len(levels) * len(cfg.arms), 0
    for frac, sset in sorted(levels.items()):
        digest = sset.content_hash()
        if out_dir is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            files.append(
                sset.save(Path(out_dir) / f"hear_mooncake_{scale}_{int(frac * 100)}.jsonl")
            )
        for name, spec in cfg.arms.items():
            replicas = make_pool(pool.gpu, pool.model, num_devices, float(pool.host_kv_gib),
                                 dict(pool.scheduler))  # fmt: skip
            run = run_arm(sset, parse_arm(name, spec), replicas,
                          max_in_flight=cfg.max_in_flight, expect_hash=digest)  # fmt: skip
            runs.append(run)
            rows.append({"load": f"{frac:.0%}", **arm_row(run), "paper": "n/a"})
            done += 1
            if progress is not None:
                progress(done, total, f"{frac:.0%}/{name}")
        if out_dir is not None:  # a full run takes a while: keep what is done so far
            partial = Path(out_dir) / f"hear_mooncake_{scale}.partial.md"
            partial.write_text(markdown_table(columns_of(rows, COLUMNS)) + "\n")
            if partial not in files:
                files.append(partial)
    header = [
        f"HEAR Mooncake ({scale}): window {cfg.workload.window_s} s, loads "
        + ", ".join(
            f"{f:.0%}={len(s)} sessions/{s.num_turns} turns (workload {s.content_hash()[:12]})"
            for f, s in levels.items()
        )
        + f"; fixed pool {num_devices} x {pool.gpu} {pool.model} ({how}), host KV "
        f"{pool.host_kv_gib} GiB each, max_in_flight {cfg.max_in_flight}"
    ]
    sizing = [s.row() for s in sweep]
    tables = {
        "arms": Table(rows, "Policy arms per load level", COLUMNS),
        "overhead": Table(overhead_rows(runs), "Control-plane overhead (host CPU), all loads"),
        "pool_sizing": Table(sizing, f"Pool size: {how}"),
        "meta": Table([{"scale": scale, "num_devices": num_devices, "pool_rule": how}], "Pool"),
    }
    return Report(tables, header=header, files=files)
