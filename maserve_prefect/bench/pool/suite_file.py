"""The pool suite file: what a `kind: pool` suite declares, parsed and checked.

One idea: a suite file names the work (workflows), the arrival patterns, the arms (a registered
pool plan, the predictor its costs come from, its ablation switches), which arm is the headline
and which are its baselines and ablations, the goals, the predictors' training rows, and the
scales to run at; `load_pool_suite` parses it into a frozen `PoolSuite` and refuses a bad field
or an unknown name with the file and field named. Running it is `bench.pool.suite`.

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

Examples:
    >>> ArmSpec(plan="joint").options().fusion
    True
    >>> Scale(sessions_per_workflow=1, devices={"V100-32GB": 2}).device_names()
    ['V100-32GB:0', 'V100-32GB:1']
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from maserve_prefect.errors import ConfigError
from maserve_prefect.pool.costs import TrainingSpec
from maserve_prefect.pool.inputs import ExecOptions
from maserve_prefect.pool.workload import ArrivalPattern
from maserve_prefect.yamlfiles import read_yaml_mapping

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
    """Predictor training rows (`pool.costs.TrainingSpec`); `profiles` is relative to the file."""

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
