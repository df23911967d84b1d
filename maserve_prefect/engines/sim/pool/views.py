"""The read side of `SimPool`: its devices, the replicas on them and the memory they hold.

One idea: everything here reads the pool's tables — device slots, registered deployments, every
replica ever created (`PoolReplica`, unloaded ones included) and each device's memory series —
and changes nothing. The lifecycle actions of `SimPool` (`sim_pool.py`, this class's subclass) are
what change those tables; `SimPool.__init__` builds them.

Exports: `device_time()` (device time split, `device_time.py`), `memory_timeline(device)`, each
replica's `Timeline` (`timelines()`) and `step_rows()` (per-step, per-request rows joinable to ops
through request ids).

Examples:
    >>> from maserve_prefect.clock.kernel import Kernel
    >>> from maserve_prefect.engines.sim.pool.sim_pool import Deployment, SimPool
    >>> k = Kernel()
    >>> pool = SimPool(k, ["H100:0"])
    >>> ticket = pool.load(Deployment("qwen", "Qwen3-0.6B"), "H100:0")
    >>> k.run()
    >>> name = ticket.replica
    >>> pool.replica(name).lifecycle.label, pool.memory("H100:0").residents == (name,)
    ('ready', True)
"""

from __future__ import annotations

from collections.abc import Sequence

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.sim.pool.device import Deployment, DeviceSlot
from maserve_prefect.engines.sim.pool.device_time import DeviceTimeRow
from maserve_prefect.engines.sim.pool.export import (
    ReplicaTimeRow,
    device_time_rows,
    replica_time_rows,
    step_rows,
)
from maserve_prefect.engines.sim.pool.lifecycle_exec import PoolReplica
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.engines.sim.step.records import Timeline
from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.state import DeviceMemory, Lifecycle


class PoolViews:
    """Reads of a pool's devices, replicas and memory (see the module docstring).

    The base of `SimPool`, whose constructor sets the attributes declared here.
    """

    clock: Kernel
    _slots: dict[str, DeviceSlot]
    _deployments: dict[str, Deployment]
    _replicas: dict[str, PoolReplica]
    _mem: dict[str, list[tuple[float, int]]]

    def devices(self) -> Sequence[str]:
        return list(self._slots)

    def slot(self, device: str) -> DeviceSlot:
        try:
            return self._slots[device]
        except KeyError:
            raise ConfigError(
                f"no device {device!r} in this pool; have {list(self._slots)}"
            ) from None

    def replicas(self) -> Sequence[SimReplica]:
        """Engines of replicas that are not unloaded, by name."""
        live = sorted(n for n, p in self._replicas.items() if p.status is not Lifecycle.UNLOADED)
        return [self._replicas[n].engine for n in live]

    def pool_replicas(self) -> Sequence[PoolReplica]:
        """Every replica ever created (unloaded ones included), in creation order."""
        return list(self._replicas.values())

    def ready_replicas(self, deployment: str) -> list[SimReplica]:
        """Engines of the READY replicas of `deployment`, by name (what a replay drives).

        Raises:
            ConfigError: none is READY (the message says how to get one).
        """
        reps = sorted(
            (
                p.engine
                for p in self._replicas.values()
                if p.deployment.name == deployment and p.status is Lifecycle.READY
            ),
            key=lambda r: r.name,
        )
        if not reps:
            raise ConfigError(
                f"the pool has no READY replica of {deployment!r}; load one and run the clock "
                "until its load ticket completes"
            )
        return reps

    def replica(self, name: str) -> SimReplica:
        return self._entry(name).engine

    def status(self, name: str) -> Lifecycle:
        return self._entry(name).status

    def deployment(self, name: str) -> Deployment:
        try:
            return self._deployments[name]
        except KeyError:
            raise ConfigError(
                f"no deployment {name!r}; known: {sorted(self._deployments)}"
            ) from None

    def memory(self, device: str) -> DeviceMemory:
        slot = self.slot(device)
        on = [p for p in self._replicas.values() if slot in p.devices and p.held_bytes > 0]
        used = sum(p.held_bytes for p in on)
        return DeviceMemory(device, slot.gpu.memory_bytes, used, tuple(p.name for p in on))

    def memory_timeline(self, device: str) -> list[tuple[float, int]]:
        """`(t_s, used_bytes)` at every change (the value holds until the next row)."""
        self.slot(device)
        return list(self._mem[device])

    def timelines(self) -> dict[str, Timeline]:
        """Each replica's engine series (vLLM Prometheus names), by replica name."""
        return {n: p.engine.timeline for n, p in self._replicas.items()}

    # -- exports ---------------------------------------------------------------------------

    def device_time(self, start_s: float = 0.0, end_s: float | None = None) -> list[DeviceTimeRow]:
        """Per-device time split over `[start_s, end_s]` (default: up to now), device order."""
        end = self.clock.now() if end_s is None else end_s
        return device_time_rows(self._slots, self._replicas.values(), start_s, end)

    def replica_time(
        self, start_s: float = 0.0, end_s: float | None = None
    ) -> list[ReplicaTimeRow]:
        """Per-replica time split and step seconds per request over `[start_s, end_s]`."""
        end = self.clock.now() if end_s is None else end_s
        return replica_time_rows(self._replicas.values(), start_s, end)

    def step_rows(self) -> list[dict[str, object]]:
        """One row per (step record, scheduled request): join to ops through `request_id`."""
        return step_rows(self._replicas.values())

    def _entry(self, name: str) -> PoolReplica:
        try:
            return self._replicas[name]
        except KeyError:
            raise ConfigError(f"no replica {name!r}; have {sorted(self._replicas)}") from None
