"""Choosing the SCBench workload knobs the paper leaves unstated, on its FCFS row only.

One idea: the HEAR paper states the SCBench setup (Appendix A.2: independent sessions, Poisson
session arrivals, think time N(5, 1) s; Qwen3-8B on one RTX PRO 6000 with a 96 GiB L2 cache) but
not the number of sessions, the context-length cap or the arrival rate. Those are chosen by
replaying the *FCFS arm only* over a grid (`calibration.grid` in the suite file: knob -> values,
every combination one workload) and keeping the point whose FCFS row is closest to the paper's
FCFS row (`calibration.target`): the score is the larger relative error of batch completion and
TTFT p50 (the issue's 15 % criterion), ties broken by the mean relative error of TTFT p95, TTFT
max and follow-up reuse. No policy arm runs here, so no policy can enter the choice. The chosen
knobs are then frozen in the suite file by hand, with this sweep's output in a comment
(`deployments/suites/hear_scbench.yaml`); the report says whether the file's workload is the
chosen point.

`maserve bench run deployments/suites/hear_scbench.yaml --scale full --calibrate` runs it.

Examples:
    >>> from maserve_prefect.bench.hear.suite_file import Calibration
    >>> cal = Calibration.model_validate({"target": {"makespan_s": 481, "ttft_p50_s": 63.1,
    ...     "ttft_p95_s": 74.2, "ttft_max_s": 79.0, "followup_reuse": 0.192},
    ...     "grid": {"num_sessions": [8, 16], "arrival_rate_per_s": [0.5]}})
    >>> grid_points(cal)
    [{'num_sessions': 8, 'arrival_rate_per_s': 0.5}, {'num_sessions': 16, 'arrival_rate_per_s': 0.5}]
    >>> rel_error(90.0, 100.0)
    -0.1
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from maserve_prefect.bench.hear.arms import make_pool, parse_arm, run_arm
from maserve_prefect.bench.hear.suite_file import Calibration, FcfsTarget, ScbenchSuite
from maserve_prefect.bench.report import ProgressFn, Report, Table
from maserve_prefect.errors import ConfigError
from maserve_prefect.workloads.scbench import generate_scbench

__all__ = ["choose", "grid_points", "rel_error", "run_calibration", "score_row"]

COLUMNS = ("makespan_s", "ttft_p50_s", "ttft_p95_s", "ttft_max_s", "followup_reuse",
           "num_turns", "err_makespan", "err_ttft_p50", "within", "score", "chosen", "frozen")  # fmt: skip


def grid_points(cal: Calibration) -> list[dict[str, Any]]:
    """Every combination of the grid's values, in file order (the last knob varies fastest)."""
    keys = list(cal.grid)
    return [dict(zip(keys, vals, strict=True)) for vals in itertools.product(*cal.grid.values())]


def rel_error(measured: float, target: float) -> float:
    """(measured - target) / target."""
    return (measured - target) / target


def score_row(row: dict[str, Any], target: FcfsTarget, tolerance: float) -> dict[str, Any]:
    """`row` (an FCFS run's figures) with its errors against `target`, whether both primary
    errors are within `tolerance`, the score (larger primary error) and the tie-breaker."""
    em = rel_error(row["makespan_s"], target.makespan_s)
    e50 = rel_error(row["ttft_p50_s"], target.ttft_p50_s)
    secondary = [
        abs(rel_error(row["ttft_p95_s"], target.ttft_p95_s)),
        abs(rel_error(row["ttft_max_s"], target.ttft_max_s)),
        abs(rel_error(row["followup_reuse"], target.followup_reuse)),
    ]
    score = max(abs(em), abs(e50))
    return {**row, "err_makespan": em, "err_ttft_p50": e50,
            "within": score <= tolerance, "score": score,
            "tie_break": sum(secondary) / len(secondary)}  # fmt: skip


def choose(rows: Sequence[dict[str, Any]]) -> int:
    """Index of the chosen row: the lowest score, then the lowest tie-breaker, then the first.

    Raises:
        ConfigError: no rows.
    """
    if not rows:
        raise ConfigError("calibration: the grid has no points")
    return min(range(len(rows)), key=lambda i: (rows[i]["score"], rows[i]["tie_break"], i))


def run_calibration(
    suite: ScbenchSuite, scale: str = "full", progress: ProgressFn | None = None
) -> Report:
    """Replay the FCFS arm at every grid point of `suite.calibration` at `scale` (module
    docstring) and report the sweep with the chosen point.

    Raises:
        ConfigError: the suite has no `calibration` block, or a grid point is not a valid
            workload.
    """
    cfg = suite.scaled(scale)
    cal = cfg.calibration
    if cal is None:
        raise ConfigError(
            f"suite {suite.name}: --calibrate needs a `calibration` block (target and grid)"
        )
    pool = cfg.pool
    arm = parse_arm("fcfs", "fcfs")
    points = grid_points(cal)
    rows: list[dict[str, Any]] = []
    for i, knobs in enumerate(points):
        w = cfg.workload.model_validate({**cfg.workload.model_dump(), **knobs})
        sset = generate_scbench(w.num_sessions, w.seed, **w.params())
        replicas = make_pool(pool.gpu, pool.model, pool.num_devices or 1, float(pool.host_kv_gib),
                             {**pool.scheduler, "policy": arm.engine_policy})  # fmt: skip
        res = run_arm(sset, arm, replicas, refresh_s=cfg.refresh_s).result
        row = {**knobs, "makespan_s": res.makespan_s, "ttft_p50_s": res.ttft_percentile(50),
               "ttft_p95_s": res.ttft_percentile(95), "ttft_max_s": res.ttft_percentile(100),
               "followup_reuse": res.followup_reuse, "num_turns": sset.num_turns,
               "frozen": all(getattr(cfg.workload, k) == v for k, v in knobs.items())}  # fmt: skip
        rows.append(score_row(row, cal.target, cal.tolerance))
        if progress is not None:
            progress(i + 1, len(points), " ".join(f"{k}={v}" for k, v in knobs.items()))
    best = choose(rows)
    for i, row in enumerate(rows):
        row["chosen"] = i == best
    chosen = {k: rows[best][k] for k in cal.grid}
    frozen = rows[best]["frozen"]
    t = cal.target
    header = [
        f"HEAR SCBench calibration ({scale}): FCFS only, {len(points)} grid points over "
        f"{', '.join(cal.grid)}; target (paper's FCFS row) batch {t.makespan_s:g} s, TTFT p50 / "
        f"p95 / max {t.ttft_p50_s:g} / {t.ttft_p95_s:g} / {t.ttft_max_s:g} s, follow-up reuse "
        f"{t.followup_reuse:.1%}; score = max(|err batch|, |err p50|), tolerance "
        f"{cal.tolerance:.0%}",
        f"chosen: {chosen} (score {rows[best]['score']:.3f}, "
        f"{'within' if rows[best]['within'] else 'NOT within'} tolerance); the suite file's "
        f"workload {'is' if frozen else 'is NOT'} this point",
    ]
    cols = (*cal.grid, *COLUMNS)
    summary = {"chosen": chosen, "score": rows[best]["score"], "frozen": frozen}
    assert all(math.isfinite(r["makespan_s"]) for r in rows)
    report = Report({"calibration": Table(rows, "FCFS calibration sweep", cols)}, header=header)
    report.summary = summary
    return report
