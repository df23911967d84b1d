"""`ModelSpec`: the architecture numbers a step-time or memory model needs, nothing else.

One idea: every cost the simulator charges is derived from a handful of config numbers (hidden
size, layers, heads, head_dim, intermediate size, vocab, experts), so a `ModelSpec` holds exactly
those and derives parameter counts, weight bytes, KV bytes per token and the per-layer GEMM
shapes (sharded per tensor-parallel rank, as vLLM shards them: QKV / gate-up / lm_head by output
columns, O / down by input rows).

Mixture-of-experts layers (Mixtral, Qwen3-MoE): every layer's MLP is `num_experts` experts of
width `moe_intermediate_size`, each token routed to `num_experts_per_tok` of them. Memory holds
all experts (`num_params`, `weight_bytes`); compute is the active ones (`layer_gemms` shows the
MLP at its per-token active width, `k * I_e`); the weights a step *reads* depend on how many
distinct experts its tokens touch (`roofline.moe_linear_time`, from `expert_gemms`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GemmShape:
    """One linear operator on one rank: `in_dim x out_dim` weights applied to each token."""

    name: str
    in_dim: int
    out_dim: int

    def weight_bytes(self, dtype_bytes: int) -> int:
        return self.in_dim * self.out_dim * dtype_bytes

    @property
    def flops_per_token(self) -> int:
        return 2 * self.in_dim * self.out_dim


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's serving-relevant architecture.

    Examples:
        >>> from maserve_prefect.engines.catalog.models import get_model
        >>> spec = get_model("qwen3-8b")
        >>> spec.kv_bytes_per_token
        147456
        >>> round(spec.weight_bytes / 1e9, 1)
        16.4
        >>> moe = get_model("Qwen3-30B-A3B")
        >>> round(moe.weight_bytes / 1e9, 1), round(moe.active_params / 1e9, 2)
        (61.1, 3.35)
    """

    name: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    dtype_bytes: int = 2
    gated_mlp: bool = True
    qk_norm: bool = False
    attention_bias: bool = False
    aliases: tuple[str, ...] = ()
    # Mixture of experts (0 = dense): experts per layer, experts per token, one expert's width
    # (0 = `intermediate_size`, as Mixtral's config has it).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0

    # --- MLP widths -----------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def expert_intermediate_size(self) -> int:
        """One expert's MLP width (the dense MLP's width for a dense model)."""
        if self.is_moe and self.moe_intermediate_size:
            return self.moe_intermediate_size
        return self.intermediate_size

    @property
    def active_intermediate_size(self) -> int:
        """MLP width one token computes through: `k * I_e` for MoE, `I` for dense."""
        if self.is_moe:
            return self.num_experts_per_tok * self.expert_intermediate_size
        return self.intermediate_size

    # --- per-rank shapes -------------------------------------------------------------------
    def attention_gemms(self, tp: int = 1) -> tuple[GemmShape, ...]:
        """QKV and O projections of one layer on one of `tp` ranks."""
        q_out = self.num_attention_heads * self.head_dim
        kv_out = 2 * self.num_kv_heads * self.head_dim
        return (
            GemmShape("qkv", self.hidden_size, (q_out + kv_out) // tp),
            GemmShape("o", q_out // tp, self.hidden_size),
        )

    def expert_gemms(self, tp: int = 1) -> tuple[GemmShape, ...]:
        """gate/up and down of ONE expert (or of the dense MLP) on one of `tp` ranks."""
        inter = self.expert_intermediate_size
        up_mult = 2 if self.gated_mlp else 1
        return (
            GemmShape("gate_up", self.hidden_size, up_mult * inter // tp),
            GemmShape("down", inter // tp, self.hidden_size),
        )

    def router_gemm(self) -> GemmShape | None:
        """The MoE router (replicated on every rank), or None for a dense model."""
        return GemmShape("router", self.hidden_size, self.num_experts) if self.is_moe else None

    def layer_gemms(self, tp: int = 1) -> tuple[GemmShape, ...]:
        """The linear operators of one layer on one of `tp` ranks, at their per-token compute:
        qkv, o, gate_up, down (MoE: the MLP at its active width `k * I_e`, plus the router)."""
        if not self.is_moe:
            return self.attention_gemms(tp) + self.expert_gemms(tp)
        active = self.active_intermediate_size
        up_mult = 2 if self.gated_mlp else 1
        router = self.router_gemm()
        assert router is not None
        return (
            *self.attention_gemms(tp),
            router,
            GemmShape("gate_up", self.hidden_size, up_mult * active // tp),
            GemmShape("down", active // tp, self.hidden_size),
        )

    def lm_head_gemm(self, tp: int = 1) -> GemmShape:
        """The vocabulary projection on one rank (vLLM shards the vocab across ranks)."""
        return GemmShape("lm_head", self.hidden_size, self.vocab_size // tp)

    def kv_bytes_per_token_per_layer(self, tp: int = 1) -> int:
        """K and V bytes one token adds to one layer's cache on one rank."""
        kv_heads = max(1, self.num_kv_heads // tp)
        return 2 * kv_heads * self.head_dim * self.dtype_bytes

    # --- whole-model figures ----------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        """K and V bytes one token adds to the cache across all layers (unsharded)."""
        return self.num_layers * self.kv_bytes_per_token_per_layer(1)

    def _layer_extras(self) -> int:
        norms = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        bias = 0
        if self.attention_bias:
            bias = (self.num_attention_heads + 2 * self.num_kv_heads) * self.head_dim
        return norms + bias

    @property
    def params_per_layer(self) -> int:
        """Parameters one layer holds (MoE: every expert, plus the router)."""
        attn = sum(g.in_dim * g.out_dim for g in self.attention_gemms(1))
        mlp = sum(g.in_dim * g.out_dim for g in self.expert_gemms(1))
        if self.is_moe:
            mlp = self.num_experts * mlp + self.hidden_size * self.num_experts
        return attn + mlp + self._layer_extras()

    @property
    def active_params_per_layer(self) -> int:
        """Parameters one token computes through in one layer (= `params_per_layer` if dense)."""
        return sum(g.in_dim * g.out_dim for g in self.layer_gemms(1)) + self._layer_extras()

    def _total(self, per_layer: int) -> int:
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return embed + self.num_layers * per_layer + self.hidden_size + head

    @property
    def num_params(self) -> int:
        """Total parameter count (embedding, layers, final norm, lm_head unless tied)."""
        return self._total(self.params_per_layer)

    @property
    def active_params(self) -> int:
        """Parameters one token computes through (MoE: routed experts only)."""
        return self._total(self.active_params_per_layer)

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    def weight_bytes_per_rank(self, tp: int = 1) -> int:
        """Weight bytes one of `tp` ranks holds (sharded evenly; norms are replicated and tiny)."""
        return -(-self.weight_bytes // tp)
