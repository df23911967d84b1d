"""The Mooncake HEAR experiment: five policies at 50 / 75 / 100 % load on one fixed pool.

One idea: sessions are inferred once from the shared Mooncake-format trace
(`workloads.mooncake_load_levels`: sessions starting in a 15-minute window, nested seeded 50 /
75 / 100 % subsets); each load level is one recorded `SessionSet` whose hash every arm checks.
The pool is fixed before any policy is compared and is the same for every arm and load: the
trace overloads one RTX PRO 6000, so the suite uses the smallest number of RTX PRO 6000s
(Qwen3-8B, 96 GiB host KV tier each) that is not hopelessly overloaded at 100 % under FCFS
(`pool.num_devices` in the YAML says how it was chosen). Arrivals are open loop (the trace's
timestamps); sessions stay on the replica of their first turn.

Table: per load and arm TTFT p50 / p95, session time, throughput and reuse, with a paper column
("n/a": the issue gives no Mooncake figures), and the control-plane overhead rows.

Examples:
    >>> cfg = load_scale(DEFAULT_SUITE, "demo")
    >>> sorted(cfg["arms"])[:2]
    ['cache_aware', 'cache_aware+guard40']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from maserve_prefect.hear_bench.adapters import ArmRun, make_pool, parse_arm, run_arm
from maserve_prefect.hear_bench.tables import (
    SuiteReport,
    arm_row,
    load_scale,
    markdown,
    overhead_rows,
    write_outputs,
)
from maserve_prefect.workloads.mooncake_sessions import mooncake_load_levels
from maserve_prefect.workloads.sessions import SessionSet

__all__ = ["DEFAULT_SUITE", "mooncake_workloads", "run_mooncake"]

_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SUITE = _ROOT / "deployments" / "suites" / "hear_mooncake.yaml"
COLUMNS = ["load", "policy", "ttft_p50_s", "ttft_p95_s", "session_p50_s", "session_mean_s",
           "throughput_rps", "reuse", "num_completed", "control_plane_share",
           "workload_sha256", "paper"]  # fmt: skip


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
    rows: list[dict[str, Any]] = []
    runs: list[ArmRun] = []
    for frac, sset in sorted(levels.items()):
        digest = sset.content_hash()
        if out_dir is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            sset.save(Path(out_dir) / f"hear_mooncake_{scale}_{int(frac * 100)}.jsonl")
        for name, spec in cfg["arms"].items():
            replicas = make_pool(pool["gpu"], pool["model"], int(pool["num_devices"]),
                                 float(pool.get("host_kv_gib", 0)),
                                 dict(pool.get("scheduler", {})))  # fmt: skip
            run = run_arm(sset, parse_arm(name, spec), replicas,
                          max_in_flight=cfg.get("max_in_flight"), expect_hash=digest)  # fmt: skip
            runs.append(run)
            rows.append({"load": f"{frac:.0%}", **arm_row(run), "paper": "n/a"})
    header = (
        f"## HEAR Mooncake ({scale}): window {cfg['workload']['window_s']} s, loads "
        + ", ".join(f"{f:.0%}={len(s)} sessions/{s.num_turns} turns" for f, s in levels.items())
        + f"; fixed pool {pool['num_devices']} x {pool['gpu']} {pool['model']}, host KV "
        f"{pool.get('host_kv_gib', 0)} GiB each, max_in_flight {cfg.get('max_in_flight')}"
    )
    text = "\n\n".join(
        [header, markdown(rows, COLUMNS),
         "### Control-plane overhead (host CPU), all loads\n\n" + markdown(overhead_rows(runs))]
    )  # fmt: skip
    tables = {"arms": rows, "overhead": overhead_rows(runs)}
    report = SuiteReport("hear_mooncake", scale, tables, text)
    if out_dir is not None:
        report.files = write_outputs(Path(out_dir), f"hear_mooncake_{scale}", tables, text)
    return report
