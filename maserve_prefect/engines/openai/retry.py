"""When a failed attempt of `OpenAIEngine` is tried again: classify the error, ask the policy.

The one idea: every exception an attempt can end in maps to one of `ERROR_KINDS` — an HTTP status
class ("5xx", "4xx", "429"), "connection" (transport errors, a stream cut before its finish reason),
"timeout", or "internal" (a bug on this side) — and `RetryPolicy.retry_on` names the kinds worth a
new attempt, with a doubling, capped backoff between attempts. A 4xx is not retried by default:
the request itself is wrong.

Examples:
    >>> RetryPolicy(max_attempts=3, backoff_s=0.2).delay_s(2)
    0.4
    >>> classify_error(TimeoutError()).kind
    'timeout'
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import openai

from maserve_prefect.errors import ConfigError

try:  # openai >= 3 speaks through httpx2; older releases through httpx
    import httpx2

    _TRANSPORT_ERRORS: tuple[type[Exception], ...] = (httpx.TransportError, httpx2.TransportError)
except ImportError:  # pragma: no cover - depends on the installed openai
    _TRANSPORT_ERRORS = (httpx.TransportError,)


__all__ = [
    "ERROR_KINDS",
    "Failure",
    "IncompleteStreamError",
    "RetryPolicy",
    "ServerStatusError",
    "classify_error",
]

ERROR_KINDS = ("5xx", "4xx", "429", "connection", "timeout", "internal")
"""How a failed attempt is classified; `RetryPolicy.retry_on` names the kinds to retry."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When and how often a failed attempt is tried again.

    Args:
        max_attempts: attempts in all (1 = never retry).
        backoff_s: wait before the second attempt; doubles each time, capped at `max_backoff_s`.
        max_backoff_s: the longest wait between attempts.
        retry_on: error kinds to retry (see `ERROR_KINDS`); 4xx answers are not retried by
            default (the request itself is wrong), 429 only if listed.

    Raises:
        ConfigError: a bound out of range or an unknown kind.
    """

    max_attempts: int = 3
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0
    retry_on: tuple[str, ...] = ("5xx", "connection", "timeout")

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ConfigError(
                f"{self!r}: need max_attempts >= 1 and non-negative backoff_s / max_backoff_s"
            )
        unknown = sorted(set(self.retry_on) - set(ERROR_KINDS))
        if unknown:
            raise ConfigError(f"RetryPolicy.retry_on: unknown kinds {unknown}; use {ERROR_KINDS}")

    def delay_s(self, attempt: int) -> float:
        """The wait after failed attempt number `attempt` (1-based)."""
        return min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)


@dataclass(frozen=True, slots=True)
class Failure:
    """A classified attempt failure: its kind, the HTTP status (if any) and a message."""

    kind: str
    status_code: int | None
    message: str


class IncompleteStreamError(Exception):
    """The stream ended without a finish reason (the connection went away mid-answer)."""


class ServerStatusError(Exception):
    """The server answered a call with a status other than 200 (`message`: its own words)."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code
        self.message = message


def _server_message(exc: openai.APIStatusError) -> str:
    """The server's own message (vLLM: `{"message": ...}` or `{"error": {"message": ...}}`)."""
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error")
        msg = inner.get("message") if isinstance(inner, dict) else body.get("message")
        if isinstance(msg, str) and msg:
            return msg
    return exc.message


def classify_error(exc: BaseException) -> Failure:
    """Classify an attempt's exception into one of `ERROR_KINDS`.

    Examples:
        >>> classify_error(IncompleteStreamError("cut")).kind
        'connection'
        >>> classify_error(ValueError("bug")).kind
        'internal'
    """
    if isinstance(exc, openai.APIStatusError | ServerStatusError):
        code = exc.status_code
        kind = "5xx" if code >= 500 else ("429" if code == 429 else "4xx")
        msg = exc.message if isinstance(exc, ServerStatusError) else _server_message(exc)
        return Failure(kind, code, f"HTTP {code}: {msg}")
    if isinstance(exc, openai.APITimeoutError | TimeoutError | httpx.TimeoutException):
        return Failure("timeout", None, f"timed out ({type(exc).__name__})")
    if isinstance(exc, (openai.APIConnectionError, IncompleteStreamError, *_TRANSPORT_ERRORS)):
        cause = f" ({type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
        return Failure("connection", None, f"connection error: {type(exc).__name__}: {exc}{cause}")
    if isinstance(exc, openai.APIError):  # an error event inside the stream: the server failed
        return Failure("5xx", None, f"server error in stream: {exc.message}")
    return Failure("internal", None, f"{type(exc).__name__}: {exc}")
