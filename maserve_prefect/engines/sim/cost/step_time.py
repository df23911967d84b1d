"""The roofline step-time model: what one vLLM-v1 engine step costs, by operator group.

One idea: a step's cost is a sum of per-operator rooflines (`engines/sim/cost/roofline.py`) over the
step's batch — M batched new tokens for linear and elementwise layers, S scheduled sequences for
lm_head and the sampler, each request's own shape for attention — times the layer count, plus
fixed per-step, per-layer and per-request overheads. Only the efficiency factors are
device-specific, and they come from a fit to measured kernel profiles (`calibrate.py`).

Where the seam's four fields get which cost:

- `linear_s`: QKV, O, gate/up, down GEMMs per layer (+ TP all-reduces when tp > 1); for a
  mixture-of-experts model the router plus gate/up and down over the experts the step's tokens
  touch (`roofline.moe_linear_time`);
- `attention_s`: all-decode steps: decode KV reads (context tokens only); steps with a prefill
  chunk: the tile/wave model of the one varlen FlashAttention call (`mixed_attention_time`);
- `lm_head_s`: the vocab GEMM over S sequences plus the sampler;
- `overhead_s`: host step overhead, embedding, final norm, the per-layer elementwise kernels,
  the per-layer attention kernel launch and, on all-decode steps, the per-decode-request
  attention cost.

That split makes an all-decode step exactly `base(S) + per_token * total_context`, which is what
`decode_affine` returns (the simulator fast-forwards decode runs with it).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from maserve_prefect.engines.catalog.devices import get_device
from maserve_prefect.engines.catalog.efficiency import DeviceEfficiency
from maserve_prefect.engines.catalog.gpus import GpuSpec
from maserve_prefect.engines.catalog.models import ModelSpec, get_model
from maserve_prefect.engines.sim.cost.roofline import (
    VLLM_LAYER_ELEMENTWISE,
    allreduce_time,
    attention_tile_m,
    decode_attention_per_token_s,
    elementwise_bytes_per_token,
    elementwise_time,
    linear_time,
    mixed_attention_time_scalar,
    moe_linear_time,
    prefill_attention_time_scalar,
    sampler_time,
)
from maserve_prefect.engines.sim.cost.step_cost import DecodeAffine, ScheduledChunk, StepCost
from maserve_prefect.errors import ConfigError

_MAX_SINGLE_CACHE = 1 << 16  # one-chunk step costs kept (cleared when full)


class RooflineStepModel:
    """A `StepCostModel` for one model on one device at one tensor-parallel degree.

    Examples:
        >>> from maserve_prefect.engines.sim.cost.step_cost import ScheduledChunk
        >>> m = make_step_model("Qwen3-8B", "H100")
        >>> cost = m.step_cost([ScheduledChunk(1, 1000), ScheduledChunk(512, 0)])
        >>> cost.total_s > m.decode_affine(1).step_s(1000)
        True
    """

    __slots__ = (
        "_affine_cache",
        "_elem_layer",
        "_elem_step",
        "_experts",
        "_gemms",
        "_head_cache",
        "_kv_tok_s",
        "_linear_cache",
        "_lm_head",
        "_overhead_cache",
        "_single_cache",
        "_tile_m",
        "eff",
        "gpu",
        "model",
        "tp",
    )

    def __init__(
        self, model: ModelSpec, gpu: GpuSpec, efficiency: DeviceEfficiency, tp: int = 1
    ) -> None:
        inter = model.expert_intermediate_size
        if tp < 1 or model.num_attention_heads % tp or inter % tp:
            raise ConfigError(
                f"tensor-parallel degree {tp} does not divide {model.name}'s "
                f"{model.num_attention_heads} heads / {inter} intermediate size"
            )
        self.model = model
        self.gpu = gpu
        self.eff = efficiency
        self.tp = tp
        # dense: qkv, o, gate_up, down; MoE: qkv, o, router here, the experts in `_experts`
        dense = model.layer_gemms(tp) if not model.is_moe else model.attention_gemms(tp)
        router = model.router_gemm()
        dense += (router,) if router is not None else ()
        self._gemms = tuple((g.in_dim, g.out_dim) for g in dense)
        self._experts = (
            tuple((g.in_dim, g.out_dim) for g in model.expert_gemms(tp)) if model.is_moe else ()
        )
        head = model.lm_head_gemm(tp)
        self._lm_head = (head.in_dim, head.out_dim)
        layer_ops = VLLM_LAYER_ELEMENTWISE + (("qk_norm",) if model.qk_norm else ())
        self._elem_layer = tuple(
            (op, elementwise_bytes_per_token(model, op, tp)) for op in layer_ops
        )
        self._elem_step = tuple(
            (op, elementwise_bytes_per_token(model, op, tp)) for op in ("embedding", "add_norm")
        )
        kv_tok = model.kv_bytes_per_token_per_layer(tp)
        self._kv_tok_s = decode_attention_per_token_s(kv_tok, gpu, efficiency)
        self._tile_m = attention_tile_m(gpu)
        self._affine_cache: dict[int, DecodeAffine] = {}
        # the parts are pure functions of small ints that recur from step to step
        self._linear_cache: dict[int, float] = {}
        self._head_cache: dict[int, float] = {}
        self._overhead_cache: dict[tuple[int, int], float] = {}
        # one-chunk steps (a prompt's chunks while nothing else runs) recur across requests:
        # every prompt without a prefix hit has the same chunk sequence
        self._single_cache: dict[ScheduledChunk, StepCost] = {}

    # --- parts ---------------------------------------------------------------------------------
    def _linear_s(self, tokens: int) -> float:
        cached = self._linear_cache.get(tokens)
        if cached is None:
            cached = self._linear_cache[tokens] = self._linear_uncached(tokens)
        return cached

    def _linear_uncached(self, tokens: int) -> float:
        d, gpu, eff = self.model.dtype_bytes, self.gpu, self.eff
        per_layer = sum(linear_time(i, o, float(tokens), d, gpu, eff) for i, o in self._gemms)
        m = self.model
        per_layer += sum(
            moe_linear_time(i, o, float(tokens), m.num_experts, m.num_experts_per_tok, d, gpu, eff)
            for i, o in self._experts
        )
        per_layer += 2.0 * allreduce_time(float(tokens), self.model, self.tp, gpu)
        return float(self.model.num_layers * per_layer)

    def _lm_head_s(self, num_seqs: int) -> float:
        cached = self._head_cache.get(num_seqs)
        if cached is None:
            cached = self._head_cache[num_seqs] = self._lm_head_uncached(num_seqs)
        return cached

    def _lm_head_uncached(self, num_seqs: int) -> float:
        i, o = self._lm_head
        n = float(num_seqs)
        head = linear_time(i, o, n, self.model.dtype_bytes, self.gpu, self.eff)
        return float(head + sampler_time(n, self.model, self.gpu, self.eff))

    def _overhead_s(self, tokens: int, num_decode: int) -> float:
        key = (tokens, num_decode)
        cached = self._overhead_cache.get(key)
        if cached is None:
            cached = self._overhead_cache[key] = self._overhead_uncached(tokens, num_decode)
        return cached

    def _overhead_uncached(self, tokens: int, num_decode: int) -> float:
        gpu, eff, m = self.gpu, self.eff, float(tokens)
        per_layer = sum(elementwise_time(op, b, m, gpu, eff) for op, b in self._elem_layer)
        per_layer += eff.attn_call_s + num_decode * eff.attn_decode_req_s
        per_step = sum(elementwise_time(op, b, m, gpu, eff) for op, b in self._elem_step)
        return float(eff.step_s + per_step + self.model.num_layers * per_layer)

    # --- the seam --------------------------------------------------------------------------------
    def step_cost(self, chunks: Sequence[ScheduledChunk]) -> StepCost:
        """Cost of one step computing `chunks` (one per scheduled request)."""
        if len(chunks) == 1:
            cost = self._single_cache.get(chunks[0])
            if cost is None:
                if len(self._single_cache) >= _MAX_SINGLE_CACHE:
                    self._single_cache.clear()
                cost = self._single_cache[chunks[0]] = self._step_cost(chunks)
            return cost
        return self._step_cost(chunks)

    def _step_cost(self, chunks: Sequence[ScheduledChunk]) -> StepCost:
        if not chunks:
            return StepCost(0.0, 0.0, 0.0, 0.0)
        tokens = 0
        num_decode = 0
        decode_ctx = 0
        max_new = 1
        prefill_s = 0.0
        for chunk in chunks:
            new = chunk.num_new_tokens
            if new < 1 or chunk.num_context_tokens < 0:
                raise ConfigError(f"invalid scheduled chunk {chunk}: need new >= 1, context >= 0")
            tokens += new
            max_new = max(max_new, new)
            if new == 1:
                num_decode += 1
                decode_ctx += chunk.num_context_tokens
            else:
                prefill_s += prefill_attention_time_scalar(
                    float(new),
                    float(chunk.num_context_tokens),
                    self.model,
                    self.tp,
                    self.gpu,
                    self.eff,
                )
        if num_decode == len(chunks):
            per_layer = self._kv_tok_s * decode_ctx
        else:
            per_layer = self._mixed_attention_s(chunks, num_decode, decode_ctx, max_new, prefill_s)
        return StepCost(
            linear_s=self._linear_s(tokens),
            attention_s=float(self.model.num_layers * per_layer),
            lm_head_s=self._lm_head_s(len(chunks)),
            # the per-decode attention cost belongs to the split-KV decode kernel only
            overhead_s=self._overhead_s(tokens, num_decode if num_decode == len(chunks) else 0),
        )

    def _mixed_attention_s(
        self,
        chunks: Sequence[ScheduledChunk],
        num_decode: int,
        decode_ctx: int,
        max_new: int,
        prefill_s: float,
    ) -> float:
        """One layer's varlen attention call for a step that holds a prefill chunk."""
        # query tiles `ceil(new / tile_m)` (`attention_m_blocks`), as exact floats
        tile_m = self._tile_m
        blocks = float(-(-max_new // tile_m))
        own_blocks = float(sum(-(-c.num_new_tokens // tile_m) for c in chunks))
        heads = self.model.num_attention_heads / self.tp
        empty = heads * (blocks * len(chunks) - own_blocks)
        # the prefill chunks' CTAs and the most keys one of them streams (prior + chunk)
        prefills = [c for c in chunks if c.num_new_tokens > 1]
        prefill_ctas = heads * float(sum(-(-c.num_new_tokens // tile_m) for c in prefills))
        prefill_keys = float(max(c.num_context_tokens + c.num_new_tokens for c in prefills))
        return float(
            mixed_attention_time_scalar(
                float(num_decode),
                float(decode_ctx),
                prefill_s,
                empty,
                self.model,
                self.tp,
                self.gpu,
                self.eff,
                prefill_ctas,
                prefill_keys,
            )
        )

    def decode_affine(self, num_seqs: int) -> DecodeAffine:
        """Exact coefficients of an all-decode step of `num_seqs` sequences."""
        cached = self._affine_cache.get(num_seqs)
        if cached is not None:
            return cached
        if num_seqs < 1:
            raise ConfigError(f"decode_affine needs num_seqs >= 1, got {num_seqs}")
        affine = DecodeAffine(
            num_seqs=num_seqs,
            linear_s=self._linear_s(num_seqs),
            lm_head_s=self._lm_head_s(num_seqs),
            overhead_s=self._overhead_s(num_seqs, num_seqs),
            attention_per_context_token_s=self.model.num_layers * self._kv_tok_s,
        )
        self._affine_cache[num_seqs] = affine
        return affine


def make_step_model(model_name: str, gpu_name: str, tp: int = 1) -> RooflineStepModel:
    """Build the step model for a catalogued model on a catalogued (or calibrated) device.

    The device's efficiencies come from its user entry, else the shipped fit, else the shipped
    pooled default (see `engines/catalog/devices.py`).

    Examples:
        >>> make_step_model("qwen3-0.6b", "A100-40GB").decode_affine(8).num_seqs
        8
    """
    device = get_device(gpu_name)
    return _shared_step_model(get_model(model_name), device.gpu, device.efficiency, tp)


@lru_cache(maxsize=64)
def _shared_step_model(
    model: ModelSpec, gpu: GpuSpec, efficiency: DeviceEfficiency, tp: int
) -> RooflineStepModel:
    """One step model per distinct (frozen) spec: every replica of a deployment shares its
    memo caches (the model is a pure function of its specs)."""
    return RooflineStepModel(model, gpu, efficiency, tp)
