"""Pool plans on real engines: the vLLM process pool as a `PoolHandle`, and the wall-clock run.

One idea: a pool plan is pure and the `PoolController` only needs a `PoolHandle`, so driving real
vLLM servers is an adapter plus a clock. `VLLMPoolHandle` turns `VLLMProcessPool` (a server
process per replica) into the handle the controller applies decisions to, on one asyncio loop:

- a load spawns a server; its health waiter's callback is posted onto the loop, where the
  replica's `OpenAIEngine` is created on the run's clock and attached to the loop (outcomes
  arrive on the dispatcher's thread, no locks);
- an unload answers ACCEPTED at once; the engine is closed on the loop and the process group is
  stopped on a worker thread, then the callback runs on the loop (the controller's books are
  consistent before any callback: a synchronous callback would arrive before it had recorded the
  action);
- residents are reported with the *planning* footprint of their deployment (the catalog model the
  pool file names for it on the device's catalog GPU), because a plan's memory checks are in
  those units: a CPU test server of a tiny model can stand in for a 14B replica on an A100,
  exercising the same decisions. Predicted times come from the same catalog entries; they are
  not calibrated to the host and only order the plan's choices.

`run_pool_vllm` runs `pool.executor`'s executor (the same `_PoolRun`, dispatcher and controller as the
simulated pool) on a `WallClock` over such a handle, from a cold pool, and returns the same
`PoolRunResult` (without the simulator's GPU-second split). Any error — a failed load, a plan
breaking a rule, a callback raising — stops the run and is raised; servers are left to the
caller's `VLLMProcessPool` (close it, or use it as a context manager).

Examples:
    >>> VLLMPoolHandle.__name__, run_pool_vllm.__name__
    ('VLLMPoolHandle', 'run_pool_vllm')
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from maserve_prefect.clock import WallClock
from maserve_prefect.dispatch.plans import Plan, get_plan
from maserve_prefect.engines.catalog import GpuSpec
from maserve_prefect.engines.catalog.devices import get_gpu
from maserve_prefect.engines.sim.pool.device import Deployment
from maserve_prefect.errors import ConfigError, EngineError
from maserve_prefect.pool.executor import _PoolRun
from maserve_prefect.pool.handle import ResidentView
from maserve_prefect.pool.inputs import ExecOptions, RootDag
from maserve_prefect.pool.results import PoolRunResult
from maserve_prefect.pool.state import (
    CostModel,
    RooflineCostModel,
    deployment_info,
)
from maserve_prefect.protocol.engine import LifecycleAction, LifecycleTicket, Replica
from maserve_prefect.protocol.outcomes import Acceptance
from maserve_prefect.protocol.state import Lifecycle

if TYPE_CHECKING:
    from maserve_prefect.engines.openai.engine import OpenAIEngine
    from maserve_prefect.engines.vllm.pool import VLLMProcessPool

__all__ = ["VLLMPoolHandle", "run_pool_vllm"]

LifecycleCallback = Callable[[LifecycleTicket], None]


class VLLMPoolHandle:
    """`PoolHandle` over a `VLLMProcessPool`, living on the running asyncio loop (module docstring).

    Args:
        pool: the process pool (its deployments are named as `deployments` are).
        device_gpus: the catalog GPU each pool device is planned as ("cpu0" -> "A100-40GB").
        deployments: the planning deployment (catalog model + serving config) of each pool
            deployment, by name.
        now: the run's clock; replica engines stamp their outcomes with it.
        engine_kwargs: extra `OpenAIEngine` arguments (e.g. `vocab_size`).

    Raises:
        ConfigError: a device without a catalog GPU, an unknown GPU name, or a deployment that
            fits no device.
        EngineError: constructed outside a running event loop.
    """

    def __init__(
        self,
        pool: VLLMProcessPool,
        device_gpus: Mapping[str, str],
        deployments: Mapping[str, Deployment],
        now: Callable[[], float],
        engine_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise EngineError(
                "VLLMPoolHandle must be created inside a running event loop"
            ) from None
        missing = sorted(set(pool.devices()) - set(device_gpus))
        if missing:
            raise ConfigError(
                f"devices {missing} have no catalog GPU to plan with; map every pool device "
                "in device_gpus (e.g. {'cpu0': 'A100-40GB'})"
            )
        self.pool = pool
        self.now = now
        self.engine_kwargs = dict(engine_kwargs or {})
        self._gpus = {d: get_gpu(device_gpus[d]) for d in pool.devices()}
        self._footprint: dict[tuple[str, str], int] = {}
        for name, dep in deployments.items():
            info = deployment_info(dep, {g.name for g in self._gpus.values()})
            if not info.fits:
                raise ConfigError(f"deployment {name!r} ({dep.model}) fits no device's GPU")
            for device, gpu in self._gpus.items():
                fit = info.fit(gpu.name)
                if fit is not None:
                    self._footprint[(name, device)] = fit.footprint_bytes
        self._where: dict[str, tuple[str, str]] = {}  # replica -> (deployment, device)
        self._lifecycle: dict[str, Lifecycle] = {}  # creation order
        self._engines: dict[str, OpenAIEngine] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.errors: list[BaseException] = []

    # -- views -----------------------------------------------------------------------------

    def devices(self) -> Sequence[str]:
        return self.pool.devices()

    def device_gpu(self, device: str) -> GpuSpec:
        return self._gpus[device]

    def replicas(self) -> Sequence[Replica]:
        return list(self._engines.values())

    def residents(self) -> Sequence[ResidentView]:
        return [
            ResidentView(
                name,
                lifecycle,
                self._footprint.get(self._where[name], 0),
                lifecycle is Lifecycle.READY,
            )
            for name, lifecycle in self._lifecycle.items()
        ]

    def callback_errors(self) -> list[BaseException]:
        """Errors raised by this handle's tasks or by any replica engine's ticket callbacks."""
        return [*self.errors, *(e for eng in self._engines.values() for e in eng.callback_errors)]

    # -- lifecycle -------------------------------------------------------------------------

    def load(
        self, deployment: Deployment, device: str, on_done: LifecycleCallback | None
    ) -> LifecycleTicket:
        def from_waiter(ticket: LifecycleTicket) -> None:
            if ticket.acceptance is Acceptance.ACCEPTED:
                self._loop.call_soon_threadsafe(self._loaded, ticket, on_done)

        ticket = self.pool.load(deployment.name, device, on_done=from_waiter)
        if ticket.acceptance is Acceptance.ACCEPTED:
            self._where[ticket.replica] = (deployment.name, device)
            self._lifecycle[ticket.replica] = Lifecycle.LOADING
        return ticket

    def _loaded(self, ticket: LifecycleTicket, on_done: LifecycleCallback | None) -> None:
        name = ticket.replica
        deployment, device = self._where[name]
        if ticket.error is not None:
            self._lifecycle.pop(name, None)
            self.errors.append(
                EngineError(f"load of {deployment} on {device} ({name}) failed: {ticket.error}")
            )
            return
        if self._lifecycle.get(name) is not Lifecycle.LOADING:
            return  # unloaded while it was loading; the unload answers the controller
        engine = self.pool.new_engine(name, now=self.now, **self.engine_kwargs)
        engine.attach()
        self._engines[name] = engine
        self._lifecycle[name] = Lifecycle.READY
        if on_done is not None:
            on_done(ticket)

    def unload(self, replica: str, on_done: LifecycleCallback | None) -> LifecycleTicket:
        if replica not in self._lifecycle:
            why = f"replica {replica} is not loaded or loading"
            return LifecycleTicket(LifecycleAction.UNLOAD, replica, Acceptance.REJECTED, why)
        ticket = LifecycleTicket(LifecycleAction.UNLOAD, replica, Acceptance.ACCEPTED)
        self._lifecycle[replica] = Lifecycle.UNLOADING
        task = self._loop.create_task(
            self._unload(ticket, self._engines.pop(replica, None), on_done)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return ticket

    async def _unload(
        self,
        ticket: LifecycleTicket,
        engine: OpenAIEngine | None,
        on_done: LifecycleCallback | None,
    ) -> None:
        try:
            if engine is not None:
                await engine.aclose()
            stopped = await self._loop.run_in_executor(None, self.pool.unload, ticket.replica)
            ticket.done_s, ticket.error = self.now(), stopped.error
            del self._lifecycle[ticket.replica]
            if stopped.error is not None:
                raise EngineError(f"unload of {ticket.replica} failed: {stopped.error}")
            if on_done is not None:
                on_done(ticket)
        except BaseException as exc:  # surfaced by run_pool_vllm
            self.errors.append(exc)

    async def aclose(self) -> None:
        """Close every replica engine (servers stay with the pool's owner)."""
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)
        engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            await engine.aclose()


def run_pool_vllm(
    workflows: Sequence[RootDag],
    pool: VLLMProcessPool,
    device_gpus: Mapping[str, str],
    deployments: Mapping[str, Deployment],
    plan: str | Plan = "joint",
    *,
    costs: CostModel | None = None,
    options: ExecOptions | None = None,
    engine_kwargs: Mapping[str, Any] | None = None,
    timeout_s: float = 900.0,
) -> PoolRunResult:
    """Run `workflows` under `plan` on real vLLM servers that the plan loads and reclaims.

    Args:
        workflows: roots with their DAGs and arrival offsets (seconds after the start).
        pool: a fresh `VLLMProcessPool` (no replica yet: the run starts cold); its `now` is
            rebound to the run's clock so lifecycle records and outcomes share one time base.
        device_gpus: the catalog GPU each pool device is planned as.
        deployments: the planning deployment of each pool deployment name units use.
        plan: "joint", "pool-fcfs", "parrot", "kairos" or a plan instance.
        costs: the plan's predictions (default `RooflineCostModel` with the options' KV).
        options: executor options; `warm` is unsupported on a process pool.
        engine_kwargs: extra `OpenAIEngine` arguments for every replica.
        timeout_s: wall seconds before the run is abandoned with an error.

    Raises:
        ConfigError: warm start, a pool that already has replicas, or bad
            workflows / deployments.
        EngineError: a load or unload failed, a callback raised, or the run timed out.
        SimulationError: the plan broke a rule (as on the simulated pool).
    """
    opts = options or ExecOptions()
    if opts.warm:
        raise ConfigError(
            "run_pool_vllm: warm starts are unsupported on a process pool; start cold"
        )
    if pool.replicas():
        raise ConfigError("run_pool_vllm needs a fresh pool (no replica); it starts cold")
    chosen = get_plan(plan) if isinstance(plan, str) else plan
    model = costs or RooflineCostModel(opts.kv_cache_bytes)
    return asyncio.run(
        _run(workflows, pool, device_gpus, deployments, chosen, model, opts, engine_kwargs,
             timeout_s)
    )  # fmt: skip


async def _run(
    workflows: Sequence[RootDag],
    pool: VLLMProcessPool,
    device_gpus: Mapping[str, str],
    deployments: Mapping[str, Deployment],
    plan: Plan,
    costs: CostModel,
    opts: ExecOptions,
    engine_kwargs: Mapping[str, Any] | None,
    timeout_s: float,
) -> PoolRunResult:
    loop = asyncio.get_running_loop()
    loop_errors: list[BaseException] = []

    def on_loop_error(_: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        loop_errors.append(
            exc if isinstance(exc, BaseException) else EngineError(context["message"])
        )

    loop.set_exception_handler(on_loop_error)
    clock = WallClock()
    pool.now = clock.now
    handle = VLLMPoolHandle(pool, device_gpus, deployments, clock.now, engine_kwargs)
    run = _PoolRun(workflows, clock, handle, plan, deployments, costs, opts)
    deadline = time.monotonic() + timeout_s
    try:
        run.start()
        while not run.finished():
            errors = loop_errors + handle.callback_errors()
            if errors:
                raise errors[0]
            if time.monotonic() > deadline:
                raise EngineError(
                    f"run_pool_vllm: {len(run.finish)}/{len(run.by_root)} roots finished after "
                    f"{timeout_s} s; raise timeout_s or check the server logs in "
                    f"{pool.log_dir}"
                )
            await asyncio.sleep(0.02)
    finally:
        await handle.aclose()
    return run.result()
