"""The pool executor: run workflow DAGs on a simulated GPU pool under any pool plan, and measure.

One idea: the executor owns the books a pool plan must not touch — unit statuses, grants and
leases, loads waiting for their victims, predicted transition times — and turns them into an
immutable `PoolSnapshot` at every event (root arrival, unit ready / complete, load or unload done;
events at one instant share one replan). It then applies the plan's `Decisions` to a `SimPool` on
the kernel: unloads first, then loads (a load with `after` starts when those unloads end), then
grants, then submits. A granted chain's later members go to their replica the instant they are
ready, and the replica stays leased until the chain ends. Anything an engine refuses, or a plan
reclaiming a leased replica, stops the run with an error: it is a plan bug, never skipped.

Measured per op: ready / submitted / first token / completion, and the model-availability delay
of every ready op split by what the pool looked like while it waited — `wait_load_s` (no replica
of its deployment serving, a load of it in progress), `wait_no_load_s` (none serving and none
loading: the load could not start), `wait_other_s` (a replica was serving; queue or plan choice)
— plus `reacquire_s` (ready → submitted for ops that follow a same-deployment predecessor). Per
run: makespan, per-root latency, p95, lifecycle actions, and GPU-seconds per completed session
split generation / idle-resident / loading / other (`SimPool.device_time`).

Ablations: `fusion=False` (every unit its own grant), `prefetch=False`, `coalesce=False`
(per-workflow lifecycle: each root gets private copies of its deployments, so nothing is shared).
Runs are deterministic: same inputs, same results.

Examples:
    >>> from maserve_prefect.runtime.window import WorkUnit
    >>> a = WorkUnit("r/a", "r", "Qwen3-0.6B", 100, 8, succs=("r/b",))
    >>> b = WorkUnit("r/b", "r", "Qwen3-0.6B", 100, 8, preds=("r/a",))
    >>> res = run_pool([Workflow("r", 0.0, (a, b))], ["A100-40GB:0"], "joint")
    >>> len(res.ops), [e.action for e in res.lifecycle], res.ops[1].chain
    (2, ['load'], 'r/a')
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from maserve_prefect.clock import LATE, URGENT
from maserve_prefect.engine.protocol import (
    Acceptance,
    LifecycleTicket,
    Outcome,
    OutcomeStatus,
    Request,
)
from maserve_prefect.engine.sim.device import Deployment, ReplicaStatus
from maserve_prefect.engine.sim.device_time import DeviceTimeRow
from maserve_prefect.engine.sim.kernel import Kernel
from maserve_prefect.engine.sim.pool import SimPool
from maserve_prefect.errors import ConfigError, SimulationError
from maserve_prefect.runtime.constructor import fusible_chains
from maserve_prefect.runtime.joint_plan import PlanOptions, PoolSnapshot
from maserve_prefect.runtime.plans import Decisions, Load, Plan, ReplicaView, Unit, get_plan
from maserve_prefect.runtime.pool_state import (
    ActiveRequest,
    CostModel,
    DeviceInfo,
    Lease,
    PlannedLoad,
    PoolState,
    ReplicaInfo,
    ReplicaPhase,
    RooflineCostModel,
    deployment_info,
)
from maserve_prefect.runtime.window import UnitStatus, WorkUnit, build_window, dag_stats

GIB = 1 << 30
_PHASE = {
    ReplicaStatus.LOADING: ReplicaPhase.LOADING,
    ReplicaStatus.WAKING: ReplicaPhase.LOADING,
    ReplicaStatus.READY: ReplicaPhase.RESIDENT,
    ReplicaStatus.FALLING_ASLEEP: ReplicaPhase.SLEEPING,
    ReplicaStatus.ASLEEP: ReplicaPhase.SLEEPING,
    ReplicaStatus.UNLOADING: ReplicaPhase.UNLOADING,
}


@dataclass(frozen=True, slots=True)
class Workflow:
    """One root: its DAG of model calls and its arrival offset (seconds after the run starts)."""

    root_id: str
    arrival_s: float
    units: tuple[WorkUnit, ...]
    name: str = ""


@dataclass(frozen=True, slots=True)
class ExecOptions:
    """Executor options.

    Attributes:
        fusion / prefetch: passed to the plan (`PlanOptions`); ablations switch them off.
        coalesce: False = per-workflow lifecycle (each root gets private deployment copies).
        kv_cache_bytes: KV pool of the default deployments (and of the default cost model).
        aging_s / prefetch_slack_s / tie_s: passed to the plan (`PlanOptions`).
        warm: (deployment, device) pairs loaded before the run starts (time 0 = warm pool).
    """

    fusion: bool = True
    prefetch: bool = True
    coalesce: bool = True
    kv_cache_bytes: int = 2 * GIB
    aging_s: float = 30.0
    prefetch_slack_s: float = 5.0
    tie_s: float = 2.0
    warm: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class OpResult:
    """What happened to one unit (times on the run's clock, seconds)."""

    unit_id: str
    root_id: str
    deployment: str
    replica: str
    device: str
    ready_s: float
    submitted_s: float
    first_token_s: float
    completed_s: float
    num_input_tokens: int
    num_output_tokens: int
    wait_load_s: float
    wait_no_load_s: float
    wait_other_s: float
    reacquire_s: float
    chain: str


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """One lifecycle action the run executed."""

    action: str
    replica: str
    deployment: str
    device: str
    start_s: float
    end_s: float
    prefetch: bool = False
    units: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PoolRunResult:
    """Everything one executor run measured (module docstring)."""

    plan: str
    start_s: float
    end_s: float
    makespan_s: float
    root_latency_s: Mapping[str, float]
    p95_latency_s: float
    mean_latency_s: float
    ops: tuple[OpResult, ...]
    lifecycle: tuple[LifecycleEvent, ...]
    device_time: tuple[DeviceTimeRow, ...]
    gpu_s_per_session: Mapping[str, float]
    num_plans: int

    def summary(self) -> dict[str, float]:
        """Headline numbers for a report table."""
        loads = [e for e in self.lifecycle if e.action == "load"]
        return {
            "makespan_s": self.makespan_s,
            "p95_latency_s": self.p95_latency_s,
            "mean_latency_s": self.mean_latency_s,
            "num_loads": float(len(loads)),
            "num_prefetches": float(sum(e.prefetch for e in loads)),
            "num_unloads": float(sum(e.action == "unload" for e in self.lifecycle)),
            "wait_load_s": sum(o.wait_load_s for o in self.ops),
            "wait_no_load_s": sum(o.wait_no_load_s for o in self.ops),
            "reacquire_s": sum(o.reacquire_s for o in self.ops),
            **{f"gpu_s_{k}": v for k, v in self.gpu_s_per_session.items()},
        }


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
    chain: str = ""


@dataclass(slots=True)
class _Waiting:
    load: Load
    pending: set[str]
    start_s: float


class _PoolRun:
    """Event logic of one executor run (module docstring)."""

    def __init__(
        self,
        workflows: Sequence[Workflow],
        devices: Sequence[str],
        plan: Plan,
        deployments: Mapping[str, Deployment],
        costs: CostModel,
        options: ExecOptions,
    ) -> None:
        self.kernel = Kernel()
        self.pool = SimPool(self.kernel, devices)
        self.plan, self.costs, self.opts = plan, costs, options
        self.workflows = list(workflows)
        self.deps = _deployments(self.workflows, deployments, options)
        gpus = {self.pool.slot(d).gpu.name for d in self.pool.devices()}
        self.info = {n: deployment_info(d, gpus) for n, d in self.deps.items()}
        self.device_infos = tuple(
            DeviceInfo(n, self.pool.slot(n).gpu.name, self.pool.slot(n).gpu.memory_bytes)
            for n in self.pool.devices()
        )
        self.ops: dict[str, _Op] = {}
        self.by_root: dict[str, list[str]] = {}
        for wf in self.workflows:
            for u in wf.units:
                u = dataclasses.replace(u, deployment=self._dep_name(u.deployment, wf.root_id))
                if u.unit_id in self.ops or u.root_id != wf.root_id:
                    raise ConfigError(
                        f"unit {u.unit_id!r}: unit ids must be unique and its root_id must be "
                        f"its workflow's ({wf.root_id!r})"
                    )
                self.ops[u.unit_id] = _Op(u)
                self.by_root.setdefault(wf.root_id, []).append(u.unit_id)
        units = {k: o.unit for k, o in self.ops.items()}
        self.best_rt = {k: self._best_runtime(u) for k, u in units.items()}
        self.stats = dag_stats(units, lambda u: self.best_rt[u.unit_id])
        self.chains = fusible_chains(units, options.fusion)
        self.plan_opts = PlanOptions(
            options.fusion,
            options.prefetch,
            options.aging_s,
            options.prefetch_slack_s,
            options.tie_s,
        )
        self.arrival: dict[str, float] = {}
        self.finish: dict[str, float] = {}
        self.left = {r: len(ids) for r, ids in self.by_root.items()}
        self.live: dict[str, None] = {}  # arrived, unfinished roots (arrival order)
        self.ready: dict[str, None] = {}  # ready, unsubmitted units
        self.active: dict[str, list[ActiveRequest]] = {}
        self.grants: dict[str, tuple[str, list[str]]] = {}  # chain id -> (replica, units left)
        self.grant_of: dict[str, str] = {}
        self.ready_at: dict[str, float] = {}  # replica -> predicted end of its transition
        self.last_used: dict[str, float] = {}
        self.waiting: list[_Waiting] = []
        self.where: dict[str, tuple[str, str]] = {}  # replica -> (deployment, device)
        self.events: list[LifecycleEvent] = []
        self.open: dict[str, LifecycleEvent] = {}
        self.replan_pending = False
        self.num_plans = 0
        self.start_s = 0.0

    # -- setup -----------------------------------------------------------------------------

    def _dep_name(self, name: str, root: str) -> str:
        return name if self.opts.coalesce else f"{name}~{root}"

    def _best_runtime(self, u: WorkUnit) -> float:
        info = self.info[u.deployment]
        if not info.fits:
            raise ConfigError(
                f"unit {u.unit_id!r}: deployment {u.deployment!r} ({info.model}) fits no device "
                f"of the pool {list(self.pool.devices())}; add a larger device or shrink its KV"
            )
        return min(
            self.costs.runtime_s(info.model, f.gpu, 1, u.input_len, u.max_tokens) for f in info.fits
        )

    def warm_up(self) -> None:
        if self.opts.warm and not self.opts.coalesce:
            raise ConfigError(
                "warm replicas are shared by every root; per-workflow lifecycle "
                "(coalesce=False) starts cold, so drop `warm` for that ablation"
            )
        for dep, device in self.opts.warm:
            t = self.pool.load(self.deps[dep], device)
            if t.acceptance is not Acceptance.ACCEPTED:
                raise ConfigError(f"warm load of {dep!r} on {device!r} refused: {t.reason}")
            self.where[t.replica] = (dep, device)
        self.kernel.run()
        self.start_s = self.kernel.now()
        for r in self.pool.replicas():
            self.last_used[r.name] = self.start_s
            self.ready_at[r.name] = self.start_s

    def start(self) -> None:
        for wf in sorted(self.workflows, key=lambda w: (w.arrival_s, w.root_id)):
            arrive = functools.partial(self._arrive, wf.root_id)
            self.kernel.call_at(self.start_s + wf.arrival_s, arrive, URGENT, f"arrive {wf.root_id}")

    # -- events ----------------------------------------------------------------------------

    def _arrive(self, root: str) -> None:
        self.arrival[root] = self.kernel.now()
        if self.left.get(root):
            self.live[root] = None
        for uid in self.by_root.get(root, []):
            if not self.ops[uid].unit.preds:
                self._make_ready(uid)
        if not self.left.get(root):
            self.finish[root] = self.kernel.now()
        self._request_replan()

    def _make_ready(self, uid: str) -> None:
        op, now = self.ops[uid], self.kernel.now()
        op.status, op.ready_s, op.wait_since, op.category = UnitStatus.READY, now, now, ""
        self.ready[uid] = None
        chain = self.grant_of.get(uid)
        if chain is not None:
            self._submit(uid, self.grants[chain][0])

    def _submit(self, uid: str, replica: str) -> None:
        op, now = self.ops[uid], self.kernel.now()
        if op.status is not UnitStatus.READY:
            raise SimulationError(
                f"plan {self.plan.name!r} submitted unit {uid!r}, which is {op.status.name}"
            )
        u = op.unit
        request = Request(
            uid,
            u.deployment,
            num_prompt_tokens=u.input_len,
            max_tokens=u.max_tokens,
            min_tokens=u.max_tokens,
            cache_salt=u.root_id,
            tags={"root": u.root_id},
        )
        ticket = self.pool.replica(replica).submit(request)
        if not ticket.accepted:
            raise SimulationError(
                f"plan {self.plan.name!r} sent unit {uid!r} to {replica}, which refused: "
                f"{ticket.reason}"
            )
        self._account(op, now)
        del self.ready[uid]
        op.status, op.submitted_s, op.replica, op.category = UnitStatus.RUNNING, now, replica, ""
        gpu = self.pool.slot(self.where[replica][1]).gpu.name
        rt = self.costs.runtime_s(self.info[u.deployment].model, gpu, 1, u.input_len, u.max_tokens)
        self.active.setdefault(replica, []).append(
            ActiveRequest(uid, u.input_len, u.max_tokens, now, now + rt)
        )
        self.last_used[replica] = now

        def first_token(t: float) -> None:
            op.first_token_s = t

        ticket.on_first_token(first_token)
        ticket.on_done(lambda out: self._complete(uid, replica, out))

    def _complete(self, uid: str, replica: str, out: Outcome) -> None:
        if out.status is not OutcomeStatus.COMPLETED:
            raise SimulationError(
                f"unit {uid!r} on {replica} ended {out.status.value}: {out.error}"
            )
        op, now = self.ops[uid], self.kernel.now()
        op.status, op.completed_s, op.num_output_tokens = (
            UnitStatus.DONE,
            now,
            out.num_output_tokens,
        )
        self.active[replica] = [a for a in self.active[replica] if a.unit_id != uid]
        self.last_used[replica] = now
        chain = self.grant_of.pop(uid, None)
        if chain is not None:
            _, left = self.grants[chain]
            left.remove(uid)
            if not left:
                del self.grants[chain]
        for s in op.unit.succs:
            if all(self.ops[p].status is UnitStatus.DONE for p in self.ops[s].unit.preds):
                self._make_ready(s)
        root = op.unit.root_id
        self.left[root] -= 1
        if self.left[root] == 0:
            self.finish[root] = now
            del self.live[root]
        self._request_replan()

    def _lifecycle_done(self, ticket: LifecycleTicket) -> None:
        ev = self.open.pop(ticket.replica)
        self.events.append(dataclasses.replace(ev, end_s=self.kernel.now()))
        self.ready_at[ticket.replica] = self.kernel.now()
        if ev.action == "unload":
            for w in list(self.waiting):
                w.pending.discard(ticket.replica)
                if not w.pending:
                    self.waiting.remove(w)
                    self._start_load(w.load)
        self._request_replan()

    # -- planning --------------------------------------------------------------------------

    def _request_replan(self) -> None:
        if not self.replan_pending:
            self.replan_pending = True
            self.kernel.call_at(self.kernel.now(), self._replan, LATE, "replan")

    def _replan(self) -> None:
        self.replan_pending = False
        now = self.kernel.now()
        for uid in self.ready:
            self._account(self.ops[uid], now)
        snap = self.snapshot()
        decisions = self.plan.plan(snap)
        self.num_plans += 1
        self._apply(decisions)
        if len(self.events) + len(self.open) > 50 * len(self.ops) + 100:
            raise SimulationError(
                f"plan {self.plan.name!r} ran {len(self.events)} lifecycle actions for "
                f"{len(self.ops)} units; it is thrashing"
            )
        for uid in self.ready:
            op = self.ops[uid]
            op.category = self._category(op.unit.deployment)

    def _account(self, op: _Op, now: float) -> None:
        if op.category:
            op.waits[op.category] = op.waits.get(op.category, 0.0) + now - op.wait_since
        op.wait_since = now

    def _category(self, deployment: str) -> str:
        phases = [
            self.pool.status(r.name) for r in self.pool.replicas() if r.deployment == deployment
        ]
        if ReplicaStatus.READY in phases:
            return "other"
        loading = ReplicaStatus.LOADING in phases or ReplicaStatus.WAKING in phases
        if loading or any(w.load.deployment == deployment for w in self.waiting):
            return "load"
        return "no_load"

    def _apply(self, d: Decisions) -> None:
        for u in d.unloads:
            self._unload(u.replica)
        for load in d.loads:
            pending = {n for n in load.after if n in self.open}
            if pending:
                self.waiting.append(_Waiting(load, pending, self.kernel.now()))
            else:
                self._start_load(load)
        for g in d.grants:
            chain = g.unit_ids[0]
            self.grants[chain] = (g.replica, list(g.unit_ids))
            for uid in g.unit_ids:
                self.grant_of[uid] = chain
                self.ops[uid].chain = chain
        for s in d.submits:
            self._submit(s.unit_id, s.replica)

    def _unload(self, name: str) -> None:
        leased = any(rep == name for rep, _ in self.grants.values()) or self.active.get(name)
        if leased:
            raise SimulationError(f"plan {self.plan.name!r} reclaimed {name}, which holds a lease")
        dep_name, device = self.where[name]
        dep = self.deps[dep_name]
        ticket = self.pool.unload(name, on_done=self._lifecycle_done)
        if ticket.acceptance is not Acceptance.ACCEPTED:
            raise SimulationError(
                f"plan {self.plan.name!r}: unload of {name} refused: {ticket.reason}"
            )
        now = self.kernel.now()
        self.ready_at[name] = now + dep.params().unload_s
        self.open[name] = LifecycleEvent("unload", name, dep.name, device, now, now)

    def _start_load(self, load: Load) -> None:
        dep = self.deps[load.deployment]
        ticket = self.pool.load(dep, load.device, on_done=self._lifecycle_done)
        if ticket.acceptance is not Acceptance.ACCEPTED:
            raise SimulationError(
                f"plan {self.plan.name!r}: load of {load.deployment} on {load.device} refused: "
                f"{ticket.reason}"
            )
        now = self.kernel.now()
        self.where[ticket.replica] = (load.deployment, load.device)
        gpu = self.pool.slot(load.device).gpu.name
        self.ready_at[ticket.replica] = now + self.costs.load_s(dep.model, gpu)
        self.last_used[ticket.replica] = now
        self.open[ticket.replica] = LifecycleEvent(
            "load", ticket.replica, dep.name, load.device, now, now, load.prefetch, load.units
        )

    # -- snapshot --------------------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        now = self.kernel.now()
        state = self._pool_state(now)
        live = list(self.live)
        units = {uid: self.ops[uid].unit for r in live for uid in self.by_root[r]}
        status = {uid: self.ops[uid].status for uid in units}
        started = {u: self.ops[u].submitted_s for u, s in status.items() if s is UnitStatus.RUNNING}
        window = build_window(
            units,
            status,
            now,
            self._predicted_runtime,
            started_s=started,
            ready_s={u: self.ops[u].ready_s for u, s in status.items() if s is UnitStatus.READY},
            done_s={u: self.ops[u].completed_s for u, s in status.items() if s is UnitStatus.DONE},
            stats=self.stats,
            root_arrival_s={r: self.arrival[r] for r in live},
        )
        views = []
        for rep in self.pool.replicas():
            st = rep.state()
            views.append(
                ReplicaView(
                    rep.name,
                    rep.deployment,
                    st.lifecycle,
                    st.num_running,
                    st.num_waiting,
                    len(self.active.get(rep.name, ())),
                    st.kv_usage,
                )
            )
        return PoolSnapshot(
            now_s=now,
            ready=tuple(_unit(w.unit, w.release_s) for w in window.ready),
            near_ready=tuple(_unit(w.unit, w.release_s) for w in window.near_ready),
            replicas=tuple(views),
            pool=state,
            window=window,
            units=units,
            costs=self.costs,
            chains={u: self.chains[u] for u in units},
            options=self.plan_opts,
        )

    def _predicted_runtime(self, u: WorkUnit) -> float:
        op = self.ops[u.unit_id]
        if op.status is UnitStatus.RUNNING:
            gpu = self.pool.slot(self.where[op.replica][1]).gpu.name
            model = self.info[u.deployment].model
            return self.costs.runtime_s(model, gpu, 1, u.input_len, u.max_tokens)
        return self.best_rt[u.unit_id]

    def _pool_state(self, now: float) -> PoolState:
        replicas = []
        for p in self.pool.pool_replicas():
            phase = _PHASE.get(p.status)
            if phase is None:
                continue
            dep_name, device = self.where[p.name]
            fit = self.info[dep_name].fit(p.devices[0].gpu.name)
            assert fit is not None, f"{p.name} runs where its deployment does not fit"
            active = tuple(self.active.get(p.name, ()))
            held = p.reserved_bytes
            if active:
                peak = self.costs.peak_mem_bytes(
                    self.info[dep_name].model,
                    p.devices[0].gpu.name,
                    len(active),
                    max(a.input_len for a in active),
                    max(a.max_tokens for a in active),
                )
                held = max(held, peak)
            replicas.append(
                ReplicaInfo(
                    p.name,
                    dep_name,
                    device,
                    phase,
                    self.ready_at.get(p.name, now),
                    held,
                    fit.footprint_bytes,
                    fit.kv_capacity_tokens,
                    fit.max_num_seqs,
                    active,
                    self.last_used.get(p.name, 0.0),
                    fit.unload_s,
                    p.engine.accepting,
                )
            )
        leases = tuple(
            Lease(rep, chain, tuple(left)) for chain, (rep, left) in sorted(self.grants.items())
        )
        grants = tuple((rep, tuple(left)) for _, (rep, left) in sorted(self.grants.items()))
        planned = []
        for w in self.waiting:
            info = self.info[w.load.deployment]
            gpu = self.pool.slot(w.load.device).gpu.name
            fit = info.fit(gpu)
            assert fit is not None
            start = max([self.ready_at.get(n, now) for n in w.pending] + [now])
            ready = start + self.costs.load_s(info.model, gpu)
            planned.append(
                PlannedLoad(
                    w.load.deployment,
                    w.load.device,
                    start,
                    ready,
                    fit.footprint_bytes,
                    tuple(sorted(w.pending)),
                    w.load.prefetch,
                )
            )
        return PoolState(
            now,
            self.device_infos,
            tuple(self.info[n] for n in sorted(self.info)),
            tuple(replicas),
            leases,
            grants,
            tuple(planned),
        )

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
        rows = tuple(self.pool.device_time(self.start_s, end))
        parts = ("generation_s", "idle_resident_s", "loading_s", "other_s")
        sessions = max(len(lat), 1)
        per = {p[:-2]: sum(getattr(r, p) for r in rows) / sessions for p in parts}
        per["total"] = sum(per.values())
        return PoolRunResult(
            plan=self.plan.name,
            start_s=self.start_s,
            end_s=end,
            makespan_s=end - self.start_s,
            root_latency_s=lat,
            p95_latency_s=float(np.percentile(values, 95)),
            mean_latency_s=float(values.mean()),
            ops=tuple(self._op_result(uid) for uid in sorted(self.ops)),
            lifecycle=tuple(sorted(self.events, key=lambda e: (e.start_s, e.end_s, e.replica))),
            device_time=rows,
            gpu_s_per_session=per,
            num_plans=self.num_plans,
        )

    def _op_result(self, uid: str) -> OpResult:
        op = self.ops[uid]
        u = op.unit
        same = any(self.ops[p].unit.deployment == u.deployment for p in u.preds)
        return OpResult(
            uid,
            u.root_id,
            u.deployment,
            op.replica,
            self.where[op.replica][1],
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
            op.chain,
        )


def _unit(u: WorkUnit, release_s: float) -> Unit:
    return Unit(
        u.unit_id,
        u.root_id,
        u.deployment,
        u.input_len,
        u.max_tokens,
        u.priority,
        release_s,
        u.workflow,
    )


def _deployments(
    workflows: Sequence[Workflow], given: Mapping[str, Deployment], options: ExecOptions
) -> dict[str, Deployment]:
    """Every deployment the run needs, by the name units use (per root without coalescing)."""
    names = {u.deployment for wf in workflows for u in wf.units}
    names |= {dep for dep, _ in options.warm}
    base = {}
    for n in sorted(names):
        dep = given.get(n) or Deployment(n, n, kv_cache_bytes=options.kv_cache_bytes)
        if dep.name != n:
            raise ConfigError(f"deployments[{n!r}] is named {dep.name!r}; use the same name")
        base[n] = dep
    if options.coalesce:
        return base
    out = {}
    for wf in workflows:
        for u in wf.units:
            name = f"{u.deployment}~{wf.root_id}"
            out[name] = dataclasses.replace(base[u.deployment], name=name)
    return out


def run_pool(
    workflows: Sequence[Workflow],
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
            name with `options.kv_cache_bytes` of pre-allocated KV).
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
    run = _PoolRun(workflows, devices, chosen, deployments or {}, model, opts)
    run.warm_up()
    run.start()
    run.kernel.run()
    return run.result()
