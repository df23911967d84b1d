"""The workflow registry: names `maserve run` accepts, each a spec plus a default binding.

A workflow is a `WorkloadSpec` (collaboration rules) and the binding it runs with by default
(inputs, prompts, tools, evaluation stay in the binding). The four templates are the spec
examples; compositions and reference workflows are the YAML files in `flows/specs/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import networkx as nx

from maserve_prefect.errors import ConfigError
from maserve_prefect.spec import WorkloadSpec, example_spec, load_spec
from maserve_prefect.spec.composition import Node, Sequence, StageRef, walk

SPEC_DIR = Path(__file__).parent / "specs"


@dataclass(frozen=True, slots=True)
class Workflow:
    """A runnable workflow: its spec and default binding."""

    name: str
    spec: WorkloadSpec
    default_binding: str
    description: str = ""

    def final_artifact(self) -> str:
        """The artifact a root's answer is read from: the last stage's first output."""
        return _last_stage(self.spec).outputs[0]


def _last_stage(spec: WorkloadSpec):  # type: ignore[no-untyped-def]
    if spec.composition is not None:
        last = _last_ref(spec.composition)
        if last is not None:
            return spec.stage(last)
    order = list(nx.topological_sort(spec.graph()))
    return spec.stage(order[-1])


def _last_ref(node: Node) -> str | None:
    if isinstance(node, StageRef):
        return node.stage
    if isinstance(node, Sequence):
        return _last_ref(node.steps[-1])
    refs = [n.stage for _, n in walk(node) if isinstance(n, StageRef)]
    return refs[-1] if refs else None


_TEMPLATE_DEFAULTS = {
    "spawn": "research",
    "fork_join": "math",
    "refinement_loop": "code",
    "debate": "science_qa",
}


def _load() -> dict[str, Workflow]:
    found: dict[str, Workflow] = {}
    for name, binding in _TEMPLATE_DEFAULTS.items():
        found[name] = Workflow(name, example_spec(name), binding, f"the {name} template")
    for path in sorted(SPEC_DIR.glob("*.yaml")):
        spec = load_spec(path)
        binding = (
            str(spec.description.split("binding:", 1)[1].split()[0])
            if "binding:" in spec.description
            else "math"
        )
        found[spec.name] = Workflow(spec.name, spec, binding, spec.description)
    return found


_WORKFLOWS: dict[str, Workflow] | None = None


def list_workflows() -> list[str]:
    """Names of the registered workflows."""
    global _WORKFLOWS
    _WORKFLOWS = _WORKFLOWS or _load()
    return sorted(_WORKFLOWS)


def get_workflow(name: str) -> Workflow:
    """The workflow `name`; `ConfigError` listing the known names otherwise."""
    global _WORKFLOWS
    _WORKFLOWS = _WORKFLOWS or _load()
    try:
        return _WORKFLOWS[name]
    except KeyError:
        raise ConfigError(
            f"unknown workflow {name!r}; known: {', '.join(sorted(_WORKFLOWS))}"
        ) from None
