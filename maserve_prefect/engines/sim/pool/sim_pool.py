"""`SimPool`: heterogeneous simulated devices, replicas placed by the caller, lifecycle on the clock.

One idea: every lifecycle action (load, sleep level 1 / 2, wake, unload) is a `catalog.lifecycle`
plan executed phase by phase as kernel events, holding the phase's memory from its start (the
larger of its start and end figures) to its end; the pool admits an action only if every device
it touches has room for the action's peak next to what the other replicas hold now. Rejections
name the numbers. Memory per replica = plan bytes + process bytes (see `engines/sim/pool/device.py`).

Replicas on one device share it, as processes on one GPU do: its memory (the admission rule
above, so a second replica loads only where it fits beside the first — at vLLM's default
`gpu_memory_utilization` of 0.9 it never does) and its compute (`engines/sim/step/device_share.py`:
while `k` replicas there have a step in flight each advances at `1/k` of full speed; a replica
alone on its device runs exactly as an unshared one).

Rules callers rely on:
- `load` creates the replica at once in LOADING; it becomes READY at `plan.total_s`. Submits to a
  replica that is not READY are REJECTED ("replica X is loading; retry after its load ticket
  completes"), never queued.
- `sleep` and `unload` need an idle replica: otherwise REJECTED ("drain first"). To drain, call
  `replica.set_accepting(False)` and sleep from `replica.on_idle(...)`. Sleep drops the KV cache
  and clears the prefix cache; level 1 keeps the weights in host RAM (fast wake), level 2 drops
  them (wake reloads from the weight source).
- Placement is the caller's (the dispatcher's plan, `dispatch`).

Exports: `lifecycle_log` (one `LifecycleRecord` per executed action); the views (`memory`,
`replicas`, ...) and the other exports (`device_time()`, `memory_timeline(device)`, `timelines()`,
`step_rows()`) read the pool's tables and live in the base class, `PoolViews` (`pool/views.py`).
An optional event `log` receives the replicas' request events and the pool's lifecycle events
`(t, event, replica, level)`: `load`/`ready`, `sleep`/`asleep`, `wake`/`awake`,
`unload`/`unloaded`.

Examples:
    >>> from maserve_prefect.clock.kernel import Kernel
    >>> from maserve_prefect.protocol.requests import Request
    >>> k = Kernel()
    >>> pool = SimPool(k, ["H100:0"])
    >>> ticket = pool.load(Deployment("qwen", "Qwen3-0.6B"), "H100:0")
    >>> k.run()
    >>> ticket.done_s == pool.lifecycle_log[0].end_s, pool.replica(ticket.replica).lifecycle.label
    (True, 'ready')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.catalog import lifecycle as lc
from maserve_prefect.engines.catalog.lifecycle import LifecyclePlan
from maserve_prefect.engines.sim.cost.step_cost import StepCostModel
from maserve_prefect.engines.sim.cost.step_time import make_step_model
from maserve_prefect.engines.sim.kv.host_tier import HostTierConfig
from maserve_prefect.engines.sim.kv.probe import ProbeMemo
from maserve_prefect.engines.sim.loop import LogEntry
from maserve_prefect.engines.sim.pool.device import (
    Deployment,
    DeviceSlot,
    LifecycleRecord,
)
from maserve_prefect.engines.sim.pool.lifecycle_exec import DONE_EVENT, PoolReplica, execute_plan
from maserve_prefect.engines.sim.pool.views import PoolViews
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.engines.sim.step.device_share import DeviceShare
from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.engine import LifecycleAction, LifecycleTicket
from maserve_prefect.protocol.outcomes import Acceptance
from maserve_prefect.protocol.state import Lifecycle

CostFactory = Callable[[Deployment, DeviceSlot], StepCostModel]
LifecycleCallback = Callable[[LifecycleTicket], None]

__all__ = ["CostFactory", "Deployment", "DeviceSlot", "PoolReplica", "SimPool"]


def roofline_costs(deployment: Deployment, slot: DeviceSlot) -> StepCostModel:
    """Default cost factory: the catalog roofline model of the deployment on the slot's GPU."""
    return make_step_model(deployment.model, slot.gpu.name, deployment.tp)


class SimPool(PoolViews):
    """Simulated devices and the replicas on them (the `Pool` protocol).

    Args:
        clock: the kernel every replica and lifecycle event runs on.
        devices: device names (`"H100:0"`) or `DeviceSlot`s; names must be unique.
        cost_model: builds a step-cost model per (deployment, device); the roofline by default.
            Models are cached per (deployment, GPU), so replicas share them.
        log: optional event log shared by the pool and its replicas.
        check_invariants: replicas run the full invariant check after every step (tests).
        host_kv_bytes: host-memory KV tier per replica (`engines/sim/kv/host_tier.py`): one size
            for every deployment, or sizes by deployment name (absent or 0: no host tier).
    """

    def __init__(
        self,
        clock: Kernel,
        devices: Sequence[str | DeviceSlot],
        *,
        cost_model: CostFactory = roofline_costs,
        log: list[LogEntry] | None = None,
        check_invariants: bool = False,
        host_kv_bytes: int | Mapping[str, int] = 0,
    ) -> None:
        self.clock = clock
        self.host_kv_bytes = host_kv_bytes
        self._slots: dict[str, DeviceSlot] = {}
        for d in devices:
            slot = d if isinstance(d, DeviceSlot) else DeviceSlot.parse(d)
            if slot.name in self._slots:
                raise ConfigError(f"device {slot.name!r} is listed twice; give each a new index")
            self._slots[slot.name] = slot
        if not self._slots:
            raise ConfigError("a pool needs at least one device")
        self._cost_factory = cost_model
        self._costs: dict[tuple[Deployment, str], StepCostModel] = {}
        self._deployments: dict[str, Deployment] = {}
        self._replicas: dict[str, PoolReplica] = {}
        self._probe_memo = ProbeMemo()  # a router's prefix probes hash each prompt once
        self._mem: dict[str, list[tuple[float, int]]] = {n: [(clock.now(), 0)] for n in self._slots}
        self.log = log
        self.check_invariants = check_invariants
        self.lifecycle_log: list[LifecycleRecord] = []
        self.compute = DeviceShare(clock)  # replicas on one device share its compute

    # -- lifecycle -------------------------------------------------------------------------

    def register(self, deployment: Deployment) -> None:
        """Make `deployment` loadable by name.

        Raises:
            ConfigError: the name already stands for a different configuration.
        """
        known = self._deployments.get(deployment.name)
        if known is not None and known != deployment:
            raise ConfigError(
                f"deployment name {deployment.name!r} already stands for another configuration "
                "(identity = model + version + serving config); give this one a new name"
            )
        self._deployments[deployment.name] = deployment

    def load(
        self,
        deployment: Deployment | str,
        device: str | Sequence[str],
        *,
        on_done: LifecycleCallback | None = None,
    ) -> LifecycleTicket:
        """Cold-load a replica of `deployment` on `device` (a list of `tp` devices for tp > 1).

        Examples:
            >>> from maserve_prefect.clock.kernel import Kernel
            >>> pool = SimPool(Kernel(), ["A100-40GB:0"])
            >>> t = pool.load(Deployment("big", "Qwen3-32B"), "A100-40GB:0")
            >>> t.acceptance.value, "GB" in t.reason
            ('rejected', True)
        """
        if isinstance(deployment, str):
            dep = self._deployments.get(deployment)
            if dep is None:
                return self._reject(
                    LifecycleAction.LOAD,
                    "",
                    f"unknown deployment {deployment!r}; load a "
                    "Deployment object (or register it) first",
                    on_done,
                )
        else:
            self.register(deployment)
            dep = deployment
        names = [device] if isinstance(device, str) else list(device)
        slots = [self.slot(n) for n in names]
        if len(slots) != dep.tp or len(set(names)) != len(names):
            return self._reject(
                LifecycleAction.LOAD,
                "",
                f"{dep.name} has tp={dep.tp}: pass {dep.tp} distinct device(s), got {names}",
                on_done,
            )
        name = self._new_name(dep, names)
        gpu = slots[0].gpu
        try:
            kv = min(dep.kv_bytes(s.gpu) for s in slots)
            blocks = min(dep.num_gpu_blocks(s.gpu) for s in slots)
            host = self._host_tier(dep, slots[0])
        except ConfigError as exc:
            where = "+".join(names)
            return self._reject(LifecycleAction.LOAD, name, f"{where}: {exc}", on_done)
        plan = lc.load_plan(dep.spec, gpu, kv, dep.weight_source, dep.tp, dep.params())
        process = max(dep.process_bytes(s.gpu) for s in slots)
        reason = self._no_room(slots, plan.peak_gpu_bytes + process, None, f"loading {name}")
        if reason:
            return self._reject(LifecycleAction.LOAD, name, reason, on_done)
        engine = SimReplica(
            self.clock,
            self._cost(dep, slots[0]),
            blocks,
            dep.scheduler_config(gpu),
            name=name,
            deployment=dep.name,
            log=self.log,
            check_invariants=self.check_invariants,
            host_tier=host,
            probe_memo=self._probe_memo,
        )
        engine.share_devices(self.compute, tuple(names))
        entry = PoolReplica(name, dep, tuple(slots), engine, kv, process)
        self._replicas[name] = entry
        self._close(entry, Lifecycle.LOADING)
        return self._run(entry, LifecycleAction.LOAD, plan, 0, on_done)

    def sleep(
        self, replica: str, level: int = 1, *, on_done: LifecycleCallback | None = None
    ) -> LifecycleTicket:
        """Put an idle READY replica to sleep (level 1: weights to host RAM; 2: discard them)."""
        p = self._entry(replica)
        why = self._needs(p, Lifecycle.READY, "sleep") or self._needs_idle(p, "sleep")
        if level not in (1, 2):
            why = f"sleep level {level} is not supported; vLLM offers levels 1 and 2"
        if why:
            return self._reject(LifecycleAction.SLEEP, replica, why, on_done)
        plan = lc.sleep_plan(
            p.deployment.spec,
            p.devices[0].gpu,
            p.kv_bytes,
            level,
            p.deployment.tp,
            p.deployment.params(),
        )
        self._close(p, Lifecycle.ASLEEP)
        p.engine.reset_prefix_cache()
        p.sleep_level = level
        return self._run(p, LifecycleAction.SLEEP, plan, level, on_done)

    def wake(self, replica: str, *, on_done: LifecycleCallback | None = None) -> LifecycleTicket:
        """Wake an ASLEEP replica (weights back from host RAM, or reloaded after level 2)."""
        p = self._entry(replica)
        why = self._needs(p, Lifecycle.ASLEEP, "wake")
        dep = p.deployment
        plan = lc.wake_plan(
            dep.spec,
            p.devices[0].gpu,
            p.kv_bytes,
            max(p.sleep_level, 1),
            dep.weight_source,
            dep.tp,
            dep.params(),
        )
        need = plan.peak_gpu_bytes + p.process_bytes
        why = why or self._no_room(p.devices, need, p, f"waking {p.name}")
        if why:
            return self._reject(LifecycleAction.WAKE, replica, why, on_done)
        return self._run(p, LifecycleAction.WAKE, plan, p.sleep_level, on_done)

    def unload(self, replica: str, *, on_done: LifecycleCallback | None = None) -> LifecycleTicket:
        """Stop an idle READY or ASLEEP replica's process, freeing all its memory."""
        p = self._entry(replica)
        why = (
            ""
            if p.status in (Lifecycle.READY, Lifecycle.ASLEEP)
            else (f"replica {p.name} is {p.status.label}; unload a ready or asleep replica")
        )
        why = why or self._needs_idle(p, "unload")
        if why:
            return self._reject(LifecycleAction.UNLOAD, replica, why, on_done)
        dep = p.deployment
        plan = lc.unload_plan(dep.spec, p.kv_bytes, dep.tp, dep.params())
        if p.status is Lifecycle.ASLEEP:  # only the process is left to stop
            ph = plan.phases[0]
            shutdown = lc.Phase(ph.name, ph.duration_s, p.plan_bytes, 0, 0)
            plan = lc.LifecyclePlan(plan.start, plan.end, (shutdown,))
        self._close(p, Lifecycle.UNLOADING)
        return self._run(p, LifecycleAction.UNLOAD, plan, 0, on_done)

    # -- internals -------------------------------------------------------------------------
    def _cost(self, dep: Deployment, slot: DeviceSlot) -> StepCostModel:
        key = (dep, slot.gpu.name)
        if key not in self._costs:
            self._costs[key] = self._cost_factory(dep, slot)
        return self._costs[key]

    def _host_tier(self, dep: Deployment, slot: DeviceSlot) -> HostTierConfig | None:
        size = self.host_kv_bytes
        nbytes = size if isinstance(size, int) else size.get(dep.name, 0)
        if not nbytes:
            return None
        block_size = dep.scheduler_config(slot.gpu).block_size
        return HostTierConfig.of(nbytes, dep.spec, slot.gpu, block_size, dep.tp)

    def _new_name(self, dep: Deployment, devices: list[str]) -> str:
        base = f"{dep.name}@{'+'.join(devices)}"
        name, n = base, 1
        while name in self._replicas:
            n += 1
            name = f"{base}#{n}"
        return name

    def _needs(self, p: PoolReplica, status: Lifecycle, action: str) -> str:
        if p.status is status:
            return ""
        return f"replica {p.name} is {p.status.label}; {action} needs it {status.label}"

    def _needs_idle(self, p: PoolReplica, action: str) -> str:
        if p.engine.is_idle:
            return ""
        return (
            f"replica {p.name} has {p.engine.num_outstanding} requests in flight; drain first "
            f"(set_accepting(False), then {action} from on_idle)"
        )

    def _no_room(
        self, slots: Sequence[DeviceSlot], need: int, me: PoolReplica | None, what: str
    ) -> str:
        """'' if every slot has room for `need` bytes next to what the other replicas hold or
        have committed to (an action in flight counts at its plan's peak)."""
        for slot in slots:
            others = [p for p in self._replicas.values() if slot in p.devices and p is not me]
            held = sum(p.reserved_bytes for p in others)
            total = slot.gpu.memory_bytes
            if held + need > total:
                names = [p.name for p in others if p.reserved_bytes > 0]
                return (
                    f"{slot.name} has {total / 1e9:.2f} GB; {held / 1e9:.2f} GB held or committed "
                    f"by {names or 'none'}, {(total - held) / 1e9:.2f} GB free; {what} needs "
                    f"{need / 1e9:.2f} GB at its peak. Sleep or unload a replica there, or give "
                    "each replica on a shared device a smaller gpu_memory_utilization or an "
                    "explicit kv_cache_bytes (vLLM's 0.9 leaves room for one replica per GPU)"
                )
        return ""

    def _reject(
        self, action: LifecycleAction, replica: str, reason: str, cb: LifecycleCallback | None
    ) -> LifecycleTicket:
        ticket = LifecycleTicket(action, replica, Acceptance.REJECTED, reason)
        if cb is not None:
            cb(ticket)
        return ticket

    def _close(self, p: PoolReplica, lifecycle: Lifecycle) -> None:
        """Stop taking work: explicit rejection reason, READY span closed."""
        reason = f"replica {p.name} is {lifecycle.label}"
        if lifecycle is Lifecycle.LOADING:
            reason += "; retry after its load ticket completes"
        elif lifecycle is Lifecycle.ASLEEP:
            reason += "; wake it first"
        p.engine.set_accepting(False, reason)
        p.engine.pool_lifecycle = lifecycle
        if p.resident and p.resident[-1][1] < 0:
            p.resident[-1][1] = self.clock.now()

    def _set_bytes(self, p: PoolReplica, plan_bytes: int) -> None:
        p.plan_bytes = plan_bytes
        now = self.clock.now()
        for slot in p.devices:
            used = self.memory(slot.name).used_bytes
            assert 0 <= used, "device memory went negative"
            series = self._mem[slot.name]
            if series[-1][0] == now:
                series[-1] = (now, used)
            else:
                series.append((now, used))

    def _event(self, t: float, event: str, p: PoolReplica, level: int) -> None:
        if self.log is not None:
            self.log.append((t, event, p.name, level))

    def _run(
        self,
        p: PoolReplica,
        action: LifecycleAction,
        plan: LifecyclePlan,
        level: int,
        cb: LifecycleCallback | None,
    ) -> LifecycleTicket:
        """Execute `plan` (`lifecycle_exec`); the ticket's `done_s` is set at the end."""
        ticket = LifecycleTicket(action, p.name, Acceptance.ACCEPTED)
        self._event(self.clock.now(), action.value, p, level)

        def finished(record: LifecycleRecord) -> None:
            if p.status is Lifecycle.READY:
                p.engine.set_accepting(True)
                p.engine.pool_lifecycle = None
            else:  # asleep or unloaded: the replica reports where it ended
                p.engine.pool_lifecycle = p.status
            self.lifecycle_log.append(record)
            self._event(record.end_s, DONE_EVENT[action], p, level)
            ticket.done_s = record.end_s
            if cb is not None:
                cb(ticket)

        execute_plan(self.clock, p, action, plan, level, self._set_bytes, finished)
        return ticket
