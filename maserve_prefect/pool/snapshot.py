"""The pool plans' input: a dispatcher snapshot extended with the pool, the window and predictions.

One idea: every pool plan (`pool.joint_plan` and its baselines in `pool.baselines`)
decides on the same immutable `PoolSnapshot` — pool state, ready / near-ready window, the live
roots' DAG, cost predictions, fused chains and the plan knobs (`PlanOptions`) — which the
`PoolController` (`pool.control`) builds; `pool_snapshot` refuses a plain snapshot.

Examples:
    >>> from maserve_prefect.dispatch.snapshot import Snapshot
    >>> PlanOptions().fusion, PlanOptions(prefetch=False).prefetch
    (True, False)
    >>> pool_snapshot(Snapshot(0.0, (), (), ()), "joint")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    maserve_prefect.errors.ConfigError: plan 'joint' needs a PoolSnapshot (...); run it under ...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from maserve_prefect.dispatch.snapshot import Snapshot
from maserve_prefect.errors import ConfigError
from maserve_prefect.pool.fusion import Chain
from maserve_prefect.pool.state import CostModel, PoolState
from maserve_prefect.pool.window import Window, WorkUnit


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """Knobs of the pool plans (ablations switch fusion and prefetch off).

    Attributes:
        fusion: run a fused chain under one grant (off: every unit is placed alone).
        prefetch: allow loading deployments of near-ready work ahead of time.
        aging_s: a waiting unit gains one priority class per `aging_s` seconds waited.
        prefetch_slack_s: prefetch once the release is within load time + this.
        tie_s: completions closer than this count as equal when ranking lifecycle options.
        coalesce: lifecycle demand pooled across workflows (off: the paper's per-workflow
            ablation — each root's demand is weighed and provisioned on its own, while every
            loaded replica is still shared by all workflows).
        provision: add copies into free memory by predicted work per deployment
            (`pool.provision`); off by default: on the full pool, burst, it made the joint
            plan slower (Qwen3-8B copies on V100s ran the long QMSum chains 2-3x slower).
    """

    fusion: bool = True
    prefetch: bool = True
    aging_s: float = 30.0
    prefetch_slack_s: float = 5.0
    tie_s: float = 2.0
    coalesce: bool = True
    provision: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSnapshot(Snapshot):
    """A `Snapshot` extended with the pool state, the window and the predictions.

    Attributes:
        pool: devices, replicas, leases, grants and planned loads at `now_s`.
        window: ready / near-ready units with predicted releases.
        units: the active roots' DAG (every unit of a root that arrived and is not finished).
        costs: runtime / memory / load predictions.
        chains: each unit's fused chain (`fusion.fusible_chains`).
        kv_backoff_blocks: ρ(t) per deployment: KV blocks held back after observed
            out-of-memory refusals (`pool.admission`).
    """

    pool: PoolState
    window: Window
    units: Mapping[str, WorkUnit]
    costs: CostModel
    chains: Mapping[str, Chain] = field(default_factory=dict)
    options: PlanOptions = PlanOptions()
    kv_backoff_blocks: Mapping[str, int] = field(default_factory=dict)


def pool_snapshot(snapshot: Snapshot, plan: str) -> PoolSnapshot:
    """`snapshot` as a `PoolSnapshot`.

    Raises:
        ConfigError: a plain dispatcher snapshot was given to a pool plan.
    """
    if not isinstance(snapshot, PoolSnapshot):
        raise ConfigError(
            f"plan {plan!r} needs a PoolSnapshot (pool state + window + predictions); run it "
            "under the pool runtime (pool.executor) or a dispatcher that builds one"
        )
    return snapshot
