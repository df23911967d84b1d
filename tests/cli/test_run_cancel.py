"""`maserve run` interrupted: Ctrl-C cancels cleanly, SIGKILL leaves a run found crashed.

The command runs in a subprocess against the OpenAI-compatible stub (streaming slowly, so ops are
in flight when the signal comes) and records runs on the session's test Prefect API. Bounds are
process-wait timeouts, not timing claims.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from maserve_prefect.cli import trace_cmd
from maserve_prefect.trace.bundle import import_bundle
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import OpStatus
from maserve_prefect.trace.runs import RunStatus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engines" / "openai"))
from openai_stub import StubConfig, StubServer, serve

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]

MAIN = "import sys; from maserve_prefect.cli import main; sys.argv[0] = 'maserve'; main()"
# Bounds on waiting (the cancel path measured 0.3 s from SIGINT to exit on a quiet machine).
EXIT_BOUND_S = 10.0
START_BOUND_S = 180.0


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with serve(StubConfig(chunk_delay_s=0.5)) as server:
        yield server


def start_run(stub: StubServer, tmp_path: Path) -> tuple[subprocess.Popen[str], str, Path]:
    """`maserve run fork_join` on the stub, returned once its first model call streams."""
    from prefect.settings import PREFECT_API_URL

    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    out = tmp_path / "bundle"
    env = {
        **os.environ,
        "MASERVE_HOME": str(tmp_path / "home"),
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", MAIN, "run", "fork_join", "--engine", f"openai:{stub.url}/v1#tiny",
         "--ledger", db, "--out", str(out), "--trace-id", "cut"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + START_BOUND_S
    while not stub.streams():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the run never reached the engine: {proc.communicate()}")
        time.sleep(0.1)
    return proc, db, out


def test_first_ctrl_c_cancels_records_and_exits_quietly(stub: StubServer, tmp_path: Path) -> None:
    proc, db, out = start_run(stub, tmp_path)
    proc.send_signal(signal.SIGINT)
    try:
        stdout, stderr = proc.communicate(timeout=EXIT_BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stdout + stderr and "KeyError" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("cancelled: run cut kept"), stderr
    assert "(partial)" in lines[0]
    with Ledger(db, MemoryStore()) as ledger:
        (info,) = ledger.list_runs()
        assert info.status is RunStatus.CANCELLED
        trace = ledger.load_trace("cut")
        flow_runs = {lk.flow_run_id for lk in ledger.prefect_links("cut") if lk.flow_run_id}
    statuses = {op.status for op in trace.op_index().values()}
    assert statuses and statuses <= {OpStatus.COMPLETED, OpStatus.INCOMPLETE, OpStatus.SKIPPED}
    assert OpStatus.INCOMPLETE in statuses  # the calls in flight were cut, not "failed"
    bundle = import_bundle(out).trace
    assert bundle.manifest.notes["partial"] == "cancelled"
    assert len(bundle.ops) == len(trace.ops)
    # Prefect holds the root's flow run as Cancelled.
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        states = {str(client.read_flow_run(fid).state_type) for fid in flow_runs}  # type: ignore[arg-type]
    assert flow_runs and states == {"StateType.CANCELLED"}


def test_a_killed_run_is_found_crashed_and_exports_what_finished(
    stub: StubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, db, _ = start_run(stub, tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=EXIT_BOUND_S)
    with Ledger(db, MemoryStore()) as ledger:
        assert ledger.crashed == ["cut"]
        assert ledger.list_runs()[0].status is RunStatus.CRASHED
    monkeypatch.setenv("MASERVE_HOME", str(tmp_path / "home"))  # the run's payload store
    out = tmp_path / "exported"
    result = CliRunner().invoke(
        trace_cmd.app, ["export", "--run", "cut", "--ledger", db, "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "(crashed) from the ledger alone" in result.output
    assert import_bundle(out).trace.manifest.notes["partial"] == "crashed"
