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
gives no Mooncake figures), the pool-size sweep, and the control-plane overhead rows.

Examples:
    >>> cfg = load_scale(DEFAULT_SUITE, "demo")
    >>> sorted(cfg["arms"])[:2]
    ['cache_aware', 'cache_aware+guard40']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from maserve_prefect.bench.hear.arms import ArmRun, make_pool, parse_arm, run_arm
from maserve_prefect.bench.hear.pool_sizing import SizingRule, SizingStep, size_pool
from maserve_prefect.bench.hear.tables import (
    SuiteReport,
    arm_row,
    load_scale,
    markdown,
    overhead_rows,
    write_outputs,
)
from maserve_prefect.errors import ConfigError
from maserve_prefect.workloads.mooncake_sessions import mooncake_load_levels
from maserve_prefect.workloads.sessions import SessionSet

__all__ = ["DEFAULT_SUITE", "mooncake_pool_size", "mooncake_workloads", "run_mooncake"]

_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_SUITE = _ROOT / "deployments" / "suites" / "hear_mooncake.yaml"
COLUMNS = ["load", "policy", "ttft_p50_s", "ttft_p95_s", "session_p50_s", "session_mean_s",
           "throughput_rps", "makespan_s", "makespan_incl_cp_s", "reuse", "reuse_host", "host_load_s",
           "num_completed",
           "control_plane_share", "workload_sha256", "paper"]  # fmt: skip


def mooncake_workloads(cfg: dict[str, Any], base_dir: Path) -> dict[float, SessionSet]:
    """The recorded load levels (fraction -> sessions) of the scaled config."""
    w = cfg["workload"]
    trace = Path(w["trace"])
    if not trace.is_absolute():
        trace = (base_dir / trace).resolve()
    return mooncake_load_levels(
        trace,
        start_s=float(w.get("start_s", 0.0)),
        window_s=float(w["window_s"]),
        fractions=tuple(float(f) for f in w["fractions"]),
        seed=int(w.get("seed", 0)),
    )


def mooncake_pool_size(
    cfg: dict[str, Any], levels: dict[float, SessionSet]
) -> tuple[int, str, list[SizingStep]]:
    """The suite's device count, how it was chosen, and the sizing sweep (empty when pinned).

    Raises:
        ConfigError: neither `pool.num_devices` nor `pool.sizing`, a sizing load that is not
            one of the workload's fractions, or no size meets the SLO.
    """
    pool = cfg["pool"]
    if pool.get("num_devices") is not None:
        return int(pool["num_devices"]), "pinned by pool.num_devices", []
    if "sizing" not in pool:
        raise ConfigError("the Mooncake suite's pool needs `sizing` (a rule) or `num_devices`")
    rule = SizingRule.from_config(pool["sizing"])
    sset = next((s for f, s in levels.items() if abs(f - rule.load) < 1e-9), None)
    if sset is None:
        raise ConfigError(
            f"pool.sizing.load {rule.load} is not a workload fraction {sorted(levels)}"
        )
    n, steps = size_pool(
        sset,
        rule,
        gpu=pool["gpu"],
        model=pool["model"],
        host_kv_gib=float(pool.get("host_kv_gib", 0)),
        scheduler=pool.get("scheduler"),
        max_in_flight=cfg.get("max_in_flight"),
    )
    return n, rule.describe(), steps


def run_mooncake(
    path: Path = DEFAULT_SUITE, scale: str = "demo", out_dir: Path | None = None
) -> SuiteReport:
    """Run every arm at every load level of the Mooncake suite at `scale`.

    Raises:
        ConfigError: a bad suite file, scale, trace or arm.
    """
    cfg = load_scale(path, scale)
    levels = mooncake_workloads(cfg, path.parent)
    pool = cfg["pool"]
    num_devices, how, sweep = mooncake_pool_size(cfg, levels)
    rows: list[dict[str, Any]] = []
    runs: list[ArmRun] = []
    for frac, sset in sorted(levels.items()):
        digest = sset.content_hash()
        if out_dir is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            sset.save(Path(out_dir) / f"hear_mooncake_{scale}_{int(frac * 100)}.jsonl")
        for name, spec in cfg["arms"].items():
            replicas = make_pool(pool["gpu"], pool["model"], num_devices,
                                 float(pool.get("host_kv_gib", 0)),
                                 dict(pool.get("scheduler", {})))  # fmt: skip
            run = run_arm(sset, parse_arm(name, spec), replicas,
                          max_in_flight=cfg.get("max_in_flight"), expect_hash=digest)  # fmt: skip
            runs.append(run)
            rows.append({"load": f"{frac:.0%}", **arm_row(run), "paper": "n/a"})
        if out_dir is not None:  # a full run takes a while: keep what is done so far
            partial = Path(out_dir) / f"hear_mooncake_{scale}.partial.md"
            partial.write_text(markdown(rows, COLUMNS) + "\n")
    header = (
        f"## HEAR Mooncake ({scale}): window {cfg['workload']['window_s']} s, loads "
        + ", ".join(f"{f:.0%}={len(s)} sessions/{s.num_turns} turns" for f, s in levels.items())
        + f"; fixed pool {num_devices} x {pool['gpu']} {pool['model']} ({how}), host KV "
        f"{pool.get('host_kv_gib', 0)} GiB each, max_in_flight {cfg.get('max_in_flight')}"
    )
    sizing = [s.row() for s in sweep]
    parts = [header, markdown(rows, COLUMNS)]
    if sizing:
        parts.append(f"### Pool size: {how}\n\n" + markdown(sizing))
    parts.append(
        "### Control-plane overhead (host CPU), all loads\n\n" + markdown(overhead_rows(runs))
    )
    text = "\n\n".join(parts)
    tables = {"arms": rows, "overhead": overhead_rows(runs), "pool_sizing": sizing,
              "meta": [{"scale": scale, "num_devices": num_devices, "pool_rule": how}]}  # fmt: skip
    report = SuiteReport("hear_mooncake", scale, tables, text)
    if out_dir is not None:
        report.files = write_outputs(Path(out_dir), f"hear_mooncake_{scale}", tables, text)
    return report
