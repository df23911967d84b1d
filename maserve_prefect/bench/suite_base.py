"""What every suite file has, whatever its kind: a name, a kind, a description, a schedule.

One idea: the three kinds of suite (`kind: replay | pool | hear`) share one header, declared
once here; each kind's model (`bench.replay.suite_file`, `bench.pool.suite_file`,
`bench.hear.suite_file`) extends `SuiteBase` with its own fields and says which scales it can run
at. The loader that picks the model by `kind` is `bench.suite`.

    name: finding-barrier          # suite (and deployment) name: letters, digits, . _ -
    kind: replay                   # replay (the default) | pool | hear
    description: Barrier vs DAG.   # optional
    schedule: {cron: "0 3 * * *"}  # optional: `maserve bench serve` runs it; or {interval_s: N}

Examples:
    >>> Schedule(interval_s=60).interval_s
    60.0
    >>> Schedule(cron="0 3 * * *").interval_s is None
    True
"""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from maserve_prefect.errors import ConfigError

NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"


class FrozenModel(BaseModel):
    """A suite-file model: unknown keys are errors, parsed values never change."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Schedule(FrozenModel):
    """When `maserve bench serve` runs the suite: a cron string or an interval in seconds."""

    cron: str | None = None
    interval_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_kind(self) -> Schedule:
        if (self.cron is None) == (self.interval_s is None):
            raise ValueError("give exactly one of `cron` or `interval_s`")
        return self


class SuiteBase(FrozenModel):
    """The header every suite file has (module docstring); kinds add their own fields."""

    name: str = Field(min_length=1, pattern=NAME_PATTERN)
    kind: str
    description: str = ""
    schedule: Schedule | None = None
    base_dir: Path = Path(".")

    @abstractmethod
    def scale_names(self) -> tuple[str, ...]:
        """The scales this suite can run at (each kind says; the base cannot be built)."""

    def check_scale(self, scale: str) -> None:
        """Raise ConfigError unless `scale` is one of `scale_names()`."""
        if scale not in self.scale_names():
            raise ConfigError(
                f"suite {self.name}: unknown scale {scale!r}; use one of "
                f"{', '.join(self.scale_names())}"
            )

    def path(self, p: Path) -> Path:
        """`p` resolved against the suite file's folder."""
        return p if p.is_absolute() else self.base_dir / p


def error_text(exc: ValidationError) -> str:
    """The first error of `exc` as `key.path: what was wrong` (and how many more there are)."""
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = str(first["msg"])
    if first["type"] == "value_error":  # our validators' messages lead with the key path
        msg = msg.removeprefix("Value error, ")
    where = f"{loc}: " if loc else ("" if first["type"] == "value_error" else "(top level): ")
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}{msg}{more}"


def config_error(source: str, exc: ValidationError) -> ConfigError:
    """A ConfigError naming the file, the key path of the first error and what was wrong."""
    return ConfigError(f"suite {source}: {error_text(exc)}")
