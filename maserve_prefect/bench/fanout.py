"""Fanning a suite's independent units out: in order here, or as Prefect tasks on Dask.

One idea: every suite kind turns its work into a list of `Unit`s — a picklable description (a
label and the arguments) plus a module-level function that computes the unit's result from them
— and hands the list to `run_units`, the one fan-out seam; it returns the results in unit order,
and the kind combines them exactly as it did when it ran them in a loop, so the figures cannot
depend on where a unit ran. With `Fanout(workers=1)` (the default) the units run here, one after
the other, in order: today's sequential path. With `workers > 1` or an `address`, they run on
prefect-dask's `DaskTaskRunner` — a local process cluster of `workers` single-threaded workers, or
the existing Dask scheduler at `address` — as one `maserve-suite-unit` Prefect task run each when
a Prefect flow run is active (the `maserve-suite` flow: its task runs, named after the units), or
as plain Dask futures of the same function without one (`--no-prefect`).

A worker that dies mid-unit (killed, out of memory) fails the units it held (`KilledWorker`: the
local cluster's scheduler is started with `distributed.scheduler.allowed-failures: 0`, so Dask
does not rerun them silently; an existing cluster's scheduler follows its own setting); each such
unit is submitted once more and its `UnitRun` says so (`retried`, the first error); a unit that
fails again, or fails by raising, fails the suite. A Prefect task run left Running by a dead
worker is set Crashed. The caller's progress callback is called here, in the caller's process, as
each unit finishes, whichever worker ran it.

Examples:
    >>> from maserve_prefect.bench.units import Unit
    >>> units = [Unit(f"u{i}", pow, (i, 2)) for i in range(3)]
    >>> results, runs = run_units(units)
    >>> results
    [0, 1, 4]
    >>> [(r.label, r.worker, r.attempts) for r in runs]
    [('u0', 'local', 1), ('u1', 'local', 1), ('u2', 'local', 1)]
    >>> Fanout(workers=0)
    Traceback (most recent call last):
    ...
    maserve_prefect.errors.ConfigError: --workers 0: need at least 1 (1: run the units here, in order)
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from maserve_prefect.bench.report import ProgressFn, Row
from maserve_prefect.bench.units import Unit, timed_unit
from maserve_prefect.errors import ConfigError, MaserveError

if TYPE_CHECKING:
    from prefect_dask import DaskTaskRunner

R = TypeVar("R")

SCHEDULER_CONFIG = {
    "distributed.scheduler.allowed-failures": 0,
    "distributed.scheduler.worker-saturation": 1.0,
}
"""A local cluster's scheduler: a worker's death fails its unit at once (this module retries it,
marked), and a single-threaded worker holds one unit at a time (a death fails only the unit it
was running; long and short units balance)."""


@dataclass(slots=True)
class UnitRun:
    """Where and how one unit ran.

    Attributes:
        label: the unit's label; `worker`: the Dask worker that finished it ('local' here).
        attempts: 1, or 2 when its first worker died; `seconds`: wall time of the last attempt.
        error: why the first attempt failed (empty when it did not).
    """

    label: str
    worker: str
    attempts: int = 1
    seconds: float = 0.0
    error: str = ""

    @property
    def retried(self) -> bool:
        return self.attempts > 1

    def row(self) -> Row:
        return {"unit": self.label, "worker": self.worker, "attempts": self.attempts,
                "retried": self.retried, "seconds": self.seconds, "error": self.error}  # fmt: skip


@dataclass(slots=True)
class Fanout:
    """Where a suite's units run, and what happened to them.

    Attributes:
        workers: local Dask worker processes (1: here, in order; ignored with `address`).
        address: an existing Dask scheduler (`tcp://HOST:8786`) instead of a local cluster.
        runs: one `UnitRun` per unit run so far, in unit order per `run_units` call.
    """

    workers: int = 1
    address: str | None = None
    runs: list[UnitRun] = field(default_factory=list)
    _stack: ExitStack | None = field(default=None, repr=False, compare=False)
    _runner: Any = field(default=None, repr=False, compare=False)

    def __enter__(self) -> Fanout:
        """Keep one Dask cluster for every `run_units` call until exit; a distributed fan-out
        starts it now and has its workers import the suite code (`warm_up`) while this process
        prepares the units (records work, trains predictors, locks deadlines)."""
        self._stack = ExitStack()
        if self.distributed:
            try:
                with self.runner() as tr:
                    tr.client.run(warm_up, wait=False)
            except BaseException:
                self.__exit__()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        stack, self._stack, self._runner = self._stack, None, None
        if stack is not None:
            stack.close()

    @contextmanager
    def runner(self) -> Iterator[Any]:
        """The started `DaskTaskRunner` (this fan-out's, kept while it is entered; else one for
        the call), its local cluster's scheduler set up as `SCHEDULER_CONFIG` says."""
        import dask

        if self._runner is not None:
            yield self._runner
            return
        with ExitStack() as temp:
            stack = self._stack if self._stack is not None else temp
            tr = stack.enter_context(task_runner(self))
            with dask.config.set(SCHEDULER_CONFIG):
                tr.client  # noqa: B018 - starts the cluster (or connects) under the config
            if self._stack is not None:
                self._runner = tr
            yield tr

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError(
                f"--workers {self.workers}: need at least 1 (1: run the units here, in order)"
            )
        if self.address is not None and "://" not in self.address:
            raise ConfigError(
                f"--dask-address {self.address!r}: expected a scheduler address such as "
                "tcp://HOST:8786"
            )

    @property
    def distributed(self) -> bool:
        """True when units run on Dask (more than one worker, or an existing cluster)."""
        return self.workers > 1 or self.address is not None

    def describe(self) -> str:
        if self.address is not None:
            return f"Dask cluster {self.address}"
        return f"{self.workers} local Dask workers" if self.distributed else "in process"

    def rows(self) -> list[Row]:
        """The units table: one row per unit run (worker, attempts, seconds, first error)."""
        return [r.row() for r in self.runs]

    def per_worker(self) -> dict[str, int]:
        """Units finished per worker."""
        out: dict[str, int] = {}
        for r in self.runs:
            out[r.worker] = out.get(r.worker, 0) + 1
        return out


def run_units(
    units: Sequence[Unit[R]], fanout: Fanout | None = None, progress: ProgressFn | None = None
) -> tuple[list[R], list[UnitRun]]:
    """Run `units` here in order (`fanout` None or one worker) or on Dask; results in unit
    order, plus one `UnitRun` each (also appended to `fanout.runs`).

    Raises:
        Exception: a unit's own error (ConfigError, SimulationError...), as it raised it.
        MaserveError: a unit's worker died on both attempts (the unit named).
    """
    fanout = fanout if fanout is not None else Fanout()
    if not units:
        return [], []
    if fanout.distributed:
        results, runs = _on_dask(units, fanout, progress)
    else:
        results, runs = [], []
        for i, unit in enumerate(units):
            t0 = time.perf_counter()
            results.append(unit())
            runs.append(UnitRun(unit.label, "local", seconds=time.perf_counter() - t0))
            if progress is not None:
                progress(i + 1, len(units), unit.label)
    fanout.runs += runs
    return results, runs


WARM_MODULES = ("maserve_prefect.bench.runner", "maserve_prefect.bench.unit_task")
"""Every kind's unit functions, and Prefect's task engine (by name: a preload, not a layer)."""


async def warm_up() -> None:
    """Import what every unit needs (the kinds' unit functions, Prefect's task engine) on a
    worker, ahead of its first unit (in a thread: the worker's event loop keeps serving)."""
    import asyncio
    import importlib

    for name in WARM_MODULES:
        await asyncio.to_thread(importlib.import_module, name)


def task_runner(fanout: Fanout) -> DaskTaskRunner:
    """The `DaskTaskRunner` for `fanout`: its address, or a local cluster of single-threaded
    worker processes, its dashboard on a free port (several suites may run on one machine)."""
    from prefect_dask import DaskTaskRunner

    if fanout.address is not None:
        return DaskTaskRunner(address=fanout.address)
    return DaskTaskRunner(
        cluster_kwargs={
            "n_workers": fanout.workers,
            "processes": True,
            "threads_per_worker": 1,
            "dashboard_address": ":0",
        },
    )


def _worker_died(exc: BaseException) -> bool:
    from distributed import KilledWorker
    from distributed.comm import CommClosedError

    return isinstance(exc, KilledWorker | CommClosedError)


def _on_dask(
    units: Sequence[Unit[R]], fanout: Fanout, progress: ProgressFn | None
) -> tuple[list[R], list[UnitRun]]:
    from distributed import as_completed
    from prefect.context import FlowRunContext

    in_flow = FlowRunContext.get() is not None
    if in_flow:
        from maserve_prefect.bench.unit_task import run_unit  # imports Prefect

        task: Any = run_unit
    else:
        task = None
    results: dict[int, R] = {}
    runs: dict[int, UnitRun] = {}
    errors: dict[int, str] = {}
    with fanout.runner() as tr:
        client = tr.client

        where: dict[str, tuple[int, Any]] = {}  # Dask key -> (unit index, Prefect future)

        def submit(i: int) -> Any:
            unit = units[i]
            if task is not None:
                name = unit.label if i not in errors else f"{unit.label} (retry)"
                with _shippable_flow_context():
                    pf = tr.submit(task.with_options(task_run_name=name), {"unit": unit})
                where[pf.wrapped_future.key] = (i, pf)
                return pf.wrapped_future
            fut = client.submit(timed_unit, unit, pure=False)
            where[fut.key] = (i, None)
            return fut

        pending = as_completed(
            [submit(i) for i in range(len(units))], loop=client.loop, with_results=False
        )
        for fut in pending:
            i, pf = where.pop(fut.key)
            try:
                value = fut.result() if pf is None else pf.result()
            except Exception as exc:
                if not _worker_died(exc):
                    raise  # the unit's own error, as the sequential path raises it
                if i in errors:
                    raise MaserveError(
                        f"suite unit {units[i].label}: its worker died twice "
                        f"({type(exc).__name__}); check the workers' memory or rerun with "
                        "--workers 1"
                    ) from exc
                errors[i] = f"its worker died ({type(exc).__name__})"
                if pf is not None:
                    _crash_task_run(pf.task_run_id, errors[i])
                pending.add(submit(i))
                continue
            results[i], worker, seconds = value
            runs[i] = UnitRun(units[i].label, worker, 1 + (i in errors), seconds, errors.get(i, ""))
            if progress is not None:
                progress(len(results), len(units), units[i].label)
    order = range(len(units))
    return [results[i] for i in order], [runs[i] for i in order]


@contextmanager
def _shippable_flow_context() -> Iterator[None]:
    """The flow run's context without its callable parameters while a task is submitted:
    prefect-dask ships the flow run context (parameters included) to the worker, and a
    `maserve-suite` flow's in-process progress callback cannot travel (it stays here, where
    progress is reported)."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None:
        yield
        return
    saved = ctx.parameters
    ctx.parameters = {k: v for k, v in (saved or {}).items() if not callable(v)}
    try:
        yield
    finally:
        ctx.parameters = saved


def _crash_task_run(task_run_id: Any, message: str) -> None:
    """Set the Prefect task run a dead worker left Running to Crashed (best effort)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    try:
        with get_client(sync_client=True) as client:
            client.set_task_run_state(
                task_run_id, Crashed(message=f"worker died: {message}"), force=True
            )
    except Exception:
        pass
