"""What the pool runtime's plans know about the pool: devices, replicas, leases, predicted costs.

One idea: a `PoolState` is a frozen picture of the pool *with predicted times* — every replica
carries its phase (loading / resident / sleeping / unloading), the time its current transition is
predicted to end, and the bytes it holds or has reserved — so a plan can walk the pool's memory
forward through every predicted transition without asking an engine anything.

Memory follows the simulator's admission rule (`engines/sim/pool/sim_pool.py`): a replica holds its
*footprint* (weights + KV pool + process memory) from the start of its load until the end of its
unload; a sleeping replica holds only what sleep keeps. Request memory comes on top only where the
cost model predicts the active batch needs more than the footprint (engines that allocate KV
dynamically); for vLLM-style pre-allocated KV it is already inside the footprint.

Leases and grants: a `Grant` (in `dispatch.plans`) lets a unit or a fused chain run on a replica; a
`Lease` marks a replica in use by committed work (a granted chain, a request in flight) and makes
it non-reclaimable. A `PlannedLoad` is a load the applier holds until its victims have unloaded.

`CostModel` is the seam to the predictors: runtime, peak memory and load time per model, device
(GPU catalog name) and request shape. `RooflineCostModel` answers from the simulator's catalog and
step-time model, so plans and tests run without a trained predictor.

Examples:
    >>> costs = RooflineCostModel(kv_cache_bytes=2 << 30)
    >>> costs.runtime_s("Qwen3-8B", "A100-40GB", 1, 100, 50) < costs.runtime_s(
    ...     "Qwen3-8B", "V100-32GB", 1, 100, 50)
    True
    >>> 30 < costs.load_s("Qwen3-8B", "A100-40GB") < 60
    True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Protocol

from maserve_prefect.engines.catalog import get_gpu, get_model
from maserve_prefect.engines.catalog import lifecycle as lc
from maserve_prefect.engines.sim.cost.step_cost import ScheduledChunk
from maserve_prefect.engines.sim.cost.step_time import RooflineStepModel, make_step_model
from maserve_prefect.engines.sim.pool.device import Deployment
from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.state import Lifecycle

INF = float("inf")


class CostModel(Protocol):
    """Predictions a pool plan needs (`device` is a GPU catalog name, e.g. "A100-40GB")."""

    def runtime_s(
        self, model: str, device: str, batch: int, input_len: int, output_len: int
    ) -> float: ...

    def peak_mem_bytes(
        self, model: str, device: str, batch: int, input_len: int, output_len: int
    ) -> int: ...

    def load_s(self, model: str, device: str) -> float: ...


@cache
def _step_model(model: str, gpu: str) -> RooflineStepModel:
    return make_step_model(model, gpu)


@cache
def _static_bytes(model: str, gpu: str) -> int:
    """Weights + process memory of a default-config replica."""
    return get_model(model).weight_bytes + Deployment(model, model).process_bytes(get_gpu(gpu))


@cache
def _load_s(model: str, gpu: str) -> float:
    dep = Deployment(model, model, kv_cache_bytes=1)  # load time does not depend on the KV size
    spec = get_gpu(gpu)
    plan = lc.load_plan(dep.spec, spec, 1, dep.weight_source, 1, dep.params())
    return plan.total_s


class RooflineCostModel:
    """Predictions from the simulator's catalog: the roofline step model, memory and load plans.

    Runtime is one prefill step of `batch x input_len` tokens plus `output_len - 1` decode steps
    of `batch` sequences over a growing context, from the same step model the simulator charges
    (exact for a lone request; chunking and co-scheduling are ignored). Peak memory is weights +
    process memory + KV: the pre-allocated `kv_cache_bytes` when given (vLLM), else the batch's
    own KV bytes. Load time is the catalog load plan's total (engine init, weights, compile).

    Args:
        kv_cache_bytes: the KV pool every replica pre-allocates; None = dynamic KV.
    """

    def __init__(self, kv_cache_bytes: int | None = None) -> None:
        self.kv_cache_bytes = kv_cache_bytes

    def runtime_s(
        self, model: str, device: str, batch: int, input_len: int, output_len: int
    ) -> float:
        sm = _step_model(model, get_gpu(device).name)
        n = max(batch, 1)
        prefill = sm.step_cost([ScheduledChunk(input_len, 0)] * n).total_s
        steps = max(output_len - 1, 0)
        if steps == 0:
            return prefill
        aff = sm.decode_affine(n)
        # decode step k (0-based) computes one token over input_len + k cached ones
        ctx = n * (steps * input_len + steps * (steps - 1) // 2)
        return prefill + steps * aff.base_s + aff.attention_per_context_token_s * ctx

    def peak_mem_bytes(
        self, model: str, device: str, batch: int, input_len: int, output_len: int
    ) -> int:
        base = _static_bytes(model, device)
        if self.kv_cache_bytes is not None:
            return base + self.kv_cache_bytes
        tokens = max(batch, 0) * (input_len + output_len)
        return base + tokens * get_model(model).kv_bytes_per_token

    def load_s(self, model: str, device: str) -> float:
        return _load_s(model, device)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One device: unique name, GPU catalog name and memory capacity."""

    name: str
    gpu: str
    capacity_bytes: int


@dataclass(frozen=True, slots=True)
class Fit:
    """What a replica of a deployment is on one GPU kind: footprint and batch limits."""

    gpu: str
    footprint_bytes: int
    kv_capacity_tokens: int
    max_num_seqs: int
    unload_s: float = 1.0
    block_size: int = 16


@dataclass(frozen=True, slots=True)
class DeploymentInfo:
    """A deployment's identity (model + version + serving config) and its fit per GPU kind."""

    name: str
    model: str
    version: str = ""
    config: str = ""
    fits: tuple[Fit, ...] = ()

    def fit(self, gpu: str) -> Fit | None:
        """The fit on `gpu`, None when the deployment cannot run there."""
        for f in self.fits:
            if f.gpu == gpu:
                return f
        return None


def deployment_info(dep: Deployment, gpus: Iterable[str]) -> DeploymentInfo:
    """Describe a simulator `Deployment` on the given GPU kinds (skipping ones it cannot fit).

    Examples:
        >>> info = deployment_info(Deployment("m", "Qwen3-8B", kv_cache_bytes=2 << 30),
        ...                        ["A100-40GB"])
        >>> round(info.fit("A100-40GB").footprint_bytes / 1e9, 1), info.fit("H100")
        (20.5, None)
    """
    fits = []
    for name in sorted(set(gpus)):
        gpu = get_gpu(name)
        try:
            kv = dep.kv_bytes(gpu)
            blocks = dep.num_gpu_blocks(gpu)
        except ConfigError:
            continue
        footprint = dep.spec.weight_bytes_per_rank(dep.tp) + kv + dep.process_bytes(gpu)
        cfg = dep.scheduler_config(gpu)
        if footprint > gpu.memory_bytes:
            continue
        fits.append(
            Fit(
                gpu.name,
                footprint,
                blocks * cfg.block_size,
                cfg.max_num_seqs,
                dep.params().unload_s,
                cfg.block_size,
            )
        )
    config = repr((dep.tp, dep.gpu_memory_utilization, dep.kv_cache_bytes, dep.scheduler))
    return DeploymentInfo(dep.name, dep.model, dep.version, config, tuple(fits))


@dataclass(frozen=True, slots=True)
class ActiveRequest:
    """A unit submitted to a replica and not finished (running or queued in the engine)."""

    unit_id: str
    input_len: int
    max_tokens: int
    start_s: float
    predicted_end_s: float

    @property
    def context_tokens(self) -> int:
        return self.input_len + self.max_tokens


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """One replica as plans see it.

    Attributes:
        phase: lifecycle phase; `ready_s` is when the current transition is predicted to end
            (load → resident, unload → gone); for a resident or sleeping replica it is the time
            it got there.
        held_bytes: bytes held or reserved now (footprint while loading / resident / unloading,
            plus predicted request memory beyond the footprint).
        active: submitted, unfinished requests in submission order (the replica's queue).
        kv_capacity_tokens / block_size: the engine's KV pool, in tokens and tokens per block.
        last_used_s: last time a request was submitted or finished here (LRU).
    """

    name: str
    deployment: str
    device: str
    lifecycle: Lifecycle
    ready_s: float
    held_bytes: int
    footprint_bytes: int
    kv_capacity_tokens: int
    max_num_seqs: int
    active: tuple[ActiveRequest, ...] = ()
    last_used_s: float = 0.0
    unload_s: float = 1.0
    accepting: bool = True
    block_size: int = 16

    @property
    def kv_blocks(self) -> int:
        """KV blocks of the engine's pool (the admission limit of its requests)."""
        return self.kv_capacity_tokens // max(self.block_size, 1)

    @property
    def serving(self) -> bool:
        """Resident and taking submissions now."""
        return self.lifecycle is Lifecycle.READY and self.accepting


@dataclass(frozen=True, slots=True)
class Lease:
    """`replica` is in use by committed work `holder` (a chain or a request) until `units` end."""

    replica: str
    holder: str
    units: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PlannedLoad:
    """A load decided earlier that starts when its victims' unloads end (held by the applier)."""

    deployment: str
    device: str
    start_s: float
    ready_s: float
    footprint_bytes: int
    after: tuple[str, ...] = ()
    prefetch: bool = False


@dataclass(frozen=True, slots=True)
class PoolState:
    """The pool at `now_s` with predicted transition times (see the module docstring)."""

    now_s: float
    devices: tuple[DeviceInfo, ...]
    deployments: tuple[DeploymentInfo, ...]
    replicas: tuple[ReplicaInfo, ...] = ()
    leases: tuple[Lease, ...] = ()
    grants: tuple[tuple[str, tuple[str, ...]], ...] = ()
    planned: tuple[PlannedLoad, ...] = ()
    _index: dict[str, object] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        names = [d.name for d in self.devices]
        if len(set(names)) != len(names):
            raise ConfigError(f"pool state: device names repeat in {names}")
        known = set(names)
        for r in self.replicas:
            if r.device not in known:
                raise ConfigError(
                    f"pool state: replica {r.name!r} sits on unknown device {r.device!r}"
                )
        self._index.update({f"d:{d.name}": d for d in self.devices})
        self._index.update({f"p:{d.name}": d for d in self.deployments})
        self._index.update({f"r:{r.name}": r for r in self.replicas})
        for lease in self.leases:
            self._index[f"l:{lease.replica}"] = lease

    def device(self, name: str) -> DeviceInfo:
        d = self._index.get(f"d:{name}")
        if not isinstance(d, DeviceInfo):
            raise ConfigError(f"pool state has no device {name!r}; have {self.device_names()}")
        return d

    def device_names(self) -> list[str]:
        return [d.name for d in self.devices]

    def deployment(self, name: str) -> DeploymentInfo:
        d = self._index.get(f"p:{name}")
        if not isinstance(d, DeploymentInfo):
            raise ConfigError(
                f"pool state has no deployment {name!r}; have "
                f"{sorted(x.name for x in self.deployments)}"
            )
        return d

    def replica(self, name: str) -> ReplicaInfo:
        r = self._index.get(f"r:{name}")
        if not isinstance(r, ReplicaInfo):
            raise ConfigError(f"pool state has no replica {name!r}")
        return r

    def fit(self, deployment: str, device: str) -> Fit | None:
        """The deployment's fit on a device, None if it cannot run there."""
        return self.deployment(deployment).fit(self.device(device).gpu)

    def replicas_on(self, device: str) -> list[ReplicaInfo]:
        return [r for r in self.replicas if r.device == device]

    def replicas_of(self, deployment: str) -> list[ReplicaInfo]:
        return [r for r in self.replicas if r.deployment == deployment]

    def leased(self, replica: str) -> bool:
        """Whether committed work holds the replica (a lease, or requests in flight)."""
        r = self.replica(replica)
        return f"l:{replica}" in self._index or bool(r.active)

    def reclaimable(self, replica: str) -> bool:
        """Idle, lease-free and resident or sleeping: an unload may start now."""
        r = self.replica(replica)
        settled = r.lifecycle is Lifecycle.READY or r.lifecycle.sleeping
        return settled and not self.leased(replica)

    def grant_of(self, unit_id: str) -> str | None:
        """The replica a standing grant binds `unit_id` to, if any."""
        for replica, units in self.grants:
            if unit_id in units:
                return replica
        return None

    def used_bytes(self, device: str) -> int:
        """Bytes held or reserved on `device` now (planned loads not yet started excluded)."""
        return sum(r.held_bytes for r in self.replicas_on(device))

    def queues(self) -> Mapping[str, tuple[str, ...]]:
        """Per replica, its submitted and unfinished units in submission order."""
        return {r.name: tuple(a.unit_id for a in r.active) for r in self.replicas}
