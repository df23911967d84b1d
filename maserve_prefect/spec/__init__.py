"""The logical workload spec W = (S, D, Γ, M) and the TaskBinding interface.

- `stages` (S): each stage is C_s = (participants, control, context) with artifact interfaces.
- `WorkloadSpec.dependencies` (D): the stage DAG, edges optionally naming the artifact carried.
- `composition` (Γ): Sequence / Choice / Parallel+Join / Repeat / Handoff over stages.
- `memory` (M): logical namespaces with scope and per-role access.
- `templates`: Spawn, Fork–Join, Refinement Loop and Debate configs (stage controls).
- `binding`: `TaskBinding` — inputs, role prompts, tools, evaluation — kept apart from the rules.
- `io`: YAML / JSON load and dump; `examples`: shipped specs.

Every invalid spec raises `maserve_prefect.errors.SpecError` naming the element (and the file
and line when loaded from one).

Examples:
    >>> from maserve_prefect.spec import example_spec, spec_to_yaml, spec_from_yaml
    >>> spec = example_spec("four_call")
    >>> spec_from_yaml(spec_to_yaml(spec)) == spec
    True
"""

from maserve_prefect.spec.artifacts import ArtifactField, ArtifactInterface, FieldType
from maserve_prefect.spec.binding import (
    Answer,
    BindingInfo,
    Provenance,
    Quality,
    TaskBinding,
    TaskInstance,
)
from maserve_prefect.spec.composition import (
    Choice,
    Condition,
    Handoff,
    Node,
    Parallel,
    Repeat,
    Sequence,
    StageRef,
)
from maserve_prefect.spec.examples import example_names, example_path, example_spec
from maserve_prefect.spec.io import (
    dump_spec,
    load_spec,
    parse_spec,
    spec_from_json,
    spec_from_yaml,
    spec_to_data,
    spec_to_json,
    spec_to_yaml,
)
from maserve_prefect.spec.memory import MemoryNamespace, MemoryScope
from maserve_prefect.spec.rules import Delivery, HistoryMode, JoinKind, JoinRule
from maserve_prefect.spec.stages import ContextRule, Participant, Stage
from maserve_prefect.spec.templates import (
    DebateConfig,
    ForkJoinConfig,
    RefinementLoopConfig,
    SingleConfig,
    SpawnConfig,
    StageControl,
    TemplateConfig,
    ToolConfig,
)
from maserve_prefect.spec.workload import Dependency, WorkloadSpec

__all__ = [
    "Answer",
    "ArtifactField",
    "ArtifactInterface",
    "BindingInfo",
    "Choice",
    "Condition",
    "ContextRule",
    "DebateConfig",
    "Delivery",
    "Dependency",
    "FieldType",
    "ForkJoinConfig",
    "Handoff",
    "HistoryMode",
    "JoinKind",
    "JoinRule",
    "MemoryNamespace",
    "MemoryScope",
    "Node",
    "Parallel",
    "Participant",
    "Provenance",
    "Quality",
    "RefinementLoopConfig",
    "Repeat",
    "Sequence",
    "SingleConfig",
    "SpawnConfig",
    "Stage",
    "StageControl",
    "StageRef",
    "TaskBinding",
    "TaskInstance",
    "TemplateConfig",
    "ToolConfig",
    "WorkloadSpec",
    "dump_spec",
    "example_names",
    "example_path",
    "example_spec",
    "load_spec",
    "parse_spec",
    "spec_from_json",
    "spec_from_yaml",
    "spec_to_data",
    "spec_to_json",
    "spec_to_yaml",
]
