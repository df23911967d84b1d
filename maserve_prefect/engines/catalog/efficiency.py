"""Per-device efficiency factors: the few fitted numbers between datasheet peaks and real kernels.

One idea: the roofline model divides bytes by `bandwidth * eff` and FLOPs by `flops * eff`, and
adds per-operator launch costs; these factors are the *only* device-specific parameters, so a
device fitted on some models transfers to models it never ran (scored leave-one-model-out in
`benchmarks/step_time_wape.py`).

`DEFAULT_EFFICIENCY` is what a device without a fit gets. Its linear / elementwise factors are
the pooled fit over every device in `../shared/data/profiles` (refitted by
`benchmarks/step_time_wape.py --write`); attention and sampler factors, and those of vLLM's fused
elementwise kernels, come from the only device with vLLM profiles (RTX PRO 6000), so for other
devices they are an assumption.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from maserve_prefect.errors import ConfigError

# Keys older fits carry that the model no longer uses (read and ignored, so device files written
# by an older `maserve sim calibrate` still load): prefill attention is a CTA wave model now.
RETIRED_KEYS = frozenset({"attn_prefill_mem"})


@dataclass(frozen=True, slots=True)
class DeviceEfficiency:
    """Fraction-of-peak factors and fixed costs for one device (times in seconds).

    Examples:
        >>> DeviceEfficiency().linear_mem
        0.8
    """

    # Linear layers (QKV, O, gate/up, down, lm_head): sqrt(T_mem^2 + T_comp^2) + launch.
    linear_mem: float = 0.8
    linear_comp: float = 0.7
    linear_op_s: float = 4e-6
    # Elementwise ops, one DRAM bandwidth factor per kernel (implementations differ a lot: an
    # unfused fp32 RMSNorm reaches a third of what a fused residual add does). vLLM's kernels
    # (what the simulator runs; fitted on vLLM profiles): fused residual-add + RMSNorm (also
    # q/k-norm), SiLU-and-mul, rotary, embedding gather.
    elem_norm_mem: float = 0.5
    elem_act_mem: float = 0.5
    elem_rope_mem: float = 0.5
    elem_embed_mem: float = 0.5
    # Vidur's (Sarathi-Serve's) unfused kernels, only in Vidur profiles: RMSNorm, residual add,
    # activation, rotary, embedding.
    elem_vidur_norm_mem: float = 0.5
    elem_add_mem: float = 0.5
    elem_vidur_act_mem: float = 0.5
    elem_vidur_rope_mem: float = 0.5
    elem_vidur_embed_mem: float = 0.5
    # Launch floors: one for vLLM's fused kernels (one launch each), and one per Vidur kernel
    # (PyTorch-level operators of one to several launches: an unfused RMSNorm is pow, mean,
    # rsqrt and two multiplies).
    elem_op_s: float = 3e-6
    elem_vidur_norm_op_s: float = 3e-6
    elem_add_op_s: float = 3e-6
    elem_vidur_act_op_s: float = 3e-6
    elem_vidur_rope_op_s: float = 3e-6
    elem_vidur_embed_op_s: float = 3e-6
    # L2 bandwidth over DRAM bandwidth for the bytes of a footprint that fits in L2.
    elem_l2_gain: float = 1.5
    # Attention: one kernel call per layer, decode reads KV bytes, prefill computes FLOPs.
    attn_call_s: float = 8e-6
    attn_decode_mem: float = 0.8
    attn_decode_req_s: float = 2e-7
    # Decodes sharing the kernel with a prefill chunk run as padded 128-row query tiles, one CTA
    # per (sequence, query head), in waves over the SMs (`roofline.mixed_attention_time`):
    # DRAM efficiency of their KV reads, per-CTA fixed cost, tile throughput as a fraction of
    # one SM's share of peak FLOPS, the cost of a CTA that exits at once (an m-block past a
    # short query), the best fraction of GQA sibling heads' KV reads served from L2, and the
    # KV footprint (bytes) beyond which same-wave sibling heads stop sharing reads.
    attn_mixed_decode_mem: float = 0.8
    attn_cta_s: float = 5e-6
    attn_tile_comp: float = 1.0
    attn_empty_cta_s: float = 1e-6
    attn_l2_reuse: float = 0.95
    attn_kv_reach_bytes: float = 7.5e9
    # Fraction of the L2 that keeps one query head's KV pass for its GQA siblings.
    attn_l2_frac: float = 0.75
    # Bytes the SMs stream between two sibling heads' reads at which half the same-wave sharing
    # is lost, once a prefill's CTAs have shifted the decode waves out of step.
    attn_desync_bytes: float = 2e8
    # Prefill CTAs (causal tiles) as a fraction of one SM's share of peak; per-request cost.
    attn_prefill_comp: float = 0.5
    attn_prefill_req_s: float = 1e-6
    # Sampler: per-step launch plus fp32 logits traffic per sequence.
    sampler_mem: float = 0.05
    sampler_s: float = 2e-5
    # Host-side scheduling / input preparation per engine step (not in kernel profiles; vLLM v1
    # with async output processing measures a few hundred microseconds on small batches).
    step_s: float = 3e-4

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def updated(self, values: dict[str, float]) -> DeviceEfficiency:
        return replace(self, **values)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> DeviceEfficiency:
        """Build from a mapping; unknown keys or non-positive values raise `ConfigError`."""
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k not in RETIRED_KEYS}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"{where}: unknown efficiency keys {unknown}; expected a subset of {sorted(known)}"
            )
        values: dict[str, float] = {}
        for key, raw in data.items():
            try:
                value = float(raw)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{where}: efficiency {key}={raw!r} is not a number") from exc
            if not value > 0:
                raise ConfigError(f"{where}: efficiency {key}={value} must be > 0")
            values[key] = value
        return cls(**values)


DEFAULT_EFFICIENCY = DeviceEfficiency()
