"""What the ledger records when an engine fails: an op Prefect never started is skipped (naming
the failed upstream op), never completed; a retried op's attempts keep their order; the run's
bundle is still written, its manifest noting it is partial.

The engine is the OpenAI-compatible stub (`tests/engines/openai/openai_stub.py`) answering every
generation with HTTP 500.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from maserve_prefect.taskrunner.native import run_native
from maserve_prefect.trace.bundle import export_bundle, import_bundle
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import OpKind, OpStatus
from maserve_prefect.trace.runs import RunStatus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engines" / "openai"))
from openai_stub import StubConfig, serve

pytestmark = pytest.mark.usefixtures("prefect_api")


def test_failed_engine_records_failed_attempts_in_order_and_skips_the_judge(
    tmp_path: Path,
) -> None:
    cfg = StubConfig(fail_next=10**6, fail_status=500, fail_message="boom")
    ledger = Ledger("sqlite://", MemoryStore())
    with serve(cfg) as stub:
        run = run_native(
            "fork_join", users=1, seed=0, ledger=ledger, trace_id="fj500",
            engine=f"openai:{stub.url}/v1#tiny",
        )  # fmt: skip
    trace = ledger.load_trace("fj500")
    latest = trace.op_index()
    assert latest, "the run recorded no op"
    # Nothing the engine refused is completed.
    assert not [op.op_id for op in latest.values() if op.status is OpStatus.COMPLETED]
    skipped = [op for op in latest.values() if op.status is OpStatus.SKIPPED]
    assert skipped, "the judge behind the failed workers should be recorded skipped"
    for op in skipped:
        assert op.times.submitted_s is None and op.num_output_tokens == 0
        assert op.error is not None and "never started: upstream op" in op.error
        upstream = op.error.split("upstream op ", 1)[1].split()[0]
        assert latest[upstream].status is OpStatus.FAILED
    # Every failed model op kept its attempts, each sent after the one before.
    failed = [
        op for op in latest.values() if op.kind is OpKind.MODEL and op.status is OpStatus.FAILED
    ]
    assert failed
    for final in failed:
        attempts = sorted(
            (op for op in trace.ops if op.op_id == final.op_id), key=lambda op: op.attempt
        )
        assert [op.attempt for op in attempts] == list(range(1, len(attempts) + 1))
        sent = [op.times.submitted_s for op in attempts]
        assert None not in sent
        assert sent == sorted(sent), f"{final.op_id}: attempts sent out of order {sent}"
        assert all("HTTP 500" in (op.error or "") for op in attempts)
    assert all(r.error for r in run.roots)

    # The run's bundle is written all the same, marked partial.
    ledger.finish_run("fj500", RunStatus.FAILED)
    out = export_bundle(ledger.load_trace("fj500"), ledger.cas, tmp_path / "b")
    back = import_bundle(out).trace
    assert back.manifest.notes["partial"] == "failed"
    assert {op.status for op in back.op_index().values()} == {OpStatus.FAILED, OpStatus.SKIPPED}
