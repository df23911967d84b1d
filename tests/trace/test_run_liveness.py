"""A run left `running` by a process that is gone is marked crashed when a ledger next opens."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from sqlmodel import Session

from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import Manifest
from maserve_prefect.trace.owner import current_owner, owner_alive
from maserve_prefect.trace.runs import RunStatus
from maserve_prefect.trace.tables import RunRow


def _set_owner(ledger: Ledger, trace_id: str, owner: str | None) -> None:
    with Session(ledger.engine) as s:
        row = s.get(RunRow, trace_id)
        assert row is not None
        row.owner = owner
        s.add(row)
        s.commit()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_owner_of_this_process_is_alive_and_a_reaped_child_is_not() -> None:
    assert owner_alive(current_owner()) is True
    host, boot, _, _ = current_owner().split("|")
    pid = _dead_pid()
    assert owner_alive(f"{host}|{boot}|{pid}|1") is False
    assert owner_alive(f"{host}|another-boot|{os.getpid()}|1") is False  # rebooted since
    assert owner_alive(f"not-{socket.gethostname()}|{boot}|1|1") is None  # cannot tell


def test_opening_the_ledger_marks_runs_of_dead_owners_crashed(durable_ledger_url: str) -> None:
    url = durable_ledger_url
    with Ledger(url, MemoryStore()) as ledger:
        for tid in ("mine", "dead", "elsewhere", "old"):
            ledger.begin_run(Manifest(trace_id=tid))
        host, boot, _, _ = current_owner().split("|")
        _set_owner(ledger, "dead", f"{host}|{boot}|{_dead_pid()}|1")
        _set_owner(ledger, "elsewhere", f"not-{host}|{boot}|1|1")
        _set_owner(ledger, "old", None)  # recorded before owners were
    with Ledger(url, MemoryStore()) as ledger:
        assert ledger.crashed == ["dead"]
        status = {r.trace_id: r.status for r in ledger.list_runs()}
        assert status == {
            "mine": RunStatus.RUNNING,
            "dead": RunStatus.CRASHED,
            "elsewhere": RunStatus.RUNNING,
            "old": RunStatus.RUNNING,
        }
        assert ledger.load_trace("dead").manifest.notes["partial"] == "crashed"
        assert "partial" not in ledger.load_trace("mine").manifest.notes
    with Ledger(url, MemoryStore()) as ledger:
        assert ledger.crashed == []  # found once
