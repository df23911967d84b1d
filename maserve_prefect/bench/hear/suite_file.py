"""The HEAR suite file (`kind: hear`): one HEAR experiment, its pool, arms, workload and scales.

One idea: `experiment` names which of the three HEAR experiments the file configures, and each
has its own typed model — `scbench` (admission ordering on SCBench-style sessions,
`bench.hear.scbench_suite`), `mooncake` (five policies at three loads of a Mooncake-format trace,
`bench.hear.mooncake_suite`) and `role_modes` (role → mode calibration and evaluation,
`bench.hear.role_modes`). The file's top level is a complete configuration; a scale
(`scales.<name>`) is a partial one merged over it one level deep (`workload: {window_s: 20}`
replaces only `window_s`), and every scale's merged configuration is validated when the file is
loaded (`HearSuite.scaled`), so a bad key names the file, the scale and the key before anything
runs. The header fields (name, kind, description, schedule) are every suite's
(`bench.suite_base`).

    name: hear-scbench
    kind: hear
    experiment: scbench                        # scbench | mooncake | role_modes
    pool: {gpu: RTX-PRO-6000, model: Qwen3-8B, num_devices: 1, host_kv_gib: 96}
    refresh_s: 1.0                             # Cache-Aware priority refresh interval
    arms: {fcfs: fcfs, ca-g40: cache_aware+guard40}   # arm name -> `+`-joined policy terms
    workload: {seed: 0, num_sessions: 64, mean_turns: 5.2}   # the experiment's own keys
    scales:
      demo: {workload: {num_sessions: 24}}
      full: {}

Numbers a workload generator records in its metadata (`Number`) keep the type they were written
with, so a suite file and the generator's own defaults give byte-identical workload files.

Examples:
    >>> s = ScbenchSuite.model_validate({"name": "s", "kind": "hear", "experiment": "scbench",
    ...     "pool": {"gpu": "H100", "model": "Qwen3-8B"}, "arms": {"fcfs": "fcfs"},
    ...     "workload": {"seed": 0, "num_sessions": 8},
    ...     "scales": {"demo": {"workload": {"num_sessions": 2}}, "full": {}}})
    >>> s.scaled("demo").workload.num_sessions, s.scaled("full").workload.num_sessions
    (2, 8)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, ValidationError, ValidationInfo, model_validator

from maserve_prefect.bench.suite_base import FrozenModel, SuiteBase, error_text
from maserve_prefect.errors import ConfigError
from maserve_prefect.workloads.scbench import ScbenchConfig

Number = int | float
"""A YAML number kept as written (int or float): generators record their parameters."""

_DEFAULT = ScbenchConfig()
_FIXED = frozenset({"name", "kind", "experiment", "description", "schedule", "scales", "base_dir"})


class SizingConfig(FrozenModel):
    """`pool.sizing` (Mooncake): the rule that fixes the pool size (`bench.hear.pool_sizing`)."""

    load: float = Field(gt=0, le=1)
    ttft_quantile: float = Field(gt=0, le=100)
    ttft_slo_s: float = Field(gt=0)
    policy: str = "fcfs"
    max_devices: int = Field(default=16, ge=1)


class HearPool(FrozenModel):
    """The simulated pool every arm gets afresh: one `model` replica per `gpu` device."""

    gpu: str
    model: str
    num_devices: int | None = Field(default=None, ge=1)
    host_kv_gib: Number = Field(default=0, ge=0)
    scheduler: dict[str, Number | str | bool] = Field(default_factory=dict)
    sizing: SizingConfig | None = None


class ScbenchParams(FrozenModel):
    """Parameters of `workloads.generate_scbench` (its `ScbenchConfig`; same defaults)."""

    arrival_rate_per_s: Number = _DEFAULT.arrival_rate_per_s
    num_contexts: int | None = _DEFAULT.num_contexts
    context_tokens: tuple[int, int] = _DEFAULT.context_tokens
    context_source: str = _DEFAULT.context_source
    max_context_tokens: int | None = _DEFAULT.max_context_tokens
    context_zipf_s: Number = _DEFAULT.context_zipf_s
    mean_turns: Number = _DEFAULT.mean_turns
    min_turns: int = _DEFAULT.min_turns
    max_turns: int = _DEFAULT.max_turns
    think_mean_s: Number = _DEFAULT.think_mean_s
    think_std_s: Number | None = _DEFAULT.think_std_s
    query_tokens: tuple[int, int] = _DEFAULT.query_tokens
    answer_tokens: tuple[int, int] = _DEFAULT.answer_tokens
    include_history: bool = _DEFAULT.include_history
    block_size: int = _DEFAULT.block_size

    def params(self) -> dict[str, Any]:
        """The generator's keyword arguments."""
        return {name: getattr(self, name) for name in ScbenchParams.model_fields}


class ScbenchWorkload(ScbenchParams):
    """The SCBench-style workload: how many sessions, the seed, and the generator parameters."""

    seed: int
    num_sessions: int = Field(ge=1)


class MooncakeWorkload(FrozenModel):
    """Sessions inferred from a Mooncake-format trace (`workloads.mooncake_load_levels`)."""

    trace: Path
    start_s: float = 0.0
    window_s: float = Field(gt=0)
    fractions: tuple[float, ...] = Field(min_length=1)
    seed: int = 0


class QualityModel(FrozenModel):
    """Parameters of the modeled quality proxy (`bench.hear.role_modes.quality_proxy`)."""

    kv_budget_tokens: int = Field(default=1024, ge=1)
    reader_needed_tokens: int = Field(default=768, ge=1)
    sparse_penalty: float = Field(default=0.02, ge=0, le=1)


class RoleModesWorkload(FrozenModel):
    """Main sessions (growing context) and Reader sessions (one document each), per seed."""

    dev_seed: int
    eval_seed: int
    num_main: int = Field(ge=1)
    num_readers: int = Field(ge=1)
    main: ScbenchParams
    reader: ScbenchParams


class HearSuite(SuiteBase):
    """What every HEAR experiment's file has; `experiment` picks the model (module docstring)."""

    kind: Literal["hear"]
    experiment: str
    pool: HearPool
    refresh_s: float = Field(default=1.0, gt=0)
    """Seconds between the harness's Cache-Aware priority refreshes from residency."""
    scales: dict[str, dict[str, Any]] = Field(min_length=1)

    @model_validator(mode="after")
    def _fits(self, info: ValidationInfo) -> Self:
        self.check()
        if info.context and info.context.get("scaled"):
            return self  # a merged configuration (`scaled`): its scales were checked already
        for scale, over in self.scales.items():
            for key in sorted(set(over or {}) & _FIXED):
                raise ValueError(f"scales.{scale}.{key}: a scale cannot change the suite's {key}")
            try:
                self.scaled(scale)
            except ValidationError as exc:
                raise ValueError(f"scales.{scale}.{error_text(exc)}") from None
        return self

    def check(self) -> None:
        """Checks across fields of one experiment (raise ValueError naming the key)."""

    def scale_names(self) -> tuple[str, ...]:
        """The scales the file names, in file order."""
        return tuple(self.scales)

    def scaled(self, scale: str) -> Self:
        """This suite with `scales[scale]` merged over its top-level keys, one level deep.

        Raises:
            ConfigError: the file names no such scale.
            pydantic.ValidationError: the merged configuration is invalid (the loader has
                already checked every scale of a loaded file).
        """
        self.check_scale(scale)
        data = self.model_dump(exclude_unset=True)
        for key, value in (self.scales[scale] or {}).items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        return type(self).model_validate(data, context={"scaled": True})


class FcfsTarget(FrozenModel):
    """The paper's FCFS row the workload knobs are chosen to match (Table 3; never a policy
    arm's figures)."""

    makespan_s: float = Field(gt=0)
    ttft_p50_s: float = Field(gt=0)
    ttft_p95_s: float = Field(gt=0)
    ttft_max_s: float = Field(gt=0)
    followup_reuse: float = Field(ge=0, le=1)


class Calibration(FrozenModel):
    """`calibration` (SCBench): the sweep over the knobs the paper leaves unstated, run on FCFS
    only (`maserve bench run --calibrate`; `bench.hear.calibrate`).

    Attributes:
        target: the paper's FCFS row.
        grid: knob -> values; every combination is one FCFS run (knobs are workload keys).
        tolerance: the relative error on makespan and TTFT p50 a point must be within.
    """

    target: FcfsTarget
    grid: dict[str, tuple[Number, ...]] = Field(min_length=1)
    tolerance: float = Field(default=0.15, gt=0)


class ScbenchSuite(HearSuite):
    """`experiment: scbench`: every arm replays one recorded SCBench-style workload."""

    experiment: Literal["scbench"]
    arms: dict[str, str] = Field(min_length=1)
    workload: ScbenchWorkload
    calibration: Calibration | None = None

    def check(self) -> None:
        if self.calibration is not None:
            bad = sorted(set(self.calibration.grid) - set(ScbenchWorkload.model_fields))
            if bad:
                raise ValueError(f"calibration.grid: {bad} are not workload keys")


class MooncakeSuite(HearSuite):
    """`experiment: mooncake`: every arm at every load level on one fixed pool."""

    experiment: Literal["mooncake"]
    arms: dict[str, str] = Field(min_length=1)
    workload: MooncakeWorkload

    def check(self) -> None:
        if self.pool.num_devices is None and self.pool.sizing is None:
            raise ValueError("pool: give `sizing` (a rule) or `num_devices`")

    def with_trace(self, trace: Path) -> MooncakeSuite:
        """This suite reading `trace` (made absolute against the current directory) instead of
        its `workload.trace`, at every scale.

        Raises:
            ConfigError: `trace` is not a file.
        """
        trace = Path(trace).resolve()
        if not trace.is_file():
            raise ConfigError(f"--trace {trace}: no such file; give a Mooncake-format JSONL trace")
        data = self.model_dump(exclude_unset=True)
        data["workload"] = {**data["workload"], "trace": trace}
        for over in data.get("scales", {}).values():
            if isinstance((over or {}).get("workload"), dict):
                over["workload"].pop("trace", None)
        return MooncakeSuite.model_validate(data)


class RoleModesSuite(HearSuite):
    """`experiment: role_modes`: calibrate a frozen role → mode mapping, then evaluate it."""

    experiment: Literal["role_modes"]
    version: str = Field(min_length=1)
    candidates: dict[str, tuple[str, ...]] = Field(min_length=1)
    stability_runs: int = Field(ge=2)
    min_quality: float = Field(ge=0, le=1)
    max_makespan_cv: float = Field(ge=0)
    quality: QualityModel = QualityModel()
    workload: RoleModesWorkload
    mapping_dir: Path = Path("out/hear_modes")


HEAR_EXPERIMENTS: dict[str, type[HearSuite]] = {
    "scbench": ScbenchSuite,
    "mooncake": MooncakeSuite,
    "role_modes": RoleModesSuite,
}
"""`experiment` → its model."""
