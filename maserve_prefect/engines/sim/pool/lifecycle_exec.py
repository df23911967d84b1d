"""Executing a lifecycle plan on the clock for one pool replica: phases, memory, status, record.

One idea: a `catalog.lifecycle` plan is a list of phases; each phase holds the larger of its start
and end memory from its start to its end (allocation is charged up front, release at the end), so
the device-memory timeline is a step function that changes only at phase boundaries. At the last
phase's end the replica takes the action's final status and one `LifecycleRecord` is written.
`SimPool` decides *whether* an action may run; this module only runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from maserve_prefect.clock import NORMAL
from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.catalog.lifecycle import LifecyclePlan
from maserve_prefect.engines.sim.pool.device import (
    Deployment,
    DeviceSlot,
    LifecycleRecord,
    PhaseSpan,
)
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.protocol.engine import LifecycleAction
from maserve_prefect.protocol.state import Lifecycle

FINAL_STATUS = {
    LifecycleAction.LOAD: Lifecycle.READY,
    LifecycleAction.SLEEP: Lifecycle.ASLEEP,
    LifecycleAction.WAKE: Lifecycle.READY,
    LifecycleAction.UNLOAD: Lifecycle.UNLOADED,
}
START_STATUS = {
    LifecycleAction.LOAD: Lifecycle.LOADING,
    LifecycleAction.SLEEP: Lifecycle.FALLING_ASLEEP,
    LifecycleAction.WAKE: Lifecycle.WAKING,
    LifecycleAction.UNLOAD: Lifecycle.UNLOADING,
}
DONE_EVENT = {
    LifecycleAction.LOAD: "ready",
    LifecycleAction.SLEEP: "asleep",
    LifecycleAction.WAKE: "awake",
    LifecycleAction.UNLOAD: "unloaded",
}


@dataclass(slots=True)
class PoolReplica:
    """A replica as the pool tracks it: engine, placement, status and held memory (per rank).

    `resident` and `transitions` hold `[start_s, end_s]` spans (end -1 while open): READY
    spans and lifecycle actions, the inputs of the device time split.
    """

    name: str
    deployment: Deployment
    devices: tuple[DeviceSlot, ...]
    engine: SimReplica
    kv_bytes: int
    process_bytes: int
    status: Lifecycle = Lifecycle.LOADING
    sleep_level: int = 0
    plan_bytes: int = 0
    committed_bytes: int = 0
    resident: list[list[float]] = field(default_factory=list)
    transitions: list[list[float]] = field(default_factory=list)

    @property
    def held_bytes(self) -> int:
        """Per-rank device memory held now."""
        return 0 if self.status is Lifecycle.UNLOADED else self.plan_bytes + self.process_bytes

    @property
    def reserved_bytes(self) -> int:
        """Held now, or the peak an action in flight will reach (what admission counts)."""
        return max(self.held_bytes, self.committed_bytes)


def execute_plan(
    clock: Kernel,
    p: PoolReplica,
    action: LifecycleAction,
    plan: LifecyclePlan,
    level: int,
    set_bytes: Callable[[PoolReplica, int], None],
    on_finish: Callable[[LifecycleRecord], None],
) -> None:
    """Run `plan` for `p` from now: phases as kernel events, `on_finish(record)` at the end.

    `set_bytes(p, plan_bytes)` is called at every phase boundary (the pool records the device
    memory there). At the end `p.status` is the action's final status; a READY replica gets a
    new resident span.
    """
    start_s = clock.now()
    before = 0 if action is LifecycleAction.LOAD else p.held_bytes
    p.status = START_STATUS[action]
    p.committed_bytes = max(before, plan.peak_gpu_bytes + p.process_bytes)
    span = [start_s, -1.0]
    p.transitions.append(span)
    spans: list[PhaseSpan] = []

    def begin(i: int) -> None:
        if i == len(plan.phases):
            finish()
            return
        ph = plan.phases[i]
        now = clock.now()
        set_bytes(p, max(ph.gpu_bytes_start, ph.gpu_bytes_end))
        spans.append(PhaseSpan(ph.name, now, now + ph.duration_s))

        def end() -> None:
            set_bytes(p, ph.gpu_bytes_end)
            begin(i + 1)

        clock.call_at(now + ph.duration_s, end, NORMAL, f"{p.name} {ph.name}")

    def finish() -> None:
        now = clock.now()
        span[1] = now
        p.status = FINAL_STATUS[action]
        p.committed_bytes = 0
        if p.status is Lifecycle.READY:
            p.sleep_level = 0
            p.resident.append([now, -1.0])
        elif p.status is Lifecycle.UNLOADED:
            set_bytes(p, 0)
        devices = tuple(s.name for s in p.devices)
        record = LifecycleRecord(
            action, p.name, devices, level, start_s, now, tuple(spans), before, p.held_bytes
        )
        on_finish(record)

    begin(0)
