"""The pool suite file: what a `kind: pool` suite declares, parsed and checked.

One idea: a suite file names the work (workflows), the arrival patterns, the arms (a registered
pool plan, the predictor its costs come from, its ablation switches), which arm is the headline
and which are its baselines and ablations, the goals, the predictors' training rows, and the
scales to run at; the one suite loader (`bench.suite.load_suite`) parses it into a frozen
`PoolSuite` and refuses a bad field or an unknown name with the file and field named. Running it is `bench.pool.suite`. The header fields (name, kind,
description, schedule) are every suite's (`bench.suite_base`). Scales are named freely in the file
(the shipped suite has demo, medium, full and full-headline).

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

from pydantic import Field, model_validator

from maserve_prefect.bench.suite_base import FrozenModel, SuiteBase
from maserve_prefect.pool.costs import TrainingSpec
from maserve_prefect.pool.inputs import ExecOptions
from maserve_prefect.pool.recorded import ArrivalPattern

Axes = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


class ArrivalSpec(FrozenModel):
    kind: Literal["burst", "poisson"]
    rate_per_s: float = Field(default=0.0, ge=0)

    def pattern(self) -> ArrivalPattern:
        return ArrivalPattern(self.kind, self.rate_per_s)


class ArmSpec(FrozenModel):
    """One arm: a registered pool plan, the predictor its costs come from, ablation switches."""

    plan: str
    predictor: Literal["formula", "gbdt", "graph"] = "graph"
    fusion: bool = True
    prefetch: bool = True
    coalesce: bool = True

    def options(self) -> ExecOptions:
        return ExecOptions(fusion=self.fusion, prefetch=self.prefetch, coalesce=self.coalesce)


class Goals(FrozenModel):
    """The paper's goals: headline/baseline makespan and p95 ratios, headline/lower bound."""

    makespan_vs_baselines: float = 0.60
    p95_vs_baselines: float = 0.72
    vs_lower_bound: float = 1.15
    pattern: str = "burst"


class TrainingConfig(FrozenModel):
    """Predictor training rows (`pool.costs.TrainingSpec`); `profiles` is relative to the file."""

    profiles: Path
    measured_shapes: Axes | None = None
    sim_shapes: Axes | None = None
    sim_models: tuple[str, ...] | None = None
    sim_devices: tuple[str, ...] | None = None
    trees: int = Field(default=300, ge=1)


class Scale(FrozenModel):
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


class PoolSuite(SuiteBase):
    """A parsed `kind: pool` suite file (module docstring)."""

    kind: Literal["pool"]
    workflows: tuple[str, ...] = Field(min_length=1)
    arrivals: dict[str, ArrivalSpec] = Field(min_length=1)
    arms: dict[str, ArmSpec] = Field(min_length=1)
    headline: str = "joint"
    baselines: dict[str, str] = Field(default_factory=dict)
    ablations: tuple[str, ...] = ()
    goals: Goals = Goals()
    training: TrainingConfig
    scales: dict[str, Scale] = Field(min_length=1)

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

    def scale_names(self) -> tuple[str, ...]:
        """The scales the file names, in file order."""
        return tuple(self.scales)

    def scale(self, name: str) -> Scale:
        """The scale `name`.

        Raises:
            ConfigError: the file names no such scale.
        """
        self.check_scale(name)
        return self.scales[name]

    def training_spec(self, scale: Scale) -> TrainingSpec:
        cfg = scale.training or self.training
        profiles = self.path(cfg.profiles)
        base = TrainingSpec(profiles=profiles.resolve(), num_trees=cfg.trees)
        return TrainingSpec(
            profiles=base.profiles,
            measured_shapes=cfg.measured_shapes or base.measured_shapes,
            sim_models=cfg.sim_models or base.sim_models,
            sim_devices=cfg.sim_devices or base.sim_devices,
            sim_shapes=cfg.sim_shapes or base.sim_shapes,
            num_trees=cfg.trees,
        )
