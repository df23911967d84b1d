"""An offline lower bound on the makespan of workflow DAGs on a pool (no plan can beat it).

One idea: two relaxations, each provably optimistic, and the bound is the larger:

- **critical path**: every root's longest dependency path, each op at its *floor* on the fastest
  device its deployment fits, with no load time and no queueing, after the root's arrival;
- **capacity**: all ops' FLOPs over the pool's peak FLOPS, counting on each device as many
  replicas as fit there at once (the simulator runs colocated replicas without contention),
  after the first arrival.

An op's floor is its step count times the least time a step can take: every step of a
decoder reads all linear-layer weights once (at the datasheet bandwidth), and a prefill step
also computes its tokens through them (at the datasheet peak FLOPS). An op takes one prefill
step (which yields the first token) and `output_len - 1` decode steps, so its floor is
`max(W / bw, F_prefill / peak) + (output_len - 1) * W / bw`. The simulator charges at least
this whenever its fitted efficiencies are at most 1 (true for every shipped fit); tensor
parallelism is not modelled (tp = 1).

Examples:
    >>> from maserve_prefect.runtime.window import WorkUnit
    >>> from maserve_prefect.runtime.pool_exec import Workflow
    >>> a = WorkUnit("r/a", "r", "Qwen3-0.6B", 100, 8, succs=("r/b",))
    >>> b = WorkUnit("r/b", "r", "Qwen3-0.6B", 100, 8, preds=("r/a",))
    >>> lb = lower_bound([Workflow("r", 0.0, (a, b))], ["A100-40GB:0"])
    >>> lb.bound_s == max(lb.critical_path_s, lb.capacity_s) > 0
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from maserve_prefect.engine.catalog import get_gpu, get_model
from maserve_prefect.engine.sim.device import Deployment, DeviceSlot
from maserve_prefect.errors import ConfigError
from maserve_prefect.runtime.pool_state import deployment_info
from maserve_prefect.runtime.window import topo_order

if TYPE_CHECKING:
    from maserve_prefect.runtime.pool_exec import Workflow

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class LowerBound:
    """The two relaxations and their maximum (seconds from the run's start)."""

    critical_path_s: float
    capacity_s: float
    bound_s: float
    per_root_s: Mapping[str, float]


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


def lower_bound(
    workflows: Sequence[Workflow],
    devices: Sequence[str],
    *,
    deployments: Mapping[str, Deployment] | None = None,
    kv_cache_bytes: int = 2 * GIB,
) -> LowerBound:
    """The makespan lower bound of running `workflows` on `devices` (module docstring).

    Args:
        workflows: roots with DAGs and arrival offsets (as `pool_exec.run_pool` takes them).
        devices: device names; a deployment counts only on devices it fits.
        deployments: deployment configs by name (default: the model of that name with
            `kv_cache_bytes` of KV, as `run_pool` builds them).

    Raises:
        ConfigError: a deployment fits no device, or a DAG is malformed.
    """
    given = deployments or {}
    slots = [DeviceSlot.parse(d) for d in devices]
    gpus = sorted({s.gpu.name for s in slots})
    infos = {}
    for wf in workflows:
        for u in wf.units:
            if u.deployment not in infos:
                dep = given.get(u.deployment) or Deployment(
                    u.deployment, u.deployment, kv_cache_bytes=kv_cache_bytes
                )
                infos[u.deployment] = deployment_info(dep, gpus)
                if not infos[u.deployment].fits:
                    raise ConfigError(
                        f"lower bound: deployment {u.deployment!r} fits none of {gpus}"
                    )
    per_root: dict[str, float] = {}
    total_flops = 0.0
    for wf in workflows:
        units = {u.unit_id: u for u in wf.units}
        finish: dict[str, float] = {}
        for uid in topo_order(units):
            u = units[uid]
            info = infos[u.deployment]
            floor = min(op_floor_s(info.model, f.gpu, u.input_len, u.max_tokens) for f in info.fits)
            finish[uid] = max((finish[p] for p in u.preds), default=0.0) + floor
            total_flops += op_flops(info.model, u.input_len, u.max_tokens)
        per_root[wf.root_id] = wf.arrival_s + max(finish.values(), default=0.0)
    capacity = 0.0
    for s in slots:
        sizes = [f.footprint_bytes for i in infos.values() if (f := i.fit(s.gpu.name))]
        if sizes:
            capacity += s.gpu.peak_flops * (s.gpu.memory_bytes // min(sizes))
    first = min((wf.arrival_s for wf in workflows), default=0.0)
    cap_s = first + total_flops / capacity if capacity > 0 else 0.0
    cp = max(per_root.values(), default=0.0)
    return LowerBound(cp, cap_s, max(cp, cap_s), per_root)
