"""A tiny random-weight Llama that vLLM can serve on a CPU in under a minute, built offline.

The one idea: the real-engine tests need *a* model, not a good one. A 2-layer, 128-wide Llama
with seeded random weights and a byte-level BPE tokenizer trained here on a built-in corpus
exercises every serving path (prefill, decode, prefix caching, priorities, KV events) with no
model hub and no download. Its output text is noise; its token counts and timings are real.

This file runs as a plain script under the vLLM venv's python (which has torch, tokenizers and
safetensors), so it imports nothing from `maserve_prefect`:

    VLLM_PY maserve_prefect/engines/vllm/tiny_model.py OUT_DIR [--seed 0]

It writes a Hugging Face Llama folder: `config.json`, `model.safetensors`, `tokenizer.json`,
`tokenizer_config.json` (ChatML chat template, bos/eos), `generation_config.json`, and last a
stamp `tiny_model.json` (seed + this script's sha256) that marks the folder complete. The same
seed gives byte-identical files. The tokenizer does not depend on the seed (its corpus is fixed);
the weights do.

Examples:
    >>> len(corpus_text()) > 4000 and corpus_text() == corpus_text()
    True
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any

HIDDEN = 128
NUM_LAYERS = 2
NUM_HEADS = 2
NUM_KV_HEADS = 2
HEAD_DIM = 64
INTERMEDIATE = 256
MAX_POSITIONS = 32768
TARGET_VOCAB = 512
INIT_STD = 0.02
STAMP_NAME = "tiny_model.json"

BOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (BOS, IM_START, IM_END)

# ChatML, as Qwen-style chat models use it; the generation prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_WORDS = (
    "the a an agent agents model models task tasks plan plans answer answers question review "
    "reviewer critic judge debate round rounds draft drafts refine refined solution solutions "
    "tool tool call result results search read write code test tests pass fail error fix step "
    "steps first then next finally because so and or but if when while with without from to "
    "of in on at by for is are was were be been has have had do does did can could will would "
    "should must may might we you they it this that these those our your their value values "
    "number numbers list lists table file files data cache prefix token tokens prompt prompts "
    "request requests server servers queue queues memory device devices time latency fast slow "
    "large small short long good better best check checks verify verified agree disagree "
    "summary summarize explain reason reasons evidence claim claims score scores vote votes "
    "final output input context role roles system user assistant message messages"
).split()
_ENDS = (".", ".", ".", "?", "!", ";")


def corpus_text() -> str:
    """A fixed, few-KB English-like corpus for training the tokenizer (never seed-dependent)."""
    rng = random.Random(20240611)
    lines: list[str] = []
    for _ in range(160):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 14))]
        words[0] = words[0].capitalize()
        lines.append(" ".join(words) + rng.choice(_ENDS))
    # digits and punctuation so every common byte pair has a chance to merge
    lines.append(" ".join(str(rng.randint(0, 9999)) for _ in range(60)))
    lines.append("{ } [ ] ( ) : , - + = * / < > # @ ' \" `")
    return "\n".join(lines) + "\n"


def train_tokenizer() -> Any:
    """Byte-level BPE with the three ChatML special tokens first (ids 0, 1, 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TARGET_VOCAB,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_text().splitlines(), trainer=trainer)
    return tok


def model_config(vocab_size: int, bos_id: int, eos_id: int) -> dict[str, Any]:
    """The Hugging Face `config.json` of the tiny Llama."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "intermediate_size": INTERMEDIATE,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "vocab_size": vocab_size,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": INIT_STD,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
        "use_cache": True,
    }


def random_weights(vocab_size: int, seed: int) -> dict[str, Any]:
    """Seeded normal(0, 0.02) matrices and unit RMSNorm scales, in a fixed creation order."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * INIT_STD

    q_out = NUM_HEADS * HEAD_DIM
    kv_out = NUM_KV_HEADS * HEAD_DIM
    tensors: dict[str, Any] = {"model.embed_tokens.weight": normal(vocab_size, HIDDEN)}
    for i in range(NUM_LAYERS):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = normal(q_out, HIDDEN)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv_out, HIDDEN)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv_out, HIDDEN)
        tensors[p + "self_attn.o_proj.weight"] = normal(HIDDEN, q_out)
        tensors[p + "mlp.gate_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[p + "mlp.up_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[p + "mlp.down_proj.weight"] = normal(HIDDEN, INTERMEDIATE)
        tensors[p + "input_layernorm.weight"] = torch.ones(HIDDEN)
        tensors[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN)
    tensors["model.norm.weight"] = torch.ones(HIDDEN)
    tensors["lm_head.weight"] = normal(vocab_size, HIDDEN)
    return tensors


def script_sha256() -> str:
    """sha256 of this file: part of the stamp, so an edited script rebuilds the model."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build(out_dir: Path | str, seed: int = 0) -> Path:
    """Write the tiny model folder into `out_dir` (created if missing) and return it.

    Args:
        out_dir: target folder; existing files of the same names are overwritten.
        seed: seeds the weights; the same seed gives byte-identical files.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    vocab_size = tok.get_vocab_size()
    bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(IM_END)
    tok.save(str(out / "tokenizer.json"))
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": IM_END,
            "pad_token": BOS,
            "unk_token": None,
            "add_bos_token": False,
            "add_eos_token": False,
            "model_max_length": MAX_POSITIONS,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _write_json(out / "config.json", model_config(vocab_size, bos_id, eos_id))
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": bos_id},
    )
    save_file(random_weights(vocab_size, seed), str(out / "model.safetensors"), {"format": "pt"})
    # the stamp goes last: its presence means every other file is complete
    _write_json(out / STAMP_NAME, {"seed": seed, "script_sha256": script_sha256()})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a tiny random-weight Llama folder.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = build(args.out_dir, args.seed)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
