"""What `maserve run` does after a Ctrl-C: record the run cancelled, keep what finished, tell.

The one idea: **the ledger first, then Prefect, each step bounded.** The run's ops that finished
are already durable (the task runner appends each op as it ends, skipped and incomplete ones
included), so the command marks the run `cancelled` in the ledger, writes the bundle of what is
there (its manifest says `partial`, see `Ledger.load_trace`), then moves the run's Prefect flow
runs and any task run not yet final to Cancelled — on a helper thread the command waits for at
most `PREFECT_CANCEL_S`, so a slow API cannot hold the exit — and prints one line saying what
was kept.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextvars import copy_context
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from maserve_prefect.errors import MaserveError
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import OpStatus
from maserve_prefect.trace.runs import RunStatus

__all__ = ["CancelReport", "cancel_in_prefect", "record_cancelled"]

# Seconds the command waits for Prefect to take the Cancelled states.
PREFECT_CANCEL_S = 1.5
CANCEL_MESSAGE = "cancelled by the user (Ctrl-C)"


@dataclass(frozen=True, slots=True)
class CancelReport:
    """What a cancelled run kept."""

    trace_id: str
    num_completed: int
    num_other: int
    bundle: Path | None
    bundle_error: str | None
    prefect_ok: bool

    def line(self) -> str:
        """One line for the console."""
        where = (
            f"bundle {self.bundle} (partial)"
            if self.bundle is not None
            else f"no bundle ({self.bundle_error})"
        )
        prefect = "" if self.prefect_ok else "; Prefect did not take every Cancelled state in time"
        return (
            f"cancelled: run {self.trace_id} kept {self.num_completed} completed op(s) and "
            f"{self.num_other} failed/skipped/incomplete in the ledger and {where}{prefect}"
        )


def record_cancelled(
    ledger: Ledger, trace_id: str, dest: Path, *, force: bool, flow_run_ids: Sequence[str]
) -> CancelReport:
    """Mark `trace_id` cancelled, export what finished to `dest`, cancel it in Prefect."""
    from maserve_prefect.trace.bundle import export_bundle

    ledger.finish_run(trace_id, RunStatus.CANCELLED)
    trace = ledger.load_trace(trace_id)
    done = sum(1 for op in trace.ops if op.status is OpStatus.COMPLETED)
    bundle: Path | None = None
    error: str | None = None
    try:
        bundle = export_bundle(trace, ledger.cas, dest, overwrite=force)
    except MaserveError as exc:
        error = str(exc).splitlines()[0]
    prefect_ok = cancel_in_prefect(flow_run_ids, timeout_s=PREFECT_CANCEL_S)
    return CancelReport(trace_id, done, len(trace.ops) - done, bundle, error, prefect_ok)


def cancel_in_prefect(flow_run_ids: Sequence[str], *, timeout_s: float) -> bool:
    """Move the flow runs, and their task runs not yet final, to Cancelled; True when done
    within `timeout_s` (the work goes on a daemon thread the caller does not wait for longer)."""
    done = threading.Event()

    def work() -> None:
        from prefect.client.orchestration import get_client
        from prefect.states import Cancelled

        from maserve_prefect.trace.prefect_export import read_task_runs

        with get_client(sync_client=True) as client:
            for fid in flow_run_ids:  # the flow runs first: what the Prefect UI lists
                client.set_flow_run_state(UUID(fid), Cancelled(message=CANCEL_MESSAGE), force=True)
            for tr in read_task_runs(flow_run_ids, client).values():
                if not tr.is_final:
                    client.set_task_run_state(
                        UUID(tr.task_run_id), Cancelled(message=CANCEL_MESSAGE), force=True
                    )
        done.set()

    if not flow_run_ids:
        return True
    # The caller's context carries the Prefect API it is connected to (`temporary_settings`).
    thread = threading.Thread(
        target=copy_context().run, args=(_quietly, work), name="maserve-cancel", daemon=True
    )
    thread.start()
    thread.join(timeout_s)
    return done.is_set()


def _quietly(fn: object) -> None:
    """Run `fn`; a failure leaves the event unset (reported as not done), never a traceback."""
    try:
        fn()  # type: ignore[operator]
    except Exception:
        return
