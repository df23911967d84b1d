"""The workflow registry: names `maserve run` accepts, each a spec plus a default binding.

A workflow is a `WorkloadSpec` (collaboration rules) and the binding it runs with by default
(inputs, prompts, tools, evaluation stay in the binding). One file says which workflows exist:
`flows/specs/index.yaml`, mapping each name to its default `binding`, optionally its `spec`
(`example:NAME` for a shipped spec example; default `<name>.yaml` in `flows/specs/`) and the
`final` artifact a root's answer is read from (default: the last stage's first output). Every
YAML spec in `flows/specs/` must be listed there, so a file dropped in without a binding is an
error that says what to add rather than a workflow silently run under the wrong binding.

Examples:
    >>> get_workflow("math_ensemble").default_binding
    'math'
    >>> "ordinary" in list_workflows()
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from maserve_prefect.errors import ConfigError
from maserve_prefect.spec import WorkloadSpec, example_spec, load_spec
from maserve_prefect.spec.composition import Node, Sequence, StageRef, walk
from maserve_prefect.spec.stages import Stage

SPEC_DIR = Path(__file__).parent / "specs"
INDEX = SPEC_DIR / "index.yaml"
_EXAMPLE = "example:"


@dataclass(frozen=True, slots=True)
class Workflow:
    """A runnable workflow: its spec, default binding and the artifact that is its answer.

    Examples:
        >>> wf = get_workflow("code_repair")
        >>> wf.final_artifact(), wf.default_binding
        ('code', 'code')
    """

    name: str
    spec: WorkloadSpec
    default_binding: str
    description: str = ""
    final: str | None = None

    def final_artifact(self) -> str:
        """The artifact a root's answer is read from: `final`, else the last stage's first
        output."""
        return self.final if self.final is not None else _last_stage(self.spec).outputs[0]


def _last_stage(spec: WorkloadSpec) -> Stage:
    if spec.composition is not None:
        last = _last_ref(spec.composition)
        if last is not None:
            return spec.stage(last)
    return spec.stage(spec.topological_stages()[-1])


def _last_ref(node: Node) -> str | None:
    if isinstance(node, StageRef):
        return node.stage
    if isinstance(node, Sequence):
        return _last_ref(node.steps[-1])
    refs = [n.stage for _, n in walk(node) if isinstance(n, StageRef)]
    return refs[-1] if refs else None


def _entry(name: str, raw: Any, index: Path) -> Workflow:
    where = f"{index}: workflow {name!r}"
    if not isinstance(raw, Mapping) or not isinstance(raw.get("binding"), str):
        raise ConfigError(f"{where}: expected a mapping with a 'binding' name, got {raw!r}")
    unknown = set(raw) - {"spec", "binding", "final"}
    if unknown:
        raise ConfigError(
            f"{where}: unknown keys {sorted(unknown)} (allowed: spec, binding, final)"
        )
    source = str(raw.get("spec", f"{name}.yaml"))
    if source.startswith(_EXAMPLE):
        spec = example_spec(source.removeprefix(_EXAMPLE))
    else:
        path = index.parent / source
        if not path.is_file():
            raise ConfigError(f"{where}: spec file {path} does not exist; add it or fix 'spec'")
        spec = load_spec(path)
    if spec.name != name:
        raise ConfigError(f"{where}: its spec is named {spec.name!r}; use the same name in both")
    final = raw.get("final")
    if final is not None and final not in spec.artifact_names():
        raise ConfigError(
            f"{where}: final artifact {final!r} is not declared by the spec "
            f"(artifacts: {', '.join(spec.artifact_names())})"
        )
    return Workflow(name, spec, raw["binding"], spec.description, final)


def load_registry(index: Path = INDEX) -> dict[str, Workflow]:
    """Every workflow listed in `index` (see the module docstring).

    Raises:
        ConfigError: unreadable index, a bad entry, or a spec file in the folder it does not
            list.
    """
    try:
        raw = yaml.safe_load(index.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{index}: cannot read the workflow index: {exc}") from exc
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{index}: the workflow index must map workflow names to entries")
    found = {str(name): _entry(str(name), entry, index) for name, entry in raw.items()}
    listed = {Path(str(e.get("spec", f"{n}.yaml"))).name for n, e in raw.items()}
    for path in sorted(index.parent.glob("*.y*ml")):
        if path != index and path.name not in listed:
            raise ConfigError(
                f"{path}: spec file not listed in {index.name}; add "
                f"'{path.stem}: {{binding: <default binding>}}' there"
            )
    return found


_WORKFLOWS: dict[str, Workflow] | None = None


def _registry() -> dict[str, Workflow]:
    global _WORKFLOWS
    if _WORKFLOWS is None:
        _WORKFLOWS = load_registry()
    return _WORKFLOWS


def list_workflows() -> list[str]:
    """Names of the registered workflows, sorted."""
    return sorted(_registry())


def get_workflow(name: str) -> Workflow:
    """The workflow `name`; `ConfigError` listing the known names otherwise."""
    workflows = _registry()
    try:
        return workflows[name]
    except KeyError:
        raise ConfigError(
            f"unknown workflow {name!r}; known: {', '.join(sorted(workflows))}"
        ) from None
