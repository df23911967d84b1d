"""What a simulated pool is made of: devices, deployments and the memory a replica holds.

One idea: a replica's device memory is the lifecycle plan's figures (weights + KV cache, from
`catalog.lifecycle`) plus a constant *process* footprint (activation workspace, CUDA context,
graph pools — `catalog.memory`) held from the start of its load until its unload ends. vLLM's
sleep mode frees only the weight and KV pools (its `CuMemAllocator` tags), so a sleeping replica
keeps the process footprint. With `gpu_memory_utilization = u`, an awake replica holds exactly
`u * device memory`, as a real vLLM process does.

A device is named `"GPU:index"` (`"H100:0"`, `"A100-40GB:1"`) where GPU is a catalog name.
A deployment's identity is model + version + serving config: two `Deployment` values are the same
deployment iff they are equal.

Examples:
    >>> slot = DeviceSlot.parse("H100:0")
    >>> slot.name, slot.gpu.name
    ('H100:0', 'H100')
    >>> dep = Deployment("qwen", "Qwen3-8B", gpu_memory_utilization=0.45)
    >>> dep.scheduler_config(slot.gpu).max_num_seqs
    1024
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from maserve_prefect.engines.catalog import get_gpu, get_model
from maserve_prefect.engines.catalog.gpus import GpuSpec
from maserve_prefect.engines.catalog.lifecycle import LifecycleParams
from maserve_prefect.engines.catalog.memory import (
    CUDA_GRAPH_BYTES,
    NCCL_BYTES,
    NON_TORCH_BYTES,
    activation_peak_bytes,
    kv_capacity_bytes,
)
from maserve_prefect.engines.catalog.models import ModelSpec
from maserve_prefect.engines.sim.step.scheduler import SchedulerConfig
from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.engine import LifecycleAction

_SCHED_FIELDS = frozenset(f.name for f in dataclasses.fields(SchedulerConfig))


@dataclass(frozen=True, slots=True)
class DeviceSlot:
    """One accelerator of the pool: its unique name and catalog spec."""

    name: str
    gpu: GpuSpec

    @classmethod
    def parse(cls, name: str) -> DeviceSlot:
        """`"H100:0"` → the H100 catalog entry under the name `H100:0`.

        Raises:
            ConfigError: no `:index` suffix, or an unknown GPU name.
        """
        gpu_name, sep, index = name.rpartition(":")
        if not sep or not gpu_name or not index.isdigit():
            raise ConfigError(
                f"device {name!r}: name devices 'GPU:index', e.g. 'H100:0' or 'A100-40GB:1'"
            )
        return cls(name, get_gpu(gpu_name))


@dataclass(frozen=True, slots=True)
class Deployment:
    """A servable model configuration (identity = model + version + serving config).

    Attributes:
        name: what requests address (`Request.deployment`).
        model: catalog model name.
        version: free-form model version (weights revision).
        tp: tensor-parallel degree (one device per rank).
        gpu_memory_utilization: share of device memory the replica takes (vLLM's flag); the KV
            cache gets what is left after weights, activations and overhead.
        kv_cache_bytes: explicit KV budget per rank instead (overrides the utilization rule).
        scheduler: `SchedulerConfig` overrides as `(field, value)` pairs (`max_num_seqs`, ...);
            unset batch limits take vLLM's per-device defaults, and an unset `max_model_len`
            the model's context window (`max_position_embeddings`, as vLLM derives it).
        enforce_eager: no torch.compile / CUDA graphs (faster load, no graph memory).
        weight_source: where cold loads read weights from ("disk", "host", "network").
        lifecycle: timing constants for load / sleep / wake / unload (catalog defaults).
    """

    name: str
    model: str
    version: str = ""
    tp: int = 1
    gpu_memory_utilization: float = 0.9
    kv_cache_bytes: int | None = None
    scheduler: tuple[tuple[str, Any], ...] = ()
    enforce_eager: bool = False
    weight_source: str = "disk"
    lifecycle: LifecycleParams | None = None

    def __post_init__(self) -> None:
        where = f"deployment {self.name!r}"
        if not self.name:
            raise ConfigError("a deployment needs a non-empty name")
        if self.tp < 1:
            raise ConfigError(f"{where}: tp must be >= 1, got {self.tp}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < 1:
            raise ConfigError(f"{where}: kv_cache_bytes must be >= 1, got {self.kv_cache_bytes}")
        bad = sorted({k for k, _ in self.scheduler} - _SCHED_FIELDS)
        if bad:
            raise ConfigError(
                f"{where}: unknown scheduler settings {bad}; valid: {sorted(_SCHED_FIELDS)}"
            )
        get_model(self.model)  # fail early on an unknown model

    @property
    def spec(self) -> ModelSpec:
        return get_model(self.model)

    def params(self) -> LifecycleParams:
        """Lifecycle constants with this deployment's `enforce_eager`."""
        base = self.lifecycle or LifecycleParams()
        return dataclasses.replace(base, enforce_eager=self.enforce_eager)

    def scheduler_config(self, gpu: GpuSpec) -> SchedulerConfig:
        """vLLM's defaults for this device class and the model's context window, then this
        deployment's overrides."""
        kw = {"max_model_len": self.spec.max_position_embeddings} | dict(self.scheduler)
        return SchedulerConfig.for_device(gpu.memory_bytes, gpu.name, **kw)

    def process_bytes(self, gpu: GpuSpec) -> int:
        """Per-rank memory of the running process besides weights and KV (module docstring)."""
        cfg = self.scheduler_config(gpu)
        act = activation_peak_bytes(
            self.spec, cfg.max_num_batched_tokens, cfg.max_num_seqs, self.tp
        )
        overhead = NON_TORCH_BYTES + (NCCL_BYTES if self.tp > 1 else 0)
        return act + overhead + (0 if self.enforce_eager else CUDA_GRAPH_BYTES)

    def kv_bytes(self, gpu: GpuSpec) -> int:
        """Per-rank KV-cache bytes on `gpu` (explicit budget, else vLLM's utilization rule).

        Raises:
            ConfigError: the model does not fit at this utilization.
        """
        if self.kv_cache_bytes is not None:
            return self.kv_cache_bytes
        cfg = self.scheduler_config(gpu)
        return kv_capacity_bytes(
            self.spec,
            gpu,
            self.gpu_memory_utilization,
            cfg.max_num_batched_tokens,
            cfg.max_num_seqs,
            self.tp,
            self.enforce_eager,
        )

    def num_gpu_blocks(self, gpu: GpuSpec) -> int:
        """KV blocks of the scheduler's block size that `kv_bytes` holds."""
        cfg = self.scheduler_config(gpu)
        per_block = cfg.block_size * self.spec.num_layers
        per_block *= self.spec.kv_bytes_per_token_per_layer(self.tp)
        blocks = self.kv_bytes(gpu) // per_block
        if blocks < 1:
            raise ConfigError(
                f"deployment {self.name!r}: {self.kv_bytes(gpu)} KV bytes hold no "
                f"{cfg.block_size}-token block of {self.model}; raise kv_cache_bytes"
            )
        return blocks


@dataclass(frozen=True, slots=True)
class PhaseSpan:
    """One executed lifecycle phase on the pool's clock."""

    name: str
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class LifecycleRecord:
    """One executed lifecycle action (memory is the replica's per-rank bytes)."""

    action: LifecycleAction
    replica: str
    devices: tuple[str, ...]
    level: int
    start_s: float
    end_s: float
    phases: tuple[PhaseSpan, ...]
    memory_before_bytes: int
    memory_after_bytes: int
