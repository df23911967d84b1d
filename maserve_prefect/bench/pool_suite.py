"""The heterogeneous-GPU pool suite: recorded multi-agent work, every pool plan, the paper's goals.

One idea: the *work* is fixed per run seed — native simulator traces of the suite's workflows
(`runtime.pool_workload`), recorded once and cached — and every arm (a pool plan, its cost
predictor, its ablation switches) runs that same work with the same arrivals on the same pool
(`runtime.pool_exec.run_pool`); only lifecycle and placement decisions differ. The suite then
reports, per arrival pattern, what was achieved next to the goals (`Goals`): the joint plan's
makespan and p95 against the Parrot-like and Kairos-like plans (and request-level FCFS), its
makespan against the offline lower bound, the GPU-seconds per completed session split four
ways, per-model-path completion, model-availability delays (waiting for an ongoing load vs a
load that cannot start) and re-acquire waits, the ablations, and the predictors' held-out
quality (`runtime.pool_costs.predictor_scores`).

A suite file has `kind: pool` (the scenario-suite loader of `bench.suite` cannot express it):

    name: pool-hetero
    kind: pool
    workflows: [math_ensemble, code_repair, hierarchical_summary]
    arrivals: {burst: {kind: burst}, p0150: {kind: poisson, rate_per_s: 0.150}}
    arms: {joint: {plan: joint, predictor: graph}, parrot: {plan: parrot}, ...}
    headline: joint                     # the arm compared against the baselines
    baselines: {parrot: parrot, kairos: kairos, fcfs: pool-fcfs}   # label -> arm
    ablations: [joint-no-fusion, ...]   # arms compared against the headline
    training: {profiles: ../../../shared/data/profiles}
    scales:
      demo: {sessions_per_workflow: 4, devices: {V100-32GB: 1, A100-40GB: 1}, runs: 1,
             arrivals: [burst], arms: [joint, parrot, kairos, pool-fcfs]}

Run `r` (0-based) records its traces with seed `42 + r` and draws Poisson arrivals with seed
`42 + r`; tables show the mean over runs, and a ratio is the ratio of those means. Results are
deterministic: the same suite file and scale give identical tables.

Examples:
    >>> ArmSpec(plan="joint").options().fusion
    True
    >>> path_label(("Qwen3-0.6B", "Qwen3-8B"))
    '0.6B+8B'
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from maserve_prefect.errors import ConfigError
from maserve_prefect.metrics.report import markdown_table, render_table
from maserve_prefect.predictors import Buckets, BucketTable
from maserve_prefect.runtime.lower_bound import lower_bound
from maserve_prefect.runtime.pool_costs import (
    TrainingRows,
    TrainingSpec,
    bucket_grid,
    predictor_cost_model,
    predictor_scores,
    training_rows,
)
from maserve_prefect.runtime.pool_exec import ExecOptions, PoolRunResult, run_pool
from maserve_prefect.runtime.pool_workload import (
    ARRIVAL_SEED,
    POOL_MODELS,
    ArrivalPattern,
    RootWork,
    build_workload,
    record_traces,
    workload_roots,
)
from maserve_prefect.yamlfiles import read_yaml_mapping

Row = dict[str, Any]
ProgressFn = Callable[[int, int, str], None]
Axes = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArrivalSpec(_Model):
    kind: Literal["burst", "poisson"]
    rate_per_s: float = Field(default=0.0, ge=0)

    def pattern(self) -> ArrivalPattern:
        return ArrivalPattern(self.kind, self.rate_per_s)


class ArmSpec(_Model):
    """One arm: a registered pool plan, the predictor its costs come from, ablation switches."""

    plan: str
    predictor: Literal["formula", "gbdt", "graph"] = "graph"
    fusion: bool = True
    prefetch: bool = True
    coalesce: bool = True

    def options(self) -> ExecOptions:
        return ExecOptions(fusion=self.fusion, prefetch=self.prefetch, coalesce=self.coalesce)


class Goals(_Model):
    """The paper's goals: headline/baseline makespan and p95 ratios, headline/lower bound."""

    makespan_vs_baselines: float = 0.60
    p95_vs_baselines: float = 0.72
    vs_lower_bound: float = 1.15
    pattern: str = "burst"


class TrainingConfig(_Model):
    """Predictor training rows (`pool_costs.TrainingSpec`); `profiles` is relative to the file."""

    profiles: Path
    measured_shapes: Axes | None = None
    sim_shapes: Axes | None = None
    sim_models: tuple[str, ...] | None = None
    sim_devices: tuple[str, ...] | None = None
    trees: int = Field(default=300, ge=1)


class Scale(_Model):
    """One scale: sessions, pool, runs, and optionally subsets of arrivals / arms."""

    sessions_per_workflow: int = Field(ge=1)
    devices: dict[str, int]
    runs: int = Field(default=1, ge=1)
    arrivals: tuple[str, ...] | None = None
    arms: tuple[str, ...] | None = None
    training: TrainingConfig | None = None
    bucket_steps: int = Field(default=3, ge=1)
    score_predictors: bool = True

    def device_names(self) -> list[str]:
        return [f"{gpu}:{i}" for gpu, n in self.devices.items() for i in range(n)]


class PoolSuite(_Model):
    """A parsed `kind: pool` suite file (module docstring)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    kind: Literal["pool"]
    description: str = ""
    workflows: tuple[str, ...] = Field(min_length=1)
    arrivals: dict[str, ArrivalSpec] = Field(min_length=1)
    arms: dict[str, ArmSpec] = Field(min_length=1)
    headline: str = "joint"
    baselines: dict[str, str] = Field(default_factory=dict)
    ablations: tuple[str, ...] = ()
    goals: Goals = Goals()
    training: TrainingConfig
    scales: dict[str, Scale] = Field(min_length=1)
    base_dir: Path = Path(".")

    @model_validator(mode="after")
    def _names_exist(self) -> PoolSuite:
        named = [("headline", self.headline)] + [(f"baselines.{k}", v) for k, v in
                                                 self.baselines.items()]  # fmt: skip
        named += [("ablations", a) for a in self.ablations]
        for scale, sc in self.scales.items():
            named += [(f"scales.{scale}.arms", a) for a in sc.arms or ()]
            for a in sc.arrivals or ():
                if a not in self.arrivals:
                    raise ValueError(f"scales.{scale}.arrivals: unknown pattern {a!r}")
        for where, arm in named:
            if arm not in self.arms:
                raise ValueError(f"{where}: unknown arm {arm!r}; arms: {', '.join(self.arms)}")
        return self

    def scale(self, name: str) -> Scale:
        if name not in self.scales:
            raise ConfigError(
                f"suite {self.name}: unknown scale {name!r}; use one of {', '.join(self.scales)}"
            )
        return self.scales[name]

    def training_spec(self, scale: Scale) -> TrainingSpec:
        cfg = scale.training or self.training
        profiles = cfg.profiles if cfg.profiles.is_absolute() else self.base_dir / cfg.profiles
        base = TrainingSpec(profiles=profiles.resolve(), num_trees=cfg.trees)
        return TrainingSpec(
            profiles=base.profiles,
            measured_shapes=cfg.measured_shapes or base.measured_shapes,
            sim_models=cfg.sim_models or base.sim_models,
            sim_devices=cfg.sim_devices or base.sim_devices,
            sim_shapes=cfg.sim_shapes or base.sim_shapes,
            num_trees=cfg.trees,
        )


def load_pool_suite(path: str | Path) -> PoolSuite:
    """Parse and check a `kind: pool` suite file.

    Raises:
        ConfigError: unreadable file, bad YAML or an invalid field (file and field named).
    """
    path = Path(path)
    data = read_yaml_mapping(path, "pool suite")
    try:
        return PoolSuite.model_validate({**data, "base_dir": path.parent})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ConfigError(f"pool suite {path}: {loc}: {first['msg']}") from None


def is_pool_suite(path: str | Path) -> bool:
    """Whether the YAML file at `path` declares `kind: pool`."""
    return read_yaml_mapping(Path(path), "suite").get("kind") == "pool"


# -- running -------------------------------------------------------------------------------


def path_label(models: Sequence[str]) -> str:
    """A model path's short name: sizes joined by '+'."""
    return "+".join(m.removeprefix("Qwen3-") for m in models)


@dataclass(slots=True)
class ArmRun:
    """The numbers one arm run produced (what the tables need, not the whole result)."""

    pattern: str
    arm: str
    run: int
    summary: dict[str, float]
    latency_s: dict[str, float]
    num_reacquiring_ops: int

    @classmethod
    def of(cls, pattern: str, arm: str, run: int, res: PoolRunResult) -> ArmRun:
        return cls(
            pattern,
            arm,
            run,
            res.summary(),
            dict(res.root_latency_s),
            sum(o.reacquire_s > 0 for o in res.ops),
        )


@dataclass(slots=True)
class PoolSuiteResult:
    """A suite run: per-run numbers, lower bounds, workload facts, predictor scores."""

    suite: PoolSuite
    scale: str
    runs: list[ArmRun] = field(default_factory=list)
    lower_bounds: dict[tuple[str, int], float] = field(default_factory=dict)
    paths: dict[int, dict[str, str]] = field(default_factory=dict)  # run -> root -> path
    workload: list[Row] = field(default_factory=list)
    predictors: list[Row] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def tables(self) -> dict[str, list[Row]]:
        """Report name → rows (module docstring); deterministic for a suite and scale."""
        return _tables(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "suite": self.suite.name,
            "scale": self.scale,
            "scale_config": self.suite.scale(self.scale).model_dump(mode="json"),
            "goals": self.suite.goals.model_dump(),
            "tables": self.tables(),
            "per_run": [
                {"pattern": r.pattern, "arm": r.arm, "run": r.run, **r.summary} for r in self.runs
            ],
            "lower_bound_s": {f"{p}/run{r}": v for (p, r), v in self.lower_bounds.items()},
            "wall_seconds": self.seconds,
        }

    def to_markdown(self) -> str:
        parts = [f"# {self.suite.name} ({self.scale})", self.suite.description]
        for name, rows in self.tables().items():
            parts.append(f"## {name}\n\n{markdown_table(rows) or '(no rows)'}")
        return "\n\n".join(parts) + "\n"

    def write(self, out: Path) -> tuple[Path, Path]:
        """Write `<out>/<suite>-<scale>.json` and `.md`; returns both paths."""
        out.mkdir(parents=True, exist_ok=True)
        stem = out / f"{self.suite.name}-{self.scale}"
        js, md = stem.with_suffix(".json"), stem.with_suffix(".md")
        js.write_text(json.dumps(_jsonable(self.to_json()), indent=1, sort_keys=True) + "\n")
        md.write_text(self.to_markdown())
        return js, md


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not np.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return v


def _cost_models(
    suite: PoolSuite, arms: Sequence[str], roots: Sequence[RootWork], rows: TrainingRows,
    scale: Scale, num_trees: int,
) -> dict[str, BucketTable]:  # fmt: skip
    units = [u for r in roots for u in r.units]
    grid: Buckets = bucket_grid(
        max(u.input_len for u in units),
        max(u.max_tokens for u in units),
        steps_per_doubling=scale.bucket_steps,
    )
    models = sorted({u.deployment for u in units} | set(POOL_MODELS))
    kinds = sorted({suite.arms[a].predictor for a in arms})
    return {
        k: predictor_cost_model(
            k,
            models=models,
            devices=scale.device_names(),
            buckets=grid,
            training=rows,
            num_trees=num_trees,
        )
        for k in kinds
    }


def run_pool_suite(
    suite: PoolSuite, scale: str = "demo", *, progress: ProgressFn | None = None
) -> PoolSuiteResult:
    """Run every (arrival pattern, run, arm) of `suite` at `scale`.

    Recording native traces needs a Prefect API (`prefect_server.ensure_server()` or a test
    harness) unless they are cached under `$MASERVE_HOME/pool_traces/`.

    Raises:
        ConfigError: unknown scale, names or profiles.
        SimulationError: a plan broke a rule or left work unfinished.
    """
    sc = suite.scale(scale)
    patterns = list(sc.arrivals or suite.arrivals)
    arms = list(sc.arms or suite.arms)
    devices = sc.device_names()
    out = PoolSuiteResult(suite, scale)
    t0 = time.perf_counter()
    spec = suite.training_spec(sc)
    rows = training_rows(spec)
    if sc.score_predictors:
        out.predictors = predictor_scores(rows.measured, spec.num_trees)
    out.seconds["predictors"] = time.perf_counter() - t0
    by_run: list[list[RootWork]] = []
    for run in range(sc.runs):
        t1 = time.perf_counter()
        traces = record_traces(suite.workflows, sc.sessions_per_workflow, ARRIVAL_SEED + run)
        by_run.append(workload_roots(traces))
        out.seconds[f"record_run{run}"] = time.perf_counter() - t1
        out.paths[run] = {r.root_id: path_label(r.models) for r in by_run[-1]}
        out.workload += _workload_rows(run, by_run[-1])
    t2 = time.perf_counter()
    every = [r for roots in by_run for r in roots]  # buckets must cover every run's requests
    costs = _cost_models(suite, arms, every, rows, sc, spec.num_trees)
    out.seconds["cost_tables"] = time.perf_counter() - t2
    total, done = sc.runs * len(patterns) * len(arms), 0
    for run, roots in enumerate(by_run):
        for pname in patterns:
            workflows = build_workload(roots, suite.arrivals[pname].pattern(), run)
            out.lower_bounds[(pname, run)] = lower_bound(workflows, devices).bound_s
            for arm in arms:
                a = suite.arms[arm]
                t3 = time.perf_counter()
                res = run_pool(
                    workflows, devices, a.plan, costs=costs[a.predictor], options=a.options()
                )
                key = f"{pname}/{arm}/run{run}"
                out.seconds[key] = time.perf_counter() - t3
                out.runs.append(ArmRun.of(pname, arm, run, res))
                done += 1
                if progress is not None:
                    progress(done, total, key)
    out.seconds["total"] = time.perf_counter() - t0
    return out


def _workload_rows(run: int, roots: Sequence[RootWork]) -> list[Row]:
    rows = []
    for wf in dict.fromkeys(r.workflow for r in roots):
        mine = [r for r in roots if r.workflow == wf]
        rows.append(
            {
                "run": run,
                "workflow": wf,
                "sessions": len(mine),
                "model_calls": sum(len(r.units) for r in mine),
                "folded_ops": sum(r.num_folded_ops for r in mine),
                "folded_tool_s_per_session": sum(r.folded_delay_s for r in mine) / len(mine),
            }
        )
    return rows


# -- tables --------------------------------------------------------------------------------


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def _by(res: PoolSuiteResult, pattern: str, arm: str) -> list[ArmRun]:
    return [r for r in res.runs if r.pattern == pattern and r.arm == arm]


def _m(runs: Sequence[ArmRun], key: str) -> float:
    return _mean([r.summary[key] for r in runs])


def _arm_rows(res: PoolSuiteResult, patterns: Sequence[str], arms: Sequence[str]) -> list[Row]:
    rows = []
    for p in patterns:
        for a in arms:
            rs = _by(res, p, a)
            rows.append(
                {
                    "arrivals": p,
                    "arm": a,
                    "makespan_s": _m(rs, "makespan_s"),
                    "p95_s": _m(rs, "p95_latency_s"),
                    "mean_s": _m(rs, "mean_latency_s"),
                    "sessions_done": _mean([len(r.latency_s) for r in rs]),
                    "gpu_s_gen": _m(rs, "gpu_s_generation"),
                    "gpu_s_idle": _m(rs, "gpu_s_idle_resident"),
                    "gpu_s_load": _m(rs, "gpu_s_loading"),
                    "gpu_s_other": _m(rs, "gpu_s_other"),
                    "gpu_s_total": _m(rs, "gpu_s_total"),
                    "loads": _m(rs, "num_loads"),
                    "runs": len(rs),
                }
            )
    return rows


def _ratio_rows(res: PoolSuiteResult, patterns: Sequence[str], arms: Sequence[str]) -> list[Row]:
    s, g = res.suite, res.suite.goals
    head = _arm_rows(res, patterns, [s.headline]) if s.headline in arms else []
    rows = []
    for hrow in head:
        p = hrow["arrivals"]
        for label, arm in s.baselines.items():
            if arm not in arms:
                continue
            base = _arm_rows(res, [p], [arm])[0]
            for metric, key, goal in (
                ("makespan", "makespan_s", g.makespan_vs_baselines),
                ("p95", "p95_s", g.p95_vs_baselines),
            ):
                rows.append(_goal_row(p, f"{s.headline}/{label}", metric, hrow[key] / base[key],
                                      goal, label != "fcfs" and p == g.pattern))  # fmt: skip
        lb = _mean([v for (pp, _), v in res.lower_bounds.items() if pp == p])
        rows.append(_goal_row(p, f"{s.headline}/lower bound", "makespan",
                              hrow["makespan_s"] / lb, g.vs_lower_bound, True))  # fmt: skip
    return rows


def _goal_row(p: str, vs: str, metric: str, ratio: float, goal: float, applies: bool) -> Row:
    return {
        "arrivals": p,
        "ratio": vs,
        "metric": metric,
        "achieved": ratio,
        "goal": f"≤ {goal:.2f}×" if applies else f"({goal:.2f}×)",
        "met": ("yes" if ratio <= goal else "no") if applies else "–",
    }


def _path_rows(res: PoolSuiteResult, patterns: Sequence[str], arms: Sequence[str]) -> list[Row]:
    rows = []
    for p in patterns:
        for a in arms:
            per: dict[str, list[float]] = {}
            runs = _by(res, p, a)
            for r in runs:
                for root, lat in r.latency_s.items():
                    per.setdefault(res.paths[r.run][root], []).append(lat)
            for label in sorted(per, key=lambda k: (-len(per[k]), k)):
                lats = per[label]
                rows.append(
                    {
                        "arrivals": p,
                        "arm": a,
                        "model_path": label,
                        "completed_per_run": len(lats) / max(len(runs), 1),
                        "mean_s": _mean(lats),
                        "p95_s": float(np.percentile(lats, 95)),
                    }
                )
    return rows


def _ablation_rows(res: PoolSuiteResult, patterns: Sequence[str], arms: Sequence[str]) -> list[Row]:
    s = res.suite
    if s.headline not in arms:
        return []
    rows = []
    for p in patterns:
        head = _arm_rows(res, [p], [s.headline])[0]
        for a in [s.headline, *(x for x in s.ablations if x in arms)]:
            row = _arm_rows(res, [p], [a])[0]
            rows.append(
                {
                    "arrivals": p,
                    "arm": a,
                    "makespan_s": row["makespan_s"],
                    "vs_head_makespan": row["makespan_s"] / head["makespan_s"],
                    "p95_s": row["p95_s"],
                    "vs_head_p95": row["p95_s"] / head["p95_s"],
                    "gpu_s_total": row["gpu_s_total"],
                    "vs_head_gpu_s": row["gpu_s_total"] / head["gpu_s_total"],
                }
            )
    return rows


def _availability_rows(
    res: PoolSuiteResult, patterns: Sequence[str], arms: Sequence[str]
) -> list[Row]:
    rows = []
    for p in patterns:
        for a in arms:
            rs = _by(res, p, a)
            n = _mean([len(r.latency_s) for r in rs])
            rows.append(
                {
                    "arrivals": p,
                    "arm": a,
                    "wait_ongoing_load_s_per_session": _m(rs, "wait_load_s") / n,
                    "wait_load_cannot_start_s_per_session": _m(rs, "wait_no_load_s") / n,
                    "reacquire_s_per_session": _m(rs, "reacquire_s") / n,
                    "reacquiring_ops": _mean([r.num_reacquiring_ops for r in rs]),
                    "loads": _m(rs, "num_loads"),
                    "prefetches": _m(rs, "num_prefetches"),
                    "unloads": _m(rs, "num_unloads"),
                }
            )
    return rows


def _tables(res: PoolSuiteResult) -> dict[str, list[Row]]:
    sc = res.suite.scale(res.scale)
    patterns = list(sc.arrivals or res.suite.arrivals)
    arms = list(sc.arms or res.suite.arms)
    out = {
        "arms": _arm_rows(res, patterns, arms),
        "goals": _ratio_rows(res, patterns, arms),
        "model_paths": _path_rows(res, patterns, arms),
        "ablations": _ablation_rows(res, patterns, arms),
        "model_availability": _availability_rows(res, patterns, arms),
        "workload": res.workload,
        "predictors": res.predictors,
    }
    return {k: v for k, v in out.items() if v}


TITLES = {
    "arms": "Per arrival pattern and arm (mean over runs; GPU-seconds per completed session)",
    "goals": "Goals: headline vs baselines and the lower bound (ratio of run means; the "
    "paper's goals apply under burst, shown in parentheses elsewhere)",
    "model_paths": "Per-model-path completion (sessions by the set of models their calls used)",
    "ablations": "Ablations vs the headline arm",
    "model_availability": "Model-availability delay per completed session: waiting for an "
    "ongoing load vs a load that cannot start; re-acquire waits",
    "workload": "Workload (tool time folded into zero-cost edges is not modelled)",
    "predictors": "Predictors, held out on measured rows (runtime)",
}


def render(res: PoolSuiteResult, console: Any) -> None:
    """Print every table with rich."""
    console.print(f"suite {res.suite.name} ({res.scale}): {res.suite.description}".rstrip(": "))
    for name, rows in res.tables().items():
        console.print(render_table(TITLES.get(name, name), rows))


def run_pool_suite_file(
    path: str | Path,
    scale: str = "demo",
    *,
    out: Path | None = None,
    progress: ProgressFn | None = None,
) -> PoolSuiteResult:
    """Load a `kind: pool` suite file, run it at `scale`, and write JSON + markdown to `out`."""
    res = run_pool_suite(load_pool_suite(path), scale, progress=progress)
    if out is not None:
        res.write(out)
    return res
