"""Role -> mode on a Main/Reader research workflow: calibrate on development sets, then evaluate.

One idea: the workload is sessions — `main-*` sessions are long-lived main agents whose context
grows turn by turn (SCBench multi-turn generator, history kept), `reader-*` sessions are
sub-agents each reading one document (multi-request mode: document + question, no history) —
and the role is the session id's prefix (`adapters.role_of`). `mode_calibration.calibrate` runs
each role's candidate modes on `stability_runs` development sets (seeds `dev_seed + i`; the other
role stays dense), filters by the quality proxy and stability, ranks by development makespan and
writes a frozen, versioned `ModeMap`; the evaluation set (another seed) then runs with the mapping
read back from that file vs all-dense, recording requested vs realized mode and fallbacks.

Quality is MODELED (the simulator computes no tokens): per request, `dense` scores 1; `kv_budget`
scores 1 when the context the role needs fits the budget (`kv_budget_tokens`, the simulator's
`ModeParams` default 1,024), else budget / needed — a Reader needs only its question and the
evidence passage (`reader_needed_tokens`), a Main agent needs its whole prompt;
`sparse_attention` scores 1 - `sparse_penalty`. A run's quality is the minimum over its requests.
The suite file is `experiment: role_modes` of `kind: hear`
(`bench.hear.suite_file.RoleModesSuite`, which also holds `QualityModel`).

Examples:
    >>> quality_proxy("reader", "kv_budget", 20000, QualityModel())
    1.0
    >>> round(quality_proxy("main", "kv_budget", 4096, QualityModel()), 2)
    0.25
"""

from __future__ import annotations

from pathlib import Path

from maserve_prefect.bench.hear.adapters import role_of
from maserve_prefect.bench.hear.arms import Arm, ArmRun, make_pool, run_arm
from maserve_prefect.bench.hear.suite_file import QualityModel, RoleModesSuite, ScbenchParams
from maserve_prefect.bench.hear.tables import arm_row, overhead_rows
from maserve_prefect.bench.report import ProgressFn, Report, Table
from maserve_prefect.hear.mode_calibration import DevRun, calibrate
from maserve_prefect.hear.modemap import ModeMap
from maserve_prefect.hear.policies import RoleModeSelection
from maserve_prefect.workloads.scbench import generate_scbench
from maserve_prefect.workloads.sessions import Session, SessionSet

__all__ = ["main_reader_set", "quality_proxy", "run_role_modes"]

EVAL_COLUMNS = ("mapping", "ttft_p50_s", "ttft_p95_s", "makespan_s", "makespan_incl_cp_s",
                "session_wait_mean_s", "quality_proxy", "fallbacks", "control_plane_share",
                "paper")  # fmt: skip
"""The evaluation table's shown columns (the JSON keeps every column)."""


def quality_proxy(role: str, mode: str, num_prompt_tokens: int, q: QualityModel) -> float:
    """The modeled quality of one request of `role` run in `mode` (module docstring)."""
    if mode == "kv_budget":
        need = q.reader_needed_tokens if role == "reader" else num_prompt_tokens
        return 1.0 if need <= q.kv_budget_tokens else q.kv_budget_tokens / need
    if mode == "sparse_attention":
        return 1.0 - q.sparse_penalty
    return 1.0


def _renamed(sset: SessionSet, role: str) -> list[Session]:
    return [Session(f"{role}-{s.session_id.split('-', 1)[1]}", s.turns) for s in sset]


def main_reader_set(
    seed: int, num_main: int, num_readers: int, main: ScbenchParams, reader: ScbenchParams
) -> SessionSet:
    """Main sessions (growing context, history kept) and Reader sessions (one document each,
    no history), one set."""
    m = generate_scbench(num_main, seed, **(main.params() | {"include_history": True}))
    r = generate_scbench(
        num_readers, seed + 10_000, **(reader.params() | {"include_history": False})
    )
    return SessionSet(tuple(_renamed(m, "main") + _renamed(r, "reader")), "closed",
                      {"generator": "main_reader", "seed": seed})  # fmt: skip


def _dev_runs(suite: RoleModesSuite) -> int:
    """Development replays calibration makes: every distinct candidate of every role, each
    `stability_runs` times."""
    modes = sum(len(dict.fromkeys(m)) for m in suite.candidates.values())
    return modes * suite.stability_runs


def run_role_modes(
    suite: RoleModesSuite,
    scale: str = "demo",
    out_dir: Path | None = None,
    progress: ProgressFn | None = None,
) -> Report:
    """Calibrate the role -> mode mapping, freeze it, and evaluate it against all-dense
    (progress: after each development and evaluation replay).

    The frozen mapping is written to `out_dir` (default: the suite's `mapping_dir`) and read
    back for the evaluation.

    Raises:
        ConfigError: a bad scale, or a role whose every candidate fails calibration.
    """
    cfg = suite.scaled(scale)
    w, pool, qm = cfg.workload, cfg.pool, cfg.quality
    out = Path(out_dir) if out_dir is not None else cfg.mapping_dir
    total, done = _dev_runs(cfg) + 2, 0

    def step(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, label)

    def workload(seed: int) -> SessionSet:
        return main_reader_set(seed, w.num_main, w.num_readers, w.main, w.reader)

    def replay(sset: SessionSet, mapping: ModeMap) -> ArmRun:
        reps = make_pool(pool.gpu, pool.model, pool.num_devices or 1, float(pool.host_kv_gib),
                         dict(pool.scheduler))  # fmt: skip
        arm = Arm(mapping.version, selection=RoleModeSelection(mapping))
        return run_arm(sset, arm, reps)

    def run_fn(role: str, mode: str, i: int) -> DevRun:
        mapping = ModeMap.of(f"dev-{role}-{mode}", {role: mode}, default="dense")
        run = replay(workload(w.dev_seed + i), mapping)
        sizes = {t.request_id: t.num_prompt_tokens for t in run.result.turns}
        used = [(r.role, r.realized or r.requested, sizes[r.request_id]) for r in run.mode_records]
        step(f"dev/{role}/{mode}/{i}")
        return DevRun(run.result.makespan_s, used)

    def quality_fn(role: str, mode: str, run: DevRun) -> float:
        used: list[tuple[str, str, int]] = run.output  # type: ignore[assignment]
        return min((quality_proxy(r, m, n, qm) for r, m, n in used if r == role), default=1.0)

    cal = calibrate(dict(cfg.candidates), run_fn, quality_fn, cfg.stability_runs,
                    version=cfg.version, min_quality=cfg.min_quality,
                    max_makespan_cv=cfg.max_makespan_cv, default="dense",
                    path=out / f"role_modes_{cfg.version}.json")  # fmt: skip
    assert cal.path is not None
    frozen = ModeMap.load(cal.path)  # the evaluation reads the frozen file back
    eval_set = workload(w.eval_seed)
    dense = ModeMap.of("all-dense", {}, default="dense")
    runs = []
    for mapping in (dense, frozen):
        runs.append(replay(eval_set, mapping))
        step(f"eval/{mapping.version}")
    rows = []
    for run in runs:
        row = arm_row(run)
        recs = run.mode_records
        q = min(quality_proxy(r.role, r.realized or r.requested, 1, qm) if r.role == "reader"
                else quality_proxy(r.role, r.realized or r.requested,
                                   next(t.num_prompt_tokens for t in run.result.turns
                                        if t.request_id == r.request_id), qm)
                for r in recs)  # fmt: skip
        row.update(
            mapping=run.arm.name,
            quality_proxy=q,
            fallbacks=sum(r.fell_back for r in recs),
            paper="n/a",
        )
        rows.append(row)
    modes = [{"role": role, "requested": frozen.lookup(role),
              "realized": sorted({r.realized or "-" for r in runs[1].mode_records
                                  if role_of(r.request_id) == role}),
              "fallbacks": sum(r.fell_back for r in runs[1].mode_records
                               if role_of(r.request_id) == role)}
             for role in sorted(cfg.candidates)]  # fmt: skip
    cands = [{"role": c.role, "mode": c.mode, "min_quality": min(c.qualities),
              "median_makespan_s": c.median_makespan_s, "passed_quality": c.passed_quality,
              "passed_stability": c.passed_stability} for c in cal.reports]  # fmt: skip
    header = [
        f"HEAR role -> mode ({scale}): mapping {frozen.version} "
        f"sha256 {frozen.content_hash[:12]} = {dict(frozen.modes)} (quality is MODELED); "
        f"evaluation workload {eval_set.content_hash()[:12]}"
    ]
    tables = {
        "calibration": Table(cands, "Calibration (development sets)"),
        "evaluation": Table(rows, "Evaluation set: mapping vs all-dense", EVAL_COLUMNS),
        "modes": Table(modes, "Requested vs realized"),
        "overhead": Table(overhead_rows(runs), "Control-plane overhead"),
    }
    return Report(tables, header=header, files=[cal.path])
