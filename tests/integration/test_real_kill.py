"""The server dies in the middle of a native run: failures are recorded, nothing recorded is lost."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import server_config
from maserve_prefect.flows.native import NativeRun, run_native

from maserve_prefect.engines.vllm.server import VLLMServer
from maserve_prefect.trace.cas import ContentStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import OpKind, OpStatus


@pytest.fixture
def doomed_server(vllm_python: Path, tiny_model: Path, tmp_path: Path) -> Iterator[VLLMServer]:
    """A server of its own: this test kills it."""
    server = VLLMServer(server_config(tiny_model), vllm_python, tmp_path / "doomed.log")
    server.start()
    try:
        server.wait_healthy(timeout_s=300)
        yield server
    finally:
        server.stop()


@pytest.mark.usefixtures("prefect_api")
def test_killed_server_gives_failed_attempts_and_keeps_the_ledger(
    doomed_server: VLLMServer, tmp_path: Path
) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", ContentStore(tmp_path / "cas"))
    tid = "killed-mid-run"
    box: list[NativeRun] = []
    errors: list[BaseException] = []

    def body() -> None:
        try:
            box.append(
                run_native(
                    "refinement_loop", users=3, seed=2, ledger=ledger, trace_id=tid,
                    engine=f"openai:{doomed_server.url}",
                )
            )  # fmt: skip
        except BaseException as exc:  # reported below
            errors.append(exc)

    runner = threading.Thread(target=body, name="native-run")
    runner.start()
    before: list = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and runner.is_alive():
        try:
            before = ledger.load_trace(tid).ops
        except Exception:  # the run row may not exist yet
            before = []
        if len(before) >= 3:
            break
        time.sleep(0.05)
    assert len(before) >= 3, "the run finished or stalled before the kill"
    doomed_server.kill()
    runner.join(timeout=300)
    assert not runner.is_alive() and not errors, errors
    run = box[0]

    # The run reports incomplete roots instead of raising.
    incomplete = [r for r in run.roots if r.error]
    assert incomplete, "no root noticed that the server died"
    after = ledger.load_trace(tid)
    # Nothing already recorded is lost: every op (attempt) seen before the kill is intact.
    recorded = {(op.op_id, op.attempt): op for op in after.ops}
    for op in before:
        assert recorded[(op.op_id, op.attempt)] == op
    # The ops in flight at the kill are recorded as failed attempts, with the retries' attempts.
    failed = [op for op in after.ops if op.kind is OpKind.MODEL and op.status is OpStatus.FAILED]
    assert failed, "no model op was recorded as failed"
    assert all(op.error for op in failed)
    retried = {op.op_id for op in failed if op.attempt > 1}
    assert retried, "the engine's retries were not recorded as attempts"
    for op_id in retried:
        attempts = sorted(op.attempt for op in after.ops if op.op_id == op_id)
        assert attempts == list(range(1, len(attempts) + 1))
    # Completed ops before the kill keep their outputs.
    assert all(
        op.output_ref
        for op in before
        if op.status is OpStatus.COMPLETED and op.kind is OpKind.MODEL
    )
