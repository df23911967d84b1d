"""Per-task overhead of `MAServeTaskRunner` against Prefect's `ThreadPoolTaskRunner`.

The one idea: run the *same* flow of trivial tasks under each runner, alternating arms over several
repetitions, and divide the flow body's wall time by the number of tasks. With a trivial body the
quotient is what Prefect plus the runner cost per task run; the ratio of the two arms is the
runner's own overhead (goal ≤ 1.1×).

Arms:
- ``threadpool``: `ThreadPoolTaskRunner(max_workers=W)`; records nothing.
- ``maserve``: `MAServeTaskRunner(max_workers=W)` under a wall-clock harness (`WallGate`) with the
  in-memory run book and no ledger. This is the fair comparison: the runner does all its own work
  (holds ops until ready, names task runs, records hierarchy, typed deps and times per op) but no
  storage the baseline does not do either. The goal ratio is computed on this arm.
- ``maserve+ledger`` (``--ledger``): the same plus the durable SQLite ledger (one WAL transaction
  per finished op) — reported for information: storage the baseline does not do.

Shapes (each ``--tasks`` tasks): ``fanout`` (independent tasks), ``chain`` (each task takes the
previous one's result), ``diamond`` (layers of width 20; each task takes two results of the layer
above).

Pre-submission latency = time from an op becoming ready (its last upstream future done, or its
submission for an op without upstream) to its body's first line, measured identically in both
arms: a done-callback on every future stamps its done time and each body stamps its start.

Settling between flows (both arms, outside the measured time): Prefect sends task-run state
events from a background worker and the server records them asynchronously, so a flow's
bookkeeping outlives its body. Left alone, that backlog lands on whichever flow runs next (a
profile showed the next flow handling about twice its own events) and, on a small machine, the
server competes with it for the CPU. After each flow the benchmark waits until the client's
event queue is empty and the server reports every task run of that flow as completed; the
`settle` column reports how long that took, per task.

Garbage-collector pauses are reported per arm (reporting only; the method is unchanged): the
time this process spent in cyclic-GC passes during the flow body, and how many of them were full
(oldest-generation) passes. A full pass walks every tracked object of the process (Prefect's and
pydantic's included) and costs a few hundred ms here — more than a whole 200-task flow body's
difference between the arms — and it lands on whichever flow crosses the collector's threshold,
so a median over few repetitions can move by a full pass. The ``excl. GC`` column subtracts the
pauses from the wall time, for reading, not for the verdict.

Run (a local Prefect server is started unless ``PREFECT_API_URL`` is set)::

    .venv/bin/python benchmarks/runner_overhead.py --reps 5 --workers 8 --ledger
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")

import numpy as np
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext
from prefect.futures import PrefectFuture
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from maserve_prefect.taskrunner.harness import Harness, activate
from maserve_prefect.taskrunner.runner import MAServeTaskRunner
from maserve_prefect.taskrunner.wallgate import WallGate
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.trace.ledger import Ledger
from maserve_prefect.trace.model import Manifest

DIAMOND_WIDTH = 20
_STARTS: dict[int, float] = {}


class _GCPauses:
    """Time spent in cyclic-GC passes while measuring (a `gc.callbacks` hook; any thread)."""

    def __init__(self) -> None:
        self.measuring = False
        self.pause_s = 0.0
        self.num_full = 0
        self._began: dict[int, float] = {}

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if not self.measuring:
            return
        if phase == "start":
            self._began[info["generation"]] = time.perf_counter()
            return
        began = self._began.pop(info["generation"], None)
        if began is not None:
            self.pause_s += time.perf_counter() - began
        if info["generation"] == 2:
            self.num_full += 1

    def reset(self) -> None:
        self.pause_s, self.num_full = 0.0, 0


_GC = _GCPauses()


@task(persist_result=False, cache_policy=NO_CACHE)
def noop(k: int, deps: tuple[Any, ...] = ()) -> int:
    """A trivial task body that stamps when it started."""
    _STARTS[k] = time.perf_counter()
    return k


@dataclass(slots=True)
class Sample:
    """One flow run of one arm: wall time in the flow body and per-op latencies."""

    arm: str
    shape: str
    body_s: float
    cpu_s: float
    num_tasks: int
    latencies_s: list[float] = field(default_factory=list)
    gc_s: float = 0.0
    num_full_gc: int = 0
    settle_s: float = 0.0

    @property
    def per_task_ms(self) -> float:
        return 1e3 * self.body_s / self.num_tasks

    @property
    def gc_per_task_ms(self) -> float:
        return 1e3 * self.gc_s / self.num_tasks

    @property
    def cpu_per_task_ms(self) -> float:
        return 1e3 * self.cpu_s / self.num_tasks

    @property
    def settle_per_task_ms(self) -> float:
        return 1e3 * self.settle_s / self.num_tasks


def _graph(shape: str, n: int) -> list[list[int]]:
    """Upstream task indices of each of `n` tasks in `shape`."""
    if shape == "fanout":
        return [[] for _ in range(n)]
    if shape == "chain":
        return [[] if i == 0 else [i - 1] for i in range(n)]
    if shape == "diamond":
        w = DIAMOND_WIDTH
        ups: list[list[int]] = []
        for i in range(n):
            layer, pos = divmod(i, w)
            if layer == 0:
                ups.append([])
            else:
                base = (layer - 1) * w
                ups.append(sorted({base + pos, base + (pos + 1) % w}))
        return ups
    raise SystemExit(f"unknown shape {shape!r}; use fanout, chain or diamond")


def _body(shape: str, n: int) -> Callable[[], tuple[float, float, list[float]]]:
    ups = _graph(shape, n)

    def run() -> tuple[float, float, list[float]]:
        _STARTS.clear()
        done_at: dict[int, float] = {}
        submitted_at: dict[int, float] = {}

        def stamp(k: int) -> Callable[[PrefectFuture[Any]], None]:
            def cb(_: PrefectFuture[Any]) -> None:
                done_at[k] = time.perf_counter()

            return cb

        _GC.reset()
        _GC.measuring = True
        t0, c0 = time.perf_counter(), time.process_time()
        futs: list[PrefectFuture[Any]] = []
        for k in range(n):
            submitted_at[k] = time.perf_counter()
            fut = noop.submit(k, tuple(futs[u] for u in ups[k]))
            fut.add_done_callback(stamp(k))
            futs.append(fut)
        for fut in futs:
            fut.wait()
        body_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
        _GC.measuring = False
        for fut in futs:
            if not fut.state.is_completed():
                raise RuntimeError(f"a benchmark task did not complete: {fut.state}")
        # A done-callback may still be running for the last futures; give them a moment.
        deadline = time.perf_counter() + 5.0
        while len(done_at) < n and time.perf_counter() < deadline:
            time.sleep(0.001)
        lat = []
        for k in range(n):
            ready = max((done_at[u] for u in ups[k]), default=submitted_at[k])
            lat.append(_STARTS[k] - ready)
        return body_s, cpu_s, lat

    return run


@contextmanager
def _arm(name: str, workers: int, ledger_dir: str) -> Iterator[TaskRunner[Any]]:
    with ExitStack() as stack:
        if name == "threadpool":
            yield ThreadPoolTaskRunner(max_workers=workers)
            return
        ledger = None
        if name == "maserve+ledger":
            db = os.path.join(ledger_dir, f"{uuid.uuid4().hex}.db")
            ledger = stack.enter_context(Ledger(f"sqlite:///{db}", MemoryStore()))
        harness = Harness(
            WallGate(),
            Manifest(trace_id=f"bench-{uuid.uuid4().hex[:8]}"),
            ledger=ledger,
            engine_kind="wall",
        )
        stack.enter_context(activate(harness))
        yield MAServeTaskRunner(max_workers=workers)


def _settle(flow_run_id: str, n: int, timeout_s: float = 120.0) -> float:
    """Wait until flow run `flow_run_id`'s bookkeeping is done everywhere (module docstring):
    the client's event queue drained and `n` completed task runs recorded by the server.
    Returns the seconds waited.

    Raises:
        RuntimeError: the server did not record them within `timeout_s`.
    """
    import httpx
    from prefect.events.worker import EventsWorker
    from prefect.settings import PREFECT_API_URL

    t0 = time.perf_counter()
    for worker in list(EventsWorker._instances.values()):
        worker.wait_until_empty()
    body = {
        "flow_runs": {"id": {"any_": [flow_run_id]}},
        "task_runs": {"state": {"type": {"any_": ["COMPLETED"]}}},
    }
    url = f"{PREFECT_API_URL.value()}/task_runs/count"
    with httpx.Client(timeout=30.0) as http:
        while True:
            done = int(http.post(url, json=body).json())
            if done >= n:
                return time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout_s:
                raise RuntimeError(
                    f"the server recorded {done} of {n} completed task runs of flow run "
                    f"{flow_run_id} in {timeout_s:.0f} s"
                )
            time.sleep(0.05)


def _measure(arm: str, shape: str, n: int, workers: int, ledger_dir: str) -> Sample:
    body = _body(shape, n)
    box: list[tuple[float, float, list[float]]] = []
    run_id: list[str] = []
    # Start every measured flow from the same collector state (both arms): otherwise a full
    # pass triggered by the *previous* flow's garbage lands on whichever arm runs next.
    gc.collect()
    with _arm(arm, workers, ledger_dir) as runner:

        def fn() -> None:
            ctx = FlowRunContext.get()
            assert ctx is not None and ctx.flow_run is not None
            run_id.append(str(ctx.flow_run.id))
            box.append(body())

        fl = flow(name=f"bench-{shape}", task_runner=runner, persist_result=False)(fn)
        fl()
    body_s, cpu_s, lat = box[0]
    settle_s = _settle(run_id[0], n)
    return Sample(arm, shape, body_s, cpu_s, n, lat, _GC.pause_s, _GC.num_full, settle_s)


def _fmt_range(xs: list[float]) -> str:
    return f"{statistics.median(xs):6.2f} [{min(xs):5.2f}-{max(xs):5.2f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--shapes", default="fanout,chain,diamond")
    ap.add_argument("--ledger", action="store_true", help="add the maserve+ledger arm")
    ap.add_argument("--only", default="", help="run just these arms (comma list; for profiling)")
    args = ap.parse_args(argv)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    for s in shapes:
        _graph(s, 1)
    arms = ["threadpool", "maserve"] + (["maserve+ledger"] if args.ledger else [])
    if args.only:
        arms = [a.strip() for a in args.only.split(",") if a.strip()]

    gc.callbacks.append(_GC)
    with ExitStack() as stack:
        stack.callback(gc.callbacks.remove, _GC)
        if not os.environ.get("PREFECT_API_URL"):
            from prefect.testing.utilities import prefect_test_harness

            print("starting a temporary local Prefect server ...", file=sys.stderr)
            stack.enter_context(prefect_test_harness(server_startup_timeout=120))
        stack.enter_context(temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        ledger_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="maserve-bench-"))
        # Warm-up: first flow / task runs pay one-off costs (imports, client, server caches).
        for arm in arms:
            _measure(arm, "fanout", 20, args.workers, ledger_dir)
        samples: list[Sample] = []
        for rep in range(args.reps):
            for shape in shapes:
                order = arms if rep % 2 == 0 else arms[::-1]  # alternate which arm goes first
                for arm in order:
                    samples.append(_measure(arm, shape, args.tasks, args.workers, ledger_dir))
                    print(".", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)

    server = "PREFECT_API_URL" if os.environ.get("PREFECT_API_URL") else "temporary local"
    print(
        f"runner overhead: {args.tasks} trivial tasks, {args.workers} workers, {args.reps} reps, "
        f"median [min-max]; Prefect server: {server}"
    )
    print(
        f"{'shape':8} {'arm':15} {'wall ms/task':>24} {'ratio':>6} {'cpu ms/task':>12} "
        f"{'ratio':>6} {'pre-sub p50 ms':>15} {'p95 ms':>8} {'GC ms/task':>11} {'full GCs':>9} "
        f"{'excl. GC':>9} {'ratio':>6} {'settle ms/task':>15}"
    )
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    for shape in shapes:
        base = [s for s in samples if s.shape == shape and s.arm == "threadpool"]
        base_wall = statistics.median([s.per_task_ms for s in base]) if base else float("nan")
        base_cpu = statistics.median([s.cpu_per_task_ms for s in base]) if base else float("nan")
        base_net = (
            statistics.median([s.per_task_ms - s.gc_per_task_ms for s in base])
            if base
            else float("nan")
        )
        for arm in arms:
            mine = [s for s in samples if s.shape == shape and s.arm == arm]
            per = [s.per_task_ms for s in mine]
            cpu = statistics.median([s.cpu_per_task_ms for s in mine])
            ratio, cpu_ratio = statistics.median(per) / base_wall, cpu / base_cpu
            if arm == "maserve":
                ratios.append(ratio)
                cpu_ratios.append(cpu_ratio)
            lat_ms = 1e3 * np.concatenate([np.asarray(s.latencies_s) for s in mine])
            p50, p95 = np.percentile(lat_ms, [50, 95])
            gc_ms = statistics.median([s.gc_per_task_ms for s in mine])
            num_full = sum(s.num_full_gc for s in mine)
            net = statistics.median([s.per_task_ms - s.gc_per_task_ms for s in mine])
            settle = statistics.median([s.settle_per_task_ms for s in mine])
            print(
                f"{shape:8} {arm:15} {_fmt_range(per):>24} {ratio:6.2f} {cpu:12.2f} "
                f"{cpu_ratio:6.2f} {p50:15.2f} {p95:8.2f} {gc_ms:11.2f} "
                f"{f'{num_full}/{len(mine)}':>9} {net:9.2f} {net / base_net:6.2f} {settle:15.2f}"
            )
    worst = max(ratios, default=float("nan"))
    verdict = "meets" if worst <= 1.1 else "misses"
    print(
        f"maserve / threadpool per-task overhead: worst shape {worst:.2f}x wall "
        f"({verdict} goal 1.1x), {max(cpu_ratios, default=float('nan')):.2f}x client CPU"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
