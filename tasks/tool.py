"""`tool_call`: run a registered Python tool as a recorded tool op.

The tool really runs (sandboxed code execution, local retrieval, a calculator...) and its result
and measured wall duration are recorded. Time: on a real engine the wall duration is the op's
duration; on the simulator the op then waits a *virtual* duration — the caller's
`virtual_duration_s`, else the tool's nominal latency below — because a measured wall time would
make native simulator runs non-deterministic. The trace's `tool_duration_s` is the duration on the
run's clock; the measured wall time stays in the ledger only (`Ledger.tool_wall_times`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from maserve_prefect.tasks.artifact import Artifact
from maserve_prefect.tasks.model import Decision
from maserve_prefect.tasks.ops_common import op_task, this_op

from maserve_prefect.engines.sim.tokenizer import count_tokens
from maserve_prefect.tools import call_tool, register_tool
from maserve_prefect.trace.cas import canonical_json
from maserve_prefect.trace.model import OpKind

NOMINAL_LATENCY_S: Mapping[str, float] = {
    "run_tests": 1.5,
    "doc_search": 0.2,
    "web_search": 0.8,
    "calculator": 0.01,
}
"""Virtual duration of a tool on the simulator when the caller gives none (seconds)."""
DEFAULT_LATENCY_S = 0.5


class ToolCallError(RuntimeError):
    """A tool op whose tool failed and whose caller asked to fail on errors."""


@op_task(OpKind.TOOL)
def tool_call(
    *,
    tool: str,
    args: Mapping[str, Any],
    inputs: Sequence[Artifact] = (),
    arg_from: Mapping[str, str] | None = None,
    output: str = "tool_result",
    virtual_duration_s: float | None = None,
    decision: Decision | None = None,
) -> Artifact:
    """Run `tool` with `args` (plus, for each `arg_from[arg] = artifact name`, that input's text).

    Returns an artifact whose fields hold `ok` and, for test runners, `passed`. With an "accept"
    `decision` (a tool evaluator in a refinement loop) the artifact also carries `verdict`: from
    the tool's own `passed` on a real engine, from the binding's seeded acceptance on the
    simulator (whose drafts are synthetic text, so the real tool result says nothing).
    """
    op, h = this_op("tool_call")
    call_args = dict(args)
    by_name = {a.name: a for a in inputs}
    for arg, art_name in (arg_from or {}).items():
        call_args[arg] = by_name[art_name].text if art_name in by_name else ""
    op.tool_name = tool
    op.input_refs = [h.store.put(canonical_json(call_args))] + [
        a.digest for a in inputs if a.digest
    ]
    result = call_tool(tool, **call_args)
    op.tool_wall_s = result.duration_s
    if h.engine_kind == "sim":
        duration = (
            virtual_duration_s
            if virtual_duration_s is not None
            else NOMINAL_LATENCY_S.get(tool, DEFAULT_LATENCY_S)
        )
        h.gate.sleep(duration, what=f"tool {tool} of {op.op_id}")
        op.tool_duration_s = duration
    else:
        op.tool_duration_s = result.duration_s
    text = (
        json.dumps(result.output, sort_keys=True, default=str)
        if not isinstance(result.output, str)
        else result.output
    )
    fields: dict[str, str | int | float | bool] = {"ok": result.ok}
    if isinstance(result.output, dict) and "passed" in result.output:
        fields["passed"] = bool(result.output["passed"])
    if result.error:
        fields["error"] = result.error[:200]
    if decision is not None and decision.kind == "accept":
        if h.draws_content:
            assert h.content is not None
            ok = h.content.accepts(decision.round, root=op.scope.root_id, op=op.op_id)
        else:
            ok = bool(fields.get("passed", result.ok))
        fields["verdict"] = "accept" if ok else "revise"
    art = Artifact(output, text, fields, num_tokens=count_tokens(text), producer=op.op_id)
    art = replace(art, digest=h.store.put(art.payload()))
    op.output_ref = art.digest
    return art


@register_tool("binding_evaluate")
def binding_evaluate(binding: str, instance_id: str, answer: str) -> dict[str, object]:
    """Evaluate `answer` with a shipped binding's own evaluator (a refinement-loop evaluator)."""
    from maserve_prefect.bindings import get_binding

    b = get_binding(binding)
    q = b.evaluate(b.instance(instance_id), answer)
    return {"passed": q.passed, "score": q.score, "detail": q.detail}
