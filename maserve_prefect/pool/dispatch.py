"""Pool-mode dispatch: which plans decide on a pool, and a simulated pool with its dispatcher.

One idea: a pool plan (the joint plan and its baselines) sees a `PoolSnapshot`, so the one
`Dispatcher` that runs it needs a `PoolController` (`pool.control`) over a pool; a native
run on the simulator asks `needs_pool(plan)` and, if so, builds both with `sim_pool_dispatcher`,
starting the pool cold (the plan loads what the work needs) or warm (the pool file's
placements loaded first).

Examples:
    >>> from maserve_prefect.engines.poolfile import default_pool_file
    >>> pool, d = sim_pool_dispatcher(default_pool_file(), Kernel(), start="warm")
    >>> needs_pool(d.plan), len(pool.replicas()) > 0
    (True, True)
"""

from __future__ import annotations

from collections.abc import Iterable

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.dispatch.dispatcher import Dispatcher
from maserve_prefect.dispatch.plans import Plan, get_plan
from maserve_prefect.engines.poolfile import PoolFile, require_devices
from maserve_prefect.engines.sim.pool.sim_pool import SimPool
from maserve_prefect.errors import ConfigError
from maserve_prefect.pool.baselines import RequestLevelPlan
from maserve_prefect.pool.control import PoolController
from maserve_prefect.pool.handle import SimPoolHandle
from maserve_prefect.pool.joint_plan import JointPlan
from maserve_prefect.pool.snapshot import PlanOptions
from maserve_prefect.pool.state import CostModel, RooflineCostModel

POOL_STARTS = ("cold", "warm")
"""How a native run's pool starts under a pool plan (`sim_pool_dispatcher`)."""


def needs_pool(plan: str | Plan) -> bool:
    """Whether `plan` decides on a `PoolSnapshot` (the joint plan and its baselines).

    Examples:
        >>> needs_pool("joint"), needs_pool("kairos"), needs_pool("fcfs")
        (True, True, False)
    """
    chosen = get_plan(plan) if isinstance(plan, str) else plan
    return isinstance(chosen, JointPlan | RequestLevelPlan)


def sim_pool_dispatcher(
    pool_file: PoolFile,
    kernel: Kernel,
    plan: str | Plan = "joint",
    *,
    start: str = "cold",
    deployments: Iterable[str] | None = None,
    costs: CostModel | None = None,
    options: PlanOptions | None = None,
) -> tuple[SimPool, Dispatcher]:
    """A simulated pool of `pool_file`'s devices and a pool-mode dispatcher driving it.

    What a native run on the simulator uses for `plan="joint"` (or another pool plan): the
    dispatcher's controller loads, reclaims and leases replicas as the plan decides, on the
    run's kernel.

    Args:
        pool_file: devices, deployments (and placements, for a warm start).
        kernel: the run's virtual clock.
        plan: a registered plan name or instance.
        start: "cold" (no replica; the plan loads what the work needs) or "warm" (the file's
            placements of `deployments` are loaded first; the kernel runs until they are).
        deployments: the pool deployments units may name (default: all of the file's).
        costs: the plan's predictions (default: `RooflineCostModel()`; replicas pre-allocate
            their KV inside their footprint, so batch memory is the KV the batch needs).
        options: plan knobs (default `PlanOptions()`).

    Raises:
        ConfigError: an unknown start, deployment or refused warm placement.

    Examples:
        >>> from maserve_prefect.engines.poolfile import default_pool_file
        >>> pool, d = sim_pool_dispatcher(default_pool_file(), Kernel())
        >>> pool.replicas(), d.plan.name, isinstance(d.books, PoolController)
        ([], 'joint', True)
    """
    if start not in POOL_STARTS:
        raise ConfigError(f"pool start {start!r}: expected one of {POOL_STARTS}")
    entries = {d.name: d.to_deployment() for d in pool_file.deployments}
    names = sorted(entries) if deployments is None else sorted(set(deployments))
    unknown = [n for n in names if n not in entries]
    if unknown:
        raise ConfigError(
            f"pool file {pool_file.source or '(inline)'}: no deployment {unknown}; have "
            f"{sorted(entries)}"
        )
    require_devices(pool_file)
    pool = SimPool(kernel, pool_file.devices)
    control = PoolController(
        SimPoolHandle(pool),
        kernel,
        {n: entries[n] for n in names},
        costs or RooflineCostModel(),
        options,
    )
    if start == "warm":
        control.warm(
            (p.deployment, p.device) for p in pool_file.placements if p.deployment in names
        )
        kernel.run()
        control.mark_warm(kernel.now())
    return pool, Dispatcher(pool.replicas, kernel.now, plan, books=control)
