"""What the pool executor is given: the roots to run and the executor's options.

One idea: a pool run is fully described by its `RootDag`s (each root's DAG of `WorkUnit`s and
its arrival offset), the devices, the plan and `ExecOptions` — the ablation switches, the KV
size of default deployments, the plan's knobs, a warm start, what plans know of a DAG (`reveal`)
and the engine requests of units — so the same inputs give the same results. What each option
does to a run is in `pool.executor`'s module docstring.

Replicas of default deployments are sized as vLLM sizes them: at `gpu_memory_utilization` (0.9,
vLLM's default) a replica takes that share of its GPU and its KV cache is what is left after
weights, activations and overhead (`catalog.memory`), so one replica fills a GPU and a model
that does not fit there at that share cannot run there. Co-location (several replicas per GPU,
sharing its memory and compute) is the explicit `kv_cache_bytes` option: each replica then
pre-allocates that much KV instead and holds only weights + KV + process memory.

Examples:
    >>> ExecOptions().reveal in REVEAL_MODES, ExecOptions().kv_cache_bytes is None
    (True, True)
    >>> ExecOptions.colocated().kv_cache_bytes == 2 * GIB
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from maserve_prefect.engines.sim.pool.device import Deployment
from maserve_prefect.pool.window import WorkUnit
from maserve_prefect.protocol.requests import Request

__all__ = ["GIB", "REVEAL_MODES", "ExecOptions", "RootDag"]

GIB = 1 << 30
REVEAL_MODES = ("arrival", "released")


@dataclass(frozen=True, slots=True)
class RootDag:
    """One root: its DAG of model calls and its arrival offset (seconds after the run starts);
    `name` is the workflow it is a root of."""

    root_id: str
    arrival_s: float
    units: tuple[WorkUnit, ...]
    name: str = ""


@dataclass(frozen=True, slots=True)
class ExecOptions:
    """Executor options.

    Attributes:
        fusion / prefetch: passed to the plan (`PlanOptions`); ablations switch them off.
        coalesce: False = per-workflow lifecycle (each root's demand weighed on its own; loaded
            replicas still shared, as the paper's ablation).
        provision: passed to the plan (`PlanOptions`): copies by predicted work per
            deployment into free memory (`pool.provision`; off by default, see `PlanOptions`).
        gpu_memory_utilization: vLLM's flag for the default deployments (module docstring).
        kv_cache_bytes: None = each default deployment's KV from `gpu_memory_utilization`;
            a size = co-location: that much pre-allocated KV per replica instead (also what the
            default cost model charges).
        aging_s / prefetch_slack_s / tie_s: passed to the plan (`PlanOptions`).
        warm: (deployment, device) pairs loaded before the run starts (time 0 = warm pool).
        reveal: what plans know of a root's DAG — "arrival" (all of it when the root arrives)
            or "released" (as MAServeTaskRunner reports it natively; `pool.executor`).
        requests: the engine request of a unit by id (e.g. token-locked from a trace, so prefix
            caching sees what the native run saw); default: a length-locked request from the
            unit's sizes.
    """

    fusion: bool = True
    prefetch: bool = True
    coalesce: bool = True
    provision: bool = False
    gpu_memory_utilization: float = 0.9
    kv_cache_bytes: int | None = None
    aging_s: float = 30.0
    prefetch_slack_s: float = 5.0
    tie_s: float = 2.0
    warm: tuple[tuple[str, str], ...] = ()
    reveal: str = "arrival"
    requests: Mapping[str, Request] | None = None

    @classmethod
    def colocated(cls, kv_cache_bytes: int = 2 * GIB, **kw: Any) -> ExecOptions:
        """Options for co-location: a fixed `kv_cache_bytes` of KV per replica, so several
        replicas fit on one GPU (sharing its memory and compute)."""
        return cls(kv_cache_bytes=kv_cache_bytes, **kw)

    def deployment(self, name: str) -> Deployment:
        """The default deployment of the model `name` under these options."""
        return Deployment(
            name,
            name,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_bytes=self.kv_cache_bytes,
        )
