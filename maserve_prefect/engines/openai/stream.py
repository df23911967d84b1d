"""One accepted request of `OpenAIEngine` on its way to an `Outcome`: its job, its stream.

The one idea: an attempt is one streaming call, sent on the engine's persistent `httpx` client
and read as raw server-sent events into a `Streamed`
(text, token ids, usage); the outcome is then built from the job's record (request, realized mode,
notes, every `Attempt`) and the last attempt's `Streamed`, or from the record alone when the job
failed or was aborted. Nothing here holds engine state: the engine passes its client, its clock and
its first-token hook in.

Token counts: the server's `usage` when it sends one; otherwise the prompt's own length and the
number of returned token ids (or of output chunks), with a note that they are estimates. The
ticket's first token may come from a failed attempt; the outcome's `first_token_s` is the one of
the attempt whose output it reports, and a note says when the two differ.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from maserve_prefect.engines.openai.prompts import CallSpec
from maserve_prefect.engines.openai.retry import IncompleteStreamError, ServerStatusError
from maserve_prefect.protocol.outcomes import Attempt, Outcome, OutcomeStatus, Ticket
from maserve_prefect.protocol.requests import Request

__all__ = [
    "Job",
    "Streamed",
    "completed_outcome",
    "ended_outcome",
    "request_body",
    "stream_attempt",
]

_JSON = {"Content-Type": "application/json"}


@dataclass(slots=True)
class Job:
    """An accepted request in flight: what to send, its ticket, and the attempts made so far."""

    request: Request
    spec: CallSpec
    ticket: Ticket
    notes: tuple[str, ...]
    mode: str
    arrival_s: float
    attempts: list[Attempt] = field(default_factory=list)
    running: bool = False
    first_token_s: float | None = None  # first token of any attempt (what the ticket reported)
    body: bytes | None = None  # the encoded request body (`request_body`), built at submission


@dataclass(slots=True)
class Streamed:
    """What one attempt's stream carried (usage fields None when the server sent no usage)."""

    text: str
    token_ids: tuple[int, ...] | None
    first_token_s: float | None
    num_prompt_tokens: int | None
    num_output_tokens: int | None
    num_cached_tokens: int
    num_pieces: int  # chunks that carried output (the count when the server sends no usage)


def request_body(spec: CallSpec) -> bytes:
    """The JSON body of `spec`'s call: its parameters with the vLLM fields merged in, encoded once
    (at submission, so that nothing is serialized between the send stamp and the send).

    Examples:
        >>> from maserve_prefect.engines.openai.prompts import CallSpec
        >>> request_body(CallSpec("completions", {"model": "m", "prompt": [1]}, {"ignore_eos": True}))
        b'{"model":"m","prompt":[1],"ignore_eos":true}'
    """
    return json.dumps(spec.params | spec.extra_body, separators=(",", ":")).encode()


def _status_message(status: int, body: bytes) -> str:
    """The server's own message of a non-200 answer (vLLM: `{"message": ...}` or
    `{"error": {"message": ...}}`), else the body's start."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        inner = data.get("error")
        msg = inner.get("message") if isinstance(inner, dict) else data.get("message")
        if isinstance(msg, str) and msg:
            return msg
    text = body.decode("utf-8", errors="replace").strip()
    return text[:200] or f"status {status}"


async def stream_attempt(
    http: httpx.AsyncClient,
    job: Job,
    now: Callable[[], float],
    on_first_token: Callable[[float], None],
    on_sent: Callable[[float], None] | None = None,
) -> Streamed:
    """One streaming call on the engine's persistent HTTP client, read as raw server-sent events.

    `now` stamps the send — the moment the request is handed to the connection pool, after
    everything about it was built (`on_sent` gets it) — and the first token, which is handed to
    `on_first_token` as it arrives.

    The call goes straight through `httpx` (a kept-alive connection pool, the body encoded at
    submission) rather than the `openai` client, and the chunks are decoded with `json.loads`
    rather than the SDK's typed models: per-request option building and per-chunk model
    construction would make this client, not the server, the bottleneck on a small machine —
    late send, first-token and finish times are exactly what a measurement tool must not produce.

    Raises:
        ServerStatusError: the server answered other than 200 (its message kept).
        IncompleteStreamError: the stream ended before a finish reason, or carried an error.
        httpx.HTTPError: the transport failed.
    """
    spec, chat = job.spec, job.spec.endpoint == "chat"
    request = http.build_request(
        "POST",
        "chat/completions" if chat else "completions",
        content=job.body if job.body is not None else request_body(spec),
        headers=_JSON,
    )
    parts: list[str] = []
    ids: list[int] | None = []
    num_pieces = 0
    usage: dict[str, Any] | None = None
    first_s: float | None = None
    finished = False
    sent_s = now()
    if on_sent is not None:
        on_sent(sent_s)
    response = await http.send(request, stream=True)
    try:
        if response.status_code != 200:
            raise ServerStatusError(
                response.status_code, _status_message(response.status_code, await response.aread())
            )
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                continue  # the stream ends here; let the line iterator finish cleanly
            chunk = json.loads(data)
            if "error" in chunk and not chunk.get("choices"):
                raise IncompleteStreamError(f"the server sent an error: {chunk['error']}")
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or ():
                piece = (
                    (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                ) or ""
                toks = choice.get("token_ids")
                if piece or toks:
                    num_pieces += 1
                    if first_s is None:
                        first_s = now()
                        on_first_token(first_s)
                parts.append(piece)
                if toks and ids is not None:
                    ids.extend(int(t) for t in toks)
                elif piece:
                    ids = None  # text without ids: the server does not return them
                finished = finished or bool(choice.get("finish_reason"))
    finally:
        await response.aclose()
    if not finished:
        raise IncompleteStreamError("the stream ended before a finish_reason")
    details = (usage or {}).get("prompt_tokens_details") or {}
    return Streamed(
        text="".join(parts),
        token_ids=tuple(ids) if ids else None,
        first_token_s=first_s,
        num_prompt_tokens=(usage or {}).get("prompt_tokens"),
        num_output_tokens=(usage or {}).get("completion_tokens"),
        num_cached_tokens=int(details.get("cached_tokens") or 0),
        num_pieces=num_pieces,
    )


def completed_outcome(job: Job, got: Streamed) -> Outcome:
    """The COMPLETED outcome of `job`, whose last attempt streamed `got`."""
    notes = list(job.notes)
    num_prompt, num_output = got.num_prompt_tokens, got.num_output_tokens
    if num_prompt is None or num_output is None:
        notes.append("the server sent no usage; token counts are estimates")
        num_prompt = job.request.num_prompt() if num_prompt is None else num_prompt
        if num_output is None:
            num_output = len(got.token_ids) if got.token_ids else got.num_pieces
    if job.first_token_s is not None and job.first_token_s != got.first_token_s:
        notes.append(
            f"the ticket's first token ({job.first_token_s:.6f} s) came from a failed attempt"
        )
    return Outcome(
        request_id=job.request.request_id,
        status=OutcomeStatus.COMPLETED,
        num_prompt_tokens=num_prompt,
        num_output_tokens=num_output,
        num_cached_tokens=got.num_cached_tokens,
        num_preemptions=0,
        realized_mode=job.mode,
        arrival_s=job.arrival_s,
        first_scheduled_s=None,
        first_token_s=got.first_token_s,
        finish_s=job.attempts[-1].end_s,
        notes=tuple(notes),
        output_text=got.text,
        output_token_ids=got.token_ids,
        attempts=tuple(job.attempts),
    )


def ended_outcome(job: Job, status: OutcomeStatus, error: str, finish_s: float) -> Outcome:
    """The outcome of a `job` that ended without output (FAILED or ABORTED) at `finish_s`."""
    req = job.request
    return Outcome(
        request_id=req.request_id,
        status=status,
        num_prompt_tokens=req.num_prompt(),
        num_output_tokens=0,
        num_cached_tokens=0,
        num_preemptions=0,
        realized_mode=job.mode,
        arrival_s=job.arrival_s,
        first_scheduled_s=None,
        first_token_s=None,
        finish_s=finish_s,
        notes=job.notes,
        error=error,
        attempts=tuple(job.attempts),
    )
