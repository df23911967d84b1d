"""A request batch's operator graph: FLOPs, bytes and roofline time per operator type and phase.

One idea: unroll the batch into the engine steps vLLM would run — prefill chunks of at most the
device's token budget (`max_num_batched_tokens`, vLLM's per-device default), then
`output_len - 1` decode steps whose KV context grows by one token each — and charge every
operator of every step its roofline time `max(FLOPs / peak FLOPS, bytes / bandwidth)` from the
catalog's datasheet peaks (no efficiency factor, no launch cost: nothing fitted). The formula
predictor sums these times; the graph predictor feeds them, per type, to LightGBM.

Operator types (per layer unless noted; d = dtype bytes, h = hidden, I = intermediate,
H / KV = query / KV heads, hd = head_dim, V = vocab, M = tokens in the step, S = sequences):

- `qkv`, `o`, `gate_up`, `down`: GEMMs, `2*in*out*M` FLOPs, `(in*out + M*(in+out))*d` bytes;
- `attn_prefill`: one varlen call over the step's prefill segments (new tokens over prior
  ones): causal FLOPs `4*H*hd*(new*prior + new*(new+1)/2)`, reads the KV of `prior + new`
  tokens and the queries / writes the outputs;
- `attn_decode`: each decode reads its whole KV context, `4*H*hd*ctx` FLOPs;
- `lm_head` (once per step): the vocab GEMM over S sequences plus the fp32 logits it writes;
- `elementwise`: norms, residual adds, rotary, activation (per layer) and embedding + final norm
  (per step), bandwidth only (bytes per token from `engines/sim/cost/roofline.py`).

Batches larger than vLLM's `max_num_seqs` run as consecutive waves (an upper bound: vLLM would
start the next wave as seats free up).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from maserve_prefect.predictors.base import Shape

from maserve_prefect.engines.catalog.gpus import GpuSpec
from maserve_prefect.engines.catalog.models import ModelSpec
from maserve_prefect.engines.sim.cost.roofline import (
    VLLM_LAYER_ELEMENTWISE,
    elementwise_bytes_per_token,
)
from maserve_prefect.engines.sim.step.scheduler import default_batch_limits

OP_TYPES = ("qkv", "o", "gate_up", "down", "attn_prefill", "attn_decode", "lm_head", "elementwise")
PHASES = ("prefill", "decode")
_LINEAR = ("qkv", "o", "gate_up", "down")


@dataclass(slots=True)
class OpTotals:
    """Sums over a request batch's steps for one (phase, operator type)."""

    flops: float = 0.0
    bytes: float = 0.0
    time_s: float = 0.0


@dataclass(slots=True)
class RequestGraph:
    """The operator totals of one shape on one device, keyed by `(phase, op type)`.

    Examples:
        >>> from maserve_prefect.engines.catalog import get_gpu, get_model
        >>> g = request_graph(get_model("Qwen3-8B"), get_gpu("H100"), Shape(1, 512, 64))
        >>> g.num_decode_steps, g.time_s("decode") > g.time_s("prefill")
        (63, True)
    """

    totals: dict[tuple[str, str], OpTotals] = field(default_factory=lambda: defaultdict(OpTotals))
    num_prefill_steps: int = 0
    num_decode_steps: int = 0

    def time_s(self, phase: str | None = None, op: str | None = None) -> float:
        """Roofline seconds summed over the matching phases and operator types."""
        return float(
            sum(
                t.time_s
                for (ph, o), t in self.totals.items()
                if (phase is None or ph == phase) and (op is None or o == op)
            )
        )

    def get(self, phase: str, op: str) -> OpTotals:
        return self.totals.get((phase, op), OpTotals())

    def _add(self, phase: str, op: str, flops: float, nbytes: float, time_s: float) -> None:
        t = self.totals[(phase, op)]
        t.flops += flops
        t.bytes += nbytes
        t.time_s += time_s


def _roof(flops: float, nbytes: float, gpu: GpuSpec) -> float:
    return max(flops / gpu.peak_flops, nbytes / gpu.mem_bw_bytes_s)


def prefill_steps(batch: int, input_len: int, budget: int) -> list[list[tuple[int, int]]]:
    """vLLM's chunked-prefill order: prompts fill each step's token budget in turn.

    Returns one list per step of `(new, prior)` segments.

    Examples:
        >>> prefill_steps(3, 100, 256)
        [[(100, 0), (100, 0), (56, 0)], [(44, 56)]]
    """
    steps: list[list[tuple[int, int]]] = []
    step: list[tuple[int, int]] = []
    room = budget
    for _ in range(batch):
        done = 0
        while done < input_len:
            take = min(room, input_len - done)
            step.append((take, done))
            done += take
            room -= take
            if room == 0:
                steps.append(step)
                step, room = [], budget
    if step:
        steps.append(step)
    return steps


def request_graph(
    model: ModelSpec, gpu: GpuSpec, shape: Shape, max_num_batched_tokens: int | None = None
) -> RequestGraph:
    """Unroll `shape` into engine steps and total every operator type (module docstring).

    The graph is built once per (model, device, shape, budget) in a process and shared: callers
    read it, never change it. A pool suite's cost tables ask for every bucket of every model on
    every device from two predictors (the formula's runtime and the graph predictor's
    features), and unrolling a long prefill step by step was half of its demo's wall time.

    Args:
        model, gpu: catalog entries.
        shape: the request batch.
        max_num_batched_tokens: prefill chunk budget; default vLLM's for the device class.
    """
    return _request_graph(model, gpu, shape, max_num_batched_tokens)


@functools.lru_cache(maxsize=1 << 15)
def _request_graph(
    model: ModelSpec, gpu: GpuSpec, shape: Shape, max_num_batched_tokens: int | None
) -> RequestGraph:
    budget, max_seqs = default_batch_limits(gpu.memory_bytes, gpu.name)
    budget = max_num_batched_tokens or budget
    graph = RequestGraph()
    left = shape.batch
    while left > 0:
        wave = min(left, max_seqs)
        _add_wave(graph, model, gpu, wave, shape.input_len, shape.output_len, budget)
        left -= wave
    return graph


def _linear_step(
    graph: RequestGraph, phase: str, model: ModelSpec, gpu: GpuSpec, m: float, n_steps: float
) -> None:
    """The four layer GEMMs of `n_steps` identical steps of `m` tokens each."""
    d, layers = model.dtype_bytes, model.num_layers
    for g in model.layer_gemms(1):
        flops = 2.0 * g.in_dim * g.out_dim * m
        nbytes = (g.in_dim * g.out_dim + m * (g.in_dim + g.out_dim)) * d
        graph._add(
            phase,
            g.name,
            flops * layers * n_steps,
            nbytes * layers * n_steps,
            _roof(flops, nbytes, gpu) * layers * n_steps,
        )


def _head_and_elementwise(
    graph: RequestGraph,
    phase: str,
    model: ModelSpec,
    gpu: GpuSpec,
    m: float,
    s: float,
    n_steps: float,
) -> None:
    d, h, v = model.dtype_bytes, model.hidden_size, model.vocab_size
    flops = 2.0 * h * v * s
    nbytes = (h * v + s * (h + v)) * d + s * v * 4.0
    graph._add(
        phase, "lm_head", flops * n_steps, nbytes * n_steps, _roof(flops, nbytes, gpu) * n_steps
    )
    layer_ops = VLLM_LAYER_ELEMENTWISE + (("qk_norm",) if model.qk_norm else ())
    per_token = model.num_layers * sum(elementwise_bytes_per_token(model, op) for op in layer_ops)
    per_token += sum(elementwise_bytes_per_token(model, op) for op in ("embedding", "add_norm"))
    nbytes = per_token * m
    graph._add(phase, "elementwise", 0.0, nbytes * n_steps, nbytes / gpu.mem_bw_bytes_s * n_steps)


def _add_wave(
    graph: RequestGraph,
    model: ModelSpec,
    gpu: GpuSpec,
    batch: int,
    input_len: int,
    output_len: int,
    budget: int,
) -> None:
    layers, d = model.num_layers, model.dtype_bytes
    q_width = model.num_attention_heads * model.head_dim
    kv_tok = model.kv_bytes_per_token_per_layer(1)
    attn_flops_per = 4.0 * q_width  # per (query token, key token) pair
    for step in prefill_steps(batch, input_len, budget):
        m = float(sum(new for new, _ in step))
        _linear_step(graph, "prefill", model, gpu, m, 1.0)
        _head_and_elementwise(graph, "prefill", model, gpu, m, float(len(step)), 1.0)
        flops = sum(attn_flops_per * (new * prior + new * (new + 1) / 2.0) for new, prior in step)
        nbytes = sum((prior + new) * kv_tok + 2.0 * new * q_width * d for new, prior in step)
        t = _roof(flops, nbytes, gpu)
        graph._add("prefill", "attn_prefill", flops * layers, nbytes * layers, t * layers)
        graph.num_prefill_steps += 1
    n_dec = output_len - 1
    if n_dec < 1:
        return
    b = float(batch)
    _linear_step(graph, "decode", model, gpu, b, float(n_dec))
    _head_and_elementwise(graph, "decode", model, gpu, b, b, float(n_dec))
    # decode step j (1..n_dec) computes one token per sequence over `input_len + j` KV tokens
    ctx = input_len + np.arange(1, n_dec + 1, dtype=np.float64)
    flops_j = attn_flops_per * b * ctx
    bytes_j = b * ctx * kv_tok + 2.0 * b * q_width * d
    time_j = np.maximum(flops_j / gpu.peak_flops, bytes_j / gpu.mem_bw_bytes_s)
    graph._add(
        "decode",
        "attn_decode",
        float(flops_j.sum()) * layers,
        float(bytes_j.sum()) * layers,
        float(time_j.sum()) * layers,
    )
    graph.num_decode_steps += n_dec
