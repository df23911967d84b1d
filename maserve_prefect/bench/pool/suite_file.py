"""The pool suite file: what a `kind: pool` suite declares, parsed and checked.

One idea: a suite file names the work (workflows), the arrival patterns, the arms (a registered
pool plan, the predictor its costs come from, its ablation switches), which arm is the headline
and which are its baselines and ablations, the goals, the predictors' training rows, and the
scales to run at; the one suite loader (`bench.suite.load_suite`) parses it into a frozen
`PoolSuite` and refuses a bad field or an unknown name with the file and field named. Running it is `bench.pool.suite`. The header fields (name, kind,
description, schedule) are every suite's (`bench.suite_base`). Scales are named freely in the file
(the shipped suite has demo, medium, full, full-headline and pressure).

`replicas` sizes every replica (`ReplicaSizing`; a scale may override it): by default one
replica per GPU as vLLM runs it, at `gpu_memory_utilization` 0.9 with the KV cache from the
memory model; `colocate: true` gives each replica a fixed `kv_cache_gib` of KV instead, so
several fit on one GPU and share its memory and compute.

    name: pool-hetero
    kind: pool
    workflows: [math_ensemble, code_repair, hierarchical_summary]
    arrivals: {burst: {kind: burst}, p0150: {kind: poisson, rate_per_s: 0.150}}
    arms: {joint: {plan: joint, predictor: graph}, parrot: {plan: parrot}, ...}
    headline: joint                     # the arm compared against the baselines
    baselines: {parrot: parrot, kairos: kairos, fcfs: pool-fcfs}   # label -> arm
    ablations: [joint-no-fusion, ...]   # arms compared against the headline
    training: {profiles: ../../../shared/data/profiles}
    replicas: {gpu_memory_utilization: 0.9}   # or {colocate: true, kv_cache_gib: 2}
    scales:
      demo: {sessions_per_workflow: 4, devices: {V100-32GB: 1, A100-40GB: 1}, runs: 1,
             arrivals: [burst], arms: [joint, parrot, kairos, pool-fcfs]}

Examples:
    >>> ArmSpec(plan="joint").options().fusion
    True
    >>> Scale(sessions_per_workflow=1, devices={"V100-32GB": 2}).device_names()
    ['V100-32GB:0', 'V100-32GB:1']
    >>> ReplicaSizing().options().kv_cache_bytes is None
    True
    >>> ReplicaSizing(colocate=True).options().kv_cache_bytes == 2 * 2**30
    True
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from maserve_prefect.bench.suite_base import FrozenModel, SuiteBase
from maserve_prefect.pool.costs import TrainingSpec
from maserve_prefect.pool.inputs import GIB, ExecOptions
from maserve_prefect.pool.oracle import DEFAULT_EVALUATIONS
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
    predictor: Literal["formula", "gbdt", "graph", "gnn"] = "graph"
    fusion: bool = True
    prefetch: bool = True
    coalesce: bool = True
    provision: bool = False

    def options(self, sizing: ReplicaSizing | None = None) -> ExecOptions:
        base = (sizing or ReplicaSizing()).options()
        return dataclasses.replace(
            base,
            fusion=self.fusion,
            prefetch=self.prefetch,
            coalesce=self.coalesce,
            provision=self.provision,
        )


class ReplicaSizing(FrozenModel):
    """How each replica is sized on its GPU (issue 15's physical substrate).

    Attributes:
        gpu_memory_utilization: vLLM's flag: a replica takes this share of its GPU and its KV
            cache is what is left after weights, activations and overhead (`catalog.memory`).
            At 0.9 (vLLM's default) one replica fills a GPU, and a model that does not fit at
            that share (Qwen3-14B on a V100-32GB) is infeasible there for every plan.
        colocate: several replicas per GPU: each pre-allocates a fixed `kv_cache_gib` of KV
            instead (utilization is then unused), so replicas fit side by side and share the
            GPU's memory and compute.
        kv_cache_gib: the fixed KV per replica when colocating.
    """

    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    colocate: bool = False
    kv_cache_gib: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _kv_only_when_colocating(self) -> ReplicaSizing:
        if not self.colocate and "kv_cache_gib" in self.model_fields_set:
            raise ValueError(
                "kv_cache_gib applies only with colocate: true (otherwise the KV cache is "
                "sized from gpu_memory_utilization)"
            )
        return self

    def options(self) -> ExecOptions:
        """Executor options with this sizing (the other options at their defaults)."""
        if self.colocate:
            return ExecOptions.colocated(int(self.kv_cache_gib * GIB))
        return ExecOptions(gpu_memory_utilization=self.gpu_memory_utilization)


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
    """One scale: sessions, pool, runs, and optionally subsets of arrivals / arms.

    `oracle_evaluations` is the Oracle's search budget (simulator runs, `pool.oracle`); 0 turns
    it off, and it is skipped where the work exceeds its size limits (`fits_oracle`).
    """

    sessions_per_workflow: int = Field(ge=1)
    devices: dict[str, int]
    runs: int = Field(default=1, ge=1)
    arrivals: tuple[str, ...] | None = None
    arms: tuple[str, ...] | None = None
    training: TrainingConfig | None = None
    bucket_steps: int = Field(default=3, ge=1)
    score_predictors: bool = True
    replicas: ReplicaSizing | None = None
    oracle_evaluations: int = Field(default=DEFAULT_EVALUATIONS, ge=0)

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
    replicas: ReplicaSizing = ReplicaSizing()
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

    def sizing(self, scale: Scale) -> ReplicaSizing:
        """The replica sizing at `scale` (its own, else the file's)."""
        return scale.replicas or self.replicas

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
