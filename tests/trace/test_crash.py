"""Crash safety of the ledger: a process SIGKILLed after N appends leaves N complete ops.

A child process appends ops one by one (each consuming its predecessor's output) to a
ledger (a SQLite file, then PostgreSQL) and prints the count after each `append_op` returns. The parent waits
(polling, bounded) until N appends are reported, kills the child with SIGKILL mid-stream, reopens
the ledger, and checks that every reported op is readable, that at most the one in-flight op more
is there, and that every readable op is whole: its edges and payload refs are all present and its
payloads are in the store.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sqlmodel import Session, func, select

from maserve_prefect.trace.cas import ContentStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.runs import RunStatus
from maserve_prefect.trace.tables import EdgeRow, PayloadRefRow
from maserve_prefect.trace.validate import validate_trace

NUM_REPORTED = 25
DEADLINE_S = 120.0  # a bound on waiting for the child, not a timing claim

CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from maserve_prefect.trace.cas import ContentStore, sha256_hex
    from maserve_prefect.trace.ledger import Ledger
    from maserve_prefect.trace.model import Dep, EdgeKind, Manifest, OpKind, OpRecord, RootRecord

    url, cas_dir = sys.argv[1], Path(sys.argv[2])
    ledger = Ledger(url, ContentStore(cas_dir))
    ledger.begin_run(Manifest(trace_id="crash"))
    ledger.add_root("crash", RootRecord(root_id="r"))
    for k in range(1, 1_000_000):
        out = f"output {k}".encode()
        deps = (Dep(op_id=f"r/{k - 1}", kind=EdgeKind.DATA),) if k > 1 else ()
        deps += tuple(Dep(op_id=f"r/{j}", kind=EdgeKind.CONTROL, required=False) for j in range(max(1, k - 3), k - 1))
        op = OpRecord(op_id=f"r/{k}", root_id="r", kind=OpKind.MODEL, deps=deps,
                      input_refs=(sha256_hex(b"prompt"),), output_ref=sha256_hex(out), num_output_tokens=k)
        ledger.append_op("crash", op, payloads={sha256_hex(out): out, sha256_hex(b"prompt"): b"prompt"})
        print(k, flush=True)
    """
)


def read_counts_until(proc: subprocess.Popen[bytes], target: int) -> int:
    """Poll the child's stdout until it reports `target` appends (bounded by DEADLINE_S)."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf, last = b"", 0
    deadline = time.monotonic() + DEADLINE_S
    while last < target:
        if time.monotonic() > deadline or proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr and proc.poll() is not None else ""
            pytest.fail(
                f"child reported {last}/{target} appends before deadline/exit; stderr:\n{err}"
            )
        if sel.select(timeout=0.5):
            chunk = os.read(proc.stdout.fileno(), 65536)
            buf += chunk
            *lines, buf = buf.split(b"\n")
            if lines:
                last = int(lines[-1])
    sel.close()
    return last


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")
def test_sigkill_after_n_appends_leaves_n_complete_ops(
    tmp_path: Path, durable_ledger_url: str
) -> None:
    url = durable_ledger_url
    cas_dir = tmp_path / "cas"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, str(cas_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        reported = read_counts_until(proc, NUM_REPORTED)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=DEADLINE_S)
        assert proc.stdout is not None
        rest = proc.stdout.read().split()
        reported = max([reported, *(int(x) for x in rest)])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL

    cas = ContentStore(cas_dir)
    ledger = Ledger(url, cas)
    # The killed writer's run is found crashed on opening, and its trace says it is partial.
    assert ledger.crashed == ["crash"]
    assert [r.status for r in ledger.list_runs()] == [RunStatus.CRASHED]
    trace = ledger.load_trace("crash")
    assert trace.manifest.notes["partial"] == "crashed"
    num_ops = len(trace.ops)
    # Every append that returned is there; at most the one in flight when killed is extra.
    assert reported >= NUM_REPORTED
    assert reported <= num_ops <= reported + 1
    assert [op.op_id for op in trace.ops] == [f"r/{k}" for k in range(1, num_ops + 1)]
    # Each readable op is whole: all its edges and payload refs, and its blobs, are present.
    with Session(ledger.engine) as s:
        edges = dict(s.exec(select(EdgeRow.dst, func.count()).group_by(EdgeRow.dst)).all())
        refs = dict(
            s.exec(select(PayloadRefRow.op_id, func.count()).group_by(PayloadRefRow.op_id)).all()
        )
    for op in trace.ops:
        assert edges.get(op.op_id, 0) == len(op.deps), op.op_id
        assert refs[op.op_id] == 2, op.op_id
        assert cas.get(op.output_ref or "") == f"output {op.op_id[2:]}".encode()
    validate_trace(trace, cas)
    ledger.close()
