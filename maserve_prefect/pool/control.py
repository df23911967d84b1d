"""Pool control: the books a pool plan decides on, and its lifecycle decisions applied to a pool.

One idea: a pool plan is pure — it sees a `PoolSnapshot` and returns `Decisions` — so somebody
must keep what the snapshot is built from and carry the decisions out. That is the
`PoolController`: the books (`dispatch.books.Books`) the one dispatcher keeps when it drives a
pool, planning once per instant at LATE priority. It keeps

- the known DAG of every live root: units with statuses and recorded ready / submit / done
  times, predicted best runtimes, DAG facts (`window.dag_stats`) and fused chains;
- the pool's books: where each replica sits, its predicted transition end and last use, the
  requests in flight per replica, standing grants (a chain leases its replica until it ends), and
  loads waiting for their victims' unloads;

and applies the lifecycle part of a plan's decisions: unloads first, then loads (a load with
`after` starts when every named unload has finished), then grants. Submits stay with the
dispatcher, which learns from `mark_ready` where a granted unit must go the moment it is ready
and reports every submit and completion back. A plan that reclaims a leased replica, a refused
lifecycle call, or thrashing stops the run with `SimulationError`: a plan bug, never skipped.

Units become known in one of two ways, never mixed for one root:

- `declare`: a root's whole DAG up front (the pool executor knows it); the root goes live at
  `arrive`. Per-root lists keep the given order.
- `reveal`: one unit at a time, as `MAServeTaskRunner` reports it (once every predecessor has
  been released; sizes are estimates — prompt unknown, counted as 1 token; output
  `DEFAULT_OUTPUT_LIMIT` — until the unit is ready and its request is known). Predecessors not
  yet known are linked when they appear, and per-root lists, preds and succs are kept in id
  order, so the books at a plan do not depend on the order in which one instant's events
  arrived. A root goes live at its first reveal.

The pool is reached through a `PoolHandle` (`pool.handle`); `pool.dispatch`
builds a simulated pool and a pool-mode dispatcher with its controller.

Examples:
    >>> from maserve_prefect.clock.kernel import Kernel
    >>> from maserve_prefect.engines.sim.pool.sim_pool import SimPool
    >>> from maserve_prefect.pool.handle import SimPoolHandle
    >>> from maserve_prefect.pool.state import RooflineCostModel
    >>> k = Kernel()
    >>> ctl = PoolController(SimPoolHandle(SimPool(k, ["A100-40GB:0"])), k,
    ...                      {"m": Deployment("m", "Qwen3-0.6B")}, RooflineCostModel())
    >>> ctl.reveal(WorkUnit("r/a", "r", "m", 0, 8), 0.0)
    True
    >>> ctl.snapshot(0.0, (), ()).window.near_ready, ctl.live_roots()
    ((), ['r'])
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from maserve_prefect.clock import LATE, Clock
from maserve_prefect.dispatch.books import Cadence, per_instant
from maserve_prefect.dispatch.snapshot import Decisions, Load, ReplicaView, Snapshot, Unit
from maserve_prefect.engines.sim.pool.device import Deployment
from maserve_prefect.errors import ConfigError, SimulationError
from maserve_prefect.pool.admission import Backoff
from maserve_prefect.pool.fusion import Chain, fusible_chains
from maserve_prefect.pool.handle import PoolHandle
from maserve_prefect.pool.outputs import OutputHistory
from maserve_prefect.pool.snapshot import PlanOptions, PoolSnapshot
from maserve_prefect.pool.state import (
    ActiveRequest,
    CostModel,
    DeploymentInfo,
    DeviceInfo,
    Lease,
    PlannedLoad,
    PoolState,
    ReplicaInfo,
    deployment_info,
)
from maserve_prefect.pool.window import DagStats, UnitStatus, WorkUnit, build_window, dag_stats
from maserve_prefect.protocol.engine import LifecycleTicket
from maserve_prefect.protocol.outcomes import Acceptance
from maserve_prefect.protocol.requests import DEFAULT_MAX_TOKENS
from maserve_prefect.protocol.state import Lifecycle

DEFAULT_OUTPUT_LIMIT = DEFAULT_MAX_TOKENS
"""Output tokens assumed for a revealed unit until its request is known: the limit a model op
uses when it declares none."""


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """One lifecycle action the pool executed (`end_s` = start while it is in progress)."""

    action: str
    replica: str
    deployment: str
    device: str
    start_s: float
    end_s: float
    prefetch: bool = False
    units: tuple[str, ...] = ()


@dataclass(slots=True)
class _Waiting:
    load: Load
    pending: set[str]
    start_s: float


class PoolController:
    """Books and lifecycle application of pool plans (see the module docstring).

    Args:
        pool: the pool (`SimPoolHandle(SimPool(...))`).
        clock: the clock lifecycle callbacks and replans run on.
        deployments: every deployment units may name, by that name.
        costs: the predictions plans see.
        options: plan knobs handed to plans in every snapshot.
    """

    def __init__(
        self,
        pool: PoolHandle,
        clock: Clock,
        deployments: Mapping[str, Deployment],
        costs: CostModel,
        options: PlanOptions | None = None,
    ) -> None:
        self.pool, self.clock, self.costs = pool, clock, costs
        self.options = options or PlanOptions()
        self.deps = dict(deployments)
        gpus = {pool.device_gpu(d) for d in pool.devices()}
        self.info: dict[str, DeploymentInfo] = {
            n: deployment_info(d, (g.name for g in gpus)) for n, d in self.deps.items()
        }
        self.device_infos = tuple(
            DeviceInfo(n, pool.device_gpu(n).name, pool.device_gpu(n).memory_bytes)
            for n in pool.devices()
        )
        self.on_lifecycle_done: Callable[[str], None] | None = None  # set by the dispatcher
        # units
        self.units: dict[str, WorkUnit] = {}
        self.status: dict[str, UnitStatus] = {}
        self.ready_s: dict[str, float] = {}
        self.submitted_s: dict[str, float] = {}
        self.completed_s: dict[str, float] = {}
        self.replica_of: dict[str, str] = {}
        self.chain_label: dict[str, str] = {}  # unit -> head of the grant it ran under
        self.by_root: dict[str, list[str]] = {}
        self.best_rt: dict[str, float] = {}
        self.stats: dict[str, DagStats] = {}
        self.chains: dict[str, Chain] = {}
        self._unlinked: dict[str, list[str]] = {}  # unknown pred -> units that name it
        self._dirty: set[str] = set()
        # roots
        self.arrival: dict[str, float] = {}
        self.left: dict[str, int] = {}
        self.live: dict[str, None] = {}  # arrived roots with unfinished known units
        # pool
        self.active: dict[str, list[ActiveRequest]] = {}
        self.grants: dict[str, tuple[str, list[str]]] = {}  # chain id -> (replica, units left)
        self.grant_of: dict[str, str] = {}
        self.ready_at: dict[str, float] = {}  # replica -> predicted end of its transition
        self.last_used: dict[str, float] = {}
        self.waiting: list[_Waiting] = []
        self.where: dict[str, tuple[str, str]] = {}  # replica -> (deployment, device)
        self.events: list[LifecycleEvent] = []
        self.open: dict[str, LifecycleEvent] = {}
        self._plan = ""  # the plan whose decisions are applied (named in errors)
        # plan inputs learned from outcomes: output lengths per node, KV back-off ρ(t)
        self.outputs = OutputHistory()
        self.backoff = Backoff()

    # -- units -----------------------------------------------------------------------------

    def declare(self, units: Sequence[WorkUnit]) -> None:
        """Add whole root DAGs (units of one or more roots, every edge inside them).

        Raises:
            ConfigError: a repeated unit id, a malformed DAG, or a deployment no device fits.
        """
        roots: dict[str, None] = {}
        for u in units:
            if u.unit_id in self.units:
                raise ConfigError(f"unit {u.unit_id!r} is declared twice; unit ids must be unique")
            self._add(u)
            roots[u.root_id] = None
        for root in roots:
            self._refresh(root)

    def reveal(self, unit: WorkUnit, now: float) -> bool:
        """A unit became known (or its sizes did); True if the books changed.

        Only `unit.preds` matter for its edges (successors link themselves when they appear);
        a known unit keeps its edges and takes the new deployment, sizes and priority. An
        unknown prompt (0 tokens) counts as one token: predictions need at least one.
        """
        if unit.input_len < 1:
            unit = dataclasses.replace(unit, input_len=1)
        known = self.units.get(unit.unit_id)
        if known is not None:
            new = dataclasses.replace(
                known,
                deployment=unit.deployment,
                input_len=unit.input_len,
                max_tokens=unit.max_tokens,
                priority=unit.priority,
                workflow=unit.workflow or known.workflow,
            )
            if new == known:
                return False
            self._check_deployment(new)
            self.units[unit.unit_id] = new
            self.best_rt.pop(unit.unit_id, None)
            self._dirty.add(unit.root_id)
            return True
        uid, root = unit.unit_id, unit.root_id
        preds = tuple(sorted(set(unit.preds)))
        linked = tuple(p for p in preds if p in self.units)
        for p in preds:
            if p not in self.units:
                self._unlinked.setdefault(p, []).append(uid)
        succs = tuple(sorted(self._unlinked.pop(uid, ())))
        for p in linked:
            pu = self.units[p]
            self.units[p] = dataclasses.replace(pu, succs=tuple(sorted((*pu.succs, uid))))
        for s in succs:
            su = self.units[s]
            self.units[s] = dataclasses.replace(su, preds=tuple(sorted((*su.preds, uid))))
        self._add(dataclasses.replace(unit, preds=linked, succs=succs), sort=True)
        if root not in self.arrival:
            self.arrival[root] = now
        if root not in self.live:
            self.live[root] = None
        self._dirty.add(root)
        return True

    def _add(self, u: WorkUnit, sort: bool = False) -> None:
        self._check_deployment(u)
        self.units[u.unit_id] = u
        self.status[u.unit_id] = UnitStatus.PENDING
        ids = self.by_root.setdefault(u.root_id, [])
        if sort:
            bisect.insort(ids, u.unit_id)
        else:
            ids.append(u.unit_id)
        self.left[u.root_id] = self.left.get(u.root_id, 0) + 1

    def _check_deployment(self, u: WorkUnit) -> None:
        info = self.info.get(u.deployment)
        if info is None:
            raise ConfigError(
                f"unit {u.unit_id!r} names deployment {u.deployment!r}, which this pool does not "
                f"know (known: {sorted(self.info)}); add it to the pool's deployments"
            )
        if not info.fits:
            raise ConfigError(
                f"unit {u.unit_id!r}: deployment {u.deployment!r} ({info.model}) fits no device "
                f"of the pool {list(self.pool.devices())}; add a larger device or shrink its KV"
            )

    def _best_runtime(self, u: WorkUnit) -> float:
        info = self.info[u.deployment]
        return min(
            self.costs.runtime_s(info.model, f.gpu, 1, u.input_len, u.max_tokens) for f in info.fits
        )

    def _refresh(self, root: str) -> None:
        """Recompute a root's runtimes, DAG facts and chains (after its DAG or sizes changed)."""
        units = {uid: self.units[uid] for uid in self.by_root[root]}
        for uid, u in units.items():
            if uid not in self.best_rt:
                self.best_rt[uid] = self._best_runtime(u)
        self.stats.update(dag_stats(units, lambda u: self.best_rt[u.unit_id]))
        self.chains.update(fusible_chains(units, self.options.fusion))

    def live_roots(self) -> list[str]:
        """Roots with unfinished known units, in the order they went live."""
        return list(self.live)

    # -- the dispatcher's books (`dispatch.books.Books`) ------------------------------------

    @property
    def cadence(self) -> Cadence:
        """A pool plan decides once per instant, after everything else due then (LATE)."""
        return per_instant(self.clock, LATE)

    def attach(self, on_lifecycle_done: Callable[[str], None]) -> None:
        """The dispatcher's lifecycle-done event, called when a load or unload ends."""
        self.on_lifecycle_done = on_lifecycle_done

    def arrive(self, root: str, now: float) -> bool:
        """A root arrived (its declared units become part of the window)."""
        self.arrival[root] = now
        if self.left.get(root):
            self.live[root] = None
        return True

    def known(self, unit: Unit, preds: Sequence[str], now: float) -> bool:
        """A model call became known with the model calls it waits for (`reveal`); its sizes
        come with its ready event once it is known."""
        if not unit.deployment or unit.unit_id in self.units:
            return False  # not a model call, or already known
        work = WorkUnit(
            unit.unit_id,
            unit.root_id,
            unit.deployment,
            unit.num_prompt_tokens,
            unit.max_tokens,
            preds=tuple(preds),
            priority=unit.priority,
            workflow=unit.workflow,
        )
        return self.reveal(work, now)

    def near_ready(self, unit: Unit, preds: Sequence[str], now: float) -> bool:
        """A near-ready unit reaches the window as a known one."""
        return self.known(unit, preds, now)

    def ready(self, unit: Unit, now: float) -> str | None:
        return self.mark_ready(unit, now)

    def submitted(self, unit_id: str, replica: str, now: float, *, root_id: str) -> None:
        self.mark_submitted(unit_id, replica, now)

    def done(self, unit_id: str, replica: str | None, now: float) -> None:
        self.mark_done(unit_id, replica, now)

    def after_plan(self, plan: str, snapshot: Snapshot) -> Sequence[tuple[str, str]]:
        """Stop a thrashing plan (`check_thrash`); a pool never fails units for lack of a replica
        (its plan may load one)."""
        self.check_thrash(plan)
        return ()

    def mark_ready(self, unit: Unit, now: float) -> str | None:
        """`unit` is ready with its real sizes; the replica a standing grant binds it to, if any."""
        uid = unit.unit_id
        known = self.units.get(uid)
        if known is None or (known.input_len, known.max_tokens) != (
            unit.num_prompt_tokens,
            unit.max_tokens,
        ):
            base = known or WorkUnit(uid, unit.root_id, unit.deployment, 0, 0)
            self.reveal(
                dataclasses.replace(
                    base,
                    deployment=unit.deployment,
                    input_len=unit.num_prompt_tokens,
                    max_tokens=unit.max_tokens,
                    priority=unit.priority,
                    workflow=unit.workflow or base.workflow,
                ),
                now,
            )
        self.status[uid] = UnitStatus.READY
        self.ready_s[uid] = now
        chain = self.grant_of.get(uid)
        return None if chain is None else self.grants[chain][0]

    def mark_submitted(self, unit_id: str, replica: str, now: float) -> None:
        """`unit_id` was accepted by `replica` at `now`."""
        u = self.units[unit_id]
        self.status[unit_id] = UnitStatus.RUNNING
        self.submitted_s[unit_id] = now
        self.replica_of[unit_id] = replica
        gpu = self.pool.device_gpu(self.where[replica][1]).name
        rt = self.costs.runtime_s(self.info[u.deployment].model, gpu, 1, u.input_len, u.max_tokens)
        self.active.setdefault(replica, []).append(
            ActiveRequest(unit_id, u.input_len, u.max_tokens, now, now + rt)
        )
        self.last_used[replica] = now

    def mark_done(self, unit_id: str, replica: str | None, now: float) -> None:
        """`unit_id` finished on `replica` at `now` (None: refused before it ran; it is over
        all the same): its lease share and grant end."""
        self.status[unit_id] = UnitStatus.DONE
        self.completed_s[unit_id] = now
        u = self.units[unit_id]
        if replica is None:  # refused before it ran: hold its blocks back from now on (ρ)
            fits = self.info[u.deployment].fits
            self.backoff.observe(u.deployment, u.context_tokens, min(f.block_size for f in fits))
        else:  # the books learn no token counts: a length-locked request's output is its limit
            self.outputs.record(u, u.max_tokens)
        if replica is not None:
            self.active[replica] = [a for a in self.active[replica] if a.unit_id != unit_id]
            self.last_used[replica] = now
        chain = self.grant_of.pop(unit_id, None)
        if chain is not None:
            _, left = self.grants[chain]
            left.remove(unit_id)
            if not left:
                del self.grants[chain]
        root = self.units[unit_id].root_id
        self.left[root] -= 1
        if self.left[root] == 0:
            self.live.pop(root, None)

    # -- lifecycle -------------------------------------------------------------------------

    def warm(self, placements: Iterable[tuple[str, str]]) -> None:
        """Start loads of (deployment, device) before a run (no callbacks; run the clock after,
        then `mark_warm`).

        Raises:
            ConfigError: the pool refused a load.
        """
        for dep, device in placements:
            t = self.pool.load(self.deps[dep], device, None)
            if t.acceptance is not Acceptance.ACCEPTED:
                raise ConfigError(f"warm load of {dep!r} on {device!r} refused: {t.reason}")
            self.where[t.replica] = (dep, device)

    def mark_warm(self, now: float) -> None:
        """Every replica of the pool counts as used and settled at `now` (the run's start)."""
        for r in self.pool.replicas():
            self.last_used[r.name] = now
            self.ready_at[r.name] = now

    def apply(self, d: Decisions, plan: str) -> None:
        """Apply the lifecycle part of `d`: unloads, then loads (held for `after`), then grants.

        Raises:
            SimulationError: a leased replica reclaimed, or a refused unload or load.
        """
        self._plan = plan
        for u in d.unloads:
            self._unload(u.replica)
        for load in d.loads:
            pending = {n for n in load.after if n in self.open}
            if pending:
                self.waiting.append(_Waiting(load, pending, self.clock.now()))
            else:
                self._start_load(load)
        for g in d.grants:
            chain = g.unit_ids[0]
            self.grants[chain] = (g.replica, list(g.unit_ids))
            for uid in g.unit_ids:
                self.grant_of[uid] = chain
                self.chain_label[uid] = chain

    def check_thrash(self, plan: str) -> None:
        """Raise if the plan ran far more lifecycle actions than there is work (it thrashes)."""
        if len(self.events) + len(self.open) > 50 * len(self.units) + 100:
            raise SimulationError(
                f"plan {plan!r} ran {len(self.events)} lifecycle actions for "
                f"{len(self.units)} units; it is thrashing"
            )

    def availability(self, deployment: str) -> str:
        """Why a ready unit of `deployment` waits: "other" (a replica serves it), "load" (one is
        loading or waits for its victims), "no_load" (none serves and none is coming)."""
        lifecycles = [
            v.lifecycle
            for v in self.pool.residents()
            if self.where.get(v.name, ("", ""))[0] == deployment
        ]
        if Lifecycle.READY in lifecycles:
            return "other"
        loading = any(lc.becoming_ready for lc in lifecycles)
        if loading or any(w.load.deployment == deployment for w in self.waiting):
            return "load"
        return "no_load"

    def _unload(self, name: str) -> None:
        plan = self._plan
        leased = any(rep == name for rep, _ in self.grants.values()) or self.active.get(name)
        if leased:
            raise SimulationError(f"plan {plan!r} reclaimed {name}, which holds a lease")
        dep_name, device = self.where[name]
        dep = self.deps[dep_name]
        ticket = self.pool.unload(name, self._lifecycle_done)
        if ticket.acceptance is not Acceptance.ACCEPTED:
            raise SimulationError(f"plan {plan!r}: unload of {name} refused: {ticket.reason}")
        now = self.clock.now()
        self.ready_at[name] = now + dep.params().unload_s
        self.open[name] = LifecycleEvent("unload", name, dep.name, device, now, now)

    def _start_load(self, load: Load) -> None:
        plan = self._plan
        dep = self.deps[load.deployment]
        ticket = self.pool.load(dep, load.device, self._lifecycle_done)
        if ticket.acceptance is not Acceptance.ACCEPTED:
            raise SimulationError(
                f"plan {plan!r}: load of {load.deployment} on {load.device} refused: "
                f"{ticket.reason}"
            )
        now = self.clock.now()
        self.where[ticket.replica] = (load.deployment, load.device)
        gpu = self.pool.device_gpu(load.device).name
        self.ready_at[ticket.replica] = now + self.costs.load_s(dep.model, gpu)
        self.last_used[ticket.replica] = now
        self.open[ticket.replica] = LifecycleEvent(
            "load", ticket.replica, dep.name, load.device, now, now, load.prefetch, load.units
        )

    def _lifecycle_done(self, ticket: LifecycleTicket) -> None:
        now = self.clock.now()
        ev = self.open.pop(ticket.replica)
        self.events.append(dataclasses.replace(ev, end_s=now))
        self.ready_at[ticket.replica] = now
        if ev.action == "unload":
            for w in list(self.waiting):
                w.pending.discard(ticket.replica)
                if not w.pending:
                    self.waiting.remove(w)
                    self._start_load(w.load)
        if self.on_lifecycle_done is not None:
            self.on_lifecycle_done(ticket.replica)

    # -- snapshot --------------------------------------------------------------------------

    def snapshot(
        self, now: float, ready: tuple[Unit, ...], views: tuple[ReplicaView, ...]
    ) -> PoolSnapshot:
        """The `PoolSnapshot` at `now` (`views`: the dispatcher's replica views; the ready units
        come from these books, with their predicted releases)."""
        for root in sorted(self._dirty):
            self._refresh(root)
        self._dirty.clear()
        state = self._pool_state(now)
        live = list(self.live)
        units = {uid: self._timed(self.units[uid]) for r in live for uid in self.by_root[r]}
        status = {uid: self.status[uid] for uid in units}
        window = build_window(
            units,
            status,
            now,
            self._predicted_runtime,
            started_s={
                u: self.submitted_s[u] for u, s in status.items() if s is UnitStatus.RUNNING
            },
            ready_s={u: self.ready_s[u] for u, s in status.items() if s is UnitStatus.READY},
            done_s={u: self.completed_s[u] for u, s in status.items() if s is UnitStatus.DONE},
            stats=self.stats,
            root_arrival_s={r: self.arrival[r] for r in live},
        )
        return PoolSnapshot(
            now_s=now,
            ready=tuple(_unit(w.unit, w.release_s) for w in window.ready),
            near_ready=tuple(_unit(w.unit, w.release_s) for w in window.near_ready),
            replicas=views,
            pool=state,
            window=window,
            units=units,
            costs=self.costs,
            chains={u: self.chains[u] for u in units},
            options=self.options,
            kv_backoff_blocks=dict(self.backoff.held),
        )

    def _timed(self, u: WorkUnit) -> WorkUnit:
        """`u` with the output it is timed on (`pool.outputs`) where that is not its limit."""
        if self.status[u.unit_id] is UnitStatus.DONE:
            return u
        tokens = self.outputs.timing_tokens(u)
        return u if tokens == u.max_tokens else dataclasses.replace(u, timing_tokens=tokens)

    def _predicted_runtime(self, u: WorkUnit) -> float:
        uid = u.unit_id
        if self.status[uid] is UnitStatus.RUNNING:
            gpu = self.pool.device_gpu(self.where[self.replica_of[uid]][1]).name
            model = self.info[u.deployment].model
            return self.costs.runtime_s(model, gpu, 1, u.input_len, u.max_tokens)
        return self.best_rt[uid]

    def _pool_state(self, now: float) -> PoolState:
        replicas = []
        for v in self.pool.residents():
            dep_name, device = self.where[v.name]
            gpu = self.pool.device_gpu(device).name
            fit = self.info[dep_name].fit(gpu)
            assert fit is not None, f"{v.name} runs where its deployment does not fit"
            active = tuple(self.active.get(v.name, ()))
            held = v.held_bytes
            if active:
                peak = self.costs.peak_mem_bytes(
                    self.info[dep_name].model,
                    gpu,
                    len(active),
                    max(a.input_len for a in active),
                    max(a.max_tokens for a in active),
                )
                held = max(held, peak)
            replicas.append(
                ReplicaInfo(
                    v.name,
                    dep_name,
                    device,
                    v.lifecycle,
                    self.ready_at.get(v.name, now),
                    held,
                    fit.footprint_bytes,
                    fit.kv_capacity_tokens,
                    fit.max_num_seqs,
                    active,
                    self.last_used.get(v.name, 0.0),
                    fit.unload_s,
                    v.accepting,
                    fit.block_size,
                )
            )
        leases = tuple(
            Lease(rep, chain, tuple(left)) for chain, (rep, left) in sorted(self.grants.items())
        )
        grants = tuple((rep, tuple(left)) for _, (rep, left) in sorted(self.grants.items()))
        planned = []
        for w in self.waiting:
            info = self.info[w.load.deployment]
            gpu = self.pool.device_gpu(w.load.device).name
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
