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


def make_trace(num_roots: int = 2, *, side: bool = False) -> Trace:
    """Roots of a chain: tool `a` (0.5 s) -> model `m` (64 in, 8 out) -> tool `b` (0.25 s); with
    `side`, also a tool `c` (0.25 s) after `a`, independent of `m` and `b` (so a barrier `c -> b`
    is legal: `trace.barrier`)."""
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
        if side:
            ops.append(OpRecord(op_id=f"{r}/c", root_id=r, kind=OpKind.TOOL, tool_name="t",
                                tool_duration_s=0.25,
                                deps=(Dep(op_id=f"{r}/a", kind=EdgeKind.CONTROL),)))  # fmt: skip
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


def write_hear_suite(folder: Path, name: str = "toy-hear", **extra: Any) -> Path:
    """A tiny `kind: hear` SCBench suite `<folder>/<name>.yaml`: 0.6B on one device, two arms,
    a few sessions over one shared context (runs in about a second)."""
    data: dict[str, Any] = {
        "name": name,
        "kind": "hear",
        "experiment": "scbench",
        "description": "a tiny HEAR suite",
        "pool": {"gpu": "RTX-PRO-6000", "model": "Qwen3-0.6B", "num_devices": 1,
                 "host_kv_gib": 1},
        "refresh_s": 0.5,
        "arms": {"fcfs": "fcfs", "cache_aware": "cache_aware"},
        "workload": {"seed": 0, "num_sessions": 4, "num_contexts": 1, "arrival_rate_per_s": 50.0,
                     "context_tokens": [1024, 2048], "mean_turns": 2, "min_turns": 1,
                     "max_turns": 3, "think_mean_s": 1.0},
        "scales": {"demo": {"workload": {"num_sessions": 3}}, "full": {}},
    } | extra  # fmt: skip
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def write_pool_suite(folder: Path, profiles: Path, name: str = "toy-pool", **extra: Any) -> Path:
    """A tiny `kind: pool` suite `<folder>/<name>.yaml`: one session of one workflow on one
    A100, two arms on formula costs, small predictor training rows, no predictor scores."""
    training = {"profiles": str(profiles), "measured_shapes": [[1, 16], [128, 1024], [16, 256]],
                "sim_shapes": [[1, 8], [128, 1024], [16, 256]], "sim_models": ["Qwen3-0.6B"],
                "sim_devices": ["A100-40GB"], "trees": 5}  # fmt: skip
    data: dict[str, Any] = {
        "name": name,
        "kind": "pool",
        "description": "a tiny pool suite",
        "workflows": ["code_repair"],
        "arrivals": {"burst": {"kind": "burst"}},
        "arms": {"joint": {"plan": "joint", "predictor": "formula"},
                 "pool-fcfs": {"plan": "pool-fcfs", "predictor": "formula"}},
        "headline": "joint",
        "baselines": {"fcfs": "pool-fcfs"},
        "training": training,
        "scales": {"tiny": {"sessions_per_workflow": 1, "devices": {"A100-40GB": 1},
                            "bucket_steps": 1, "score_predictors": False}},
    } | extra  # fmt: skip
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
