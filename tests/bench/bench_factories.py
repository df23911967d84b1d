"""Tiny suites for bench tests: a synthetic bundle, a scenario over it, and a suite file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from maserve_prefect.trace.bundle import export_bundle
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    GenerationSettings,
    Manifest,
    OpKind,
    OpRecord,
    RootRecord,
    Trace,
)


def make_trace(num_roots: int = 2) -> Trace:
    """Roots of a chain: tool `a` (0.5 s) -> model `m` (64 in, 8 out) -> tool `b` (0.25 s)."""
    roots, ops = [], []
    for i in range(num_roots):
        r = f"r{i}"
        roots.append(RootRecord(root_id=r, workflow="toy", arrival_s=float(i)))
        ops += [
            OpRecord(op_id=f"{r}/a", root_id=r, kind=OpKind.TOOL, tool_name="t",
                     tool_duration_s=0.5),
            OpRecord(op_id=f"{r}/m", root_id=r, kind=OpKind.MODEL,
                     deps=(Dep(op_id=f"{r}/a", kind=EdgeKind.CONTROL),),
                     generation=GenerationSettings(deployment="main"),
                     num_input_tokens=64, num_output_tokens=8),
            OpRecord(op_id=f"{r}/b", root_id=r, kind=OpKind.TOOL, tool_name="t",
                     tool_duration_s=0.25, deps=(Dep(op_id=f"{r}/m", kind=EdgeKind.CONTROL),)),
        ]  # fmt: skip
    return Trace(manifest=Manifest(trace_id="toy"), roots=roots, ops=ops)


def write_scenario(folder: Path, name: str = "toy", **extra: Any) -> Path:
    """A bundle `<folder>/bundle` and a scenario `<folder>/scenarios/<name>.yaml` over it."""
    bundle = folder / "bundle"
    if not bundle.exists():
        export_bundle(make_trace(), MemoryStore(), bundle)
    data: dict[str, Any] = {
        "name": name,
        "cohorts": [{"name": "t", "bundle": "../bundle"}],
        "lock": "length",
        "arrivals": {"kind": "poisson", "rate_per_s": 1.0, "seed": 0},
        "arms": [{"name": "dag", "release": "dag"}, {"name": "flat", "release": "flat"}],
    } | extra
    path = folder / "scenarios" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def write_suite(folder: Path, name: str = "toy-suite", **extra: Any) -> Path:
    """A suite file `<folder>/<name>.yaml` over one scenario (written if missing)."""
    write_scenario(folder)
    data: dict[str, Any] = {
        "name": name,
        "description": "a tiny suite",
        "scenarios": ["scenarios/toy.yaml"],
        "scales": {"demo": {"blocks": 1}, "full": {"blocks": 2, "rate_per_s": 2.0}},
    } | extra
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def count_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """A findings analysis for tests: one row with the number of scenarios."""
    return [{"num_scenarios": len(results)}]
