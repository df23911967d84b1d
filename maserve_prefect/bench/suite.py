"""The one suite loader: any suite file, whatever its kind, parsed into its typed model.

One idea: every suite file shares one header (`bench.suite_base`: name, kind, description,
schedule) and its `kind` picks the model that validates the rest — `replay` (the default when
`kind` is absent; `bench.replay.suite_file.ReplaySuite`), `pool`
(`bench.pool.suite_file.PoolSuite`) or `hear`, whose `experiment` picks one of three models
(`bench.hear.suite_file`). `load_suite` returns that model; every error is one `ConfigError`
naming the file and the key path. Running a suite of any kind is `bench.runner`.

    name: hear-scbench
    kind: hear                  # replay | pool | hear
    experiment: scbench         # hear only: scbench | mooncake | role_modes
    ...                         # the kind's own keys

Examples:
    >>> parse_suite({"name": "s", "scenarios": ["a.yaml"]}).kind
    'replay'
    >>> parse_suite({"name": "s", "kind": "bench"}, source="s.yaml")
    Traceback (most recent call last):
    ...
    maserve_prefect.errors.ConfigError: suite s.yaml: kind: unknown kind 'bench'; use one of replay, pool, hear
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError

from maserve_prefect.bench.hear.suite_file import (
    HEAR_EXPERIMENTS,
    MooncakeSuite,
    RoleModesSuite,
    ScbenchSuite,
)
from maserve_prefect.bench.pool.suite_file import PoolSuite
from maserve_prefect.bench.replay.suite_file import ReplaySuite
from maserve_prefect.bench.suite_base import SuiteBase, config_error
from maserve_prefect.errors import ConfigError
from maserve_prefect.yamlfiles import read_yaml_mapping

Suite = ReplaySuite | PoolSuite | ScbenchSuite | MooncakeSuite | RoleModesSuite
"""A parsed suite file of any kind."""

KINDS: tuple[str, ...] = ("replay", "pool", "hear")


def suite_model(data: Mapping[str, Any], source: str = "(inline)") -> type[SuiteBase]:
    """The model that validates `data`: by `kind` (default replay), and by `experiment` for
    `kind: hear`.

    Raises:
        ConfigError: an unknown kind or experiment (names the file and the key).
    """
    kind = data.get("kind", "replay")
    if kind == "replay":
        return ReplaySuite
    if kind == "pool":
        return PoolSuite
    if kind != "hear":
        raise ConfigError(
            f"suite {source}: kind: unknown kind {kind!r}; use one of {', '.join(KINDS)}"
        )
    experiment = data.get("experiment")
    if experiment not in HEAR_EXPERIMENTS:
        raise ConfigError(
            f"suite {source}: experiment: a `kind: hear` suite names its experiment, one of "
            f"{', '.join(HEAR_EXPERIMENTS)} (got {experiment!r})"
        )
    return HEAR_EXPERIMENTS[experiment]


def parse_suite(
    data: Mapping[str, Any], *, source: str = "(inline)", base_dir: Path = Path(".")
) -> Suite:
    """Validate a suite mapping of any kind; errors name `source` and the key path.

    Raises:
        ConfigError: an unknown kind or experiment, or an invalid field.
    """
    model = suite_model(data, source)
    try:
        suite = model.model_validate({"kind": "replay", **data, "base_dir": base_dir})
    except ValidationError as exc:
        raise config_error(source, exc) from None
    return cast(Suite, suite)


def load_suite(path: str | Path) -> Suite:
    """Parse and check a suite file of any kind (a replay suite's scenarios are read when it
    runs, by `ReplaySuite.load_scenarios`).

    Raises:
        ConfigError: unreadable file, bad YAML, an unknown kind, or an invalid field (file and
            key named).

    Examples:
        >>> load_suite("/nonexistent.yaml")
        Traceback (most recent call last):
        ...
        maserve_prefect.errors.ConfigError: suite /nonexistent.yaml: cannot read it: [Errno 2] No such file or directory: '/nonexistent.yaml'
    """
    path = Path(path)
    return parse_suite(read_yaml_mapping(path, "suite"), source=str(path), base_dir=path.parent)


def find_suites(folder: str | Path) -> list[Path]:
    """The suite files (`*.yaml`, `*.yml`) directly in `folder`, sorted (scenario subfolders
    are not searched).

    Raises:
        ConfigError: `folder` is not a directory.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"suites folder {folder} does not exist; pass --suites DIR")
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".yaml", ".yml"))
