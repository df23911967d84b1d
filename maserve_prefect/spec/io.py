"""Load and dump workload specs as YAML or JSON, with errors that name the file and line.

Every failure — unreadable file, YAML/JSON syntax, wrong type, bound below 1, unknown stage,
cycle — surfaces as one `SpecError` starting with the source (`path/to/spec.yaml, line 12:`), then
the element path and the problem. For YAML sources the line comes from the composed node tree.
YAML is read with YAML 1.2 booleans (only true/false), so keys like `on:` stay strings.

Dumps leave out fields at their default values (except the `kind` tags the unions need) and write
stage nodes as bare names, so a dumped spec stays short; `load(dump(spec)) == spec` holds for every valid spec.

Examples:
    >>> from maserve_prefect.spec.examples import example_spec
    >>> spec = example_spec("four_call")
    >>> spec_from_yaml(spec_to_yaml(spec)) == spec
    True
    >>> spec_from_json(spec_to_json(spec)) == spec
    True
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from maserve_prefect.errors import SpecError
from maserve_prefect.spec.base import LineOf, raw_validation_errors, spec_error_from
from maserve_prefect.spec.composition import StageRef
from maserve_prefect.spec.workload import WorkloadSpec

YAML_SUFFIXES = (".yaml", ".yml")
JSON_SUFFIXES = (".json",)


class _SpecLoader(yaml.SafeLoader):
    """Safe YAML with YAML 1.2 booleans: only true/false, so `on: review.verdict` stays a key."""


_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


def parse_spec(data: Any, *, source: str = "<data>", line_of: LineOf | None = None) -> WorkloadSpec:
    """Validate already-parsed data (a mapping) into a `WorkloadSpec`.

    Args:
        data: the decoded document.
        source: what to name in errors (a path, or `<string>`).
        line_of: optional lookup from an error location to a source line.

    Raises:
        SpecError: naming `source`, the element path and the problem.
    """
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a workload spec must be a mapping, got {type(data).__name__}")
    try:
        with raw_validation_errors():
            return WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from(exc, source=source, data=data, line_of=line_of) from exc


def spec_from_yaml(text: str, *, source: str = "<string>") -> WorkloadSpec:
    """Parse a YAML document into a `WorkloadSpec`.

    Examples:
        >>> spec_from_yaml("name: x\\nstages: []\\n")
        Traceback (most recent call last):
        ...
        maserve_prefect.errors.SpecError: <string>, line 2: stages: Tuple should have at least 1 item after validation, not 0 (got [])
    """
    try:
        data = yaml.load(text, Loader=_SpecLoader)
        root = yaml.compose(text, Loader=_SpecLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}, line {mark.line + 1}" if mark is not None else source
        raise SpecError(f"{where}: not valid YAML: {exc}") from exc
    return parse_spec(data, source=source, line_of=lambda loc: _yaml_line(root, loc))


def spec_from_json(text: str, *, source: str = "<string>") -> WorkloadSpec:
    """Parse a JSON document into a `WorkloadSpec`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{source}, line {exc.lineno}: not valid JSON: {exc.msg}") from exc
    return parse_spec(data, source=source)


def load_spec(path: str | Path) -> WorkloadSpec:
    """Load a spec from a `.yaml`, `.yml` or `.json` file.

    Examples:
        >>> from maserve_prefect.spec.examples import example_path
        >>> load_spec(example_path("debate")).name
        'debate'
    """
    path = Path(path)
    reader = _reader_for(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read spec file: {exc.strerror or exc}") from exc
    return reader(text, source=str(path))


def dump_spec(spec: WorkloadSpec, path: str | Path) -> Path:
    """Write `spec` to `path`, as YAML or JSON by its suffix; returns the path."""
    path = Path(path)
    text = spec_to_json(spec) if path.suffix.lower() in JSON_SUFFIXES else None
    if text is None:
        _reader_for(path)  # rejects unknown suffixes
        text = spec_to_yaml(spec)
    path.write_text(text, encoding="utf-8")
    return path


def spec_to_data(spec: WorkloadSpec) -> dict[str, Any]:
    """The spec as plain JSON-compatible data, defaults left out, union tags kept."""
    data: dict[str, Any] = _restore_kinds(spec, spec.model_dump(mode="json", exclude_defaults=True))
    return data


def spec_to_yaml(spec: WorkloadSpec) -> str:
    """The spec as a YAML document (keys in declaration order)."""
    return yaml.safe_dump(spec_to_data(spec), sort_keys=False, allow_unicode=True)


def spec_to_json(spec: WorkloadSpec) -> str:
    """The spec as an indented JSON document."""
    return json.dumps(spec_to_data(spec), indent=2, ensure_ascii=False) + "\n"


def _reader_for(path: Path) -> Any:
    suffix = path.suffix.lower()
    if suffix in YAML_SUFFIXES:
        return spec_from_yaml
    if suffix in JSON_SUFFIXES:
        return spec_from_json
    raise SpecError(
        f"{path}: unsupported spec file type {suffix or '(none)'!r}; "
        f"use one of {', '.join(YAML_SUFFIXES + JSON_SUFFIXES)}"
    )


def _restore_kinds(value: Any, data: Any) -> Any:
    """Put back the `kind` tags `exclude_defaults` dropped (walking model and data together);
    stage nodes become their shorthand, the bare stage name."""
    if isinstance(value, StageRef):
        return value.stage
    if isinstance(value, BaseModel) and isinstance(data, dict):
        fields = dict(value)
        out = {"kind": fields["kind"]} if "kind" in fields else {}
        for name, sub in data.items():
            if name != "kind":
                out[name] = _restore_kinds(fields[name], sub)
        return out
    if isinstance(value, tuple | list) and isinstance(data, list):
        return [_restore_kinds(item, sub) for item, sub in zip(value, data, strict=True)]
    if isinstance(value, dict) and isinstance(data, dict):
        return {key: _restore_kinds(value[key], sub) for key, sub in data.items()}
    return data


def _yaml_line(root: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """1-based line of the YAML node at a pydantic location (deepest node found)."""
    node = root
    if node is None:
        return None
    for part in loc:
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                break
            node = node.value[part]
        elif isinstance(node, yaml.MappingNode) and isinstance(part, str):
            child = next((v for k, v in node.value if k.value == part), None)
            if child is None:
                # A discriminated-union tag (`parallel`) names the node itself, not a key.
                if any(k.value == "kind" and v.value == part for k, v in node.value):
                    continue
                break
            node = child
        else:
            break
    return int(node.start_mark.line) + 1
