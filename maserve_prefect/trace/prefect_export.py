"""Prefect's run history as a trace store: assemble a trace from Prefect, check it against the ledger.

The one idea: **Prefect holds the task-run graph and states, the ledger holds the details, and the
link table joins them by task-run id.** Each task run Prefect recorded carries `task_inputs`: a
parameter that received an upstream future lists that task run (a *data* edge), the `wait_for` key
lists the futures it was ordered after (a *control* edge). Mapping task-run ids to op ids through
`Ledger.prefect_links` turns that into an op graph, which must equal the ledger's data/control
edges one to one. *State* edges (an op read a state version another wrote) are ledger-only:
Prefect never sees them, so they are carried over from the ledger and not compared.

Prefect records task runs asynchronously (they reached the API 6–22 s after a flow returned, see
DESIGN.md), so `wait_for_prefect` polls with a bound until every task run the ledger linked is
present in a final state, and reports honestly when the bound runs out.

Examples:
    >>> export = export_from_prefect(ledger, trace_id="fork_join-math-s0-u2")  # doctest: +SKIP
    >>> export.agreement.ok, len(export.trace.ops)  # doctest: +SKIP
    (True, 12)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from maserve_prefect.errors import ConfigError, TraceNotFoundError, TraceValidationError
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import EdgeKind, OpRecord, OpStatus, Trace
from maserve_prefect.trace.runs import PrefectLink

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient

__all__ = [
    "Agreement",
    "Edge",
    "PrefectExport",
    "PrefectTaskRun",
    "SyncProgress",
    "compare",
    "export_from_prefect",
    "ledger_edges",
    "read_task_runs",
    "wait_for_prefect",
]

Edge = tuple[str, str, EdgeKind]
"""(upstream op id, downstream op id, kind) — data or control."""

FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CRASHED", "CANCELLED"})
NOT_STARTED = "PENDING"  # the state type of Prefect's NotReady (an upstream task run failed)
_PAGE = 200  # Prefect's default maximum page size
_MAX_SHOWN = 5  # edges / ids quoted per category in a mismatch message


@dataclass(frozen=True, slots=True)
class PrefectTaskRun:
    """What Prefect recorded about one task run.

    `data_inputs` pairs each upstream task-run id with the parameter that carried it;
    `control_inputs` are the `wait_for` upstreams.
    """

    task_run_id: str
    flow_run_id: str
    name: str
    state: str
    data_inputs: tuple[tuple[str, str], ...] = ()
    control_inputs: tuple[str, ...] = ()

    @property
    def is_final(self) -> bool:
        """Whether Prefect has recorded a terminal state."""
        return self.state in FINAL_STATES


@dataclass(frozen=True, slots=True)
class Agreement:
    """How Prefect's view of a run compares with the ledger's.

    Attributes:
        num_ops / num_task_runs: ops the ledger linked in scope / task runs Prefect holds.
        missing: op ids whose task run Prefect does not hold.
        unlinked: task-run ids Prefect holds that no ledger op links to.
        unfinished: op ids whose task run is not in a final state in Prefect.
        state_mismatch: (op id, ledger status, Prefect state) where they disagree.
        only_prefect / only_ledger: data/control edges found on one side only.
        num_edges: data/control edges the ledger holds in scope.
        carried_by: for each Prefect-only edge, the task parameter(s) Prefect found it in — an
            edge in a parameter that held no future comes from Prefect's tracking of resolved
            values by object identity, not from a dependency the flow declared.
    """

    num_ops: int
    num_task_runs: int
    missing: tuple[str, ...] = ()
    unlinked: tuple[str, ...] = ()
    unfinished: tuple[str, ...] = ()
    state_mismatch: tuple[tuple[str, str, str], ...] = ()
    only_prefect: frozenset[Edge] = frozenset()
    only_ledger: frozenset[Edge] = frozenset()
    num_edges: int = 0
    carried_by: dict[Edge, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when ops ↔ task runs are one to one, all final, states and edges equal."""
        return not (
            self.missing
            or self.unlinked
            or self.unfinished
            or self.state_mismatch
            or self.only_prefect
            or self.only_ledger
        )

    def describe(self) -> str:
        """A readable diff (empty string when `ok`)."""
        parts: list[str] = []

        def add(title: str, items: Iterable[object]) -> None:
            seq = sorted(items, key=str)
            if seq:
                shown = "; ".join(map(_fmt_item, seq[:_MAX_SHOWN]))
                more = f" (+{len(seq) - _MAX_SHOWN} more)" if len(seq) > _MAX_SHOWN else ""
                parts.append(f"{len(seq)} {title}: {shown}{more}")

        add("ops without a Prefect task run", self.missing)
        add("Prefect task runs no ledger op links to", self.unlinked)
        add("ops whose task run is not final in Prefect", self.unfinished)
        add("ops whose status differs (op, ledger, Prefect)", self.state_mismatch)
        add(
            "edges only Prefect recorded (in parameter)",
            [(*e, self.carried_by.get(e, "?")) for e in self.only_prefect],
        )
        add("edges only the ledger recorded", self.only_ledger)
        return "\n".join(parts)


@dataclass(frozen=True, slots=True)
class SyncProgress:
    """How far Prefect has caught up with the ledger (see `wait_for_prefect`)."""

    num_expected: int
    num_recorded: int
    num_final: int
    waited_s: float

    @property
    def complete(self) -> bool:
        """Every linked task run is recorded in a final state."""
        return self.num_final == self.num_expected


@dataclass(slots=True)
class PrefectExport:
    """A trace assembled from Prefect plus the ledger, with the comparison that checked it."""

    trace: Trace
    agreement: Agreement
    flow_run_ids: tuple[str, ...]
    task_runs: dict[str, PrefectTaskRun] = field(default_factory=dict)
    num_dropped_deps: int = 0

    def check(self) -> None:
        """Raise `TraceValidationError` with the diff when Prefect and the ledger disagree."""
        if not self.agreement.ok:
            raise TraceValidationError(
                f"Prefect and the ledger disagree on run {self.trace.manifest.trace_id!r} "
                f"(flow runs {', '.join(self.flow_run_ids)}):\n{self.agreement.describe()}\n"
                f"if Prefect is still recording, wait and retry; otherwise the ledger is the "
                f"source of truth (`maserve trace export --run "
                f"{self.trace.manifest.trace_id} --ledger-only` writes its record alone)"
            )


def _fmt_item(item: object) -> str:
    if isinstance(item, tuple) and len(item) >= 3 and isinstance(item[2], EdgeKind):
        via = f" ({item[3]})" if len(item) > 3 else ""
        return f"{item[0]} -{item[2].value}-> {item[1]}{via}"
    if isinstance(item, tuple):
        return " / ".join(map(str, item))
    return str(item)


@contextmanager
def _client(client: SyncPrefectClient | None) -> Iterator[SyncPrefectClient]:
    if client is not None:
        yield client
        return
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as c:
        yield c


def read_task_runs(
    flow_run_ids: Iterable[str], client: SyncPrefectClient | None = None
) -> dict[str, PrefectTaskRun]:
    """Every task run Prefect holds for the given flow runs, by task-run id (paged reads)."""
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterFlowRunId
    from prefect.client.schemas.sorting import TaskRunSort

    ids = sorted(set(flow_run_ids))
    found: dict[str, PrefectTaskRun] = {}
    with _client(client) as c:
        for start in range(0, len(ids), 100):
            flt = TaskRunFilter(
                flow_run_id=TaskRunFilterFlowRunId(any_=ids[start : start + 100])  # type: ignore[arg-type]
            )
            offset = 0
            while True:
                page = c.read_task_runs(
                    task_run_filter=flt, sort=TaskRunSort.ID_DESC, limit=_PAGE, offset=offset
                )
                for tr in page:
                    found[str(tr.id)] = _task_run(tr)
                if len(page) < _PAGE:
                    break
                offset += _PAGE
    return found


def _task_run(tr: Any) -> PrefectTaskRun:
    data: list[tuple[str, str]] = []
    control: list[str] = []
    for key, inputs in (tr.task_inputs or {}).items():
        if key.startswith("__"):  # Prefect-internal keys (parents, ...) are not op edges
            continue
        ids = sorted(str(i.id) for i in inputs if getattr(i, "input_type", None) == "task_run")
        if key == "wait_for":
            control.extend(ids)
        else:
            data.extend((key, i) for i in ids)
    state = tr.state_type.value if tr.state_type is not None else "PENDING"
    return PrefectTaskRun(
        task_run_id=str(tr.id),
        flow_run_id=str(tr.flow_run_id),
        name=str(tr.name),
        state=str(state),
        data_inputs=tuple(dict.fromkeys(data)),
        control_inputs=tuple(dict.fromkeys(control)),
    )


def ledger_edges(ops: Iterable[OpRecord]) -> set[Edge]:
    """The data and control edges the ledger recorded between `ops` (state edges left out)."""
    latest = {op.op_id: op for op in ops}
    return {
        (d.op_id, op.op_id, d.kind)
        for op in latest.values()
        for d in op.deps
        if d.kind is not EdgeKind.STATE and d.op_id in latest
    }


def _prefect_edges(task_runs: Iterable[PrefectTaskRun], op_of: dict[str, str]) -> dict[Edge, str]:
    """Prefect's data/control edges between ops, each with the parameter(s) that carried it."""
    edges: dict[Edge, str] = {}
    for tr in task_runs:
        down = op_of.get(tr.task_run_id)
        if down is None:
            continue
        carried = [(EdgeKind.DATA, key, up) for key, up in tr.data_inputs]
        carried += [(EdgeKind.CONTROL, "wait_for", up) for up in tr.control_inputs]
        for kind, key, up in carried:
            edge = (op_of.get(up, f"task-run:{up}"), down, kind)
            edges[edge] = f"{edges[edge]}, {key}" if edge in edges else key
    return edges


def _settled(tr: PrefectTaskRun, op: OpRecord) -> bool:
    """Whether Prefect is done with the task run: a final state, or the NotReady (PENDING) state
    Prefect leaves on a task run it never started because an upstream one failed."""
    return tr.is_final or (op.status is OpStatus.SKIPPED and tr.state == NOT_STARTED)


def _status_of(state: str | None, recorded: OpStatus | None = None) -> OpStatus:
    """An op's status as Prefect's state for its task run implies (None: no task run); a task
    run Prefect left PENDING is an op the ledger recorded as skipped."""
    if recorded is OpStatus.SKIPPED and state == NOT_STARTED:
        return OpStatus.SKIPPED
    if state == "COMPLETED":
        return OpStatus.COMPLETED
    if state in FINAL_STATES:
        return OpStatus.FAILED
    return OpStatus.INCOMPLETE


def compare(
    ops: Iterable[OpRecord], links: Iterable[PrefectLink], task_runs: dict[str, PrefectTaskRun]
) -> Agreement:
    """Compare ledger ops (and their Prefect links) with the task runs Prefect recorded.

    Examples:
        >>> compare([], [], {}).ok
        True
    """
    latest = {op.op_id: op for op in ops}
    op_of = {
        link.task_run_id: link.op_id
        for link in links
        if link.task_run_id is not None and link.op_id in latest
    }
    task_of = {op_id: tr_id for tr_id, op_id in op_of.items()}
    missing = tuple(sorted(op for op in latest if task_of.get(op) not in task_runs))
    unlinked = tuple(sorted(tr for tr in task_runs if tr not in op_of))
    unfinished, mismatch = [], []
    for op_id, op in sorted(latest.items()):
        tr = task_runs.get(task_of.get(op_id, ""))
        if tr is None:
            continue
        if not _settled(tr, op):
            unfinished.append(op_id)
        elif _status_of(tr.state, op.status) is not op.status:
            mismatch.append((op_id, op.status.value, tr.state))
    mine = ledger_edges(latest.values())
    carried = _prefect_edges(task_runs.values(), op_of)
    theirs = set(carried)
    return Agreement(
        num_ops=len(latest),
        num_task_runs=len(task_runs),
        missing=missing,
        unlinked=unlinked,
        unfinished=tuple(unfinished),
        state_mismatch=tuple(mismatch),
        only_prefect=frozenset(theirs - mine),
        only_ledger=frozenset(mine - theirs),
        num_edges=len(mine),
        carried_by={e: carried[e] for e in theirs - mine},
    )


def _scope(
    ledger: Ledger, flow_run_id: str | None, trace_id: str | None
) -> tuple[str, list[PrefectLink]]:
    if (flow_run_id is None) == (trace_id is None):
        raise ConfigError("give exactly one of a flow-run id or a trace id to export")
    if flow_run_id is not None:
        runs = ledger.runs_of_flow_run(flow_run_id)
        if not runs:
            raise TraceNotFoundError(
                f"no ledger run links to Prefect flow run {flow_run_id}; check the id (the "
                f"Prefect UI shows it) and that MASERVE_LEDGER_URL names the ledger that recorded it"
            )
        if len(runs) > 1:
            raise ConfigError(
                f"flow run {flow_run_id} is linked to several ledger runs ({', '.join(runs)}); "
                f"export one with --run TRACE_ID"
            )
        trace_id = runs[0]
        links = [lk for lk in ledger.prefect_links(trace_id) if lk.flow_run_id == flow_run_id]
        return trace_id, links
    assert trace_id is not None
    return trace_id, ledger.prefect_links(trace_id)


def export_from_prefect(
    ledger: Ledger,
    *,
    flow_run_id: str | None = None,
    trace_id: str | None = None,
    client: SyncPrefectClient | None = None,
) -> PrefectExport:
    """Assemble a trace from Prefect's task runs plus the ledger's records, and compare them.

    With `flow_run_id`, the trace holds that flow run's ops (one root of a `maserve run`); deps on
    ops outside it (cross-root state edges) are dropped and counted. With `trace_id`, it holds
    every op the ledger linked in that run. Op records come from the ledger, their status from
    Prefect's final state; `agreement` says where the two disagree (call `check()` to raise).

    Raises:
        TraceNotFoundError: the ledger holds no such run / no run linked to the flow run.
        ConfigError: neither or both of `flow_run_id` and `trace_id`.
    """
    trace_id, links = _scope(ledger, flow_run_id, trace_id)
    full = ledger.load_trace(trace_id)
    flow_runs = tuple(sorted({lk.flow_run_id for lk in links if lk.flow_run_id}))
    if flow_run_id is not None:
        flow_runs = (flow_run_id,)
    in_scope = {lk.op_id for lk in links}
    if flow_run_id is None:
        in_scope |= {op.op_id for op in full.ops}  # unlinked ledger ops show up as missing
    ops = [op for op in full.ops if op.op_id in in_scope]
    task_runs = read_task_runs(flow_runs, client)
    agreement = compare(ops, links, task_runs)
    state_of = {
        lk.op_id: task_runs[lk.task_run_id].state
        for lk in links
        if lk.task_run_id is not None and lk.task_run_id in task_runs
    }
    kept, dropped = [], 0
    for op in ops:
        deps = tuple(d for d in op.deps if d.op_id in in_scope)
        dropped += len(op.deps) - len(deps)
        status = _status_of(state_of.get(op.op_id), op.status)
        kept.append(op.model_copy(update={"deps": deps, "status": status}))
    roots = {op.root_id for op in kept}
    trace = Trace(
        manifest=full.manifest,
        roots=[r for r in full.roots if r.root_id in roots],
        stages=[s for s in full.stages if s.root_id in roots],
        sessions=[s for s in full.sessions if s.root_id in roots],
        ops=kept,
        samples=list(full.samples),
    )
    return PrefectExport(trace, agreement, flow_runs, task_runs, num_dropped_deps=dropped)


def wait_for_prefect(
    ledger: Ledger,
    trace_id: str,
    *,
    timeout_s: float = 120.0,
    poll_s: float = 1.0,
    on_poll: Callable[[SyncProgress], None] | None = None,
    client: SyncPrefectClient | None = None,
) -> SyncProgress:
    """Poll Prefect until it holds every task run the ledger linked in `trace_id`, all final.

    Returns the last progress; `complete` is False when `timeout_s` ran out first (the caller
    must report that — Prefect's history is then incomplete, the ledger is not).
    """
    links = [lk for lk in ledger.prefect_links(trace_id) if lk.task_run_id is not None]
    expected = {str(lk.task_run_id) for lk in links}
    flow_runs = {lk.flow_run_id for lk in links if lk.flow_run_id}
    skipped = {
        (op.op_id, op.attempt)
        for op in ledger.load_trace(trace_id).ops
        if op.status is OpStatus.SKIPPED
    }
    # Prefect leaves a task run it never started (NotReady) PENDING: settled for a skipped op.
    pending_ok = {str(lk.task_run_id) for lk in links if (lk.op_id, lk.attempt) in skipped}
    t0 = time.monotonic()
    with _client(client) as c:
        while True:
            seen = read_task_runs(flow_runs, c) if expected else {}
            recorded = [seen[t] for t in expected if t in seen]
            progress = SyncProgress(
                num_expected=len(expected),
                num_recorded=len(recorded),
                num_final=sum(
                    tr.is_final or (tr.task_run_id in pending_ok and tr.state == NOT_STARTED)
                    for tr in recorded
                ),
                waited_s=time.monotonic() - t0,
            )
            if on_poll is not None:
                on_poll(progress)
            if progress.complete or progress.waited_s >= timeout_s:
                return progress
            time.sleep(min(poll_s, max(0.0, timeout_s - progress.waited_s)))
