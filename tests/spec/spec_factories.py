"""Factories for spec tests: plain-data builders (what a YAML file would hold)."""

from __future__ import annotations

from typing import Any

from maserve_prefect.spec.io import parse_spec
from maserve_prefect.spec.workload import WorkloadSpec


def make_artifact(name: str, *fields: str) -> dict[str, Any]:
    """An artifact with text fields (default: one field `text`)."""
    return {"name": name, "fields": [{"name": f} for f in fields or ("text",)]}


def make_stage(
    name: str,
    inputs: list[str] | tuple[str, ...] = (),
    outputs: list[str] | tuple[str, ...] | None = None,
    *,
    role: str | None = None,
    control: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A single-call stage whose role is the stage name; produces `out_<name>` by default."""
    role = role or name
    return {
        "name": name,
        "participants": [{"role": role, "deployment": "m"}],
        "control": control or {"kind": "single", "role": role},
        "inputs": list(inputs),
        "outputs": list(outputs if outputs is not None else [f"out_{name}"]),
        **extra,
    }


def make_chain_data(names: list[str], composition: Any = None) -> dict[str, Any]:
    """A linear workload task → names[0] → names[1] → ... as plain data."""
    stages, deps = [], []
    prev = "task"
    for i, name in enumerate(names):
        stages.append(make_stage(name, [prev]))
        if i:
            deps.append({"source": names[i - 1], "target": name, "artifact": prev})
        prev = f"out_{name}"
    data: dict[str, Any] = {
        "name": "chain",
        "artifacts": [make_artifact("task"), *(make_artifact(f"out_{n}") for n in names)],
        "inputs": ["task"],
        "stages": stages,
        "dependencies": deps,
    }
    if composition is not None:
        data["composition"] = composition
    return data


def make_dag_data(num_stages: int, edges: list[tuple[int, int]]) -> dict[str, Any]:
    """Stages s0..s{n-1}; each edge (i, j), i < j, carries `a_i` from s_i to s_j."""
    names = [f"s{i}" for i in range(num_stages)]
    stages = [
        make_stage(
            names[j],
            ["task", *(f"a_{i}" for i, k in edges if k == j)],
            [f"a_{j}"],
        )
        for j in range(num_stages)
    ]
    return {
        "name": "dag",
        "artifacts": [make_artifact("task"), *(make_artifact(f"a_{i}") for i in range(num_stages))],
        "inputs": ["task"],
        "stages": stages,
        "dependencies": [
            {"source": names[i], "target": names[j], "artifact": f"a_{i}"} for i, j in edges
        ],
    }


def make_workload(data: dict[str, Any]) -> WorkloadSpec:
    """Validate plain data as a spec (errors name `<test>`)."""
    return parse_spec(data, source="<test>")
