"""Model catalog: the architecture numbers a step-time or memory model needs, nothing else.

One idea: every cost the simulator charges is derived from a handful of config numbers (hidden
size, layers, heads, head_dim, intermediate size, vocab), so a `ModelSpec` holds exactly those
and derives parameter counts, weight bytes, KV bytes per token and the per-layer GEMM shapes
(sharded per tensor-parallel rank, as vLLM shards them: QKV / gate-up / lm_head by output
columns, O / down by input rows).

Sources (HF `config.json` of each repository, fields copied verbatim):
- Qwen/Qwen3-{0.6B,1.7B,4B,8B,14B,32B}: all use head_dim 128, 8 KV heads, QK-norm, no attention
  bias; 0.6B, 1.7B and 4B tie the word embeddings, 8B/14B/32B do not. (Cross-checked against the
  LLMServingSim Qwen3-32B `meta.yaml`, whose TP2 `hf_overrides` are exactly half of 25600 / 64 /
  8 / 151936.)
- meta-llama/Llama-3.1-8B, Meta-Llama-3-8B, Llama-2-7b-hf, codellama/CodeLlama-34b-Instruct-hf,
  microsoft/phi-2, internlm/internlm-20b: the shapes also appear in the Vidur profile columns
  (`n_head`, `n_kv_head`, `n_embd`, `n_expanded_embd`, `use_gated_mlp`).
"""

from __future__ import annotations

from dataclasses import dataclass

from maserve_prefect.errors import ConfigError


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
        >>> spec = get_model("qwen3-8b")
        >>> spec.kv_bytes_per_token
        147456
        >>> round(spec.weight_bytes / 1e9, 1)
        16.4
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

    # --- per-rank shapes -------------------------------------------------------------------
    def layer_gemms(self, tp: int = 1) -> tuple[GemmShape, ...]:
        """The four linear operators of one layer on one of `tp` ranks."""
        q_out = self.num_attention_heads * self.head_dim
        kv_out = 2 * self.num_kv_heads * self.head_dim
        up_mult = 2 if self.gated_mlp else 1
        return (
            GemmShape("qkv", self.hidden_size, (q_out + kv_out) // tp),
            GemmShape("o", q_out // tp, self.hidden_size),
            GemmShape("gate_up", self.hidden_size, up_mult * self.intermediate_size // tp),
            GemmShape("down", self.intermediate_size // tp, self.hidden_size),
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

    @property
    def params_per_layer(self) -> int:
        gemm = sum(g.in_dim * g.out_dim for g in self.layer_gemms(1))
        norms = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        bias = 0
        if self.attention_bias:
            bias = (self.num_attention_heads + 2 * self.num_kv_heads) * self.head_dim
        return gemm + norms + bias

    @property
    def num_params(self) -> int:
        """Total parameter count (embedding, layers, final norm, lm_head unless tied)."""
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return embed + self.num_layers * self.params_per_layer + self.hidden_size + head

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    def weight_bytes_per_rank(self, tp: int = 1) -> int:
        """Weight bytes one of `tp` ranks holds (sharded evenly; norms are replicated and tiny)."""
        return -(-self.weight_bytes // tp)


def _qwen3(name: str, hidden: int, layers: int, heads: int, inter: int, tied: bool) -> ModelSpec:
    # Qwen3 dense configs share head_dim=128, num_key_value_heads=8, vocab 151936,
    # max_position_embeddings=40960, qk-norm and no attention bias.
    return ModelSpec(
        name=name,
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=inter,
        vocab_size=151936,
        tie_word_embeddings=tied,
        max_position_embeddings=40960,
        qk_norm=True,
        aliases=(f"Qwen/{name}",),
    )


def _llama(
    name: str,
    hidden: int,
    layers: int,
    heads: int,
    kv: int,
    inter: int,
    vocab: int,
    max_pos: int,
    aliases: tuple[str, ...],
) -> ModelSpec:
    return ModelSpec(
        name=name,
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv,
        head_dim=hidden // heads,
        intermediate_size=inter,
        vocab_size=vocab,
        tie_word_embeddings=False,
        max_position_embeddings=max_pos,
        aliases=aliases,
    )


MODELS: tuple[ModelSpec, ...] = (
    _qwen3("Qwen3-0.6B", 1024, 28, 16, 3072, tied=True),
    _qwen3("Qwen3-1.7B", 2048, 28, 16, 6144, tied=True),
    _qwen3("Qwen3-4B", 2560, 36, 32, 9728, tied=True),
    _qwen3("Qwen3-8B", 4096, 36, 32, 12288, tied=False),
    _qwen3("Qwen3-14B", 5120, 40, 40, 17408, tied=False),
    _qwen3("Qwen3-32B", 5120, 64, 64, 25600, tied=False),
    _llama("Llama-3.1-8B", 4096, 32, 32, 8, 14336, 128256, 131072, ("meta-llama/Llama-3.1-8B",)),
    _llama(
        "Meta-Llama-3-8B", 4096, 32, 32, 8, 14336, 128256, 8192, ("meta-llama/Meta-Llama-3-8B",)
    ),
    _llama(
        "Llama-2-7B",
        4096,
        32,
        32,
        32,
        11008,
        32000,
        4096,
        ("Llama-2-7b-hf", "meta-llama/Llama-2-7b-hf"),
    ),
    _llama(
        "CodeLlama-34B",
        8192,
        48,
        64,
        8,
        22016,
        32000,
        16384,
        ("CodeLlama-34b-Instruct-hf", "codellama/CodeLlama-34b-Instruct-hf"),
    ),
    _llama(
        "InternLM-20B",
        5120,
        60,
        40,
        40,
        13824,
        103168,
        4096,
        ("internlm-20b", "internlm/internlm-20b"),
    ),
    ModelSpec(
        name="Phi-2",
        hidden_size=2560,
        num_layers=32,
        num_attention_heads=32,
        num_kv_heads=32,
        head_dim=80,
        intermediate_size=10240,
        vocab_size=51200,
        tie_word_embeddings=False,
        max_position_embeddings=2048,
        gated_mlp=False,
        attention_bias=True,
        aliases=("microsoft/phi-2",),
    ),
)


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


_BY_KEY: dict[str, ModelSpec] = {}
for _spec in MODELS:
    for _alias in (_spec.name, *_spec.aliases):
        if _BY_KEY.get(_key(_alias), _spec) is not _spec:
            raise RuntimeError(f"duplicate model alias {_alias!r} in the catalog")
        _BY_KEY[_key(_alias)] = _spec


def list_models() -> list[str]:
    """Canonical names of every catalogued model."""
    return [m.name for m in MODELS]


def get_model(name: str) -> ModelSpec:
    """Look a model up by name or alias, case-insensitively.

    Raises:
        ConfigError: the name is unknown; the message lists the known names.

    Examples:
        >>> get_model("Qwen/Qwen3-0.6B").tie_word_embeddings
        True
    """
    spec = _BY_KEY.get(_key(name))
    if spec is None:
        raise ConfigError(
            f"unknown model {name!r}; known models: {', '.join(list_models())}. "
            "Add a ModelSpec to maserve_prefect/engines/catalog/models.py for a new one."
        )
    return spec
