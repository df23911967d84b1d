"""The pool seam: what the `PoolController` needs from a pool, and the simulator's adapter.

One idea: the controller never touches a pool directly; it reaches one through `PoolHandle`
(devices and their GPUs, replicas, the residents that hold device memory, load and unload with a
completion callback). `SimPoolHandle` adapts `SimPool`, and `pool.wall.VLLMPoolHandle`
adapts a real process pool (`engines.vllm.VLLMProcessPool`), posting its lifecycle callbacks onto
the dispatcher's loop (its loads finish on a waiter thread).

Examples:
    >>> from maserve_prefect.clock.kernel import Kernel
    >>> from maserve_prefect.engines.sim.pool.sim_pool import SimPool
    >>> handle = SimPoolHandle(SimPool(Kernel(), ["A100-40GB:0"]))
    >>> list(handle.devices()), handle.device_gpu("A100-40GB:0").name, handle.residents()
    (['A100-40GB:0'], 'A100-40GB', [])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from maserve_prefect.engines.catalog import GpuSpec
from maserve_prefect.engines.sim.pool.device import Deployment
from maserve_prefect.engines.sim.pool.sim_pool import SimPool
from maserve_prefect.protocol.engine import LifecycleTicket, Replica
from maserve_prefect.protocol.state import Lifecycle

LifecycleCallback = Callable[[LifecycleTicket], None]


@dataclass(frozen=True, slots=True)
class ResidentView:
    """A replica that holds (or is acquiring / releasing) device memory, as the pool reports it."""

    name: str
    lifecycle: Lifecycle
    held_bytes: int
    accepting: bool


class PoolHandle(Protocol):
    """What the controller needs from a pool (`SimPoolHandle` adapts the simulator's)."""

    def devices(self) -> Sequence[str]: ...

    def device_gpu(self, device: str) -> GpuSpec: ...

    def replicas(self) -> Sequence[Replica]: ...

    def residents(self) -> Sequence[ResidentView]: ...

    def load(
        self, deployment: Deployment, device: str, on_done: LifecycleCallback | None
    ) -> LifecycleTicket: ...

    def unload(self, replica: str, on_done: LifecycleCallback | None) -> LifecycleTicket: ...


class SimPoolHandle:
    """`PoolHandle` over a `SimPool` (lifecycle callbacks run on its kernel)."""

    def __init__(self, pool: SimPool) -> None:
        self.pool = pool

    def devices(self) -> Sequence[str]:
        return self.pool.devices()

    def device_gpu(self, device: str) -> GpuSpec:
        return self.pool.slot(device).gpu

    def replicas(self) -> Sequence[Replica]:
        return self.pool.replicas()

    def residents(self) -> Sequence[ResidentView]:
        out = []
        for p in self.pool.pool_replicas():  # creation order
            if not p.status.is_dead:
                out.append(ResidentView(p.name, p.status, p.reserved_bytes, p.engine.accepting))
        return out

    def load(
        self, deployment: Deployment, device: str, on_done: LifecycleCallback | None
    ) -> LifecycleTicket:
        return self.pool.load(deployment, device, on_done=on_done)

    def unload(self, replica: str, on_done: LifecycleCallback | None) -> LifecycleTicket:
        return self.pool.unload(replica, on_done=on_done)
