"""Token accounting for ops on engines without a tokenizer here (the simulator).

The simulator needs prompt lengths and token ids so that prefix caching sees shared context.
Text is split into word / punctuation tokens, and each token maps to an id by a stable hash
(BLAKE2b, never Python's salted `hash()`), so equal text prefixes give equal id prefixes in every
process. Chat messages add a fixed ChatML-style overhead per message. Real engines report their
own counts; these are used only where the engine cannot.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from functools import lru_cache

_TOKEN = re.compile(r"\w+|[^\w\s]")

VOCAB_SIZE = 151_936
"""Token-id space (Qwen3's vocabulary size)."""

MESSAGE_OVERHEAD_TOKENS = 4
"""<|im_start|>, role, newline, <|im_end|> per message."""


def split_tokens(text: str) -> list[str]:
    """Word / punctuation tokens of `text`."""
    return _TOKEN.findall(text)


def count_tokens(text: str) -> int:
    """Number of tokens of `text`."""
    return len(split_tokens(text))


@lru_cache(maxsize=65536)
def _token_id(token: str) -> int:
    digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % VOCAB_SIZE


def token_ids(text: str) -> list[int]:
    """Stable ids of `text`'s tokens."""
    return [_token_id(t) for t in split_tokens(text)]


def chat_token_ids(messages: Sequence[tuple[str, str]]) -> list[int]:
    """Ids of a chat prompt: per message a role header, the content, an end marker."""
    ids: list[int] = []
    for role, content in messages:
        ids.append(_token_id("<|im_start|>"))
        ids.append(_token_id(role))
        ids.append(_token_id("\n"))
        ids.extend(token_ids(content))
        ids.append(_token_id("<|im_end|>"))
    return ids
