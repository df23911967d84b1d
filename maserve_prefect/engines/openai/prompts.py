"""How an engine `Request` and its controls become one OpenAI-compatible streaming call.

Pure functions, no I/O: `resolve_controls` decides which controls the server honours by HEAR's
force rules (a requirement it cannot honour raises `UnsupportedError`, an unhonoured preference
becomes a note),
`build_call` picks the endpoint and the body, and `synth_token_ids` makes a deterministic prompt
for requests that carry only a length (and maybe prefix block hashes, as Mooncake traces do).

The one idea: a request reaches the server in the form that keeps its token counts exact.
Token ids go to `/v1/completions` as `prompt=[ids...]`; chat messages go to
`/v1/chat/completions`; a length-only request gets synthesized ids where every prefix block's
tokens are drawn from a generator seeded by that block's hash and the tail from the request id, so
requests that share hash prefixes share token prefixes and a real engine's prefix cache hits
exactly where the trace says it should. vLLM-only fields (`min_tokens`, `ignore_eos`, `priority`,
`cache_salt`, `return_token_ids`) travel in `extra_body` and only when the server supports them.

Synthesized ids depend on numpy's `PCG64` stream for a `SeedSequence`; numpy keeps that stream
stable, so a trace replays to the same ids across runs and machines.

Examples:
    >>> a = synth_token_ids(8, (11, 12), 4, vocab_size=256, salt="r1")
    >>> b = synth_token_ids(8, (11, 99), 4, vocab_size=256, salt="r2")
    >>> a[:4] == b[:4], a[4:] == b[4:]
    (True, False)
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from maserve_prefect.errors import ConfigError, UnsupportedError
from maserve_prefect.protocol.capabilities import Capabilities
from maserve_prefect.protocol.controls import Control, Priority
from maserve_prefect.protocol.force import resolve
from maserve_prefect.protocol.requests import Request

DEFAULT_VOCAB_SIZE = 256
"""Token ids are drawn below this unless the caller knows the model's vocabulary (safe for tiny
test models whose vocabularies hold a few hundred tokens)."""

DEFAULT_LOW_TOKEN_ID = 16
"""Synthesized ids start here: many tokenizers keep special tokens (BOS, EOS, pad) at low ids."""

_MASK_128 = (1 << 128) - 1
_BLOCK_DOMAIN = 1  # keeps a block hash and a salt with equal seeds from drawing equal tokens
_TAIL_DOMAIN = 2

Endpoint = Literal["completions", "chat"]

__all__ = [
    "DEFAULT_LOW_TOKEN_ID",
    "DEFAULT_VOCAB_SIZE",
    "CallSpec",
    "ControlChoice",
    "ServerFeatures",
    "build_call",
    "resolve_controls",
    "synth_token_ids",
]


# ---------------------------------------------------------------------------------------------
# synthesized prompts


def _draw(entropy: tuple[int, int], n: int, low: int, vocab_size: int) -> list[int]:
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(entropy))))
    out: list[int] = rng.integers(low, vocab_size, size=n).tolist()
    return out


@functools.lru_cache(maxsize=4096)
def _block(h: int, n: int, low: int, vocab_size: int) -> tuple[int, ...]:
    """One hashed prefix block's ids (cached: blocks recur, and a submission is on the send
    path of a timed replay)."""
    return tuple(_draw((_BLOCK_DOMAIN, h & _MASK_128), n, low, vocab_size))


def synth_token_ids(
    num_tokens: int,
    block_hashes: Sequence[int],
    block_size: int,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    salt: str = "",
    *,
    low: int = DEFAULT_LOW_TOKEN_ID,
) -> list[int]:
    """Deterministic prompt ids: block `i` is drawn from `block_hashes[i]`, the tail from `salt`.

    Args:
        num_tokens: prompt length (>= 1).
        block_hashes: prefix block hashes (any ints); may cover up to `block_size - 1` tokens
            past the end (a partial last block is cut).
        block_size: tokens per hashed block (>= 1 when hashes are given).
        vocab_size: ids are drawn from `[low, vocab_size)`.
        salt: seeds the tokens after the hashed blocks (the request id, so tails differ).
        low: the smallest id drawn (keeps clear of special tokens).

    Raises:
        ConfigError: bad lengths or a vocabulary no larger than `low`.

    Examples:
        >>> synth_token_ids(5, (), 0, vocab_size=64, salt="x") == synth_token_ids(
        ...     5, (), 0, vocab_size=64, salt="x")
        True
        >>> all(16 <= t < 64 for t in synth_token_ids(50, (3,), 10, vocab_size=64))
        True
    """
    if num_tokens < 1:
        raise ConfigError(f"synth_token_ids: num_tokens must be >= 1, got {num_tokens}")
    if vocab_size <= low or low < 0:
        raise ConfigError(
            f"synth_token_ids: need 0 <= low < vocab_size, got low={low}, vocab_size="
            f"{vocab_size}; pass the model's vocabulary size (OpenAIEngine(vocab_size=...))"
        )
    if block_hashes and block_size < 1:
        raise ConfigError(f"synth_token_ids: block hashes need block_size >= 1, got {block_size}")
    ids: list[int] = []
    for h in block_hashes:
        if len(ids) >= num_tokens:
            break
        ids.extend(_block(h, block_size, low, vocab_size))
    del ids[num_tokens:]
    if len(ids) < num_tokens:
        digest = int.from_bytes(hashlib.sha256(salt.encode()).digest()[:16], "big")
        ids.extend(_draw((_TAIL_DOMAIN, digest), num_tokens - len(ids), low, vocab_size))
    return ids


# ---------------------------------------------------------------------------------------------
# controls


@dataclass(frozen=True, slots=True)
class ControlChoice:
    """What `resolve_controls` settled: the priority to send (None: send none), the realized
    execution mode, and notes for every preference or fallback that changed the request."""

    priority: int | None
    mode: str
    notes: tuple[str, ...]


def resolve_controls(
    request: Request,
    controls: Sequence[Control],
    *,
    capabilities: Capabilities,
    where: str,
) -> ControlChoice:
    """Decide which controls an engine honours; `request.priority != 0` is a priority preference.

    The force rules are HEAR's, applied by `protocol.force.resolve` (the same function the simulator
    uses): requirements claim their slots first, so a preference never overrides a requirement,
    whatever the order of `controls`; a requirement the server cannot honour uses the first
    allowed fallback that works, or the call is unsupported.

    Args:
        request: the request (its `priority` field counts as a preference).
        controls: typed controls with their force and allowed fallbacks.
        capabilities: the server's (`OpenAIEngine.capabilities()`); its first mode is the default.
        where: names the engine in messages.

    Raises:
        UnsupportedError: a requirement cannot be honoured and no allowed fallback works.
        RequestError: a control's fallback entry is neither a control nor (for `ExecutionMode`)
            a mode name.

    Examples:
        >>> from maserve_prefect.protocol.controls import ExecutionMode, Force
        >>> caps = Capabilities((ExecutionMode, Priority), True, True, True, True, False, (),
        ...                     ("default",))
        >>> req = Request("r", "m", num_prompt_tokens=4, priority=2)
        >>> resolve_controls(req, [], capabilities=caps, where="e").priority
        2
        >>> resolve_controls(req, [Priority(9), Priority(1, force=Force.REQUIREMENT)],
        ...                  capabilities=caps, where="e").priority
        1
    """
    res = resolve(controls, capabilities)
    if res.unsatisfied:
        raise UnsupportedError(
            f"{where} cannot honour {res.reason}; relax it to a preference or allow a fallback"
        )
    notes = list(res.notes())
    honoured = res.honoured_of(Priority)
    priority = honoured[0].value if honoured else None
    if request.priority != 0 and not any(isinstance(c, Priority) for c in controls):
        if Priority in capabilities.control_types and capabilities.priority_scheduling:
            priority = request.priority
        else:
            notes.append(
                f"preference request.priority={request.priority} not honoured: {where} does "
                "not schedule by priority; ignored"
            )
    return ControlChoice(priority, res.realized_mode(capabilities.modes[0]), tuple(notes))


# ---------------------------------------------------------------------------------------------
# the call


@dataclass(frozen=True, slots=True)
class ServerFeatures:
    """The server facts `build_call` needs (from discovery)."""

    token_id_prompts: bool = True
    length_lock: bool = False
    cache_salt: bool = False
    return_token_ids: bool = False


@dataclass(frozen=True, slots=True)
class CallSpec:
    """One streaming call: the endpoint, the keyword arguments of the `openai` client method
    (`model`, `prompt` or `messages`, `max_tokens`, `stream`, `stream_options`), the vLLM fields
    for `extra_body`, and notes on what could not be sent."""

    endpoint: Endpoint
    params: dict[str, Any]
    extra_body: dict[str, Any]
    notes: tuple[str, ...] = ()


def fold_token_ids(ids: list[int], vocab_size: int, low: int = 16) -> list[int]:
    """Map ids into `[low, vocab_size)` deterministically (count and equal prefixes kept).

    Examples:
        >>> fold_token_ids([5, 300, 1000], 256)
        [5, 60, 40]
    """
    span = vocab_size - low
    if span < 1:
        raise ConfigError(f"fold_token_ids: vocab_size {vocab_size} must exceed low={low}")
    return [i if i < vocab_size else low + (i - low) % span for i in ids]


def build_call(
    request: Request,
    *,
    model: str,
    features: ServerFeatures,
    priority: int | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    where: str = "server",
) -> CallSpec:
    """Map a request to one streaming call (see the module docstring for the forms).

    Args:
        request: the engine request.
        model: the server's model id.
        features: what the server supports.
        priority: the priority to send (from `resolve_controls`); None sends none.
        vocab_size: upper bound (exclusive) for synthesized token ids.
        where: names the engine in messages.

    Raises:
        UnsupportedError: the request needs token-id prompts and the server does not take them.

    Examples:
        >>> spec = build_call(Request("r", "m", prompt_token_ids=(5, 6), max_tokens=3,
        ...                           min_tokens=3), model="tiny",
        ...                   features=ServerFeatures(length_lock=True))
        >>> spec.endpoint, spec.params["prompt"], spec.extra_body
        ('completions', [5, 6], {'min_tokens': 3, 'ignore_eos': True})
    """
    params: dict[str, Any] = {
        "model": model,
        "max_tokens": request.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    extra: dict[str, Any] = {}
    notes: list[str] = []
    endpoint: Endpoint = "completions"
    if request.prompt_token_ids is None and request.messages is not None:
        endpoint = "chat"
        params["messages"] = [{"role": role, "content": text} for role, text in request.messages]
    else:
        if not features.token_id_prompts:
            raise UnsupportedError(
                f"{where} does not accept token-id prompts, which request "
                f"{request.request_id!r} needs; give it chat messages or use a vLLM server"
            )
        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
            if max(ids) >= vocab_size:
                # Ids from another tokenizer (a trace recorded elsewhere): fold them into this
                # vocabulary, which keeps the count and equal prefixes equal.
                ids = fold_token_ids(ids, vocab_size)
                notes.append(f"prompt token ids folded into a {vocab_size}-token vocabulary")
            params["prompt"] = ids
        else:
            params["prompt"] = synth_token_ids(
                request.num_prompt(),
                request.prefix_block_hashes,
                request.prefix_block_size,
                vocab_size,
                salt=request.request_id,
            )
    if request.min_tokens > 0:
        locked = request.min_tokens == request.max_tokens
        if not features.length_lock:
            what = "length lock" if locked else f"min_tokens={request.min_tokens}"
            notes.append(f"{what} not supported by {where}; output may end early at EOS")
        elif locked:
            extra["min_tokens"] = request.min_tokens
            extra["ignore_eos"] = True
        else:
            extra["min_tokens"] = request.min_tokens
    if priority is not None:
        extra["priority"] = priority
    if request.cache_salt is not None:
        if features.cache_salt:
            extra["cache_salt"] = request.cache_salt
        else:
            notes.append(f"cache_salt not supported by {where}; prefix cache is not isolated")
    if features.return_token_ids:
        extra["return_token_ids"] = True
    return CallSpec(endpoint, params, extra, tuple(notes))
