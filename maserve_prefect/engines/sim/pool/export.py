"""Tables a `SimPool` exports: per-device and per-replica time splits and per-step rows
joinable to ops.

One idea: all are computed after the fact from what the run already recorded (replica step
records, lifecycle spans), never sampled while it runs, so they are exact and cost nothing on
the hot path. A replica's split uses its own intervals only (the device split takes the union
over its replicas), and its generation seconds are shared among the requests of each step by
the tokens each computed in it (a fast-forwarded decode run: one token each per step, so an
equal share).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class ReplicaTimeRow:
    """One replica's time over a window: generation, loading (not generating), idle-resident
    (neither), and its generation seconds per request (sums to `generation_s` when steps do not
    overlap, as on one replica)."""

    replica: str
    deployment: str
    devices: tuple[str, ...]
    generation_s: float
    loading_s: float
    idle_resident_s: float
    request_s: Mapping[str, float]


def replica_time_rows(
    replicas: Iterable[PoolReplica], start_s: float, end_s: float
) -> list[ReplicaTimeRow]:
    """Per replica (every replica the pool ever had, in the given order), its time split over
    `[start_s, end_s]` and its step seconds per request (module docstring); spans still open
    count as running until `end_s`."""
    rows = []
    for p in replicas:
        gen = [(r.start_s, r.end_s) for r in p.engine.records]
        load = [(a, end_s if b < 0 else b) for a, b in p.transitions]
        res = [(a, end_s if b < 0 else b) for a, b in p.resident]
        split = split_device_time(p.name, (start_s, end_s), gen, load, res)
        per: dict[str, float] = {}
        for r in p.engine.records:
            lo, hi = max(r.start_s, start_s), min(r.end_s, end_s)
            tokens = sum(s.num_new_tokens for s in r.scheduled)
            if hi <= lo or tokens <= 0:
                continue
            for s in r.scheduled:
                per[s.request_id] = (
                    per.get(s.request_id, 0.0) + (hi - lo) * s.num_new_tokens / tokens
                )
        rows.append(
            ReplicaTimeRow(
                p.name, p.deployment.name, tuple(d.name for d in p.devices), split.generation_s,
                split.loading_s, split.idle_resident_s, per,
            )
        )  # fmt: skip
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
