"""Small Hugging Face `config.json` fixtures, written from the public architectures' published
numbers (each repository's config.json), plus the parameter counts their model cards state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LLAMA_2_70B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
    "intermediate_size": 28672, "vocab_size": 32000, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05, "torch_dtype": "float16", "tie_word_embeddings": False,
}  # fmt: skip
LLAMA_3_70B: dict[str, Any] = {
    **LLAMA_2_70B, "vocab_size": 128256, "max_position_embeddings": 8192,
    "rope_theta": 500000.0, "torch_dtype": "bfloat16",
}  # fmt: skip
QWEN25_72B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 8192,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
    "intermediate_size": 29568, "vocab_size": 152064, "max_position_embeddings": 32768,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}  # fmt: skip
QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "norm_topk_prob": True, "vocab_size": 151936,
    "max_position_embeddings": 40960, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}  # fmt: skip
MIXTRAL_8X7B: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2,
    "vocab_size": 32000, "max_position_embeddings": 32768, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}  # fmt: skip
MISTRAL_7B: dict[str, Any] = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 32768,
    "sliding_window": 4096, "tie_word_embeddings": False,
}  # fmt: skip
GEMMA_7B: dict[str, Any] = {
    "architectures": ["GemmaForCausalLM"], "model_type": "gemma", "hidden_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
    "head_dim": 256, "intermediate_size": 24576, "vocab_size": 256000,
    "max_position_embeddings": 8192, "hidden_act": "gelu",
}  # fmt: skip
PHI_3_MINI: dict[str, Any] = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    "intermediate_size": 8192, "vocab_size": 32064, "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}  # fmt: skip
QWEN25_7B: dict[str, Any] = {
    **QWEN25_72B, "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "intermediate_size": 18944,
}  # fmt: skip

# (fixture, shipped catalog name, total / active parameters in billions as the model cards
# state them, rounded as the cards round)
PUBLISHED: dict[str, tuple[dict[str, Any], str, float, float]] = {
    "llama-2-70b": (LLAMA_2_70B, "Llama-2-70B", 69.0, 69.0),
    "llama-3-70b": (LLAMA_3_70B, "Llama-3-70B", 70.6, 70.6),
    "qwen2.5-72b": (QWEN25_72B, "Qwen2.5-72B", 72.7, 72.7),
    "qwen2.5-7b": (QWEN25_7B, "Qwen2.5-7B", 7.61, 7.61),
    "qwen3-30b-a3b": (QWEN3_30B_A3B, "Qwen3-30B-A3B", 30.5, 3.3),
    "mixtral-8x7b": (MIXTRAL_8X7B, "Mixtral-8x7B", 46.7, 12.9),
    "mistral-7b": (MISTRAL_7B, "Mistral-7B", 7.24, 7.24),
    "gemma-7b": (GEMMA_7B, "Gemma-7B", 8.54, 8.54),
    "phi-3-mini": (PHI_3_MINI, "Phi-3-mini", 3.8, 3.8),
}


def write_config(folder: Path, cfg: dict[str, Any], name: str = "config.json") -> Path:
    path = folder / name
    path.write_text(json.dumps(cfg, indent=2))
    return path
