"""What the pool executor is given: the roots to run and the executor's options.

One idea: a pool run is fully described by its `RootDag`s (each root's DAG of `WorkUnit`s and
its arrival offset), the devices, the plan and `ExecOptions` — the ablation switches, the KV
size of default deployments, the plan's knobs, a warm start, what plans know of a DAG (`reveal`)
and the engine requests of units — so the same inputs give the same results. What each option
does to a run is in `pool.executor`'s module docstring.

Examples:
    >>> ExecOptions().reveal in REVEAL_MODES, ExecOptions().kv_cache_bytes == 2 * GIB
    (True, True)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
        coalesce: False = per-workflow lifecycle (each root gets private deployment copies).
        kv_cache_bytes: KV pool of the default deployments (and of the default cost model).
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
    kv_cache_bytes: int = 2 * GIB
    aging_s: float = 30.0
    prefetch_slack_s: float = 5.0
    tie_s: float = 2.0
    warm: tuple[tuple[str, str], ...] = ()
    reveal: str = "arrival"
    requests: Mapping[str, Request] | None = None
