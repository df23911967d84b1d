"""Per-operator roofline formulas shared by the step-time model and its calibration.

One idea: every operator's time is a launch cost plus a roofline over two resources, combined as
`sqrt(T_mem^2 + T_comp^2)` — a smooth max that is memory-bound for few tokens, compute-bound
for many, and slower than either near the ridge point, as measured GEMMs are. Each function
takes numpy arrays or floats, so the fit evaluates thousands of profile rows in one call and the
simulator evaluates one step with the same code.

Operators and what they move (d = dtype bytes, h = hidden, I = intermediate, H/KV = heads,
hd = head_dim, all per tensor-parallel rank):

- linear (QKV, O, gate/up, down, lm_head): weights `in*out*d` + activations `M*(in+out)*d`
  bytes, `2*in*out*M` FLOPs over M tokens padded to 128-row tiles (lm_head: M = scheduled
  sequences); a mixture-of-experts MLP reads the weights of the experts its M tokens touch and
  computes `M*k` rows;
- elementwise (norms, rotary, activation, residual add, embedding gather): bytes per token below,
  served from L2 while the kernel's footprint fits (see `elementwise_time`);
- decode attention: reads `ctx * kv_bytes_per_token_per_layer` per request;
- prefill attention: a wave model of the causal FlashAttention grid (`ceil(new / tile_m)` query
  tiles x H CTAs, one per SM at a time, each streaming the keys it sees), see
  `prefill_attention_time`;
- mixed decode attention (decodes in a step that also computes a prefill chunk): a tile/wave
  model of vLLM's FlashAttention-2 varlen kernel, see `mixed_attention_time`;
- sampler: fp32 logits `vocab*4` bytes per sequence.
"""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from maserve_prefect.engines.catalog.efficiency import DeviceEfficiency
from maserve_prefect.engines.catalog.gpus import GpuSpec
from maserve_prefect.engines.catalog.models import ModelSpec
from maserve_prefect.errors import ConfigError

Num = TypeVar("Num", float, npt.NDArray[np.float64])

LINEAR_OPS = ("qkv", "o", "gate_up", "down")
# vLLM's kernels (what the simulator runs) and Vidur's unfused ones (`emb`, `mlp_act`, `attn_rope`,
# `norm`, `add`: only in Vidur profiles; same bytes as their vLLM namesakes, other efficiencies).
ELEMENTWISE_OPS = (
    "norm",
    "add_norm",
    "add",
    "act",
    "rope",
    "qk_norm",
    "embedding",
    "emb",
    "mlp_act",
    "attn_rope",
)
# vLLM's per-layer elementwise kernels: residual add fused into RMSNorm twice, rotary, SiLU-mul.
VLLM_LAYER_ELEMENTWISE = ("add_norm", "add_norm", "rope", "act")


def elementwise_bytes_per_token(model: ModelSpec, op: str, tp: int = 1) -> float:
    """Bytes one token moves through elementwise operator `op` on one rank."""
    d = model.dtype_bytes
    h = model.hidden_size
    qk = (model.num_attention_heads + model.num_kv_heads) * model.head_dim / tp
    if op in ("norm", "embedding", "emb"):
        return 2 * h * d
    if op == "add_norm":
        return 4 * h * d
    if op == "add":
        return 3 * h * d
    if op in ("act", "mlp_act"):
        return (3 if model.gated_mlp else 2) * model.active_intermediate_size / tp * d
    if op in ("rope", "qk_norm", "attn_rope"):
        return 2 * qk * d
    raise ConfigError(f"unknown elementwise operator {op!r}; expected one of {ELEMENTWISE_OPS}")


# Rows of one GEMM output tile: tensor-core GEMMs compute the token dimension in tiles of 128
# rows (cuBLAS / CUTLASS on sm80 / sm90 / sm120 alike), so 129 tokens cost the MMA work of 256.
GEMM_TILE_M = 128


def gemm_rows(tokens: Num) -> Num:
    """Token rows a GEMM computes: `tokens` padded up to whole `GEMM_TILE_M` tiles."""
    return np.ceil(tokens / GEMM_TILE_M) * GEMM_TILE_M


def linear_time(
    in_dim: float, out_dim: float, tokens: Num, d: int, gpu: GpuSpec, eff: DeviceEfficiency
) -> Num:
    """One GEMM of `tokens x in_dim` by `in_dim x out_dim` (seconds): weight and activation bytes
    against the MMA work of the tile-padded rows (`gemm_rows`)."""
    t_mem = (
        (in_dim * out_dim + tokens * (in_dim + out_dim)) * d / (gpu.mem_bw_bytes_s * eff.linear_mem)
    )
    t_comp = 2.0 * in_dim * out_dim * gemm_rows(tokens) / (gpu.peak_flops * eff.linear_comp)
    return eff.linear_op_s + np.sqrt(t_mem * t_mem + t_comp * t_comp)


def experts_touched(tokens: Num, num_experts: int, top_k: int) -> Num:
    """Expected distinct experts `tokens` tokens route to, each picking `top_k` of
    `num_experts` uniformly: `E * (1 - (1 - k/E)^M)` (1 token: k; many tokens: all E)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def moe_linear_time(
    in_dim: float,
    out_dim: float,
    tokens: Num,
    num_experts: int,
    top_k: int,
    d: int,
    gpu: GpuSpec,
    eff: DeviceEfficiency,
) -> Num:
    """One fused-MoE GEMM (one expert's `in_dim x out_dim`) over `tokens` tokens (seconds).

    The roofline of `linear_time` with the weights of the experts the batch touches
    (`experts_touched`) and `tokens * top_k` routed rows: a decode step of a few sequences reads
    a few experts, a long prefill chunk reads them all. With one expert and top-1 it equals
    `linear_time`.
    """
    rows = tokens * top_k
    touched = experts_touched(tokens, num_experts, top_k)
    weights = touched * in_dim * out_dim
    t_mem = (weights + rows * (in_dim + out_dim)) * d / (gpu.mem_bw_bytes_s * eff.linear_mem)
    # each touched expert's GEMM pads its own share of the rows to whole tiles
    padded = touched * gemm_rows(rows / touched)
    t_comp = 2.0 * in_dim * out_dim * padded / (gpu.peak_flops * eff.linear_comp)
    return eff.linear_op_s + np.sqrt(t_mem * t_mem + t_comp * t_comp)


ELEMENTWISE_EFF_FIELD = {
    "add_norm": "elem_norm_mem",
    "qk_norm": "elem_norm_mem",
    "act": "elem_act_mem",
    "rope": "elem_rope_mem",
    "embedding": "elem_embed_mem",
    "norm": "elem_vidur_norm_mem",
    "add": "elem_add_mem",
    "mlp_act": "elem_vidur_act_mem",
    "attn_rope": "elem_vidur_rope_mem",
    "emb": "elem_vidur_embed_mem",
}
# Launch floors: Vidur's unfused kernels each have their own (one to several launches per
# operator); vLLM's fused kernels share `elem_op_s`.
ELEMENTWISE_FLOOR_FIELD = {
    "norm": "elem_vidur_norm_op_s",
    "add": "elem_add_op_s",
    "mlp_act": "elem_vidur_act_op_s",
    "attn_rope": "elem_vidur_rope_op_s",
    "emb": "elem_vidur_embed_op_s",
}
# Share of the L2 that keeps an elementwise kernel's operands between the kernel that wrote them
# and the one that reads them (a fixed assumption, not fitted).
ELEM_L2_SHARE = 0.5


def elementwise_time(
    op: str, bytes_per_token: float, tokens: Num, gpu: GpuSpec, eff: DeviceEfficiency
) -> Num:
    """One bandwidth-bound elementwise kernel of kind `op` over `tokens` tokens (seconds).

    The fraction `min(1, ELEM_L2_SHARE * L2 / footprint)` of its bytes is served from L2 at
    `elem_l2_gain` times the DRAM rate: a small batch's activations are still in L2 from the
    kernel that wrote them (the 128 MB L2 of an RTX PRO 6000 holds every profiled batch, the
    40-50 MB of an A100 / H100 only the smaller ones), so the same kernel looks up to `gain`
    times faster than DRAM allows on small footprints. Its launch floor is `elem_op_s` for
    vLLM's fused kernels and the kernel's own for Vidur's (`ELEMENTWISE_FLOOR_FIELD`).
    """
    eff_mem: float = getattr(eff, ELEMENTWISE_EFF_FIELD[op])
    floor: float = getattr(eff, ELEMENTWISE_FLOOR_FIELD.get(op, "elem_op_s"))
    footprint = tokens * bytes_per_token
    hit = np.minimum(1.0, ELEM_L2_SHARE * gpu.l2_bytes / np.maximum(footprint, 1.0))
    return floor + footprint * (1.0 - hit + hit / eff.elem_l2_gain) / (gpu.mem_bw_bytes_s * eff_mem)


def decode_attention_per_token_s(
    kv_bytes_per_token: float, gpu: GpuSpec, eff: DeviceEfficiency
) -> float:
    """Seconds per context token one decode request reads, in one layer, in an all-decode step
    (split-KV decode kernel: affine in context, which `decode_affine` relies on)."""
    return kv_bytes_per_token / (gpu.mem_bw_bytes_s * eff.attn_decode_mem)


# FlashAttention-2's query tile (kBlockM) for head_dim <= 128: one CTA computes this many query
# rows, so a 1-token decode query is padded to a full tile. FA2 runs 128-row tiles on sm80 /
# sm90 parts; on the small-shared-memory parts (sm86 / sm89 / sm120: L40S, RTX PRO Blackwell) it
# picks square 64 x 64 tiles for causal attention. The RTX PRO 6000 profiles show it directly:
# prefill attention time steps with `ceil(ceil(chunk / 64) * heads / SMs)` and not with 128.
# The datasheet's `arch` says which (a calibrated or user device keeps its base GPU's arch).
ATTN_TILE_M = 128
_TILE_M_64_ARCHS = frozenset({"sm86", "sm89", "sm120"})


# How sharply same-wave GQA sharing is lost past `attn_kv_reach_bytes`: the RTX PRO 6000 profiles
# keep the full share (hit ~0.66 at 64 decodes) up to 4.6 GB of decode KV and lose half of it by
# 6.9 GB; 8 fits them better in-sample than the 4 used before (in-sample WAPE 6.5 vs 6.7 %).
KV_REACH_POWER = 8
# How sharply same-wave sharing is lost as a prefill's CTAs shift the decode waves out of step
# (`mixed_attention_time`); chosen on in-sample fit of the RTX PRO 6000 profiles (the only ones
# with attention): WAPE 5.41 % at 4, 5.42 % at 2, 5.59 % at 8.
DESYNC_POWER = 4
# The mixed attention call runs at the smooth max `(a^p + b^p)^(1/p)` of its CTA-schedule and
# DRAM bounds, slower than either where they meet (as the linear roofline's p = 2 is); chosen on
# in-sample fit of the same profiles: 5.41 % at 10, 5.42 % at 6, 5.43 % at 16, 5.46 % hard max.
MIXED_MAX_POWER = 10


def smooth_max(a: Num, b: Num) -> Num:
    """`(a^p + b^p)^(1/p)` with p = `MIXED_MAX_POWER`: the larger of two bounds, rounded where
    they are close (equal bounds cost 2^(1/p) = 7 % more than either)."""
    return (a**MIXED_MAX_POWER + b**MIXED_MAX_POWER) ** (1.0 / MIXED_MAX_POWER)


def _desync_keep(lag_bytes: Num, eff: DeviceEfficiency) -> Num:
    """Share of same-wave sibling sharing kept when sibling heads read `lag_bytes` apart."""
    return 1.0 / (1.0 + (lag_bytes / eff.attn_desync_bytes) ** DESYNC_POWER)


def attention_tile_m(gpu: GpuSpec) -> int:
    """Query rows per attention CTA on `gpu` (see `ATTN_TILE_M`)."""
    return 64 if gpu.arch in _TILE_M_64_ARCHS else ATTN_TILE_M


def attention_m_blocks(max_new_tokens: Num, tile_m: int = ATTN_TILE_M) -> Num:
    """Query tiles per (sequence, head) in a varlen launch: `ceil(max_seqlen_q / tile_m)`."""
    return np.ceil(max_new_tokens / tile_m)


def _tile_tok_s(model: ModelSpec, gpu: GpuSpec, comp: float, tile_m: int) -> float:
    """Seconds one CTA spends per key token: `4 * tile_m * hd` FLOPs at `comp` of one SM's
    share of peak."""
    return 4.0 * tile_m * model.head_dim * gpu.num_sms / (gpu.peak_flops * comp)


def prefill_attention_time(
    new: Num, prior: Num, model: ModelSpec, tp: int, gpu: GpuSpec, eff: DeviceEfficiency
) -> Num:
    """One layer's attention for one request computing `new` tokens over `prior` cached ones.

    A wave model of the causal FlashAttention grid: `ceil(new / tile_m)` query tiles per query
    head, one CTA each, one CTA per SM at a time. Each CTA streams the keys it sees, on
    average `prior + (new + tile_m) / 2` under the causal mask (capped at `prior + new`),
    after a fixed `attn_cta_s`; the waves run one after another. So a short chunk over a long
    context costs one full pass over that context per wave, not FLOPs / peak: the profiles'
    time is flat in the chunk size until the tile count passes the SM count, then jumps.
    """
    tile_m = attention_tile_m(gpu)
    heads = model.num_attention_heads / tp
    waves = np.ceil(np.ceil(new / tile_m) * heads / gpu.num_sms)
    keys = prior + np.minimum(new, (new + tile_m) / 2.0)
    cta = eff.attn_cta_s + keys * _tile_tok_s(model, gpu, eff.attn_prefill_comp, tile_m)
    return eff.attn_prefill_req_s + waves * cta


def prefill_attention_time_scalar(
    new: float, prior: float, model: ModelSpec, tp: int, gpu: GpuSpec, eff: DeviceEfficiency
) -> float:
    """`prefill_attention_time` on plain floats (same operations, same order; bit-identical)."""
    tile_m = attention_tile_m(gpu)
    heads = model.num_attention_heads / tp
    waves = float(math.ceil(float(math.ceil(new / tile_m)) * heads / gpu.num_sms))
    keys = prior + min(new, (new + tile_m) / 2.0)
    cta = eff.attn_cta_s + keys * _tile_tok_s(model, gpu, eff.attn_prefill_comp, tile_m)
    return eff.attn_prefill_req_s + waves * cta


def mixed_attention_time(
    num_decode: Num,
    decode_ctx: Num,
    prefill_s: Num,
    empty_ctas: Num,
    model: ModelSpec,
    tp: int,
    gpu: GpuSpec,
    eff: DeviceEfficiency,
    prefill_ctas: float | npt.NDArray[np.float64] = 0.0,
    prefill_keys: float | npt.NDArray[np.float64] = 0.0,
) -> Num:
    """One layer's attention kernel (launch excluded) for a step holding a prefill chunk.

    vLLM's FlashAttention backend runs the whole batch in one varlen call; its grid is
    (m-blocks of the longest query) x sequences x query heads, one CTA each, one CTA per SM at
    a time. Decodes therefore get one padded 128-row tile per *query* head (no GQA packing,
    no split-KV), and m-blocks past a sequence's query exit at once (`empty_ctas`). Two bounds,
    the larger wins:

    - CTA schedule: `ceil(n*H / SMs)` waves of decode tiles, each streaming the mean decode
      context at `attn_tile_comp` of one SM's share of peak FLOPS (`4*128*hd` FLOPs per KV
      token) after a fixed `attn_cta_s`, plus the prefill chunks' own roofline `prefill_s`,
      plus the empty CTAs spread over the SMs;
    - DRAM: unique decode KV bytes `U = K*ctx*2*hd*d`, re-read by the `G-1` sibling query heads
      of each KV head except for the hit fraction `h` = `attn_l2_reuse` x the larger of
      (a) same-wave sharing `1 - seqs/SMs` (lost within a short span of `U` around
      `attn_kv_reach_bytes`: `1 / (1 + (U / reach)^KV_REACH_POWER)`) and
      (b) L2 persistence `min(1, attn_l2_frac * L2 / one head's pass)^2` (only part of the L2
      keeps a pass: the profiles lose the sibling hits from about 0.8 x L2, not at 1 x L2);
      the prefill chunks' own time `prefill_s` adds to this bound too (their CTAs hold SMs the
      streaming decodes then lack: without it the model missed large chunks by -10..-15 %).

    Prefill CTAs shift the decode waves out of step. Sibling heads share reads only while they
    stream the same keys at the same time; an SM that ran a prefill CTA of `prefill_keys` keys
    (the longest: prior + chunk) starts its next decode CTA that many keys out of phase with
    the others, i.e. `fold(prefill_keys / mean_ctx)` of a decode pass (the distance to a whole
    number of passes: a prefill as long as the decodes shifts nothing). Between sibling reads
    the SMs then stream `lag = fold * SMs * mean_ctx * kv_head_tok` bytes; the share
    `1 / (1 + (lag / attn_desync_bytes)^DESYNC_POWER)` of same-wave sharing survives on the
    `min(1, prefill_ctas / SMs)` of SMs that ran one. (The profiles: 64 decodes over 16 k
    context take 1.85-2.2x longer once the chunk spans enough tiles over a 4-9 k prior, and
    not over a 16 k prior.)

    Both bounds hold the prefill chunks' `prefill_s`; their decode parts combine as
    `smooth_max` (p = `MIXED_MAX_POWER`).

    `decode_ctx` is the decodes' total context; `num_decode` may be 0 (prefill only);
    `prefill_ctas` is the prefill chunks' query tiles x query heads, `prefill_keys` the most keys
    one prefill CTA streams (0, 0: no shift).

    Examples:
        >>> from maserve_prefect.engines.catalog import get_efficiency, get_gpu, get_model
        >>> m, g = get_model("Qwen3-8B"), get_gpu("RTX PRO 6000")
        >>> eff = get_efficiency("RTX PRO 6000")
        >>> round(float(mixed_attention_time(0.0, 0.0, 1e-4, 0.0, m, 1, g, eff)), 9)  # prefill
        0.0001
    """
    heads = model.num_attention_heads / tp
    kv_heads = max(model.num_kv_heads / tp, 1.0)
    group = heads / kv_heads
    sms = float(gpu.num_sms)
    kv_head_tok = 2.0 * model.head_dim * model.dtype_bytes  # K + V bytes, one token, one KV head
    has_dec = num_decode > 0
    mean_ctx = np.where(has_dec, decode_ctx / np.maximum(num_decode, 1.0), 0.0)
    tile_tok_s = _tile_tok_s(model, gpu, eff.attn_tile_comp, attention_tile_m(gpu))
    waves = np.ceil(num_decode * heads / sms)
    t_sched = waves * (eff.attn_cta_s + mean_ctx * tile_tok_s) + empty_ctas * (
        eff.attn_empty_cta_s / sms
    )
    unique = kv_heads * decode_ctx * kv_head_tok
    one_pass = np.maximum(decode_ctx * kv_head_tok, 1.0)
    same_wave = np.clip(1.0 - (num_decode + 1.0) / sms, 0.0, 1.0) / (
        1.0 + (unique / eff.attn_kv_reach_bytes) ** KV_REACH_POWER
    )
    dec_keys = np.maximum(mean_ctx, 1.0)
    turns = prefill_keys / dec_keys
    lag = np.abs(turns - np.floor(turns + 0.5)) * sms * dec_keys * kv_head_tok
    shifted = np.minimum(prefill_ctas / sms, 1.0)
    same_wave = same_wave * (1.0 - shifted * (1.0 - _desync_keep(lag, eff)))
    in_l2 = np.minimum(1.0, eff.attn_l2_frac * gpu.l2_bytes / one_pass) ** 2
    hit = min(eff.attn_l2_reuse, 1.0) * np.maximum(same_wave, in_l2)
    t_dram = (
        unique
        * (1.0 + (group - 1.0) * (1.0 - hit))
        / (gpu.mem_bw_bytes_s * eff.attn_mixed_decode_mem)
    )
    return prefill_s + smooth_max(t_sched, t_dram)


def mixed_attention_time_scalar(
    num_decode: float,
    decode_ctx: float,
    prefill_s: float,
    empty_ctas: float,
    model: ModelSpec,
    tp: int,
    gpu: GpuSpec,
    eff: DeviceEfficiency,
    prefill_ctas: float = 0.0,
    prefill_keys: float = 0.0,
) -> float:
    """`mixed_attention_time` on plain floats (one simulated step): the same operations in the
    same order, without numpy's per-call cost; results are bit-identical (tested)."""
    heads = model.num_attention_heads / tp
    kv_heads = max(model.num_kv_heads / tp, 1.0)
    group = heads / kv_heads
    sms = float(gpu.num_sms)
    kv_head_tok = 2.0 * model.head_dim * model.dtype_bytes
    mean_ctx = decode_ctx / max(num_decode, 1.0) if num_decode > 0 else 0.0
    tile_tok_s = _tile_tok_s(model, gpu, eff.attn_tile_comp, attention_tile_m(gpu))
    waves = float(math.ceil(num_decode * heads / sms))
    t_sched = waves * (eff.attn_cta_s + mean_ctx * tile_tok_s) + empty_ctas * (
        eff.attn_empty_cta_s / sms
    )
    unique = kv_heads * decode_ctx * kv_head_tok
    one_pass = max(decode_ctx * kv_head_tok, 1.0)
    reach = unique / eff.attn_kv_reach_bytes
    same_wave = min(max(1.0 - (num_decode + 1.0) / sms, 0.0), 1.0) / (1.0 + reach**KV_REACH_POWER)
    dec_keys = max(mean_ctx, 1.0)
    turns = prefill_keys / dec_keys
    lag = abs(turns - math.floor(turns + 0.5)) * sms * dec_keys * kv_head_tok
    shifted = min(prefill_ctas / sms, 1.0)
    same_wave = same_wave * (1.0 - shifted * (1.0 - _desync_keep(lag, eff)))
    in_l2 = min(1.0, eff.attn_l2_frac * gpu.l2_bytes / one_pass) ** 2
    hit = min(eff.attn_l2_reuse, 1.0) * max(same_wave, in_l2)
    t_dram = (
        unique
        * (1.0 + (group - 1.0) * (1.0 - hit))
        / (gpu.mem_bw_bytes_s * eff.attn_mixed_decode_mem)
    )
    return prefill_s + smooth_max(t_sched, t_dram)


def sampler_time(num_seqs: Num, model: ModelSpec, gpu: GpuSpec, eff: DeviceEfficiency) -> Num:
    """Sampling over fp32 logits of `num_seqs` sequences (seconds)."""
    return eff.sampler_s + num_seqs * model.vocab_size * 4.0 / (
        gpu.mem_bw_bytes_s * eff.sampler_mem
    )


def allreduce_time(tokens: Num, model: ModelSpec, tp: int, gpu: GpuSpec) -> Num:
    """One ring all-reduce of the `tokens x hidden` activations across `tp` ranks (seconds).

    Not in any kernel profile we fit; the 10 us latency is NCCL's usual small-message figure.
    """
    if tp <= 1:
        return tokens * 0.0
    size = tokens * model.hidden_size * model.dtype_bytes
    return 1e-5 + 2.0 * (tp - 1) / tp * size / gpu.interconnect_bytes_s
