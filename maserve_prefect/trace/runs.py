"""What the ledger reports about recorded runs: their lifecycle, summaries and Prefect links.

The one idea: these are plain, frozen values that `Ledger` returns (`list_runs`,
`prefect_links`) or takes (`finish_run`), never rows of its tables, so callers hold them without a
session and a later write cannot change one under them. `RunStatus` is the lifecycle a run row
moves through, in order. `trace.ledger` re-exports all three beside `Ledger`.

Examples:
    >>> RunStatus("failed").is_finished, RunStatus.RUNNING.is_finished
    (True, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["PrefectLink", "RunInfo", "RunStatus"]


class RunStatus(StrEnum):
    """Lifecycle of a recorded run, in order."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CRASHED = "crashed"
    """Found running with no live owner process (killed, or the machine went down)."""

    @property
    def is_finished(self) -> bool:
        """Whether the run has ended (any status but running)."""
        return self is not RunStatus.RUNNING


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A summary row of `Ledger.list_runs`."""

    trace_id: str
    status: RunStatus
    source: str
    created_at: str
    finished_at: str | None
    flow_run_id: str | None
    num_ops: int


@dataclass(frozen=True, slots=True)
class PrefectLink:
    """Which Prefect task run executed one attempt of an op."""

    op_id: str
    attempt: int
    flow_run_id: str | None
    task_run_id: str | None
