"""A native run of a template end to end through Prefect and the task runner on the real vLLM."""

from __future__ import annotations

import pytest
from conftest import OUTPUT_BUDGET, budgeted_pool
from maserve_prefect.flows.native import run_native

from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import OpKind, OpStatus
from maserve_prefect.trace.prefect_export import read_task_runs, wait_for_prefect


@pytest.mark.usefixtures("prefect_api")
def test_fork_join_runs_natively_on_vllm_and_prefect_agrees(engine_url: str) -> None:
    ledger = Ledger("sqlite://", MemoryStore())
    run = run_native(
        "fork_join", users=2, seed=3, ledger=ledger, engine=engine_url, pool=budgeted_pool()
    )
    assert [r.error for r in run.roots] == [None, None]
    assert run.trace.manifest.engine == engine_url and run.pool is None
    tid = run.trace.manifest.trace_id
    models = [op for op in run.trace.ops if op.kind is OpKind.MODEL]
    assert len(models) == 2 * 6  # five workers and a judge per root
    content = run.harness.content
    assert content is not None
    for op in models:
        assert op.status is OpStatus.COMPLETED and op.attempt == 1
        # content_source="binding": the output length was drawn, locked, and honoured exactly.
        assert op.generation is not None and op.generation.min_tokens == op.num_output_tokens
        assert op.num_output_tokens <= OUTPUT_BUDGET  # the pool file's output budget
        assert op.num_input_tokens > 0  # counted by the server's own tokenizer
        t = op.times
        assert t.ready_s is not None and t.submitted_s is not None and t.completed_s is not None
        assert t.ready_s <= t.submitted_s < t.first_token_s <= t.completed_s  # type: ignore[operator]
        assert op.output_ref is not None  # the model's real text is in the CAS
    index = run.trace.op_index()
    for op in run.trace.ops:  # in wall time too, an op is ready only after its predecessors
        for dep in op.deps:
            assert op.times.ready_s >= index[dep.op_id].times.completed_s  # type: ignore[operator]
    judges = [op for op in models if op.op_id.endswith("judge/0")]
    assert len(judges) == 2 and all(len(j.deps) >= 1 for j in judges)

    progress = wait_for_prefect(ledger, tid, timeout_s=90, poll_s=0.5)
    assert progress.complete, progress
    links = ledger.prefect_links(tid)
    task_runs = read_task_runs({lk.flow_run_id for lk in links if lk.flow_run_id})
    ops = ledger.load_trace(tid).ops
    assert len(task_runs) == len(ops) == len(links)
    assert sorted(tr.name for tr in task_runs.values()) == sorted(op.op_id for op in ops)
