"""A model's context window as a vLLM server enforces it, refused in the server's own words.

One idea: vLLM's OpenAI server refuses — never truncates — a request whose prompt plus
`max_tokens` exceeds `max_model_len` (by default the model's `max_position_embeddings`), with
HTTP 400 `BadRequestError` and the message below. The simulator rejects the same requests with
the same text, so a trace replayed on the simulator and on a server fails the same ops the same
way (each recorded as a failed attempt of its op).

Examples:
    >>> context_length_error(40960, 200000, 16)
    "This model's maximum context length is 40960 tokens. However, you requested 200016 tokens (200000 in the messages, 16 in the completion). Please reduce the length of the messages or completion."
"""

from __future__ import annotations

__all__ = ["context_length_error"]


def context_length_error(max_model_len: int, num_prompt: int, max_tokens: int) -> str:
    """vLLM's 400 message for a request over the context window."""
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, you "
        f"requested {num_prompt + max_tokens} tokens ({num_prompt} in the messages, "
        f"{max_tokens} in the completion). Please reduce the length of the messages or "
        "completion."
    )
