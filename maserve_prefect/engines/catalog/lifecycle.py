"""Replica lifecycle costs: load, sleep (level 1 / 2), wake and unload, with transitional memory.

One idea: every transition is a short sequence of phases, each with a duration and the GPU (and
host) memory held at its start and end, so a scheduler can both time a transition and check
that the memory it passes through fits. Pure functions; nothing here touches a GPU.

Defaults and the published measurements they rest on:
- vLLM docs, "Sleep Mode" (docs.vllm.ai/en/latest/features/sleep_mode): level 1 offloads
  weights to CPU RAM and discards the KV cache; level 2 discards both (a later wake reloads
  weights).
- vLLM blog, "Zero-Reload Model Switching with vLLM Sleep Mode" (blog.vllm.ai, 2025-10-26):
  reloading a model costs 30-100+ s; wake from level 1 takes ~0.1-6 s and from level 2
  ~0.8-2.6 s (models 0.6B-235B, A4000-A100), i.e. bounded by weight bytes over the host link
  or the weight source; a cold start re-pays allocator setup, torch.compile and CUDA graph
  capture, which sleep keeps.
- vLLM start-up logs typically show engine init (process spawn, distributed init, profiling
  run) of ~10-20 s, torch.compile from a warm cache of ~5-15 s and "Graph capturing finished
  in 5-20 secs"; we use 15 s init, 8 s compile and 8 s capture (skipped with enforce_eager).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from maserve_prefect.engines.catalog.gpus import GpuSpec
from maserve_prefect.engines.catalog.models import ModelSpec
from maserve_prefect.errors import ConfigError

GB = 10**9


class ReplicaState(IntEnum):
    """Ordered by how much GPU memory the replica holds."""

    UNLOADED = 0
    SLEEP_2 = 1
    SLEEP_1 = 2
    AWAKE = 3

    @property
    def holds_weights_on_gpu(self) -> bool:
        return self is ReplicaState.AWAKE


@dataclass(frozen=True, slots=True)
class LifecycleParams:
    """Tunable timing constants (seconds, bytes/s); defaults cited in the module docstring."""

    engine_init_s: float = 15.0
    compile_s: float = 8.0
    graph_capture_s: float = 8.0
    disk_bytes_s: float = 2.0 * GB  # NVMe read of safetensors
    host_ram_bytes_s: float = 0.0  # 0: limited by the GPU's host link
    network_bytes_s: float = 1.25 * GB  # 10 Gb/s object store
    sleep_fixed_s: float = 0.1
    wake_fixed_s: float = 0.1
    unload_s: float = 1.0
    enforce_eager: bool = False


@dataclass(frozen=True, slots=True)
class Phase:
    """One step of a transition; memory figures are per rank."""

    name: str
    duration_s: float
    gpu_bytes_start: int
    gpu_bytes_end: int
    host_bytes_end: int


@dataclass(frozen=True, slots=True)
class LifecyclePlan:
    """A transition from `start` to `end` as ordered phases."""

    start: ReplicaState
    end: ReplicaState
    phases: tuple[Phase, ...]

    @property
    def total_s(self) -> float:
        return sum(p.duration_s for p in self.phases)

    @property
    def peak_gpu_bytes(self) -> int:
        return max((max(p.gpu_bytes_start, p.gpu_bytes_end) for p in self.phases), default=0)


def _source_bw(source: str, gpu: GpuSpec, params: LifecycleParams) -> float:
    if source == "disk":
        return min(params.disk_bytes_s, gpu.host_link_bytes_s)
    if source == "host":
        return params.host_ram_bytes_s or gpu.host_link_bytes_s
    if source == "network":
        return min(params.network_bytes_s, gpu.host_link_bytes_s)
    raise ConfigError(f"unknown weight source {source!r}; expected 'disk', 'host' or 'network'")


def load_plan(
    model: ModelSpec,
    gpu: GpuSpec,
    kv_bytes: int,
    source: str = "disk",
    tp: int = 1,
    params: LifecycleParams | None = None,
) -> LifecyclePlan:
    """Cold load: engine init, weights streamed in from `source`, compile + graph capture, KV.

    Examples:
        >>> from maserve_prefect.engines.catalog import get_gpu, get_model
        >>> plan = load_plan(get_model("Qwen3-8B"), get_gpu("H100"), kv_bytes=50 * GB)
        >>> 30 < plan.total_s < 60, plan.peak_gpu_bytes > 60 * GB
        (True, True)
    """
    p = params or LifecycleParams()
    w = model.weight_bytes_per_rank(tp)
    warm = 0.0 if p.enforce_eager else p.compile_s + p.graph_capture_s
    phases = (
        Phase("engine_init", p.engine_init_s, 0, 0, 0),
        Phase("load_weights", w / _source_bw(source, gpu, p), 0, w, 0),
        Phase("allocate_kv", 0.0, w, w + kv_bytes, 0),
        Phase("compile_and_capture", warm, w + kv_bytes, w + kv_bytes, 0),
    )
    return LifecyclePlan(ReplicaState.UNLOADED, ReplicaState.AWAKE, phases)


def sleep_plan(
    model: ModelSpec,
    gpu: GpuSpec,
    kv_bytes: int,
    level: int,
    tp: int = 1,
    params: LifecycleParams | None = None,
) -> LifecyclePlan:
    """Sleep an awake replica: level 1 copies weights to host RAM, level 2 discards them."""
    p = params or LifecycleParams()
    w = model.weight_bytes_per_rank(tp)
    if level == 1:
        offload = Phase("offload_weights", w / gpu.host_link_bytes_s, w + kv_bytes, w, w)
        free = Phase("free", p.sleep_fixed_s, w, 0, w)
        return LifecyclePlan(ReplicaState.AWAKE, ReplicaState.SLEEP_1, (offload, free))
    if level == 2:
        free = Phase("free", p.sleep_fixed_s, w + kv_bytes, 0, 0)
        return LifecyclePlan(ReplicaState.AWAKE, ReplicaState.SLEEP_2, (free,))
    raise ConfigError(f"sleep level {level} is not supported; vLLM offers levels 1 and 2")


def wake_plan(
    model: ModelSpec,
    gpu: GpuSpec,
    kv_bytes: int,
    level: int,
    source: str = "disk",
    tp: int = 1,
    params: LifecycleParams | None = None,
) -> LifecyclePlan:
    """Wake from sleep level 1 (weights back over the host link) or 2 (reload from `source`)."""
    p = params or LifecycleParams()
    w = model.weight_bytes_per_rank(tp)
    if level == 1:
        bw, start = gpu.host_link_bytes_s, ReplicaState.SLEEP_1
    elif level == 2:
        bw, start = _source_bw(source, gpu, p), ReplicaState.SLEEP_2
    else:
        raise ConfigError(f"wake from sleep level {level} is not supported; expected 1 or 2")
    phases = (
        Phase("restore_weights", p.wake_fixed_s + w / bw, 0, w, 0),
        Phase("allocate_kv", 0.0, w, w + kv_bytes, 0),
    )
    return LifecyclePlan(start, ReplicaState.AWAKE, phases)


def unload_plan(
    model: ModelSpec, kv_bytes: int, tp: int = 1, params: LifecycleParams | None = None
) -> LifecyclePlan:
    """Stop an awake replica's process, freeing everything."""
    p = params or LifecycleParams()
    w = model.weight_bytes_per_rank(tp)
    phase = Phase("shutdown", p.unload_s, w + kv_bytes, 0, 0)
    return LifecyclePlan(ReplicaState.AWAKE, ReplicaState.UNLOADED, (phase,))
