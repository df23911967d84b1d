"""Tiny synthetic traces for replay tests that need no native run."""

from __future__ import annotations

from collections.abc import Sequence

from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    GenerationSettings,
    Manifest,
    OpKind,
    OpRecord,
    RootRecord,
    StageRecord,
    Trace,
)


def make_trace(
    num_roots: int = 2,
    *,
    tool_s: Sequence[float] = (1.0, 2.0),
    model_tokens: tuple[int, int] | None = None,
    workflow: str = "toy",
) -> Trace:
    """Roots of a chain `a -> b` (tools of the given durations), optionally `-> m` (a model op
    with (input, output) tokens, length-locked)."""
    roots, stages, ops = [], [], []
    for i in range(num_roots):
        r = f"r{i}"
        roots.append(RootRecord(root_id=r, workflow=workflow, arrival_s=float(i)))
        for name in ("s1", "s2"):
            stages.append(StageRecord(stage_id=f"{r}/{name}", root_id=r, name=name))
        a = OpRecord(op_id=f"{r}/a", root_id=r, stage_id=f"{r}/s1", kind=OpKind.TOOL,
                     tool_name="t", tool_duration_s=tool_s[0])  # fmt: skip
        b = OpRecord(op_id=f"{r}/b", root_id=r, stage_id=f"{r}/s2", kind=OpKind.TOOL,
                     tool_name="t", tool_duration_s=tool_s[1])  # fmt: skip
        ops += [a, b]
        if model_tokens is not None:
            ops.append(
                OpRecord(
                    op_id=f"{r}/m",
                    root_id=r,
                    stage_id=f"{r}/s2",
                    kind=OpKind.MODEL,
                    deps=(Dep(op_id=f"{r}/a", kind=EdgeKind.DATA),),
                    generation=GenerationSettings(deployment="main"),
                    num_input_tokens=model_tokens[0],
                    num_output_tokens=model_tokens[1],
                )
            )
    return Trace(manifest=Manifest(trace_id="toy"), roots=roots, stages=stages, ops=ops)
