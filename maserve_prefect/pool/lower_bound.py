"""An offline lower bound on the makespan of workflow DAGs on a pool (no plan can beat it).

One idea: three relaxations, each provably optimistic, and the bound is the largest. Times are
seconds from the run's start (time 0, when the pool is cold: no replica loaded or loading).

- **critical path** (per root): an op starts no earlier than its predecessors' finish, its
  root's arrival and the end of the first load of its deployment on the GPU kind it runs on;
  it then takes at least its *floor* there. `finish(u) = min over GPU kinds g the deployment
  fits of max(preds' finish, arrival, load(g)) + floor(u, g)`, and a root ends at its last op.
- **memory-time** (capacity of memory): a replica reserves its footprint F(g) from the start of
  its load until its unload ends (`engines/sim/pool/sim_pool.py` admits a load only when its footprint
  fits beside what the others reserve), so the device-byte-seconds all replicas use fit in
  `sum(device memory) * makespan`. Every deployment used needs at least one replica, resident
  for its load L(g) plus, for every dependency path, the floors of the path's ops of that
  deployment (ops on one path never overlap; split over several replicas, each adds its own
  load). So `makespan >= sum over deployments of min F * (min L + P) / sum(device memory)`,
  with P the longest path of that deployment's op floors (fastest GPU kind each).
- **compute** (capacity of FLOPs): after time τ only ops of deployments that can have a replica
  by τ run; with `W(τ)` the FLOPs of ops whose deployment's fastest load ends at τ or later,
  `makespan >= τ + W(τ) / C` for every such τ, where C is the pool's peak FLOPS, each device
  counted once (replicas on one device share its compute: `engines/sim/step/device_share.py`).

Proof that each is a lower bound: every inequality above holds in every feasible schedule of
the simulator — an op needs a resident replica of its deployment, a cold pool's first replica of
a deployment is resident no earlier than its load time after time 0 (the load plan's total, the
same `lifecycle.load_plan` the pool runs), an op runs at least its floor (below), memory
reserved on a device never exceeds its capacity, and FLOPs per second never exceed the peak
on any device, whatever number of replicas share it. Taking minima over GPU kinds, footprints, load times and
floors only lowers each term, and the maximum of lower bounds is a lower bound.

An op's floor is its step count times the least time a step can take: every step of a
decoder reads all linear-layer weights once (at the datasheet bandwidth), and a prefill step
also computes its tokens through them (at the datasheet peak FLOPS). An op takes one prefill
step (which yields the first token) and `output_len - 1` decode steps, so its floor is
`max(W / bw, F_prefill / peak) + (output_len - 1) * W / bw`. The simulator charges at least
this whenever its fitted efficiencies are at most 1 (true for every shipped fit); tensor
parallelism is not modelled (tp = 1).

A warm pool (`cold=False`) drops the load terms (replicas may be resident at time 0).

Examples:
    >>> from maserve_prefect.pool.window import WorkUnit
    >>> from maserve_prefect.pool.inputs import RootDag
    >>> a = WorkUnit("r/a", "r", "Qwen3-0.6B", 100, 8, succs=("r/b",))
    >>> b = WorkUnit("r/b", "r", "Qwen3-0.6B", 100, 8, preds=("r/a",))
    >>> lb = lower_bound([RootDag("r", 0.0, (a, b))], ["A100-40GB:0"])
    >>> lb.bound_s == max(lb.critical_path_s, lb.capacity_s, lb.memory_time_s) > 30
    True
    >>> lower_bound([RootDag("r", 0.0, (a, b))], ["A100-40GB:0"], cold=False).bound_s < 1
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from maserve_prefect.engines.catalog import get_gpu, get_model
from maserve_prefect.engines.catalog import lifecycle as lc
from maserve_prefect.engines.sim.pool.device import Deployment, DeviceSlot
from maserve_prefect.errors import ConfigError
from maserve_prefect.pool.inputs import ExecOptions
from maserve_prefect.pool.state import DeploymentInfo, deployment_info
from maserve_prefect.pool.window import WorkUnit, topo_order

if TYPE_CHECKING:
    from maserve_prefect.pool.inputs import RootDag


@dataclass(frozen=True, slots=True)
class LowerBound:
    """The relaxations and their maximum (seconds from the run's start).

    Attributes:
        critical_path_s: the latest root's critical path (loads included on a cold pool).
        capacity_s: the compute (FLOPs) bound.
        memory_time_s: the memory-time bound (0 without a cold pool's loads and no work).
        bound_s: the maximum of the three.
        per_root_s: each root's critical-path end.
    """

    critical_path_s: float
    capacity_s: float
    bound_s: float
    per_root_s: Mapping[str, float]
    memory_time_s: float = 0.0


def _linear_params(model: str) -> tuple[int, int]:
    """(parameters of all layers' linear operators, parameters of the lm_head)."""
    spec = get_model(model)
    layers = spec.num_layers * sum(g.in_dim * g.out_dim for g in spec.layer_gemms(1))
    head = spec.lm_head_gemm(1)
    return layers, head.in_dim * head.out_dim


def op_flops(model: str, input_len: int, output_len: int) -> float:
    """Linear-layer FLOPs of one op: every token through the layers, one lm_head per step."""
    layers, head = _linear_params(model)
    return 2.0 * layers * (input_len + output_len - 1) + 2.0 * head * output_len


def op_floor_s(model: str, gpu: str, input_len: int, output_len: int) -> float:
    """The least time one op can take on `gpu` (module docstring).

    Examples:
        >>> op_floor_s("Qwen3-8B", "A100-40GB", 100, 10) < op_floor_s("Qwen3-8B", "V100-32GB", 100, 10)
        True
    """
    spec, g = get_model(model), get_gpu(gpu)
    layers, head = _linear_params(model)
    step = (layers + head) * spec.dtype_bytes / g.mem_bw_bytes_s
    prefill = 2.0 * (layers * input_len + head) / g.peak_flops
    return max(step, prefill) + max(output_len - 1, 0) * step


def load_time_s(dep: Deployment, gpu: str) -> float:
    """The time the simulator takes to cold-load `dep` on `gpu` (its own load plan).

    Examples:
        >>> 30 < load_time_s(Deployment("m", "Qwen3-8B"), "A100-40GB") < 60
        True
    """
    g = get_gpu(gpu)
    plan = lc.load_plan(dep.spec, g, dep.kv_bytes(g), dep.weight_source, dep.tp, dep.params())
    return plan.total_s


@dataclass(frozen=True, slots=True)
class _Dep:
    """What the bound needs of one deployment, per GPU kind it fits."""

    info: DeploymentInfo
    load_s: Mapping[str, float]  # GPU kind -> cold load time (0 on a warm pool)

    @property
    def gpus(self) -> list[str]:
        return [f.gpu for f in self.info.fits]

    def floor_s(self, u: WorkUnit, gpu: str) -> float:
        return op_floor_s(self.info.model, gpu, u.input_len, u.max_tokens)

    def min_floor_s(self, u: WorkUnit) -> float:
        return min(self.floor_s(u, g) for g in self.gpus)


def _deps(
    workflows: Sequence[RootDag],
    gpus: Sequence[str],
    given: Mapping[str, Deployment],
    options: ExecOptions,
    cold: bool,
) -> dict[str, _Dep]:
    out: dict[str, _Dep] = {}
    for wf in workflows:
        for u in wf.units:
            if u.deployment in out:
                continue
            dep = given.get(u.deployment) or options.deployment(u.deployment)
            info = deployment_info(dep, gpus)
            if not info.fits:
                raise ConfigError(f"lower bound: deployment {u.deployment!r} fits none of {gpus}")
            loads = {f.gpu: load_time_s(dep, f.gpu) if cold else 0.0 for f in info.fits}
            out[u.deployment] = _Dep(info, loads)
    return out


def _root_finish(wf: RootDag, deps: Mapping[str, _Dep]) -> tuple[float, dict[str, float]]:
    """(the root's critical-path end, per deployment its longest path of op floors)."""
    units = {u.unit_id: u for u in wf.units}
    finish: dict[str, float] = {}
    path: dict[str, dict[str, float]] = {}  # unit -> deployment -> longest floor sum up to it
    longest: dict[str, float] = {}
    for uid in topo_order(units):
        u = units[uid]
        d = deps[u.deployment]
        after = max([wf.arrival_s, *(finish[p] for p in u.preds)])
        finish[uid] = min(max(after, d.load_s[g]) + d.floor_s(u, g) for g in d.gpus)
        mine: dict[str, float] = {}
        for p in u.preds:
            for dep, t in path[p].items():
                mine[dep] = max(mine.get(dep, 0.0), t)
        mine[u.deployment] = mine.get(u.deployment, 0.0) + d.min_floor_s(u)
        path[uid] = mine
        for dep, t in mine.items():
            longest[dep] = max(longest.get(dep, 0.0), t)
    return max(finish.values(), default=wf.arrival_s), longest


def lower_bound(
    workflows: Sequence[RootDag],
    devices: Sequence[str],
    *,
    deployments: Mapping[str, Deployment] | None = None,
    options: ExecOptions | None = None,
    cold: bool = True,
) -> LowerBound:
    """The makespan lower bound of running `workflows` on `devices` (module docstring).

    Args:
        workflows: roots with DAGs and arrival offsets (as `pool.executor.run_pool` takes them).
        devices: device names; a deployment counts only on devices it fits.
        deployments: deployment configs by name (default: the model of that name sized by
            `options`, as `run_pool` builds them).
        options: the run's options; only the replica sizing (`gpu_memory_utilization`,
            `kv_cache_bytes`) is read.
        cold: the pool starts with no replica (as `run_pool` without `warm`); False drops the
            load terms.

    Raises:
        ConfigError: a deployment fits no device, or a DAG is malformed.
    """
    slots = [DeviceSlot.parse(d) for d in devices]
    gpus = sorted({s.gpu.name for s in slots})
    deps = _deps(workflows, gpus, deployments or {}, options or ExecOptions(), cold)
    per_root: dict[str, float] = {}
    longest: dict[str, float] = {}
    flops_by_dep: dict[str, float] = {}
    for wf in workflows:
        per_root[wf.root_id], paths = _root_finish(wf, deps)
        for dep, t in paths.items():
            longest[dep] = max(longest.get(dep, 0.0), t)
        for u in wf.units:
            flops = op_flops(deps[u.deployment].info.model, u.input_len, u.max_tokens)
            flops_by_dep[u.deployment] = flops_by_dep.get(u.deployment, 0.0) + flops
    cp = max(per_root.values(), default=0.0)
    # compute: FLOPs of deployments whose first replica is ready at or after tau, from tau on
    capacity = 0.0
    for s in slots:
        if any(d.info.fit(s.gpu.name) for d in deps.values()):
            capacity += s.gpu.peak_flops
    first = min((wf.arrival_s for wf in workflows), default=0.0)
    cap_s = 0.0
    if capacity > 0:
        # no op of a deployment starts before its first replica can be ready, nor before the
        # first arrival
        ready = {n: max(min(d.load_s.values()), first) for n, d in deps.items()}
        for tau in sorted(set(ready.values())):
            work = sum(f for n, f in flops_by_dep.items() if ready[n] >= tau)
            cap_s = max(cap_s, tau + work / capacity)
    # memory-time: each deployment's footprint through one load and its longest floor path
    need = 0.0
    for n, d in deps.items():
        foot = min(f.footprint_bytes for f in d.info.fits)
        need += foot * (min(d.load_s.values()) + longest.get(n, 0.0))
    total_mem = sum(s.gpu.memory_bytes for s in slots)
    mem_s = need / total_mem if total_mem > 0 else 0.0
    return LowerBound(cp, cap_s, max(cp, cap_s, mem_s), per_root, mem_s)
