"""Tables a `SimPool` exports: per-device time split and per-step rows joinable to ops.

One idea: both are computed after the fact from what the run already recorded (replica step
records, lifecycle spans), never sampled while it runs, so they are exact and cost nothing on
the hot path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from maserve_prefect.engines.sim.pool.device import DeviceSlot
from maserve_prefect.engines.sim.pool.device_time import DeviceTimeRow, Interval, split_device_time
from maserve_prefect.engines.sim.pool.lifecycle_exec import PoolReplica


def device_time_rows(
    slots: Mapping[str, DeviceSlot],
    replicas: Iterable[PoolReplica],
    start_s: float,
    end_s: float,
) -> list[DeviceTimeRow]:
    """Device time split over `[start_s, end_s]` for every slot (in `slots` order); spans still
    open count as running until `end_s`."""
    reps = list(replicas)
    rows = []
    for name, slot in slots.items():
        gen: list[Interval] = []
        load: list[Interval] = []
        res: list[Interval] = []
        for p in reps:
            if slot not in p.devices:
                continue
            gen.extend((r.start_s, r.end_s) for r in p.engine.records)
            load.extend((a, end_s if b < 0 else b) for a, b in p.transitions)
            res.extend((a, end_s if b < 0 else b) for a, b in p.resident)
        rows.append(split_device_time(name, (start_s, end_s), gen, load, res))
    return rows


def step_rows(replicas: Iterable[PoolReplica]) -> list[dict[str, object]]:
    """One row per (step record, scheduled request); `request_id` joins it to the op."""
    rows: list[dict[str, object]] = []
    for p in replicas:
        devices = ",".join(s.name for s in p.devices)
        for r in p.engine.records:
            head = {
                "replica": p.name,
                "devices": devices,
                "step_index": r.step_index,
                "start_s": r.start_s,
                "end_s": r.end_s,
                "num_steps": r.num_steps,
                "kind": r.kind.value,
            }
            for s in r.scheduled:
                rows.append(
                    head
                    | {
                        "request_id": s.request_id,
                        "num_computed_before": s.num_computed_before,
                        "num_new_tokens": s.num_new_tokens,
                    }
                )
    return rows
