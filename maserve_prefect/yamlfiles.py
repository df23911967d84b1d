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
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {path}: not valid YAML: {_one_line(exc)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what} {path}: cannot read it: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path}: expected a mapping at the top level")
    return data


def _one_line(exc: yaml.YAMLError) -> str:
    """A YAML error as `line L, column C: problem` (PyYAML's own text spans several lines).

    Examples:
        >>> try:
        ...     yaml.safe_load("{[: x")
        ... except yaml.YAMLError as exc:
        ...     _one_line(exc)
        "line 1, column 3: expected the node content, but found ':'"
    """
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}"
