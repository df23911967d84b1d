"""The Mooncake HEAR experiment as the paper runs it: five policies at 50 / 75 / 100 % load,
beside the paper's Table 4.

One idea: sessions are inferred once from a Mooncake-format trace
(`workloads.mooncake_load_levels`: the sessions whose first request falls in one 15-minute
window, with their original start times and complete turn sequences; nested seeded 50 / 75 /
100 % subsets); each load level is one recorded `SessionSet` whose hash every arm checks. The
pool is the paper's (§4.1, A.2): Qwen3-8B on one H100 with a 96 GiB host (L2) KV tier, the same
for every arm and load. Every turn goes to the engine at its recorded time; the arms differ only
in what the harness sends (`bench.hear.arms`): Cache-Aware priority preferences (the engine runs
its priority policy), a Guard-40 waiting requirement, Session-Aware continuation intents the
engine's eviction ranking reads.

The paper replays a production trace that is not shipped; the suite reads `workload.trace`
(`maserve bench run ... --trace FILE` replaces it), by default the shared synthetic trace, and
its header names the trace and its SHA-256. With another trace the comparison is in *shape*
(`bench.hear.shape`): per load and metric, the order of the policies and the sign of each
policy's effect against FCFS, beside the paper's.

Tables: per load and arm TTFT p50 / p95 / max, session (total response-waiting time per
conversation, mean over conversations), throughput (turns per minute) and reuse (follow-up
prompt tokens), each beside the paper's; the shape comparison; the load *regime* (offered
turns per minute over what FCFS serves, ours and the paper's) and the shape comparison against
the paper level of the closest regime — a heavier trace at 50 % can sit where the paper's 100 %
does; the waiting table (follow-ups that waited Guard's W, and their reuse); the host-tier use;
the control-plane overhead per load. A YAML may give `pool.sizing` instead of `num_devices` (an FCFS sweep
then fixes the size, `bench.hear.pool_sizing`). The suite file is `experiment: mooncake` of
`kind: hear` (`bench.hear.suite_file.MooncakeSuite`).

Examples:
    >>> from maserve_prefect.bench.hear.suite_file import HearPool
    >>> mooncake_pool_size(HearPool(gpu="H100", model="Qwen3-8B", num_devices=1), {})
    (1, 'pinned by pool.num_devices', [])
    >>> round(paper_offered_tpm("100%"), 1)
    172.2
    >>> PAPER_TABLE4["100%"]["fcfs"]["ttft_p50_s"]
    163.9
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

from maserve_prefect.bench.fanout import Fanout, run_units
from maserve_prefect.bench.hear.arms import ArmRun, arm_unit, parse_arm
from maserve_prefect.bench.hear.pool_sizing import SizingRule, SizingStep, size_pool
from maserve_prefect.bench.hear.shape import shape_rows
from maserve_prefect.bench.hear.suite_file import HearPool, MooncakeSuite
from maserve_prefect.bench.hear.tables import arm_row, overhead_rows, wait_reuse_rows
from maserve_prefect.bench.report import ProgressFn, Report, Table, columns_of
from maserve_prefect.bench.units import Unit
from maserve_prefect.errors import ConfigError
from maserve_prefect.metrics.report import markdown_table
from maserve_prefect.workloads.mooncake_sessions import mooncake_load_levels
from maserve_prefect.workloads.sessions import SessionSet

__all__ = [
    "PAPER_TABLE4",
    "mooncake_pool_size",
    "mooncake_workloads",
    "offered_tpm",
    "paper_offered_tpm",
    "regime_rows",
    "run_mooncake",
]

_KEYS = ("ttft_p50_s", "ttft_p95_s", "ttft_max_s", "session_s", "throughput_tpm",
         "followup_reuse")  # fmt: skip


def _paper(*rows: tuple[str, float, float, float, float, float, float]) -> dict[str, Any]:
    return {arm: dict(zip(_KEYS, vals, strict=True)) for arm, *vals in rows}


SA_CA_G = "session_aware+cache_aware+guard40"
PAPER_TABLE4: dict[str, dict[str, dict[str, float]]] = {
    "50%": _paper(
        ("fcfs", 0.7, 2.8, 6.2, 13.7, 86.1, 0.195),
        ("cache_aware", 0.6, 2.4, 5.9, 13.3, 86.0, 0.202),
        ("cache_aware+guard40", 0.6, 2.8, 7.4, 13.6, 86.2, 0.196),
        ("session_aware", 0.6, 2.5, 6.3, 13.0, 86.6, 0.319),
        (SA_CA_G, 0.5, 2.3, 6.1, 12.7, 86.8, 0.321),
    ),
    "75%": _paper(
        ("fcfs", 10.9, 51.9, 56.7, 50.2, 116.4, 0.080),
        ("cache_aware", 8.7, 42.9, 49.6, 42.6, 119.2, 0.101),
        ("cache_aware+guard40", 9.1, 42.3, 47.9, 42.5, 119.3, 0.081),
        ("session_aware", 10.5, 39.0, 45.1, 43.2, 119.5, 0.161),
        (SA_CA_G, 8.2, 39.8, 45.4, 39.8, 121.0, 0.169),
    ),
    "100%": _paper(
        ("fcfs", 163.9, 277.0, 281.5, 256.9, 122.7, 0.052),
        ("cache_aware", 86.8, 209.9, 220.9, 156.1, 128.3, 0.100),
        ("cache_aware+guard40", 97.1, 209.2, 217.6, 178.7, 122.8, 0.080),
        ("session_aware", 93.0, 199.2, 207.8, 171.8, 124.6, 0.127),
        (SA_CA_G, 161.7, 267.4, 277.7, 243.2, 108.9, 0.125),
    ),
}
"""The paper's Table 4 (production Mooncake trace, Qwen3-8B on one H100, 96 GiB L2 KV cache),
by load and arm name; session = total response waiting per conversation, throughput in turns
per minute, reuse over follow-up prompt tokens."""
PAPER_UNSATURATED = "50%"
"""The paper's load level that does not queue (FCFS TTFT p50 0.7 s): its throughput is its offered
rate, so the paper's offered rate at another level is that rate scaled by the session fraction
(an inference: the paper does not print offered rates)."""
PAPER_SETUP = (
    "paper: production Mooncake trace (not shipped), 50/75/100 % of the sessions starting in one "
    "15-minute window, Qwen3-8B on one H100 with a 96 GiB L2 KV cache (vLLM), Guard W = 40 s"
)
SHAPE_METRICS = {"ttft_p50_s": True, "ttft_p95_s": True, "ttft_max_s": True, "session_s": True,
                 "throughput_tpm": False, "followup_reuse": False}  # fmt: skip
"""The metrics compared in shape: name -> lower is better."""
COLUMNS = ("load", "policy", "ttft_p50_s", "paper_ttft_p50_s", "ttft_p95_s", "paper_ttft_p95_s",
           "ttft_max_s", "paper_ttft_max_s", "session_s", "paper_session_s", "throughput_tpm",
           "paper_throughput_tpm", "followup_reuse", "paper_followup_reuse", "num_completed")  # fmt: skip
"""The arm table's shown columns (the JSON keeps every column; each load level's workload hash
is in the header)."""
HOST_COLUMNS = ("load", "policy", "reuse", "reuse_host", "host_load_s", "num_host_loads",
                "num_intents", "num_priority_updates", "makespan_s", "makespan_incl_cp_s")  # fmt: skip


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
    pool: HearPool, levels: dict[float, SessionSet]
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
    n, steps = size_pool(sset, rule, gpu=pool.gpu, model=pool.model,
                         host_kv_gib=float(pool.host_kv_gib), scheduler=dict(pool.scheduler))  # fmt: skip
    return n, rule.describe(), steps


def trace_line(path: Path) -> str:
    """Which trace produced the tables: its path and the first 12 hex digits of its SHA-256."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return f"trace {path} (sha256 {digest[:12]})"


def offered_tpm(sset: SessionSet) -> float:
    """Turns per minute the harness offers: turns over the span of their recorded arrivals (an
    open-loop set; NaN with fewer than two arrivals)."""
    times = [t.arrival_s for s in sset for t in s.turns if t.arrival_s is not None]
    span = max(times, default=0.0) - min(times, default=0.0)
    return 60.0 * len(times) / span if len(times) > 1 and span > 0 else math.nan


def paper_offered_tpm(load: str) -> float:
    """The paper's offered turns per minute at `load` ("75%"), inferred from its unsaturated
    level (`PAPER_UNSATURATED`)."""
    base = PAPER_TABLE4[PAPER_UNSATURATED]["fcfs"]["throughput_tpm"]
    return base * float(load.rstrip("%")) / float(PAPER_UNSATURATED.rstrip("%"))


def regime_rows(rows: list[dict[str, Any]], offered: dict[str, float]) -> list[dict[str, Any]]:
    """Per measured load: offered turns per minute over what FCFS served (the *pressure*: above 1
    the queue grows), the same for the paper's level, and the paper level whose pressure is
    closest (log ratio) — the level to compare with in shape when the traces differ."""
    paper = {
        load: paper_offered_tpm(load) / arms["fcfs"]["throughput_tpm"]
        for load, arms in PAPER_TABLE4.items()
    }
    out = []
    for r in rows:
        if r["policy"] != "fcfs":
            continue
        load = r["load"]
        pressure = offered[load] / r["throughput_tpm"] if r["throughput_tpm"] > 0 else math.nan
        match = min(paper, key=lambda k: abs(math.log(paper[k] / pressure)))
        out.append({
            "load": load, "offered_tpm": offered[load], "fcfs_tpm": r["throughput_tpm"],
            "pressure": pressure,
            "paper_offered_tpm": paper_offered_tpm(load) if load in PAPER_TABLE4 else math.nan,
            "paper_pressure": paper.get(load, math.nan),
            "matched_paper_load": match, "matched_paper_pressure": paper[match],
        })  # fmt: skip
    return out


def _row(load: str, run: ArmRun) -> dict[str, Any]:
    row = arm_row(run)
    row["session_s"] = row["session_wait_mean_s"]
    paper = PAPER_TABLE4.get(load, {}).get(row["policy"], {})
    for key in _KEYS:
        row[f"paper_{key}"] = paper.get(key, math.nan)
    return {"load": load, **row}


def shape_table(
    rows: list[dict[str, Any]], against: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Per load and metric: measured vs paper policy order and effect signs (`bench.hear.shape`),
    each measured load against the paper's level of the same name or, with `against`
    (measured load -> paper load), the one given."""
    out: list[dict[str, Any]] = []
    for load in dict.fromkeys(r["load"] for r in rows):
        paper_load = (against or {}).get(load, load)
        paper = PAPER_TABLE4.get(paper_load)
        if paper is None:
            continue
        measured = {r["policy"]: r for r in rows if r["load"] == load}
        head = {"load": load} if against is None else {"load": load, "paper_load": paper_load}
        out += [{**head, **r} for r in shape_rows(measured, paper, SHAPE_METRICS)]
    return out


def run_mooncake(
    suite: MooncakeSuite,
    scale: str = "demo",
    out_dir: Path | None = None,
    progress: ProgressFn | None = None,
    fanout: Fanout | None = None,
) -> Report:
    """Run every arm at every load level of the Mooncake suite at `scale` (progress: after each
    (load level, arm)); each (load level, arm) is one unit (`bench.fanout`: here in order, or on
    Dask).

    With `out_dir`, each load level's workload is written there as JSONL before the arms run,
    and the arm table as markdown after them (`hear_mooncake_<scale>.partial.md`).

    Raises:
        ConfigError: a bad scale, trace or arm, or no pool size meets the sizing rule.
    """
    cfg = suite.scaled(scale)
    levels = mooncake_workloads(cfg)
    pool = cfg.pool
    num_devices, how, sweep = mooncake_pool_size(pool, levels)
    rows: list[dict[str, Any]] = []
    overhead: list[dict[str, Any]] = []
    offered: dict[str, float] = {}
    waiting: list[dict[str, Any]] = []
    files: list[Path] = []
    arms = {name: parse_arm(name, spec) for name, spec in cfg.arms.items()}
    wait_s = min((a.guard.wait_s for a in arms.values() if a.guard), default=40.0)
    shape = (pool.gpu, pool.model, num_devices, float(pool.host_kv_gib), dict(pool.scheduler))
    order = sorted(levels.items())
    units = []
    for frac, sset in order:
        if out_dir is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            files.append(
                sset.save(Path(out_dir) / f"hear_mooncake_{scale}_{int(frac * 100)}.jsonl")
            )
        digest = sset.content_hash()
        units += [Unit(f"{frac:.0%}/{name}", arm_unit,
                       (sset, name, spec, shape, cfg.refresh_s, digest))
                  for name, spec in cfg.arms.items()]  # fmt: skip
    results = iter(run_units(units, fanout, progress)[0])
    for frac, sset in order:
        load = f"{frac:.0%}"
        offered[load] = offered_tpm(sset)
        level: dict[str, ArmRun] = {}
        for name in arms:
            run = next(results)
            level[name] = run
            rows.append(_row(load, run))
        waiting += [{"load": load, **r} for r in wait_reuse_rows(level, wait_s)]
        overhead += [{"load": load, **r} for r in overhead_rows(list(level.values()))]
    if out_dir is not None:  # the arm table as markdown, as the sequential run leaves it
        partial = Path(out_dir) / f"hear_mooncake_{scale}.partial.md"
        partial.write_text(markdown_table(columns_of(rows, COLUMNS)) + "\n")
        files.append(partial)
    trace = trace_line(cfg.path(cfg.workload.trace).resolve())
    regime = regime_rows(rows, offered)
    header = [
        f"HEAR Mooncake ({scale}): {trace}; window {cfg.workload.window_s:g} s, loads "
        + ", ".join(
            f"{f:.0%}={len(s)} sessions/{s.num_turns} turns (workload {s.content_hash()[:12]})"
            for f, s in sorted(levels.items())
        )
        + f"; {num_devices} x {pool.gpu} {pool.model} ({how}), host KV {pool.host_kv_gib} GiB "
        f"each; every turn to the engine at its recorded time; Cache-Aware priorities refreshed "
        f"every {cfg.refresh_s:g} s",
        PAPER_SETUP,
    ]
    tables = {
        "arms": Table(
            rows, f"Policy arms per load level beside the paper's Table 4 ({trace})", COLUMNS
        ),
        "shape": Table(
            shape_table(rows),
            "In shape: policy order (best first) and effect signs "
            "vs FCFS, measured/paper ('+' better, '-' worse, '=' within 2 %)",
        ),
        "regime": Table(
            regime,
            "Load regime: offered turns/min over FCFS's served turns/min (pressure), ours and "
            f"the paper's (its offered rate inferred from its unqueued {PAPER_UNSATURATED} level)",
        ),
        "shape_matched": Table(
            shape_table(rows, {r["load"]: r["matched_paper_load"] for r in regime}),
            "In shape at matched pressure: each load against the paper level whose pressure "
            "is closest",
        ),
        "waiting": Table(
            waiting,
            f"Waiting and reuse per load: follow-ups that waited >= {wait_s:g} s (TTFT; in the "
            f"engine's queue: what Guard-{wait_s:g} protects) vs the rest",
        ),
        "host_tier": Table(
            rows,
            "Reuse from the host tier, intents and priority updates",
            HOST_COLUMNS,
            detail=True,
        ),
        "overhead": Table(overhead, "Control-plane overhead (host CPU) per load", detail=True),
        "meta": Table(
            [{"scale": scale, "trace": trace, "num_devices": num_devices, "pool_rule": how}], "Pool"
        ),
    }
    if sweep:
        tables["pool_sizing"] = Table([s.row() for s in sweep], f"Pool size: {how}")
    return Report(tables, header=header, files=files)
