"""Each template realizes on the simulator through Prefect and the runner, deterministically."""

from __future__ import annotations

import pytest
from maserve_prefect.flows.native import run_native

from maserve_prefect.trace.model import EdgeKind, OpKind

pytestmark = pytest.mark.usefixtures("prefect_api")


@pytest.mark.parametrize("workflow", ["fork_join", "refinement_loop", "debate", "spawn"])
def test_template_runs_every_root_to_completion(workflow: str) -> None:
    run = run_native(workflow, users=2, seed=3)
    assert [r.error for r in run.roots] == [None, None]
    kinds = {op.kind for op in run.trace.ops}
    assert OpKind.MODEL in kinds
    assert all(op.times.completed_s is not None for op in run.trace.ops)
    # every data edge points at an op of the same root that produced a payload
    index = run.trace.op_index()
    for op in run.trace.ops:
        for dep in op.deps:
            if index[dep.op_id].root_id != op.root_id:  # persistent memory only
                assert dep.kind is EdgeKind.STATE and not dep.required
            if dep.kind is EdgeKind.DATA:
                assert index[dep.op_id].output_ref


def test_same_seed_same_trace() -> None:
    first = run_native("fork_join", users=3, seed=11)
    second = run_native("fork_join", users=3, seed=11)
    assert first.trace.ops == second.trace.ops
