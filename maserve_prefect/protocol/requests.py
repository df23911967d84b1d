"""What an engine is asked to run: one generation call, `Request`.

One idea: a request carries its prompt in exactly one form — token ids, or a length with optional
prefix-block hashes (Mooncake's hash ids) — and is checked once, when it is made, so every engine
behind the seam can trust it. Plain slots dataclass: it lives on the simulator's hot path.

Examples:
    >>> req = Request("r1", "llama-8b", num_prompt_tokens=1024, max_tokens=64)
    >>> req.num_prompt()
    1024
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from maserve_prefect.errors import RequestError

DEFAULT_MAX_TOKENS = 1024
"""The output limit of a model call that declares none (the runner records it, the pool runtime
plans with it until the call's request is known)."""


@dataclass(frozen=True, slots=True)
class Request:
    """One generation call as an engine sees it.

    Exactly one prompt form: `prompt_token_ids`, or `num_prompt_tokens` (+ optional
    `prefix_block_hashes` of `prefix_block_size` tokens each, e.g. Mooncake's 512-token hash ids).

    Attributes:
        request_id: unique per engine.
        deployment: the model deployment that must serve it.
        max_tokens: output length target; with `min_tokens == max_tokens` the length is locked.
        priority: lower runs first under priority scheduling (vLLM convention).
        cache_salt: isolates prefix-cache reuse to requests with the same salt.
        tags: opaque ids (op id, root id) so step records join back to the ops that issued them.
        messages: the chat messages as (role, content) pairs, for engines that generate text
            (OpenAI-compatible servers); the simulator schedules on the token form alone.
    """

    request_id: str
    deployment: str
    prompt_token_ids: tuple[int, ...] | None = None
    num_prompt_tokens: int | None = None
    prefix_block_hashes: tuple[int, ...] = ()
    prefix_block_size: int = 0
    max_tokens: int = 1
    min_tokens: int = 0
    priority: int = 0
    cache_salt: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    messages: tuple[tuple[str, str], ...] | None = None

    def __post_init__(self) -> None:
        where = f"request {self.request_id!r}"
        has_ids = self.prompt_token_ids is not None
        has_len = self.num_prompt_tokens is not None
        if has_ids == has_len:
            raise RequestError(
                f"{where}: give exactly one of prompt_token_ids or num_prompt_tokens"
            )
        if has_ids and self.prefix_block_hashes:
            raise RequestError(
                f"{where}: prefix_block_hashes only go with num_prompt_tokens; "
                "token-id prompts are hashed from their ids"
            )
        if self.num_prompt() < 1:
            raise RequestError(f"{where}: the prompt must hold at least one token")
        if self.prefix_block_hashes:
            if self.prefix_block_size < 1:
                raise RequestError(f"{where}: prefix_block_hashes need prefix_block_size >= 1")
            covered = len(self.prefix_block_hashes) * self.prefix_block_size
            if covered > self.num_prompt() + self.prefix_block_size - 1:
                raise RequestError(
                    f"{where}: {len(self.prefix_block_hashes)} prefix blocks of "
                    f"{self.prefix_block_size} tokens exceed the {self.num_prompt()}-token prompt"
                )
        if self.max_tokens < 1:
            raise RequestError(f"{where}: max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise RequestError(
                f"{where}: need 0 <= min_tokens <= max_tokens, got "
                f"min_tokens={self.min_tokens}, max_tokens={self.max_tokens}"
            )

    def num_prompt(self) -> int:
        """Prompt length in tokens, whichever form the prompt has."""
        if self.prompt_token_ids is not None:
            return len(self.prompt_token_ids)
        assert self.num_prompt_tokens is not None
        return self.num_prompt_tokens
