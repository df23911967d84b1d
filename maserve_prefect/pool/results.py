"""What one pool-executor run measured: per op, and per run.

One idea: the results are plain frozen records filled once, when the run ends
(`pool.executor`); a report reads them and never the run's live state.

Measured per op: ready / submitted / first token / completion, and the model-availability delay
of every ready op split by what the pool looked like while it waited — `wait_load_s` (no replica
of its deployment serving, a load of it in progress), `wait_no_load_s` (none serving and none
loading: the load could not start), `wait_other_s` (a replica was serving; queue or plan choice)
— plus `reacquire_s` (ready → submitted for ops that follow a same-deployment predecessor). Per
run: makespan, per-root latency, p95, lifecycle actions, and GPU-seconds per completed session
split generation / idle-resident / loading / other (`SimPool.device_time`), overall and per
scenario (`pool.gpu_attribution`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from maserve_prefect.engines.sim.pool.device_time import DeviceTimeRow
from maserve_prefect.pool.control import LifecycleEvent

__all__ = ["OpResult", "PoolRunResult"]


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
    gpu_s_by_scenario: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Per workflow (scenario), GPU-seconds per completed session by part, shared lifecycle time
    attributed by generation share (`pool.gpu_attribution`); empty without a simulated pool."""

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
