"""The pool executor: run workflow DAGs on a simulated GPU pool under any pool plan, and measure.

One idea: the executor is a thin driver over the one dispatcher (`dispatch.dispatcher`) in pool
mode. It owns only the workload and the measurements: roots arrive at their offsets, a unit is
released to `Dispatcher.on_ready` when its predecessors have completed, and completions come back
through the dispatcher. Everything a pool plan needs — unit statuses, grants and leases, loads
waiting for their victims, predicted transition times, the `PoolSnapshot`, and applying the
plan's `Decisions` to the `SimPool` (unloads, then loads, then grants, then submits) — lives in the
dispatcher and its `PoolController` (`pool.control`), the same code a native run through
`MAServeTaskRunner` uses. Events at one instant share one replan. Anything an engine refuses, or a
plan reclaiming a leased replica, stops the run with an error: it is a plan bug, never skipped.

What plans know of a root's DAG (`ExecOptions.reveal`): "arrival" — the whole DAG when the root
arrives (the executor's default); "released" — a unit becomes known once every predecessor has
been released, with estimated sizes (0 prompt tokens, `DEFAULT_OUTPUT_LIMIT` output) until it is
ready: what `MAServeTaskRunner` can report in a native run, so a replay of a native trace under
"released" (with the trace's token-locked `requests`) makes the native run's decisions.

Measured per op: ready / submitted / first token / completion and the model-availability delay
of every ready op, split by what the pool looked like while it waited; per run: makespan,
latencies, lifecycle actions and GPU-seconds per session (`pool.results`). The inputs,
`RootDag` and `ExecOptions`, live in `pool.inputs`.

Ablations: `fusion=False` (every unit its own grant), `prefetch=False`, `coalesce=False`
(the paper's per-workflow lifecycle: each root's demand is weighed and provisioned on its own,
while loaded replicas are still shared across workflows; `PlanOptions.coalesce`).
Runs are deterministic: same inputs, same results.

Examples:
    >>> from maserve_prefect.pool.window import WorkUnit
    >>> a = WorkUnit("r/a", "r", "Qwen3-0.6B", 100, 8, succs=("r/b",))
    >>> b = WorkUnit("r/b", "r", "Qwen3-0.6B", 100, 8, preds=("r/a",))
    >>> res = run_pool([RootDag("r", 0.0, (a, b))], ["A100-40GB:0"], "joint")
    >>> len(res.ops), [e.action for e in res.lifecycle], res.ops[1].chain
    (2, ['load'], 'r/a')
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from maserve_prefect.clock import URGENT, Clock
from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.dispatch.plans import Plan, get_plan
from maserve_prefect.dispatch.snapshot import Unit
from maserve_prefect.engines.sim.pool.device import Deployment
from maserve_prefect.engines.sim.pool.device_time import DeviceTimeRow
from maserve_prefect.engines.sim.pool.export import ReplicaTimeRow
from maserve_prefect.engines.sim.pool.sim_pool import SimPool
from maserve_prefect.errors import ConfigError, SimulationError
from maserve_prefect.pool.control import DEFAULT_OUTPUT_LIMIT, PoolController
from maserve_prefect.pool.gpu_attribution import gpu_seconds_by_scenario
from maserve_prefect.pool.handle import PoolHandle, SimPoolHandle
from maserve_prefect.pool.inputs import REVEAL_MODES, ExecOptions, RootDag
from maserve_prefect.pool.results import OpResult, PoolRunResult
from maserve_prefect.pool.snapshot import PlanOptions
from maserve_prefect.pool.state import CostModel, RooflineCostModel
from maserve_prefect.pool.window import UnitStatus, WorkUnit
from maserve_prefect.protocol.outcomes import Outcome, OutcomeStatus
from maserve_prefect.protocol.requests import Request

__all__ = ["run_pool"]

DeviceTimeFn = Callable[[float, float], Iterable[DeviceTimeRow]]
"""GPU-seconds per device between two instants (`SimPool.device_time`); real pools have none."""
ReplicaTimeFn = Callable[[float, float], Iterable[ReplicaTimeRow]]
"""The same per replica, with step seconds per request (`SimPool.replica_time`)."""


@dataclass(slots=True)
class _Op:
    unit: WorkUnit
    status: UnitStatus = UnitStatus.PENDING
    ready_s: float = 0.0
    submitted_s: float = 0.0
    first_token_s: float = 0.0
    completed_s: float = 0.0
    replica: str = ""
    num_output_tokens: int = 0
    waits: dict[str, float] = field(default_factory=dict)
    wait_since: float = 0.0
    category: str = ""
    revealed: bool = False


class _PoolRun:
    """One executor run: releases units into the dispatcher and measures (module docstring)."""

    def __init__(
        self,
        workflows: Sequence[RootDag],
        clock: Clock,
        pool: PoolHandle,
        plan: Plan,
        deployments: Mapping[str, Deployment],
        costs: CostModel,
        options: ExecOptions,
        device_time: DeviceTimeFn | None = None,
        replica_time: ReplicaTimeFn | None = None,
    ) -> None:
        if options.reveal not in REVEAL_MODES:
            raise ConfigError(
                f"ExecOptions(reveal={options.reveal!r}): expected one of {REVEAL_MODES}"
            )
        self.clock, self.pool, self.device_time = clock, pool, device_time
        self.replica_time = replica_time
        self.plan, self.opts = plan, options
        self.workflows = list(workflows)
        self.deps = _deployments(self.workflows, deployments, options)
        self.ops: dict[str, _Op] = {}
        self.by_root: dict[str, list[str]] = {}
        for wf in self.workflows:
            for u in wf.units:
                if u.unit_id in self.ops or u.root_id != wf.root_id:
                    raise ConfigError(
                        f"unit {u.unit_id!r}: unit ids must be unique and its root_id must be "
                        f"its workflow's ({wf.root_id!r})"
                    )
                self.ops[u.unit_id] = _Op(u)
                self.by_root.setdefault(wf.root_id, []).append(u.unit_id)
        plan_opts = PlanOptions(
            options.fusion,
            options.prefetch,
            options.aging_s,
            options.prefetch_slack_s,
            options.tie_s,
            options.coalesce,
            options.provision,
        )
        self.control = PoolController(self.pool, clock, self.deps, costs, plan_opts)
        units = [op.unit for op in self.ops.values()]
        if options.reveal == "arrival":
            self.control.declare(units)
        else:  # validate up front what `reveal` would only find mid-run
            check = PoolController(self.pool, clock, self.deps, costs, plan_opts)
            check.declare(units)
        self.dispatcher = Dispatcher(
            self.pool.replicas, clock.now, plan, books=self.control, observer=self
        )
        self.arrival: dict[str, float] = {}
        self.finish: dict[str, float] = {}
        self.left = {r: len(ids) for r, ids in self.by_root.items()}
        self.ready: dict[str, None] = {}  # ready, unsubmitted units
        self.start_s = 0.0

    # -- setup -----------------------------------------------------------------------------

    def warm_up(self) -> None:
        if not isinstance(self.clock, Kernel):
            raise ConfigError("a warm start needs the simulator's kernel; start the pool cold")
        self.control.warm(self.opts.warm)
        self.clock.run()
        self.start_s = self.clock.now()
        self.control.mark_warm(self.start_s)

    def start(self) -> None:
        for wf in sorted(self.workflows, key=lambda w: (w.arrival_s, w.root_id)):
            arrive = functools.partial(self._arrive, wf.root_id)
            self.clock.call_at(self.start_s + wf.arrival_s, arrive, URGENT, f"arrive {wf.root_id}")

    def finished(self) -> bool:
        """Every root has finished (a wall-clock driver polls this)."""
        return len(self.finish) == len(self.by_root)

    # -- events ----------------------------------------------------------------------------

    def _arrive(self, root: str) -> None:
        self.arrival[root] = self.clock.now()
        with self.dispatcher.batch():
            self.dispatcher.on_arrival(root)
            for uid in self.by_root.get(root, []):
                if not self.ops[uid].unit.preds:
                    self._release(uid)
        if not self.left.get(root):
            self.finish[root] = self.clock.now()

    def _release(self, uid: str) -> None:
        """`uid`'s predecessors are done: it is ready (a standing grant submits it at once)."""
        op, now = self.ops[uid], self.clock.now()
        op.status, op.ready_s, op.wait_since, op.category = UnitStatus.READY, now, now, ""
        self.ready[uid] = None
        u = op.unit
        if self.opts.reveal == "released":
            self._reveal(uid)
            for s in u.succs:
                if all(
                    self.ops[p].status is not UnitStatus.PENDING for p in self.ops[s].unit.preds
                ):
                    self._reveal(s)
        request = self.opts.requests.get(uid) if self.opts.requests else None
        if request is None:
            request = Request(
                uid,
                u.deployment,
                num_prompt_tokens=u.input_len,
                max_tokens=u.max_tokens,
                min_tokens=u.max_tokens,
                cache_salt=u.root_id,
                tags={"root": u.root_id},
            )
        unit = Unit(uid, u.root_id, u.deployment, u.input_len, u.max_tokens, u.priority, now,
                    u.workflow)  # fmt: skip
        self.dispatcher.on_ready(
            unit,
            request,
            on_done=functools.partial(self._complete, uid),
            on_submitted=functools.partial(self._submitted, uid),
        )

    def _reveal(self, uid: str) -> None:
        """Tell the dispatcher about `uid` as MAServeTaskRunner would: once every predecessor
        has been released, with the sizes a runner knows before the op runs."""
        op = self.ops[uid]
        if op.revealed:
            return
        op.revealed = True
        u = op.unit
        unit = Unit(uid, u.root_id, u.deployment, 0, DEFAULT_OUTPUT_LIMIT, u.priority,
                    self.clock.now(), u.workflow)  # fmt: skip
        self.dispatcher.on_known(unit, u.preds)

    def _submitted(self, uid: str, t: float, replica: str) -> None:
        op = self.ops[uid]
        self._account(op, t)
        del self.ready[uid]
        op.status, op.submitted_s, op.replica, op.category = UnitStatus.RUNNING, t, replica, ""

    def _complete(self, uid: str, out: Outcome) -> None:
        op, now = self.ops[uid], self.clock.now()
        if out.status is not OutcomeStatus.COMPLETED:
            raise SimulationError(
                f"plan {self.plan.name!r}: unit {uid!r} on {op.replica or '?'} ended "
                f"{out.status.value}: {out.error}"
            )
        op.status, op.completed_s, op.num_output_tokens = (
            UnitStatus.DONE,
            now,
            out.num_output_tokens,
        )
        op.first_token_s = out.first_token_s if out.first_token_s is not None else now
        for s in op.unit.succs:
            if all(self.ops[p].status is UnitStatus.DONE for p in self.ops[s].unit.preds):
                self._release(s)
        root = op.unit.root_id
        self.left[root] -= 1
        if self.left[root] == 0:
            self.finish[root] = now

    # -- measurement around every plan (PlanObserver) --------------------------------------

    def before_plan(self, now: float) -> None:
        for uid in self.ready:
            self._account(self.ops[uid], now)

    def after_plan(self, now: float) -> None:
        for uid in self.ready:
            op = self.ops[uid]
            op.category = self.control.availability(op.unit.deployment)

    def _account(self, op: _Op, now: float) -> None:
        if op.category:
            op.waits[op.category] = op.waits.get(op.category, 0.0) + now - op.wait_since
        op.wait_since = now

    # -- results ---------------------------------------------------------------------------

    def result(self) -> PoolRunResult:
        stuck = sorted(uid for uid, op in self.ops.items() if op.status is not UnitStatus.DONE)
        if stuck:
            raise SimulationError(
                f"plan {self.plan.name!r}: {len(stuck)} units never completed (first: "
                f"{', '.join(stuck[:5])}); the plan never served their deployment"
            )
        end = max([self.start_s, *(op.completed_s for op in self.ops.values())])
        lat = {r: self.finish[r] - self.arrival[r] for r in sorted(self.by_root)}
        values = np.array(list(lat.values()) or [0.0])
        rows = tuple(self.device_time(self.start_s, end)) if self.device_time else ()
        parts = ("generation_s", "idle_resident_s", "loading_s", "other_s")
        sessions = max(len(lat), 1)
        per = {p[:-2]: sum(getattr(r, p) for r in rows) / sessions for p in parts}
        per["total"] = sum(per.values())
        by_scenario = self._gpu_by_scenario(end, sum(r.other_s for r in rows))
        events = self.control.events
        return PoolRunResult(
            plan=self.plan.name,
            start_s=self.start_s,
            end_s=end,
            makespan_s=end - self.start_s,
            root_latency_s=lat,
            p95_latency_s=float(np.percentile(values, 95)),
            mean_latency_s=float(values.mean()),
            ops=tuple(self._op_result(uid) for uid in sorted(self.ops)),
            lifecycle=tuple(sorted(events, key=lambda e: (e.start_s, e.end_s, e.replica))),
            device_time=rows,
            gpu_s_per_session=per,
            num_plans=self.dispatcher.stats.num_plans,
            gpu_s_by_scenario=by_scenario,
        )

    def _gpu_by_scenario(self, end: float, other_s: float) -> dict[str, dict[str, float]]:
        if self.replica_time is None:
            return {}
        scenario = {u.unit_id: wf.name or wf.root_id for wf in self.workflows for u in wf.units}
        sessions: dict[str, int] = {}
        for wf in self.workflows:
            sessions[wf.name or wf.root_id] = sessions.get(wf.name or wf.root_id, 0) + 1
        reps = list(self.replica_time(self.start_s, end))
        return gpu_seconds_by_scenario(reps, other_s, scenario, sessions)

    def _op_result(self, uid: str) -> OpResult:
        op = self.ops[uid]
        u = op.unit
        same = any(self.ops[p].unit.deployment == u.deployment for p in u.preds)
        return OpResult(
            uid,
            u.root_id,
            u.deployment,
            op.replica,
            self.control.where[op.replica][1],
            op.ready_s,
            op.submitted_s,
            op.first_token_s,
            op.completed_s,
            u.input_len,
            op.num_output_tokens,
            op.waits.get("load", 0.0),
            op.waits.get("no_load", 0.0),
            op.waits.get("other", 0.0),
            op.submitted_s - op.ready_s if same else 0.0,
            self.control.chain_label.get(uid, ""),
        )


def _deployments(
    workflows: Sequence[RootDag], given: Mapping[str, Deployment], options: ExecOptions
) -> dict[str, Deployment]:
    """Every deployment the run needs, by the name units use (per root without coalescing)."""
    names = {u.deployment for wf in workflows for u in wf.units}
    names |= {dep for dep, _ in options.warm}
    base = {}
    for n in sorted(names):
        dep = given.get(n) or options.deployment(n)
        if dep.name != n:
            raise ConfigError(f"deployments[{n!r}] is named {dep.name!r}; use the same name")
        base[n] = dep
    return base


def run_pool(
    workflows: Sequence[RootDag],
    devices: Sequence[str],
    plan: str | Plan = "joint",
    *,
    deployments: Mapping[str, Deployment] | None = None,
    costs: CostModel | None = None,
    options: ExecOptions | None = None,
) -> PoolRunResult:
    """Run `workflows` on a fresh simulated pool of `devices` under `plan`.

    Args:
        workflows: roots with their DAGs and arrival offsets.
        devices: device names ("A100-40GB:0", "V100-32GB:0", ...).
        plan: a registered plan name ("joint", "pool-fcfs", "parrot", "kairos") or instance.
        deployments: deployment configs by the names units use (default: the model of that
            name sized by `options`: vLLM's `gpu_memory_utilization`, or a fixed
            `kv_cache_bytes` of KV when co-locating; `ExecOptions.deployment`).
        costs: the predictions plans see (default: `RooflineCostModel` with the same KV).
        options: ablations and knobs (`ExecOptions`).

    Raises:
        ConfigError: malformed DAGs, repeated unit ids, a deployment that fits no device.
        SimulationError: a plan broke a rule (refused submit or load, leased replica
            reclaimed, thrashing) or left units unfinished.
    """
    opts = options or ExecOptions()
    chosen = get_plan(plan) if isinstance(plan, str) else plan
    model = costs or RooflineCostModel(opts.kv_cache_bytes)
    kernel = Kernel()
    pool = SimPool(kernel, devices)
    run = _PoolRun(
        workflows, kernel, SimPoolHandle(pool), chosen, deployments or {}, model, opts,
        pool.device_time, pool.replica_time,
    )  # fmt: skip
    run.warm_up()
    run.start()
    kernel.run()
    return run.result()
