"""GPU memory budget of one vLLM replica: what is left for the KV cache.

One idea, as vLLM computes it at start-up: the KV cache gets
`gpu_memory_utilization * total - weights - peak activations - non-torch memory`.

- weights: `ModelSpec.weight_bytes_per_rank(tp)` (a mixture-of-experts model holds every
  expert, though a token computes through `num_experts_per_tok` of them);
- peak activations: vLLM profiles one forward pass of `max_num_batched_tokens` tokens; its
  peak is dominated by the MLP (gate/up output 2*I, activation output I, plus a few hidden-size
  buffers: residual, normed input, QKV, attention output; MoE: the active width `k * I_e`
  plus the fused-MoE output `k * h`) and the fp32 logits of up to
  `max_num_seqs` sequences, i.e.
  `M * d * (3*I/tp + (4*h + (H+2*KV)*hd/tp)) + max_num_seqs * vocab/tp * 4`;
- non-torch memory: CUDA context, cuBLAS workspaces and (tp > 1) NCCL buffers. vLLM's start-up
  log reports "non-torch memory" of roughly 0.2-1 GiB on one GPU; we charge 1 GiB plus 0.5 GiB
  for NCCL when tp > 1, and CUDA graph pools of 0.5 GiB unless `enforce_eager`.
"""

from __future__ import annotations

from maserve_prefect.engines.catalog.gpus import GpuSpec
from maserve_prefect.engines.catalog.models import ModelSpec
from maserve_prefect.errors import ConfigError

GIB = 1 << 30
NON_TORCH_BYTES = 1 * GIB
NCCL_BYTES = GIB // 2
CUDA_GRAPH_BYTES = GIB // 2


def activation_peak_bytes(
    model: ModelSpec, max_num_batched_tokens: int = 2048, max_num_seqs: int = 256, tp: int = 1
) -> int:
    """Peak activation bytes of vLLM's profiling forward pass (formula in the module docstring)."""
    d = model.dtype_bytes
    per_token = 3 * model.active_intermediate_size // tp + 4 * model.hidden_size
    if model.is_moe:  # the fused-MoE kernel's per-(token, expert) output before the reduction
        per_token += model.num_experts_per_tok * model.hidden_size
    per_token += (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim // tp
    logits = max_num_seqs * (model.vocab_size // tp) * 4
    return max_num_batched_tokens * per_token * d + logits


def kv_capacity_bytes(
    model: ModelSpec,
    gpu: GpuSpec,
    gpu_memory_utilization: float = 0.9,
    max_num_batched_tokens: int = 2048,
    max_num_seqs: int = 256,
    tp: int = 1,
    enforce_eager: bool = False,
) -> int:
    """KV-cache bytes one rank gets.

    Raises:
        ConfigError: utilization out of (0, 1], or the model does not fit.

    Examples:
        >>> from maserve_prefect.engines.catalog import get_gpu, get_model
        >>> kv_capacity_bytes(get_model("Qwen3-8B"), get_gpu("H100")) > 40 * GIB
        True
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise ConfigError(f"gpu_memory_utilization={gpu_memory_utilization} must be in (0, 1]")
    budget = int(gpu_memory_utilization * gpu.memory_bytes)
    weights = model.weight_bytes_per_rank(tp)
    activations = activation_peak_bytes(model, max_num_batched_tokens, max_num_seqs, tp)
    overhead = NON_TORCH_BYTES + (NCCL_BYTES if tp > 1 else 0)
    overhead += 0 if enforce_eager else CUDA_GRAPH_BYTES
    left = budget - weights - activations - overhead
    if left <= 0:
        raise ConfigError(
            f"{model.name} needs ~{weights / 1e9:.1f} GB of weights per rank (tp={tp}) plus "
            f"~{(activations + overhead) / 1e9:.1f} GB activations/overhead; {gpu.name} has "
            f"{gpu.memory_bytes / 1e9:.1f} GB, {budget / 1e9:.1f} GB at utilization "
            f"{gpu_memory_utilization}. Use a larger GPU, raise tp, or pick a smaller model."
        )
    return left


def num_gpu_blocks(
    model: ModelSpec,
    gpu: GpuSpec,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    max_num_batched_tokens: int = 2048,
    max_num_seqs: int = 256,
    tp: int = 1,
    enforce_eager: bool = False,
) -> int:
    """KV blocks of `block_size` tokens that fit (per rank; KV heads are sharded over tp).

    Examples:
        >>> from maserve_prefect.engines.catalog import get_gpu, get_model
        >>> num_gpu_blocks(get_model("Qwen3-0.6B"), get_gpu("A100-40GB")) > 10_000
        True
    """
    if block_size < 1:
        raise ConfigError(f"block_size={block_size} must be >= 1")
    capacity = kv_capacity_bytes(
        model, gpu, gpu_memory_utilization, max_num_batched_tokens, max_num_seqs, tp, enforce_eager
    )
    per_block = block_size * model.num_layers * model.kv_bytes_per_token_per_layer(tp)
    return capacity // per_block
