"""Reading the project's YAML configuration files (pool files, scenarios, suites) one way.

Every loader reports an unreadable file, bad YAML or a non-mapping top level as one
`ConfigError` naming what kind of file it is and its path; field validation stays with each
file's own model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from maserve_prefect.errors import ConfigError


def read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """The top-level mapping of a YAML file.

    Examples:
        >>> read_yaml_mapping(Path("/nonexistent.yaml"), "pool file")
        Traceback (most recent call last):
        ...
        maserve_prefect.errors.ConfigError: pool file /nonexistent.yaml: cannot read it: [Errno 2] No such file or directory: '/nonexistent.yaml'
    """
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{what} {path}: cannot read it: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path}: expected a mapping at the top level")
    return data
