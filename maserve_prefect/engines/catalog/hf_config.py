"""Read a `ModelSpec` from a Hugging Face `config.json` mapping (a local file; nothing is fetched).

One idea: each supported `model_type` differs from the Llama layout in a few known ways (qkv
bias, QK-norm, tied embeddings, a non-gated MLP, experts), listed in `_FAMILIES`; everything else
is read from the standard config keys. A key that is missing or not a positive integer is a
one-line `ConfigError` naming the file and the key. Layouts the step model does not cover
(shared experts, models mixing dense and MoE layers, quantized weights) are refused, never
guessed. A sliding window (Mistral, Gemma 2) is ignored: every layer is charged the full KV
cache, an upper bound on memory and attention time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maserve_prefect.engines.catalog.model_spec import ModelSpec
from maserve_prefect.errors import ConfigError


@dataclass(frozen=True, slots=True)
class _Family:
    tied_default: bool = False  # tie_word_embeddings when the config omits it
    qkv_bias: bool = False
    qk_norm: bool = False
    gated_mlp: bool = True
    moe: bool = False


_FAMILIES: dict[str, _Family] = {
    "llama": _Family(),
    "mistral": _Family(),
    "internlm": _Family(),
    "internlm2": _Family(),
    "qwen2": _Family(qkv_bias=True),
    "qwen": _Family(qkv_bias=True),
    "qwen3": _Family(qk_norm=True),
    "gemma": _Family(tied_default=True),
    "gemma2": _Family(tied_default=True),
    "phi": _Family(qkv_bias=True, gated_mlp=False),
    "phi3": _Family(),
    "mixtral": _Family(moe=True),
    "qwen3_moe": _Family(qk_norm=True, moe=True),
}


def supported_model_types() -> list[str]:
    return sorted(_FAMILIES)


def _int(cfg: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    raw = cfg.get(key)
    if raw is None:  # absent or null (as some configs write head_dim)
        raw = default
    if raw is None:
        raise ConfigError(f"{where}: missing {key!r}")
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise ConfigError(f"{where}: {key}={raw!r} must be a positive integer")
    return raw


def spec_from_hf_config(
    cfg: Any, name: str, where: str, aliases: tuple[str, ...] = ()
) -> ModelSpec:
    """Build a `ModelSpec` from a parsed `config.json`.

    Raises:
        ConfigError: unsupported `model_type`, a missing / bad key, or a layout not modelled.

    Examples:
        >>> cfg = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
        ...        "num_attention_heads": 32, "num_key_value_heads": 8,
        ...        "intermediate_size": 14336, "vocab_size": 128256,
        ...        "max_position_embeddings": 8192}
        >>> spec_from_hf_config(cfg, "llama3-8b", "config.json").kv_bytes_per_token
        131072
    """
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: expected a JSON object (a Hugging Face config.json)")
    model_type = cfg.get("model_type")
    family = _FAMILIES.get(str(model_type))
    if family is None:
        raise ConfigError(
            f"{where}: model_type {model_type!r} is not supported; supported: "
            f"{', '.join(supported_model_types())}"
        )
    if cfg.get("quantization_config"):
        raise ConfigError(
            f"{where}: quantized checkpoints are not modelled (weights and GEMMs are 16-bit); "
            "use the unquantized model's config.json"
        )
    if "text_config" in cfg:
        raise ConfigError(f"{where}: multimodal configs (text_config) are not supported")
    hidden = _int(cfg, "hidden_size", where)
    heads = _int(cfg, "num_attention_heads", where)
    kv_heads = _int(cfg, "num_key_value_heads", where, heads)
    head_dim = _int(cfg, "head_dim", where, hidden // heads if hidden % heads == 0 else None)
    if heads % kv_heads:
        raise ConfigError(f"{where}: num_attention_heads={heads} not a multiple of kv={kv_heads}")
    inter = _int(cfg, "intermediate_size", where)
    if model_type == "qwen":  # Qwen (v1) halves its intermediate_size into the two MLP halves
        inter //= 2
    num_experts = per_tok = moe_inter = 0
    if family.moe:
        experts_key = "num_local_experts" if model_type == "mixtral" else "num_experts"
        num_experts = _int(cfg, experts_key, where)
        per_tok = _int(cfg, "num_experts_per_tok", where)
        if per_tok > num_experts:
            raise ConfigError(f"{where}: num_experts_per_tok={per_tok} > {num_experts} experts")
        if model_type == "qwen3_moe":
            moe_inter = _int(cfg, "moe_intermediate_size", where)
            if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
                raise ConfigError(
                    f"{where}: mixed dense / MoE layers (mlp_only_layers, decoder_sparse_step) "
                    "are not modelled"
                )
    elif cfg.get("num_experts") or cfg.get("num_local_experts"):
        raise ConfigError(f"{where}: model_type {model_type!r} with experts is not modelled")
    if cfg.get("shared_expert_intermediate_size"):
        raise ConfigError(f"{where}: shared experts are not modelled")
    tied = cfg.get("tie_word_embeddings", family.tied_default)
    has_max_pos = cfg.get("max_position_embeddings") is not None
    max_pos = _int(cfg, "max_position_embeddings", where) if has_max_pos else 0
    bias_key = "bias" if model_type == "internlm" else "attention_bias"
    bias = bool(cfg.get(bias_key, family.qkv_bias))
    return ModelSpec(
        name=name,
        hidden_size=hidden,
        num_layers=_int(cfg, "num_hidden_layers", where),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=_int(cfg, "vocab_size", where),
        tie_word_embeddings=bool(tied),
        max_position_embeddings=max_pos,
        gated_mlp=family.gated_mlp,
        qk_norm=family.qk_norm,
        attention_bias=bias,
        aliases=aliases,
        num_experts=num_experts,
        num_experts_per_tok=per_tok,
        moe_intermediate_size=moe_inter,
    )


def load_hf_config(path: Path) -> dict[str, Any]:
    """Parse a local `config.json`.

    Raises:
        ConfigError: unreadable or not JSON (one line, with the line number).
    """
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a JSON object (a Hugging Face config.json)")
    return doc
